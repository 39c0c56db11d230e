"""A ZO step against the inference floor: ``python benchmarks/bench_step.py --model tiny-opt --track lora ft``.

The same as ``paczero bench``; see :mod:`paczero.bench` for what is measured.
For example (docs/performance.md has the figures and their commands)::

    python benchmarks/bench_step.py --model tiny-opt --track ft lora --n 1000 --steps 15 --memory-repeats 3 --live-memory
    python benchmarks/bench_step.py --model smollm2 --track ft --n 1000 --steps 3 --no-scaling --live-memory
"""
import sys

from paczero.bench import main

if __name__ == "__main__":
    sys.exit(main())
