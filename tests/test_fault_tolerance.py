"""Kill, stop, corrupt and mismatch: a resumed run ends exactly where an uninterrupted one does.

One uninterrupted reference run (in-process) against one run that is stopped
with SIGTERM, SIGKILLed while writing a checkpoint, SIGKILLed mid-step (after
the mechanism has consumed private randomness and charged MI, before anything
is saved) and SIGKILLed at a random moment, resuming each time with
``--resume``. The training subprocesses are ``paczero.cli.main`` behind a tiny
wrapper that installs the kill point (no test hook in the library).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from paczero.cli import main
from paczero.config import TrainConfig
from paczero.train import train

REPO = Path(__file__).resolve().parents[1]
STEPS = 10
CFG = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=STEPS, num_subsets=8,
           mechanism="pac-mi", mi_budget=0.5, eval_every=5, checkpoint_every=2, private_seed=7,
           progress=False, eval_zero_shot=False)

WRAPPER = r'''
import os, signal, sys
import paczero.checkpoint as ck
import paczero.train as tr
from paczero.cli import main

mode, at = os.environ.get("FT_MODE", ""), int(os.environ.get("FT_AT", "-1"))
if mode == "kill_in_checkpoint":   # SIGKILL after private.json of checkpoint `at` is written, before its rename
    _write = ck.write_json
    def write_json(path, obj, *, private=False):
        _write(path, obj, private=private)
        if path.name == "private.json" and path.parent.name.startswith(".tmp-step-%06d" % at):
            os.kill(os.getpid(), signal.SIGKILL)
    ck.write_json = write_json
elif mode in ("kill_mid_step", "term_mid_step", "slurm_mid_step"):   # lr_at runs after mechanism.step,
    _lr = tr.lr_at                                                      # before the update
    def lr_at(cfg, step):
        if step == at and mode == "slurm_mid_step":  # SLURM's warning, then its time limit's SIGTERM
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGTERM)
        elif step == at:
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill_mid_step" else signal.SIGTERM)
        return _lr(cfg, step)
    tr.lr_at = lr_at
sys.exit(main(sys.argv[1:]))
'''


def _flags(out: Path, **extra) -> list[str]:
    values = {**CFG, **extra}
    args = ["train", "--out-dir", str(out)]
    for k, v in values.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            args.append(flag if v else "--no-" + k.replace("_", "-"))
        else:
            args += [flag, str(v)]
    return args


@pytest.fixture(scope="module")
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-identical to the OMP_NUM_THREADS=1 subprocesses
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("ft") / "reference"
    train(TrainConfig(out_dir=str(out), **CFG), log=lambda *a: None)
    return out


def _transcript(run: Path) -> list[dict]:
    """The step records minus the timing field. ``train_loss`` (a float32 diagnostic, not part of
    the release) is rounded: MKL's fp32 kernels may sum in another order in another process
    (alignment-dependent code paths), which moves it by an ulp; every released value
    (bit, coef, y_tilde, sigma, MI) and the weights must match bit for bit."""
    recs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    for r in recs:
        r.pop("seconds")
        r["train_loss"] = float(f"{r['train_loss']:.5g}")
    return recs


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _assert_same_run(run: Path, ref: Path) -> None:
    assert _transcript(run) == _transcript(ref)
    assert [len(_transcript(run))] == [STEPS]
    a, b = json.loads((run / "summary.json").read_text()), json.loads((ref / "summary.json").read_text())
    assert a["privacy"]["mi_spent"] == b["privacy"]["mi_spent"]
    assert a["privacy"]["steps"] == STEPS and a["privacy"]["mi_spent"] <= CFG["mi_budget"]
    assert a["test"] == b["test"] and a["selected_step"] == b["selected_step"]
    assert (run / "evals.jsonl").read_text() == (ref / "evals.jsonl").read_text()
    for name in ("selected.safetensors", f"checkpoints/step-{STEPS:06d}/weights.safetensors"):
        wa, wb = _weights(run / name), _weights(ref / name)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _spawn(tmp: Path, out: Path, mode: str = "", at: int = -1, resume: bool = False) -> subprocess.Popen:
    wrapper = tmp / "wrapper.py"
    wrapper.write_text(WRAPPER)
    env = {**os.environ, "FT_MODE": mode, "FT_AT": str(at), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, str(wrapper)] + _flags(out) + (["--resume"] if resume else [])
    return subprocess.Popen(args, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _steps_logged(out: Path) -> int:
    try:
        return sum(1 for line in (out / "log.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        return 0


def test_kill_and_resume_matches_uninterrupted_run(reference, tmp_path, capsys):
    out = tmp_path / "run"
    # 1. SIGTERM mid-step 2: the step finishes, a checkpoint of step 3 is written, exit code 130
    p = _spawn(tmp_path, out, "term_mid_step", 2)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-2000:]
    assert "stopped at step 3" in stdout and (out / "checkpoints" / "step-000003").is_dir()
    # 2. SIGKILL while checkpoint 6 is being written: the half-written folder is never used
    p = _spawn(tmp_path, out, "kill_in_checkpoint", 6, resume=True)
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert not (out / "checkpoints" / "step-000006").exists()
    assert any(d.name.startswith(".tmp-step-000006") for d in (out / "checkpoints").iterdir())
    # 3. SIGKILL mid-step 7: MI charged in memory for step 7 must not be counted on resume
    p = _spawn(tmp_path, out, "kill_mid_step", 7, resume=True)
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL and _steps_logged(out) == 7
    # 4. SIGKILL at a random moment after training restarts (it may also finish first: fine)
    rng = random.Random()
    p = _spawn(tmp_path, out, resume=True)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline and _steps_logged(out) <= 7:
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.3))
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.communicate(timeout=120)
    # 5. the last resume, in-process, finishes the run
    assert main(_flags(out) + ["--resume"]) == 0
    _assert_same_run(out, reference)


def test_slurm_warning_then_time_limit_mid_step_checkpoints_and_resumes(reference, tmp_path):
    """SLURM warns of a job's time limit or preemption with SIGUSR2 (submitit asks for it) and sends
    SIGTERM at the limit. Both mid-step 4: the step finishes and is checkpointed (the SIGTERM does not
    count as a second Ctrl-C), exit code 130; the resume ends where the uninterrupted run does.
    Before, SIGUSR2 killed the run without a checkpoint."""
    out = tmp_path / "run"
    p = _spawn(tmp_path, out, "slurm_mid_step", 4)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-2000:]
    assert "stopped at step 5" in stdout and (out / "checkpoints" / "step-000005").is_dir()
    assert main(_flags(out) + ["--resume"]) == 0
    _assert_same_run(out, reference)


def test_corrupted_newest_checkpoint_falls_back(reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    newest = out / "checkpoints" / f"step-{STEPS:06d}"
    data = (newest / "weights.safetensors").read_bytes()
    (newest / "weights.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with open(out / "log.jsonl", "a") as f:
        f.write('{"step": 99, "torn')  # a torn last line, as a crash leaves it
    for name in ("summary.json", "selected.safetensors"):
        (out / name).unlink()
    assert main(_flags(out) + ["--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"checkpoint step-{STEPS:06d}: weights.safetensors is corrupted" in printed
    assert f"resuming from step {STEPS - 2}" in printed
    _assert_same_run(out, reference)


def test_corrupted_manifest_falls_back(reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "checkpoints" / f"step-{STEPS:06d}" / "manifest.json").write_text("{not json")
    assert main(_flags(out) + ["--resume"]) == 0
    printed = capsys.readouterr().out
    assert "unreadable manifest" in printed and f"resuming from step {STEPS - 2}" in printed
    assert "directions now come from" not in printed  # the same generator: no warning
    _assert_same_run(out, reference)


def test_resume_with_another_generator_of_z_says_so(reference, tmp_path, capsys, monkeypatch):
    """run.json records which generator defines z; a resume whose z comes from another one (no C compiler
    there, or PACZERO_TORCH_DIRECTIONS=1) finishes the run but warns that its later steps follow other
    directions."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:06d}")
    saved = json.loads((out / "run.json").read_text())["directions"]
    assert "philox" in saved
    monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    assert main(_flags(out) + ["--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"resuming from step {STEPS - 2}" in printed
    assert f"warning: the directions now come from torch generator per chunk (cpu) ({saved} in the original run)" \
        in printed
    assert _transcript(out)[:STEPS - 2] == _transcript(reference)[:STEPS - 2]
    assert json.loads((out / "run.json").read_text())["directions"] == saved  # the original run's record


def test_resume_of_a_run_that_predates_the_record_of_its_directions_says_so(reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:06d}")
    meta = json.loads((out / "run.json").read_text())
    del meta["directions"]
    (out / "run.json").write_text(json.dumps(meta))
    assert main(_flags(out) + ["--resume"]) == 0
    assert "run.json does not record the original run's directions" in capsys.readouterr().out


@pytest.mark.parametrize("change, word", [
    ({"mi_budget": 0.6}, "mi_budget"),
    ({"num_subsets": 4}, "num_subsets"),
    ({"mechanism": "hybrid", "switch_step": 5}, "mechanism"),
    ({"private_seed": "none"}, "private_seed"),
    ({"n_train": 12}, "n_train"),
    ({"data": "DATAFILE"}, "data"),
])
def test_mismatched_resume_is_refused(reference, tmp_path, capsys, change, word):
    if change.get("data") == "DATAFILE":
        src = REPO / "paczero" / "data" / "demo_sentiment.jsonl"
        (tmp_path / "other.jsonl").write_text(src.read_text())
        change = {"data": str(tmp_path / "other.jsonl"), "columns": '{"sentence": "text"}'}
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    before = (out / "log.jsonl").read_text()
    assert main(_flags(out, **change) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("paczero: error: cannot resume") and word in err
    assert (out / "log.jsonl").read_text() == before


def test_resume_with_other_data_under_the_same_settings_is_refused(reference, tmp_path, capsys):
    """The examples are compared, not only the flags: data that changed since the original run (the
    file edited in place; here its recorded fingerprint) stop the resume with one line, exit code 2,
    nothing written. Control: the untouched copy resumes."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    before = (out / "log.jsonl").read_text()
    record = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**record, "data_fingerprint": "0" * 64}))
    assert main(_flags(out) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "paczero: error: cannot resume: the data (universe, dev or test examples) differ from the original run"
    assert (out / "log.jsonl").read_text() == before
    (out / "run.json").write_text(json.dumps(record))
    assert main(_flags(out) + ["--resume"]) == 0


def test_a_run_folder_in_use_is_neither_resumed_nor_overwritten(reference, tmp_path, capsys):
    """While another process holds a run folder (here a process holding its lock, as a running
    ``paczero train`` does), ``--resume`` and ``--overwrite`` stop with one line and exit code 2 and
    change no file. Control: once that process is SIGKILLed the lock is gone with it, and the resume
    runs."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from paczero.checkpoint import RunLock; "
                               "lock = RunLock(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(out)],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        files = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".paczero.lock"}
        for extra in (["--resume"], ["--overwrite"]):
            assert main(_flags(out) + extra) == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0, err
            assert err.startswith(f"paczero: error: run folder {str(out)!r} is in use by another paczero process "
                                  f"(pid {holder.pid} on ")
        assert {p: p.read_bytes() for p in sorted(out.rglob("*"))
                if p.is_file() and p.name != ".paczero.lock"} == files
    finally:
        holder.kill()
        holder.wait()
    assert main(_flags(out) + ["--resume"]) == 0
