"""Experiments over many runs: grids run locally or as SLURM jobs (:mod:`.sweep`, :mod:`.slurm`), the
unanimity regime (:mod:`.regime`), tables and plots (:mod:`.report`). The recipes they run are
:mod:`paczero.recipes` (package data, also read by the flags).

Imports: anything below it (run, audit, machine, privacy, tasks, zo, recipes, flags); never cli, api or bench.
"""
