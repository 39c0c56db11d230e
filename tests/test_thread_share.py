"""Threads shared by paczero processes on the same cores (paczero/machine/thread_share.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from paczero.machine import thread_share
from paczero.machine.thread_share import ThreadShare

FOUR = {0, 1, 2, 3}


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(FOUR), raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _other(folder, cores, fixed=None):
    """A live process registered in ``folder`` the way a paczero run registers (it sleeps until killed)."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from paczero.machine import thread_share
        thread_share._cores = lambda: {sorted(cores)!r}
        with thread_share.ThreadShare({fixed!r}, folder=Path({str(folder)!r})):
            print("registered", flush=True)
            time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "registered"
    return p


def test_runs_on_the_same_cores_divide_them_and_take_them_back(tmp_path, four_cores):
    """Alone on 4 cores: 4 threads; with another registered live process on overlapping cores: 2; with two: 1
    (4 // 3); a process on other cores does not count; when the others end, the share returns to 4 and their
    entries are removed. Red if the count ignored the others (always 4), counted a process on disjoint cores,
    or kept a dead process's entry."""
    with ThreadShare(folder=tmp_path, every=0) as share:
        assert share.refresh() == 4 and torch.get_num_threads() == 4
        a = _other(tmp_path, {2, 3, 4, 5})
        assert share.refresh() == 2 and torch.get_num_threads() == 2
        b = _other(tmp_path, {0})
        far = _other(tmp_path, {8, 9})
        assert share.refresh() == 1 and torch.get_num_threads() == 1
        for p in (a, b, far):
            p.kill()
            p.wait()
        assert share.refresh() == 4 and torch.get_num_threads() == 4
        assert [e.name for e in tmp_path.glob("*.json")] == [f"{os.getpid()}.json"]
    assert list(tmp_path.glob("*.json")) == []


def test_a_fixed_count_is_kept_and_counted(tmp_path, four_cores):
    """A process given --threads 3 keeps 3 whatever else runs, and the shared one beside it counts it (4 // 2).
    Red if a fixed count were changed, or a fixed process not registered."""
    other = _other(tmp_path, FOUR, fixed=3)
    try:
        with ThreadShare(3, folder=tmp_path, every=0) as fixed:
            assert fixed.refresh() == 3
        with ThreadShare(folder=tmp_path, every=0) as shared:
            assert shared.refresh() == 2
    finally:
        other.kill()
        other.wait()


def test_an_entry_of_a_reused_pid_is_stale(tmp_path, four_cores):
    """An entry whose PID is alive but whose start time is another process's is not counted. Red if PIDs alone
    decided (a PID reused by an unrelated process would halve the threads for good)."""
    if thread_share._start_time(os.getppid()) is None:
        pytest.skip("no /proc here: start times unknown")
    (tmp_path / f"{os.getppid()}.json").write_text(json.dumps({"cores": sorted(FOUR), "fixed": None,
                                                                "start": "1"}))
    with ThreadShare(folder=tmp_path, every=0) as share:
        assert share.refresh() == 4


def test_a_training_run_registers_and_refreshes_its_share(tmp_path, four_cores, monkeypatch):
    """train() with no thread count runs on its share: alone on 4 cores its first step runs at 4 threads; a
    process that registers on the same cores during that step makes the next step run at 2 (read inside each
    step); the run's entry is gone afterwards. Red if train() did not register, or did not refresh its share
    before each step."""
    from paczero.config import TrainConfig
    from paczero.train import train
    import paczero.zo as zo

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(thread_share, "default_folder", lambda: tmp_path)
    seen, others = [], []
    real = zo.zo_step

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        if not others:
            assert (tmp_path / f"{os.getpid()}.json").exists()
            thread_share._ACTIVE[-1].every = 0  # no 2-second wait before the next look
            others.append(_other(tmp_path, FOUR))
        return real(*a, **k)

    monkeypatch.setattr(zo, "zo_step", spy)
    try:
        cfg = TrainConfig(model="tiny-llama", task="demo", n_train=8, n_dev=4, n_test=4, num_subsets=2, steps=2,
                          eval_every=2, dtype="fp32", progress=False, eval_zero_shot=False,
                          out_dir=str(tmp_path / "run"))
        train(cfg, log=lambda *a: None)
    finally:
        for p in others:
            p.kill()
            p.wait()
    assert seen == [4, 2]
    assert not (tmp_path / f"{os.getpid()}.json").exists()


