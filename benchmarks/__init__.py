"""The benchmarks of a paczero source checkout (not shipped in the package).

The step benchmark (a ZO step against the inference floor) is a user command, ``paczero bench``, and
ships in the package (``paczero.bench``); the files here are the scripts that are not user commands
(measurements behind implementation choices), and ``results/`` holds measured figures with the commands
that produced them.
"""
