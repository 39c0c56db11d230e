"""A clean stop on a signal: finish the step, checkpoint, exit (see :class:`StopRequest`); a parent that
passes the stop on to its child processes (:func:`on_stop_signals`)."""
from __future__ import annotations

import contextlib
import signal
from typing import Callable, Iterator


class StopRequest:
    """SIGTERM / Ctrl-C: finish the current step, checkpoint, exit cleanly; a second one stops at once.
    SIGUSR2, SLURM's warning of the time limit or of a preemption, asks for the same clean stop but never
    stops at once: the SIGTERM that SLURM sends at the time limit must not cut the checkpoint short."""

    def __init__(self):
        self.requested = False
        self._interrupts = 0
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR2", None)):
            if sig is None:
                continue
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread
                pass
        return self

    def _handle(self, signum, frame):
        self.requested = True
        if signum != getattr(signal, "SIGUSR2", None):
            self._interrupts += 1
            if self._interrupts > 1:  # second SIGTERM / Ctrl-C: stop now
                raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """Within the block, Ctrl-C (SIGINT) and SIGTERM (``kill PID``, a container's stop) call ``handler``
    instead of ending the process, so that a parent can pass the stop on to its children and record it.
    A SIGINT that the process inherited ignored (started in the background by a shell without job control)
    stays ignored. Off the main thread, where Python cannot install handlers, nothing changes."""
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        try:
            old[sig] = signal.signal(sig, handler)
        except ValueError:  # not in the main thread
            break
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
