"""A ZO step against the inference floor: ``python benchmarks/bench_step.py --model tiny-opt --track lora ft``.

The same as ``paczero bench``; see :mod:`paczero.bench` for what is measured.
The figures of docs/performance.md came from::

    python benchmarks/bench_step.py --model tiny-opt --track lora ft --n 256 --threads 1 --steps 5
    python benchmarks/bench_step.py --model smollm2-135m-instruct --track lora ft --n 64 --threads 1 --steps 3
"""
import sys

from paczero.bench import main

if __name__ == "__main__":
    sys.exit(main())
