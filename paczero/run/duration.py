"""A run's expected duration, said once from its first steps, before the run is long.

After the first few steps a process runs, one line gives the time its remaining steps should take at the median
time of those steps (the median: a first step's warm-up does not count twice). A run whose steps are projected to
take less than :data:`SAY_FROM` seconds in all gets no line. A DP run gets none ever: its step time grows with
its private batch size, so it publishes no time (``_private_batches`` in :mod:`paczero.train`,
docs/privacy.md), and this line, printed where the run's other lines go, would be such a time. The line is
printed only: log.jsonl and the run's other files hold what they held (a non-DP run's log.jsonl records every
step's seconds already).
"""
from __future__ import annotations

import statistics
from typing import Callable

#: steps timed before the estimate is said
FIRST_STEPS = 3
#: the projected seconds below which no line is said (a run that short needs no estimate)
SAY_FROM = 60.0


class Estimate:
    """Times the steps of one process (``steps`` in the run, ``start`` the first this process runs) and says
    (``say``) one line after :data:`FIRST_STEPS` of them where steps remain and the whole is long enough.
    ``private``: a DP run, which records no time and says nothing."""

    def __init__(self, steps: int, start: int, private: bool, say: Callable[[str], None]):
        self.steps, self.start, self.private, self.say = int(steps), int(start), bool(private), say
        self.times: list[float] = []
        self.said = False

    def add(self, seconds: float) -> float:
        """Record one step's ``seconds`` (nothing for a DP run); say the estimate when it is due. Returns
        ``seconds``."""
        if self.private or self.said:
            return seconds
        self.times.append(float(seconds))
        k = len(self.times)
        if k == FIRST_STEPS and self.start + k < self.steps:
            self.said = True
            line = estimate_line(self.steps - self.start, statistics.median(self.times), k)
            if line is not None:
                self.say(line)
        return seconds


def estimate_line(steps: int, per_step: float, timed: int) -> str | None:
    """``paczero: about N min for T steps at S s a step (from the first k steps)`` for ``steps`` steps of
    ``per_step`` seconds; None below :data:`SAY_FROM` seconds."""
    total = steps * per_step
    if total < SAY_FROM:
        return None
    minutes = total / 60
    amount = f"{minutes / 60:.1f} h" if minutes >= 120 else f"{minutes:.0f} min"
    return (f"paczero: about {amount} for {steps} steps at {per_step:.3g} s a step (from the first {timed} "
            "steps)")
