"""The benchmarks of a paczero source checkout (not shipped in the package).

``benchmarks.step`` is the step benchmark (a ZO step against the inference floor), run by
``paczero bench`` and ``python benchmarks/bench_step.py``; the other files here are scripts,
and ``results/`` holds measured figures with the commands that produced them.
"""
