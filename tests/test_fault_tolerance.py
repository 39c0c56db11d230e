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

from paczero.checkpoint import decode

from paczero.cli import main
from paczero.config import TrainConfig
from paczero.train import train

pytestmark = pytest.mark.slow  # training subprocesses killed and resumed

REPO = Path(__file__).resolve().parents[1]
STEPS = 10
CFG = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=STEPS, num_subsets=8,
           mechanism="pac-mi", mi_budget=0.5, eval_every=5, checkpoint_every=2, private_seed=7,
           progress=False, eval_zero_shot=False, threads=1)  # one thread: float32 sums in one order in every process

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
elif mode == "kill_after_log":   # SIGKILL once step `at`'s record is in log.jsonl (and its checkpoint, if due)
    from killpoints import kill_after_logged_step
    kill_after_logged_step(at)
elif mode == "kill_after_journal":   # SIGKILL once step `at` is journaled, before its record reaches log.jsonl
    import paczero.run.journal as jn
    _step = jn.Journal.step
    def step(self, record, state):
        _step(self, record, state)
        if record["step"] == at:
            os.kill(os.getpid(), signal.SIGKILL)
    jn.Journal.step = step
if os.environ.get("FT_TRACE"):   # each draw of a first-order step, one line a draw
    from killpoints import trace_draws
    trace_draws(os.environ["FT_TRACE"])
