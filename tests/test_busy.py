"""A slow step says why: one line when the machine is busier than paczero's cores (paczero/machine/busy.py).

The load reading is simulated (monkeypatched), so these tests do not depend on the machine they run on."""
from __future__ import annotations

import json
import os

import pytest
import torch

from paczero.machine import busy, thread_share
from paczero.machine.thread_share import ThreadShare


@pytest.fixture
def two_cores(monkeypatch):
    """A 2-core machine whose load average the test sets (``load[0]``)."""
    load = [0.5]
    monkeypatch.setenv(busy.BUSY_LINE_ENV, "1")  # the suite turns the line off elsewhere (tests/conftest.py)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(busy, "load_average", lambda: load[0])
    before = torch.get_num_threads()
    yield load
    torch.set_num_threads(before)


def _said(err: str) -> list[str]:
    return [line for line in err.splitlines() if "machine busy" in line]


def test_a_busy_machine_is_said_once_with_its_load_and_a_quiet_one_never(two_cores, tmp_path, capsys):
    """Before every step the run's thread share looks at the load: at 0.5 and at 2.9 on 2 cores (paczero's own
    2 threads and less than one more) nothing is said; at 3.9 one line with the load and the cores; at 3.9
    and 5.0 again nothing more. Red if the line is said at every step (not once), at a load under the
    cores plus one thread, or not at all."""
    with ThreadShare(2, folder=tmp_path, every=0):
        for load in (0.5, 2.9, 0.5):
            two_cores[0] = load
            thread_share.refresh()
        assert _said(capsys.readouterr().err) == []
        for load in (3.9, 3.9, 5.0, 3.9):
            two_cores[0] = load
            thread_share.refresh()
    assert _said(capsys.readouterr().err) == [
        "paczero: machine busy: load 3.9 on 2 cores (paczero runs 2 threads here); step times include the other "
        "processes' work"]


def test_other_paczero_processes_on_the_cores_are_said_too(two_cores, tmp_path, capsys, monkeypatch):
    """A quiet load but another paczero process on these cores (the thread share counts it): said once, with
    the count. A core set that is part of a larger machine compares the load with the machine's cores: load
    3.9 on a 64-core machine is not busy. Red if the share's count is ignored, or a 2-core set on a 64-core
    machine is called busy at load 3.9."""
    with ThreadShare(folder=tmp_path, every=0) as share:
        monkeypatch.setattr(share, "sharing", lambda: 2)
        thread_share.refresh()
    assert _said(capsys.readouterr().err) == [
        "paczero: machine busy: load 0.5 on 2 cores (paczero runs 1 thread here, 1 other paczero process on these "
        "cores); step times include the other processes' work"]  # the share gave it 1 of the 2 cores
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    two_cores[0] = 3.9
    with ThreadShare(folder=tmp_path, every=0):
        thread_share.refresh()
    assert _said(capsys.readouterr().err) == []


def test_a_training_on_a_busy_machine_says_so_once_and_logs_its_measured_step_times(two_cores, tmp_path, capsys,
                                                                                    monkeypatch):
    """``paczero train`` on a simulated busy machine (load 3.9 on 2 cores): one line on stderr, its step records
    as on a quiet machine (the same keys, each step's measured seconds, none rescaled or dropped). Red if the
    loop never looks at the load, says it at every step, or alters the records."""
    from paczero.cli import main

    monkeypatch.setattr(thread_share, "default_folder", lambda: tmp_path / "threads")  # no other paczero counted
    two_cores[0] = 3.9
    flags = ["train", "--model", "tiny-llama", "--task", "demo", "--n-train", "16", "--n-dev", "4", "--n-test", "4",
             "--steps", "3", "--num-subsets", "4", "--no-progress", "--no-eval-zero-shot", "--threads", "1"]
    assert main(flags + ["--out-dir", str(tmp_path / "busy")]) == 0
    said = _said(capsys.readouterr().err)
    assert said == ["paczero: machine busy: load 3.9 on 2 cores (paczero runs 1 thread here); step times include "
                    "the other processes' work"]
    two_cores[0] = 0.5
    assert main(flags + ["--out-dir", str(tmp_path / "quiet")]) == 0
    assert _said(capsys.readouterr().err) == []
    records = {name: [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
               for name in ("busy", "quiet")}
    assert [sorted(r) for r in records["busy"]] == [sorted(r) for r in records["quiet"]]
    assert len(records["busy"]) == 3 and all(0 < r["seconds"] < 60 for r in records["busy"])


def test_the_line_is_off_where_the_environment_says_so(two_cores, monkeypatch):
    """PACZERO_BUSY_LINE=0 silences the line however busy the machine (the test suite's setting, so that no
    expected output depends on the load). Red if the variable is not read."""
    monkeypatch.setenv(busy.BUSY_LINE_ENV, "0")
    two_cores[0] = 9.0
    assert busy.BusyWatch(2).check(threads=2) is None
