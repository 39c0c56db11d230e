"""A slow step says why: one warning when other work shares the cores a paczero run was given.

A step's time is the machine's, not the run's alone: the same SmolLM2 forward took 8× as long on 2 cores while
another 2-thread training ran there. The machine's load (the 1-minute load average: threads running or
waiting to run) is compared with the cores paczero was given: the machine's cores where paczero may use them
all, as it usually may. paczero's own threads are part of the load, so the machine counts as busy when the
load reaches those cores plus :data:`MARGIN` (at least one thread more than the cores, on average); it counts
as shared, too, when other paczero processes share these cores (:mod:`paczero.machine.thread_share` counts
them and divides the threads). Either way one line on stderr, once per run, above the progress bar:

    paczero: machine busy: load 3.9 on 2 cores (paczero runs 2 threads here); step times include the other
    processes' work

The step times in the run's log records are measured as ever and never altered; the line only says what they
include. It is a line of its own, not one of paczero's warnings, so that what a run warns of does not depend
on the machine it ran on.
"""
from __future__ import annotations

import os
import sys

#: threads beyond the cores, on average over the last minute, before the machine counts as busy
MARGIN = 1.0
#: set to "0" to never say it (a test suite whose expected output must not depend on the machine's load)
BUSY_LINE_ENV = "PACZERO_BUSY_LINE"


def load_average() -> float | None:
    """The machine's 1-minute load average (``os.getloadavg``, which reads ``/proc/loadavg`` on Linux), or
    None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def machine_cores(given: int) -> int:
    """The cores a machine-wide load is compared with: the machine's (the load counts the threads of every
    core), which are the ``given`` cores where paczero may use them all; never fewer than ``given``."""
    return max(given, os.cpu_count() or given)


class BusyWatch:
    """Says once, on stderr above a progress bar, that the machine is busier than its cores."""

    def __init__(self, cores: int):
        self.cores = machine_cores(cores)
        self.said: str | None = None

    def check(self, threads: int, sharing: int = 1) -> str | None:
        """Look at the load now (``threads``: this process's torch threads; ``sharing``: the paczero
        processes on these cores, this one included); the line's text the first time the machine is busy
        or shared (printed then), else None."""
        if self.said is not None or os.environ.get(BUSY_LINE_ENV, "1") == "0":
            return None
        load = load_average()
        busy = load is not None and load >= self.cores + MARGIN
        if not busy and sharing <= 1:
            return None
        others = f", {sharing - 1} other paczero process{'es' if sharing > 2 else ''} on these cores" \
            if sharing > 1 else ""
        said = "" if load is None else f"load {load:.1f} on {self.cores} core{'s' if self.cores > 1 else ''} "
        self.said = (f"machine busy: {said}(paczero runs {threads} thread{'s' if threads > 1 else ''} here"
                     f"{others}); step times include the other processes' work")
        from tqdm import tqdm

        tqdm.write(f"paczero: {self.said}", file=sys.stderr)  # above a running progress bar, which stays whole
        return self.said