@pytest.mark.slow  # loads SmolLM2-135M: about half a minute on 2 cores
def test_the_thread_count_does_not_change_the_scalars(tmp_path):
    """What the share may change mid-run must not change a run: SmolLM2-135M's per-example scalars of the quick
    start (fp32) along one direction are equal bit for bit at 1 and at 2 threads. Red if a kernel split a sum
    between threads (its last bits would follow the count)."""
    import numpy as np

    from paczero.cli import main
    from paczero.experiments.regime import read_scalars

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: no second thread count to compare")
    if not _forward_is_thread_invariant():
        pytest.skip("this CPU's kernels split a forward's sums by the thread count (the base model's losses differ "
                    "at 1 and 2 threads before any perturbation): no bit-for-bit comparison to make here")
    out = {}
    for threads in (1, 2):
        assert main(["regime", str(tmp_path / str(threads)), "--recipe", "quickstart/smollm2-demo-zpl-lora",
                     "--dtype", "fp32", "--n-train", "32", "--directions", "1", "--threads", str(threads),
                     "--n-grid", "32", "--m-grid", "8"]) == 0
        out[threads] = read_scalars(tmp_path / str(threads))[0]
    assert out[1].shape == (1, 32) and np.array_equal(out[1], out[2])


def _forward_is_thread_invariant() -> bool:
    """Whether torch's kernels on this CPU give SmolLM2-135M's fp32 per-example losses of the quick start's
    prompt bit for bit at 1 and at 2 threads, before any perturbation (the base model's forward and the task's
    loss, no direction drawn): on some CPU kinds (an Intel Xeon with AMX) they do not, and then no run is,
    whatever the share does."""
    from paczero.models import load_model, load_tokenizer
    from paczero.tasks import build_task, load_splits

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct", dtype="fp32", device="cpu", track="lora").model
    task = build_task("demo", tokenizer, template="Review: {sentence}\nSentiment:",
                      verbalizer={0: " negative", 1: " positive"})
    train, _, _ = load_splits("demo", n_train=32, n_dev=0, n_test=0)
    batches = task.make_batches(task.encode(train), token_budget=2048)
    before, losses = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                losses.append(torch.cat([task.losses(model, batch) for batch in batches]))
    finally:
        torch.set_num_threads(before)
    return torch.equal(losses[0], losses[1])


def test_a_regime_map_takes_its_share(tmp_path, four_cores, monkeypatch):
    """`paczero regime` computes its directions on its share of the cores: with another registered process on
    the same 4 cores, each direction runs at 2 threads, and its entry is gone afterwards. Red if the map's
    forwards ran on all the cores beside a training."""
    import paczero.zo as zo
    from paczero.cli import main

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(thread_share, "default_folder", lambda: tmp_path)
    seen = []
    real = zo.two_point_scalars

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return real(*a, **k)

    monkeypatch.setattr(zo, "two_point_scalars", spy)
    other = _other(tmp_path, FOUR)
    try:
        assert main(["regime", str(tmp_path / "map"), "--model", "tiny-llama", "--task", "demo", "--dtype", "fp32",
                     "--n-train", "8", "--directions", "2", "--n-grid", "8", "--m-grid", "2"]) == 0
    finally:
        other.kill()
        other.wait()
    assert seen == [2, 2]
    assert not (tmp_path / f"{os.getpid()}.json").exists()
