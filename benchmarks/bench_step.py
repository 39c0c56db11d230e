"""A ZO step against the inference floor: ``python benchmarks/bench_step.py --model tiny-opt --track lora ft``.

The same as ``paczero bench``; see :mod:`benchmarks.step` for what is measured.
For example (docs/performance.md has the figures and their commands)::

    python benchmarks/bench_step.py --model tiny-opt --track ft lora --n 1000 --steps 15 --memory-repeats 3 --live-memory
    python benchmarks/bench_step.py --model smollm2 --track ft --n 1000 --steps 3 --no-scaling --live-memory
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for `benchmarks` (and its children)

from benchmarks.step import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
