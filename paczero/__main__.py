"""``python -m paczero ...``: the ``paczero`` command."""
import sys

from paczero.cli import main

if __name__ == "__main__":
    sys.exit(main())