sys.exit(main(sys.argv[1:]))
'''


def _flags(out: Path, **extra) -> list[str]:
    values = {**CFG, **extra}
    args = ["train", "--out-dir", str(out)]
    for k, v in values.items():
        flag = "--" + k.replace("_", "-")
        if v is None:
            continue
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
        if r["train_loss"] is not None:
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


def _spawn(tmp: Path, out: Path, mode: str = "", at: int = -1, resume: bool = False, trace: Path | None = None,
           **extra) -> subprocess.Popen:
    wrapper = tmp / "wrapper.py"
    wrapper.write_text(WRAPPER)
    env = {**os.environ, "FT_MODE": mode, "FT_AT": str(at), "OMP_NUM_THREADS": "1", "FT_TRACE": str(trace or ""),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, str(wrapper)] + _flags(out, **extra) + (["--resume"] if resume else [])
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
    Red if SIGUSR2 kills the run without a checkpoint."""
    out = tmp_path / "run"
    p = _spawn(tmp_path, out, "slurm_mid_step", 4)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-2000:]
    assert "stopped at step 5" in stdout and (out / "checkpoints" / "step-000005").is_dir()
    assert main(_flags(out) + ["--resume"]) == 0
    _assert_same_run(out, reference)


def test_a_stopped_run_resumes_with_out_dir_and_resume_alone(reference, tmp_path, capsys):
    """`paczero train --out-dir RUN --resume`, no other flag, takes the run's settings from its run.json and
    ends where the uninterrupted run does; a flag given alongside that differs from the run's is refused as
    before (one line naming it), and one that agrees is accepted (--print-config shows the run's settings). Red if the resume reads its settings from
    the defaults (a dozen settings differ: refused) or lets a differing flag through."""
    out = tmp_path / "run"
    p = _spawn(tmp_path, out, "term_mid_step", 4)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-2000:]
    capsys.readouterr()
    assert main(["train", "--out-dir", str(out), "--resume", "--lr", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("paczero: error: cannot resume: lr differs") and "\n" not in err, err
    assert main(["train", "--out-dir", str(out), "--resume", "--steps", str(STEPS), "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["lr"] == TrainConfig(**CFG).lr  # an agreeing flag: accepted
    assert main(["train", "--out-dir", str(out), "--resume"]) == 0
    _assert_same_run(out, reference)


def test_a_finished_zpl_run_extended_with_more_steps_is_the_run_planned_that_long(tmp_path, capsys, one_thread):
    """A finished PAC-ZPL run of 4 steps, continued with `--resume --steps 8` (no other flag), ends where a
    run of 8 steps from the start does: transcript, evaluations, summary and weights; run.json records the
    new length (a later `--resume` alone goes to it). The same for PAC-MI, whose MI budget is spread over the
    planned steps, is refused in one line. Red if the extension is refused, if it does not continue the
    journal's private state (another transcript), or if it is allowed where the releases depend on T."""
    cfg = dict(CFG, mechanism="pac-zpl", mi_budget=None, eval_every=2)
    straight, short = tmp_path / "straight", tmp_path / "short"
    train(TrainConfig(out_dir=str(straight), **dict(cfg, steps=8)), log=lambda *a: None)
    train(TrainConfig(out_dir=str(short), **dict(cfg, steps=4)), log=lambda *a: None)
    assert main(["train", "--out-dir", str(short), "--resume", "--steps", "8"]) == 0
    assert "extending the run from 4 to 8 steps" in capsys.readouterr().out
    assert _transcript(short) == _transcript(straight) and len(_transcript(short)) == 8
    assert (short / "evals.jsonl").read_text() == (straight / "evals.jsonl").read_text()
    a, b = json.loads((short / "summary.json").read_text()), json.loads((straight / "summary.json").read_text())
    assert (a["test"], a["selected_step"], a["privacy"]["steps"]) == (b["test"], b["selected_step"], 8)
    wa, wb = _weights(short / "selected.safetensors"), _weights(straight / "selected.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    run = json.loads((short / "run.json").read_text())
    assert run["config"]["steps"] == 8 and run["extended_from"] == [4]

    mi = tmp_path / "mi"
    train(TrainConfig(out_dir=str(mi), **dict(CFG, steps=2)), log=lambda *a: None)
    capsys.readouterr()  # that run's own lines
    assert main(["train", "--out-dir", str(mi), "--resume", "--steps", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("paczero: error: cannot resume: steps differs") and "MI budget" in err and "\n" not in err


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
    printed = capsys.readouterr()
    assert f"paczero: warning: checkpoint step-{STEPS:06d}: weights.safetensors is corrupted" in printed.err
    assert f"resuming from step {STEPS} (weights of step {STEPS - 2}, 2 logged steps replayed)" in printed.out
    _assert_same_run(out, reference)


def test_corrupted_manifest_falls_back(reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "checkpoints" / f"step-{STEPS:06d}" / "manifest.json").write_text("{not json")
    assert main(_flags(out) + ["--resume"]) == 0
    printed = capsys.readouterr()
    assert "unreadable manifest" in printed.err and f"resuming from step {STEPS} (weights of step {STEPS - 2}" in printed.out
    assert "directions now come from" not in printed.err  # the same generator: no warning
    _assert_same_run(out, reference)


#: what run.json records for a run whose z came from another generator (here: the CPU kernel of paczero 0.1)
OTHER_DIRECTIONS = "philox4x32-10 box-muller, float32 series (paczero.cpu_directions)"


def _record_other_directions(run: Path) -> str:
    """Make run.json say the run drew z from another generator; returns what it recorded before."""
    meta = json.loads((run / "run.json").read_text())
    was, meta["directions"] = meta["directions"], OTHER_DIRECTIONS
    (run / "run.json").write_text(json.dumps(meta))
    return was


def test_resume_with_another_generator_of_z_says_so(reference, tmp_path, capsys):
    """run.json records which generator defines z. A resume that must replay logged steps (here 9 and 10,
    after the checkpoint of step 8) along another generator than the run's (a run of paczero 0.1 drew z
    on CPU from a compiled kernel; on CUDA, Triton's kernels or torch's generator) is refused with one
    line, exit code 2, nothing written: the published coefficients would move the weights along other
    directions. Where nothing needs replaying (a run stopped at its checkpoint) the resume goes on with
    a warning that its later steps follow other directions. Red if the refusal is dropped (the first
    resume then succeeds)."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:06d}")
    now = _record_other_directions(out)
    assert now == "torch generator per chunk (cpu)"
    files = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".paczero.lock"}
    assert main(_flags(out) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err == (
        f"paczero: error: cannot resume: steps {STEPS - 1}..{STEPS} must be replayed along the original run's "
        f"directions ({OTHER_DIRECTIONS}), and this process draws z from {now}")
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".paczero.lock"} == files

    stopped = tmp_path / "stopped"
    p = _spawn(tmp_path, stopped, "term_mid_step", 2)
    assert p.communicate(timeout=120) and p.returncode == 130
    _record_other_directions(stopped)
    assert main(_flags(stopped) + ["--resume"]) == 0
    printed = capsys.readouterr()
    assert "resuming from step 3\n" in printed.out
    assert f"paczero: warning: the directions now come from {now} ({OTHER_DIRECTIONS} in the original run)" \
        in printed.err
    assert _transcript(stopped) == _transcript(reference)  # the same generator here, so the same run
    assert json.loads((stopped / "run.json").read_text())["directions"] == OTHER_DIRECTIONS  # the original record


def test_resume_of_a_run_that_predates_the_record_of_its_directions_says_so(reference, tmp_path, capsys):
    """A run written before run.json recorded its directions has no private journal either: it resumes from
    a checkpoint at its last logged step, with a warning about the directions."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "private" / "journal.jsonl").unlink()
    (out / "summary.json").unlink()
    meta = json.loads((out / "run.json").read_text())
    del meta["directions"]
    (out / "run.json").write_text(json.dumps(meta))
    assert main(_flags(out) + ["--resume"]) == 0
    assert "paczero: warning: run.json does not record the original run's directions" in capsys.readouterr().err


def test_a_run_without_journal_is_not_continued_past_its_logged_steps(reference, tmp_path, capsys):
    """Without a private journal (runs of paczero 0.1) the private state after logged steps 9 and 10 is
    unknown (the checkpoint is of step 8): continuing would execute them again with the same private
    noise. Refused with one line, exit code 2, nothing written. Red if the resume falls back to
    re-running from the checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "private" / "journal.jsonl").unlink()
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:06d}")
    before = (out / "log.jsonl").read_text()
    assert main(_flags(out) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(
        f"paczero: error: cannot resume: log.jsonl holds steps up to {STEPS} but the newest checkpoint is step "
        f"{STEPS - 2}")
    assert (out / "log.jsonl").read_text() == before


@pytest.mark.parametrize("change, word", [
    ({"mi_budget": 0.6}, "mi_budget"),
    ({"num_subsets": 4}, "num_subsets"),
    ({"mechanism": "hybrid", "switch_step": 5}, "mechanism"),
    ({"private_seed": "none"}, "private_seed"),
    ({"n_train": 12}, "n_train"),
    ({"data": "DATAFILE"}, "data"),
    ({"token_budget": 2048}, "token_budget 4096 there, 2048 now"),
    ({"eval_every": 3}, "eval_every 5 there, 3 now"),
    ({"max_length": 300}, "max_length"),
    ({"token_budget": 2048, "lr": 0.01, "seed": 1}, "lr, token_budget, seed differ from the original run"),
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


#: every mechanism with a private state, as flags on top of CFG
MECHANISMS = {
    "pac-mi": {},
    "pac-zpl": {"mechanism": "pac-zpl", "mi_budget": None},
    "hybrid": {"mechanism": "hybrid", "switch_step": 5},
    "dpzero": {"mechanism": "dpzero", "mi_budget": None, "epsilon": 2.0, "sample_rate": 0.5},
    "dp-aggzo": {"mechanism": "dp-aggzo", "mi_budget": None, "epsilon": 2.0, "sample_rate": 0.5, "num_directions": 2},
}


def _lines(run: Path) -> list[str]:
    return (run / "log.jsonl").read_text().splitlines()


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_a_logged_step_is_final(mechanism, tmp_path, capsys, one_thread):
    """SIGKILL after step 6 is logged, two steps after the checkpoint of step 4. Every record of the log
    copied at the kill is unchanged in the final log, byte for byte, and the finished run is the
    uninterrupted one (transcript, charge, weights): the resume continued after the last logged step
    from the private state that followed it, and rebuilt the weights by replaying the published
    coefficients. A resume that would replay along another generator of z is refused first, with one
    line, changing nothing. Red if a resume executes logged steps again (their releases then differ
    from the published ones as soon as anything differs, e.g. the generator of z, and the private
    noise repeats), if the private state is taken from the checkpoint instead of the journal (the
    noise of steps 5 and 6 is drawn twice), or if the replay refusal is dropped."""
    extra = {**MECHANISMS[mechanism], "checkpoint_every": 4}
    reference = tmp_path / "reference"
    train(TrainConfig(out_dir=str(reference), **{**CFG, **extra}), log=lambda *a: None)
    out = tmp_path / "run"
    p = _spawn(tmp_path, out, "kill_after_log", 5, **extra)
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL
    work = out / "private" / "stage" if "dp" in mechanism else out  # a DP run publishes at its end only
    assert not (out / "log.jsonl").exists() or work == out
    published = _lines(work)
    assert len(published) == 6 and [c.name for c in (work / "checkpoints").iterdir()] == ["step-000004"]
    assert oct((work / "private" / "journal.jsonl").stat().st_mode & 0o777) == "0o600"

    record = (work / "run.json").read_text()
    _record_other_directions(work)
    assert main(_flags(out, **extra) + ["--resume"]) == 2
    assert "must be replayed along the original run's directions" in capsys.readouterr().err
    assert _lines(work) == published
    (work / "run.json").write_text(record)

    assert main(_flags(out, **extra) + ["--resume"]) == 0
    assert "resuming from step 6 (weights of step 4, 2 logged steps replayed)" in capsys.readouterr().out
    final = _lines(out)
    assert final[:6] == published and [json.loads(r)["step"] for r in final] == list(range(STEPS))
    assert _transcript(out) == _transcript(reference)
    a, b = json.loads((out / "summary.json").read_text()), json.loads((reference / "summary.json").read_text())
    assert a["privacy"] == b["privacy"] and a["test"] == b["test"]
    assert (out / "evals.jsonl").read_text() == (reference / "evals.jsonl").read_text()
    wa, wb = _weights(out / "selected.safetensors"), _weights(reference / "selected.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_journaled_step_missing_from_the_log_is_published_from_the_journal(reference, tmp_path, capsys):
    """SIGKILL between the journal's line of step 5 and its log record: the resume writes step 5's record
    from the journal (it may have been seen: a torn line counts as published) and goes on from step 6;
    the run ends as the uninterrupted one. Red if step 5 is executed again instead."""
    out = tmp_path / "run"
    p = _spawn(tmp_path, out, "kill_after_journal", 5)
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL and len(_lines(out)) == 5
    with open(out / "log.jsonl", "a") as f:
        f.write('{"step": 5, "bra')  # a torn write of step 5's record
    assert main(_flags(out) + ["--resume"]) == 0
    assert "resuming from step 6 (weights of step 4, 2 logged steps replayed)" in capsys.readouterr().out
    _assert_same_run(out, reference)


def test_a_log_that_differs_from_the_journal_is_refused(reference, tmp_path, capsys):
    """A logged record that the private journal does not hold as it is (an edited log) stops the resume
    with one line and exit code 2; nothing is written."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "summary.json").unlink()
    lines = _lines(out)
    record = json.loads(lines[3])
    record["bit"] = -record["bit"]
    lines[3] = json.dumps(record)
    (out / "log.jsonl").write_text("\n".join(lines) + "\n")
    before = (out / "log.jsonl").read_text()
    assert main(_flags(out) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "paczero: error: cannot resume: log.jsonl step 3 differs from the run's private journal"
    assert (out / "log.jsonl").read_text() == before


def test_a_resume_may_change_where_and_how_fast_it_runs(reference, tmp_path, capsys):
    """The keys of RESUME_FREE (here checkpoint_every, progress, eval_zero_shot, device) may differ on a
    resume, and it ends where the uninterrupted run does. Control of test_mismatched_resume_is_refused."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:06d}")
    (out / "summary.json").unlink()
    assert main(_flags(out, checkpoint_every=3, progress=True, eval_zero_shot=True, device="cpu") + ["--resume"]) == 0
    _assert_same_run(out, reference)


def _files(run: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".paczero.lock"}


def test_a_run_none_of_whose_checkpoints_verifies_is_not_resumed_in_silence(reference, tmp_path, capsys):
    """Both checkpoints damaged: the resume stops with one line naming the run folder and what to do, exit
    code 2, nothing written (red if the resume passes over them, rebuilding from step 0 unasked). Doing what
    the line says (moving checkpoints/ aside) replays every logged step from the journal and ends where the
    uninterrupted run does, with the same secret. A run without a journal is told to start anew."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "summary.json").unlink()
    for ckpt in (out / "checkpoints").iterdir():
        (ckpt / "private.json").write_text("{}")
    files = _files(out)
    assert main(_flags(out) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"paczero: error: cannot resume '{out}': none of its 2 checkpoints verifies (see the warnings above); "
        "restore its checkpoints/ folder from a backup, or move checkpoints/ out of the run folder and --resume "
        "again to rebuild the weights from the base model by replaying its logged steps")
    assert all(line.startswith("paczero: warning: checkpoint step-") for line in err[:-1]) and len(err) == 3
    assert _files(out) == files
    secret = decode(json.loads((out / "private" / "journal.jsonl").read_text().splitlines()[0]))["mechanism"]["secret"]
    shutil.move(out / "checkpoints", tmp_path / "damaged")
    assert main(_flags(out) + ["--resume"]) == 0
    assert f"resuming from step {STEPS} (weights of step 0, {STEPS} logged steps replayed)" in capsys.readouterr().out
    _assert_same_run(out, reference)
    assert decode(json.loads((out / "private" / "journal.jsonl").read_text().splitlines()[0]))["mechanism"]["secret"] == secret

    old = tmp_path / "old"
    shutil.copytree(reference, old)
    (old / "private" / "journal.jsonl").unlink()
    for ckpt in (old / "checkpoints").iterdir():
        (ckpt / "manifest.json").unlink()
    assert main(_flags(old) + ["--resume"]) == 2
    assert "start a new run in another folder" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_full_disk_while_checkpointing_is_one_line_and_the_run_resumes(reference, tmp_path, capsys, monkeypatch):
    """The disk fills while the checkpoint of step 4 is written: one line naming the error and the way on
    (free space, --resume), exit code 2, no half-written checkpoint left; the earlier checkpoint and every
    logged step are kept, and the resume ends where the uninterrupted run does. Red if the OSError comes out
    as a traceback or the partial checkpoint is left behind."""
    import errno

    import paczero.checkpoint as ck

    real = ck.write_json

    def full_disk(path, obj, *, private=False):
        if path.name == "private.json" and path.parent.name.startswith(".tmp-step-000004"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, obj, private=private)

    monkeypatch.setattr(ck, "write_json", full_disk)
    out = tmp_path / "run"
    assert main(_flags(out)) == 2
    err = "\n".join(line for line in capsys.readouterr().err.strip().splitlines()
                    if not line.startswith("paczero: dtype auto:"))  # the run's line on its dtype, when it loaded
    assert err == (f"paczero: error: cannot write the checkpoint of step 4 in '{out}': No space left on device; free "
                   "some space, then continue the run with --resume (every logged step is kept)")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002"]
    assert _steps_logged(out) == 4
    monkeypatch.setattr(ck, "write_json", real)
    assert main(_flags(out) + ["--resume"]) == 0
    _assert_same_run(out, reference)


@pytest.mark.parametrize("how", ["alone", "config with dtype auto, on a machine that resolves it otherwise"])
def test_a_stopped_dp_run_resumes_with_out_dir_and_resume_alone(tmp_path, capsys, monkeypatch, how):
    """A DP run keeps its run.json in its private stage until it ends; `paczero train --out-dir RUN --resume`
    alone takes the run's settings from there as it does for a PAC run, and a resume from a config file (a
    sweep's) with ``dtype: auto`` keeps the recorded dtype where this machine would resolve auto otherwise;
    the run ends and publishes. Red if either looks for run.json in the folder only (the defaults, or the
    other dtype, then differ from the run's settings: refused)."""
    from paczero.machine import hardware

    out = tmp_path / "dp"
    dp = dict(mechanism="dpzero", mi_budget=None, num_subsets=None, epsilon=2.0, sample_rate=0.5)
    p = _spawn(tmp_path, out, "term_mid_step", 4, **dp)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-2000:]
    assert not (out / "run.json").exists()  # staged: the folder shows nothing of the run yet
    capsys.readouterr()
    if how == "alone":
        argv = ["train", "--out-dir", str(out), "--resume"]
    else:
        recorded = "bf16" if hardware.native_bf16("cpu")[0] else "fp32"
        monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2"} if recorded == "bf16" else {"avx512_bf16"})
        config = tmp_path / "dp.yaml"
        config.write_text(json.dumps({**{k: v for k, v in {**CFG, **dp}.items() if v is not None}, "dtype": "auto"}))
        argv = ["train", "--config", str(config), "--out-dir", str(out), "--resume"]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["mechanism"] == "dpzero" and summary["config"]["steps"] == STEPS
    assert len(_transcript(out)) == STEPS


#: the first-order runs, as flags on top of CFG
FIRST_ORDER = {
    "dp-sgd": {"mechanism": "dp-sgd", "mi_budget": None, "epsilon": 2.0, "sample_rate": 0.5, "dp_clip": 1.0,
               "checkpoint_every": 4},
    "adamw": {"mechanism": "adamw", "mi_budget": None, "batch_size": 4, "checkpoint_every": 4},
}
TIMING = ("seconds", "train_seconds", "seconds_per_step")  # wall-clock figures (adamw's; a DP run has none)
WHERE = ("out_dir", "resume")  # the config's folder and whether this process resumed (RESUME_FREE)


def _journaled(work: Path) -> int:
    """Steps the private journal holds (its first line is the run's starting state)."""
    return len((work / "private" / "journal.jsonl").read_text().splitlines()) - 1


def _without_timing(value):
    if isinstance(value, dict):
        return {k: {c: x for c, x in v.items() if c not in WHERE} if k == "config" and isinstance(v, dict)
                else _without_timing(v) for k, v in value.items() if k not in TIMING}
    return [_without_timing(v) for v in value] if isinstance(value, list) else value


def _public_files(run: Path) -> dict[str, object]:
    """Every file of a finished run outside ``private/`` and ``checkpoints/``, and the final checkpoint's files
    (weights, AdamW's state, public and private part): JSON as parsed less wall-clock figures and the config's
    folder, the rest as bytes.
    (Which earlier checkpoints exist depends on where a resume began: the resume point is checkpointed.)"""
    out = {}
    final = f"checkpoints/step-{STEPS:06d}/"
    for path in sorted(run.rglob("*")):
        name = path.relative_to(run).as_posix()
        if not path.is_file() or name == ".paczero.lock" or name.startswith("private/") or (
                name.startswith("checkpoints/") and (not name.startswith(final) or name.endswith("manifest.json"))):
            continue
        if path.suffix == ".json":
            out[name] = _without_timing(json.loads(path.read_text()))
        elif path.suffix == ".jsonl":
            out[name] = [_without_timing(json.loads(line)) for line in path.read_text().splitlines()]
        else:
            out[name] = path.read_bytes()
    return out


@pytest.mark.parametrize("mechanism", sorted(FIRST_ORDER))
def test_a_first_order_run_killed_anywhere_resumes_to_the_uninterrupted_run(mechanism, tmp_path, monkeypatch,
                                                                          capsys, one_thread):
    """A DP-SGD or adamw run SIGKILLed at four instants, each time resumed with ``--resume``: after step 5 is
    logged (checkpoint 4: steps 4 and 5 are replayed from their kept gradients), after step 7 is journaled and
    before it is logged (it is published from the journal), while the resume's checkpoint of step 8 is written
    (the resume falls back to checkpoint 6), and mid-step 9 (its Poisson sample drawn, nothing kept). The last
    resume finishes in process. Against an uninterrupted run of the same private seed: every public file equal
    (weights, AdamW's state of the final checkpoint, transcript, evaluations, summary with its privacy
    statement, released model), and no process drew the batch or the noise of a step the journal held when
    it began (tests/killpoints.py's trace). The kept gradients and AdamW's state are owner-only, in
    ``private/`` and the checkpoint; a logged step whose kept gradient is gone stops the resume with one line,
    nothing written.

    Mutations tried: the resume does not load AdamW's state (red: the weights and the final optimizer state
    differ); the mechanism's state comes from the checkpoint instead of the journal, so the private stream is
    not advanced past the logged steps (red: the trace shows the sample and noise of steps 4 and 5 drawn again);
    logged steps are executed again instead of replayed (red)."""
    from killpoints import trace_draws

    extra = FIRST_ORDER[mechanism]
    reference = tmp_path / "reference" / "run"  # the same folder name: curves.png's title
    train(TrainConfig(out_dir=str(reference), **{**CFG, **extra}), log=lambda *a: None)
    out = tmp_path / "run"
    work = out / "private" / "stage" if mechanism == "dp-sgd" else out  # a DP run publishes at its end
    draws = []  # (journaled steps when a process began, the steps whose batch or noise it drew)

    def traced_run(*args, **kw):
        before = _journaled(work) if (work / "private" / "journal.jsonl").exists() else 0
        trace = tmp_path / f"trace{len(draws)}"
        trace.write_text("")
        p = _spawn(tmp_path, out, *args, trace=trace, **kw, **extra)
        stderr = p.communicate(timeout=300)[1]
        assert p.returncode == -signal.SIGKILL, stderr[-2000:]
        draws.append((before, [int(line.split()[1]) for line in trace.read_text().splitlines()]))

    traced_run("kill_after_log", 5)
    assert _steps_logged(work) == 6 and [c.name for c in (work / "checkpoints").iterdir()] == ["step-000004"]
    kept = sorted((work / "private" / "updates").iterdir())
    assert [k.name for k in kept] == ["step-000004.safetensors", "step-000005.safetensors"]
    assert all(oct(k.stat().st_mode & 0o777) == "0o600" for k in kept)
    assert oct((work / "checkpoints" / "step-000004" / "optimizer.safetensors").stat().st_mode & 0o777) == "0o600"
    files = _files(out)
    kept[1].rename(tmp_path / "aside")  # a logged step with no gradient to replay: one line, nothing written
    assert main(_flags(out, **extra) + ["--resume"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("paczero: dtype auto:")]
    assert err == ["paczero: error: cannot resume: the update of logged step 5 is not in private/updates/; start the "
                   "run again in another folder"]
    (tmp_path / "aside").rename(kept[1])
    assert _files(out) == files
    traced_run("kill_after_journal", 7, resume=True)
    assert (_steps_logged(work), _journaled(work)) == (7, 8)
    traced_run("kill_in_checkpoint", 8, resume=True)
    assert _steps_logged(work) == 8 and not (work / "checkpoints" / "step-000008").exists()
    traced_run("kill_mid_step", 9, resume=True)
    assert (_steps_logged(work), _journaled(work)) == (9, 9)

    trace = tmp_path / "trace-last"
    trace_draws(trace, monkeypatch.setattr)
    assert main(_flags(out, **extra) + ["--resume"]) == 0
    assert "resuming from step 9 (weights of step 8, 1 logged steps replayed)" in capsys.readouterr().out
    draws.append((9, [int(line.split()[1]) for line in trace.read_text().splitlines()]))
    for before, steps in draws:
        assert all(step >= before for step in steps), draws  # no journaled step drawn again
    assert draws[-1][1] == ([9, 9] if mechanism == "dp-sgd" else [9])  # step 9: its sample (and noise), once

    a, b = _public_files(out), _public_files(reference)
    assert a.keys() == b.keys() and f"checkpoints/step-{STEPS:06d}/optimizer.safetensors" in a
    assert {k for k in a if a[k] != b[k]} == set()
    assert len(a["log.jsonl"]) == STEPS and a["summary.json"]["privacy"]["steps"] == STEPS
