"""Threads shared by the paczero processes that run on the same cores.

torch gives a process one intra-op thread per core it may use. Two trainings on the same two cores then run
four threads on two cores, and at every parallel region each process waits for a thread that the other one
has descheduled: two quick starts together on a 2-core CPU each ran 3.4x slower than one alone, where
sharing the cores costs 2x. A process that chose no thread count (no ``--threads``, no ``OMP_NUM_THREADS``)
registers in a per-user folder and, before every step and evaluation, takes its cores divided by the number
of registered live processes whose cores overlap its own (at least one thread). A process with a fixed
count registers too, so that the others count it, and keeps its count. A change of the count must not change
a run: SmolLM2-135M's per-example scalars are equal bit for bit at 1 and 2 threads
(tests/test_thread_share.py).

``with ThreadShare(fixed): ... refresh()``; :func:`refresh` refreshes the share of this process, if any, and says
once when the machine is busier than its cores (:mod:`paczero.machine.busy`).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from paczero.machine.busy import BusyWatch
from paczero.machine.hardware import allowed_cores

_ACTIVE: list["ThreadShare"] = []


def default_folder() -> Path:
    """The per-user folder of the registrations (0700 under the temporary directory)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"paczero-{uid}" / "threads"


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return list(range(allowed_cores()))


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/PID/stat, field 22): a PID used again is another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start is None or _start_time(pid) in (None, start)


class ThreadShare:
    """This process's registration; ``fixed``: a thread count chosen by the user (kept), or None (shared)."""

    def __init__(self, fixed: int | None = None, *, folder: Path | None = None, every: float = 2.0):
        self.fixed, self.every = fixed, every
        self.folder = Path(folder) if folder is not None else default_folder()
        self.cores = _cores()
        self.path = self.folder / f"{os.getpid()}.json"
        self._checked = self._watched = float("-inf")
        self.threads = fixed or len(self.cores)
        self.busy = BusyWatch(len(self.cores))

    def __enter__(self) -> "ThreadShare":
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"cores": self.cores, "fixed": self.fixed, "start": _start_time(os.getpid())}))
            os.replace(tmp, self.path)
        except OSError:  # a read-only temporary directory: no sharing, the cores this process is allowed
            self.path = None
        _ACTIVE.append(self)
        self.refresh(force=True)
        return self

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def sharing(self) -> int:
        """The registered live processes whose cores overlap this one's, this one included; stale entries go."""
        if self.path is None:
            return 1
        mine, count = set(self.cores), 1
        for entry in self.folder.glob("*.json"):
            if entry == self.path:
                continue
            try:
                pid, info = int(entry.stem), json.loads(entry.read_text())
            except (OSError, ValueError):
                continue  # being written, or not ours
            if not _alive(pid, info.get("start")):
                entry.unlink(missing_ok=True)
            elif mine & set(info.get("cores", [])):
                count += 1
        return count

    def refresh(self, force: bool = False) -> int:
        """Set torch's threads to this process's share (at most every ``every`` seconds); returns the count."""
        now = time.monotonic()
        if self.fixed or (not force and now - self._checked < self.every):
            return self.threads
        self._checked = now
        self.threads = max(1, len(self.cores) // self.sharing())
        import torch

        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return self.threads

    def watch(self) -> None:
        """Say once if the machine is busy or these cores shared (:class:`BusyWatch`); at most every ``every``
        seconds."""
        now = time.monotonic()
        if self.busy.said is None and now - self._watched >= self.every:
            self._watched = now
            self.busy.check(self.threads, self.sharing())


def refresh() -> None:
    """Refresh the thread share of this process's innermost registration, and say once if the machine is busy
    (no registration: nothing)."""
    if _ACTIVE:
        _ACTIVE[-1].refresh()
        _ACTIVE[-1].watch()
