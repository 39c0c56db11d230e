"""No side channel: what a run lets others see does not depend on the secret j*, nor a DP run's timing on its batches.

Two runs that differ only in j* (the same public inputs, the same private stream of coins and noise) are
compared over everything they leave: every file's mode; the content of every file that others can read
(clock times masked); the size of every file they cannot read; the TensorBoard scalars; the console.
The secret's generator is replaced by one that draws the design from the run's own secret stream and
returns a chosen j*: the design and everything else stay the same.
"""
from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import numpy as np
import pytest

import paczero.mechanisms.pac as pac
import paczero.privacy.subsets as subsets
from forced_secret import forced
from paczero.checkpoint import encode
from paczero.config import TrainConfig
from paczero.privacy.subsets import private_generator, secret_generator
from paczero.train import train

TIMING = re.compile(r"seconds|time|elapsed")
WHERE = re.compile(r"^(out_dir|run_dir)$")  # the two runs' folders differ by name
#: files drawn from others that are compared (curves.png from log.jsonl; a manifest holds the checksums of
#: public.json, whose seconds differ, and of private.json, whose size is compared)
DERIVED = ("curves.png", "manifest.json")
#: the files that hold private state (the secret, the posterior, the private stream's state)
PRIVATE = {"journal.jsonl", "private.json"}


def _masked(value):
    if isinstance(value, dict):
        return {k: ("<time>" if TIMING.search(k) else "<folder>" if WHERE.match(k) else _masked(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _json_content(path: Path):
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [_masked(json.loads(line)) for line in text.splitlines() if line.strip()]
    return _masked(json.loads(text))


def _readable_by_others(path: Path, root: Path) -> bool:
    """Whether a user other than the owner can read ``path`` (every folder above it searchable, it readable)."""
    folder = path.parent
    while True:
        if not stat.S_IMODE(folder.stat().st_mode) & 0o001:
            return False
        if folder == root:
            break
        folder = folder.parent
    return bool(stat.S_IMODE(path.stat().st_mode) & 0o004)


def _scalars(run: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if not TIMING.search(tag)}


def _run_with_secret(tmp_path, monkeypatch, name: str, secret: int, signs: list | None = None,
                     **extra) -> tuple[Path, list[str]]:
    """One run with j* = ``secret``; ``signs``: a list that receives each step's [K, M] subset signs."""
    monkeypatch.setattr(subsets, "secret_generator", forced(secret))
    if signs is not None:
        def recorded(g, design, real=subsets.subset_signs):
            signs.append(real(g, design))
            return signs[-1]
        monkeypatch.setattr(pac, "subset_signs", recorded)
    out = tmp_path / name
    console: list[str] = []
    cfg = TrainConfig(model="tiny-llama", task="demo", n_train=16, n_dev=4, n_test=4, steps=6, num_subsets=16,
                      eval_every=3, checkpoint_every=2, private_seed=3, progress=False, report_to="tensorboard",
                      out_dir=str(out), **extra)
    train(cfg, log=lambda *a: console.append(" ".join(map(str, a))))
    monkeypatch.setattr(pac, "subset_signs", subsets.subset_signs)
    return out, [re.sub(r"\d+(\.\d+)?\s*(s|min)\b", "<time>", line) for line in console]


def _shape(run: Path) -> list:
    """Each logged step's branch and which of its values are null: what a private file's size may follow."""
    return [(r["branch"], *(r[k] is None for k in ("y_tilde", "sigma", "q_plus", "agreement")))
            for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())]


def compare_runs(a: Path, b: Path, console_a: list[str], console_b: list[str], *, public_content: bool) -> None:
    """Assert what others can see of runs ``a`` and ``b`` is the same; ``public_content`` False: only modes,
    the private files' sizes and the set of files (PAC-MI's noised releases differ with j*, and so does
    what follows from them)."""
    names_a = {p.relative_to(a) for p in a.rglob("*") if "tensorboard" not in p.parts}
    names_b = {p.relative_to(b) for p in b.rglob("*") if "tensorboard" not in p.parts}
    assert names_a == names_b
    # a private file's size may follow the public transcript (a branch's name, a value released or not: the
    # journal's numbers are fixed-width, its words and nulls are not); PAC-MI's transcript differs with j*
    same_shape = _shape(a) == _shape(b)
    assert public_content <= same_shape
    for rel in sorted(names_a):
        pa, pb = a / rel, b / rel
        assert stat.S_IMODE(pa.stat().st_mode) == stat.S_IMODE(pb.stat().st_mode), rel
        if pa.is_dir():
            continue
        if rel.name in PRIVATE and same_shape:  # not readable by others (checked below); its size must not say
            assert pa.stat().st_size == pb.stat().st_size, f"{rel}: its size depends on j*"  # more than the log
        elif public_content and rel.name not in DERIVED:  # a public file, or one that holds public values
            if pa.suffix in (".json", ".jsonl"):
                assert _json_content(pa) == _json_content(pb), rel
            else:
                assert pa.read_bytes() == pb.read_bytes(), rel
    assert _readable_by_others(a / "log.jsonl", a)  # the comparison above saw public files
    hidden = {p.name for p in a.rglob("*") if p.is_file() and not _readable_by_others(p, a)}
    assert PRIVATE <= hidden
    if public_content:
        assert _scalars(a) == _scalars(b)
        assert console_a == console_b


def other_secret(run: Path, signs: list, secret: int, candidates: range) -> int:
    """A j* among ``candidates`` whose sign differs from ``secret``'s at some step of ``run`` where the subsets
    disagreed (a coin, or a noised release), from the signs replayed from the run (for PAC-ZPL, with the same
    private stream, they are the same for every j*), so that a fault that moved theta along s_{j*} on such a
    step gives the two runs other weights."""
    split = [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()
             if json.loads(line)["branch"] != "unanimous"]
    assert split, "the subsets never disagreed: the A/B comparison could not see a coin that moves theta"
    differ = [j for j in candidates if any(signs[t][0][j] != signs[t][0][secret] for t in split)]
    assert differ, "every candidate shares j*'s sign wherever the subsets disagreed"
    return differ[0]


def _weights(run: Path) -> dict[str, bytes]:
    """The released weights and the final checkpoint's, byte for byte."""
    final = sorted((run / "checkpoints").iterdir())[-1]
    return {name: (run / name).read_bytes() for name in ("selected.safetensors",)} | {
        "final": (final / "weights.safetensors").read_bytes()}


@pytest.mark.parametrize("mechanism, extra, public_content", [
    ("pac-zpl", {}, True),
    ("pac-zpl", {"coin_step": "skip"}, True),
    ("pac-mi", {"mi_budget": 0.2}, False),
    ("hybrid", {"mi_budget": 0.2, "switch_step": 3}, False),
])
def test_two_runs_that_differ_only_in_the_secret_look_the_same_to_others(mechanism, extra, public_content, tmp_path,
                                                                         monkeypatch):
    """j* = 3 against a two-digit j* (M = 16) whose subset sign differs from 3's at a coin step of the run
    (chosen by replaying the run's signs: 8 of the 16 candidates share 3's sign at every coin step, and a
    pair of those could not tell a coin that moves theta): identical public files, released and final
    weights bit for bit, TensorBoard scalars and console (PAC-ZPL); for every mechanism the same files with
    the same modes, and private files of the same size in a folder only the owner can enter.

    Red if the journal stores j* in a variable-width encoding (``encode(entry)`` in ``Journal._write``:
    one byte per line more for j* = 12), if the journal lies in the run folder itself (readable size), if a
    PAC-ZPL coin depended on j*, or if the loop moved theta along s_{j*} on a coin step while the log kept
    the coin's coefficient (PAC-ZPL's weights then differ between the two runs)."""
    signs: list = []
    a, con_a = _run_with_secret(tmp_path, monkeypatch, "ja", 3, signs=signs, mechanism=mechanism, **extra)
    other = other_secret(a, signs, 3, range(10, 16))
    b, con_b = _run_with_secret(tmp_path, monkeypatch, "jb", other, mechanism=mechanism, **extra)
    assert stat.S_IMODE((a / "private").stat().st_mode) == 0o700
    assert stat.S_IMODE((a / "checkpoints").stat().st_mode) == 0o700
    for name in ("selected.safetensors", "best/weights.safetensors", "log.jsonl", "summary.json"):
        assert _readable_by_others(a / name, a), name  # what the run releases: readable as any new file
    if public_content:
        assert _weights(a) == _weights(b), "the weights depend on j*"
    compare_runs(a, b, con_a, con_b, public_content=public_content)


def test_the_fixed_width_encoding_is_what_keeps_the_sizes_equal():
    """Negative control of the comparison above: the plain encoding of a state with j* = 3 and with j* = 12
    differ in length, the fixed-width encoding does not."""
    state = {"secret": 3, "mi_spent": 0.0, "rng_state": {"counter": 7}}
    other = {"secret": 12, "mi_spent": 0.08333333332074876, "rng_state": {"counter": 1234}}
    assert len(json.dumps(encode(state))) != len(json.dumps(encode(other)))
    assert len(json.dumps(encode(state, fixed=True))) == len(json.dumps(encode(other, fixed=True)))
    from paczero.checkpoint import decode

    big = {"state": {"state": 2**127 + 5, "inc": 3}, "x": -1.5, "flag": True, "none": None}  # numpy PCG64's words
    assert decode(json.loads(json.dumps(encode(big, fixed=True)))) == big


def test_the_secret_and_the_released_randomness_have_independent_keys():
    """j* and the design come from a key of their own: with a fixed seed, a key apart from the private
    stream's; with OS entropy, a separate draw. Red if ``secret_generator`` returned the private stream
    (``private_generator(seed)``), as one key for everything did."""
    assert secret_generator(5).state["key"] != private_generator(5).state["key"]
    assert secret_generator(5).state == secret_generator(5).state
    assert secret_generator(None).state["key"] != secret_generator(None).state["key"]


def test_a_runs_secret_does_not_move_with_its_private_stream(tmp_path, monkeypatch):
    """Two runs whose private streams (coins) differ but whose secret streams agree have the same j* and
    design. Red if j* or the design were drawn from the private stream."""
    from paczero.train import make_mechanism

    cfg = TrainConfig(model="tiny-llama", task="demo", mechanism="pac-zpl", num_subsets=16, n_train=16).validate()
    one = make_mechanism(cfg, 16, private_generator(1), secret_rng=secret_generator(9))
    two = make_mechanism(cfg, 16, private_generator(2), secret_rng=secret_generator(9))
    assert one.state_dict()["secret"] == two.state_dict()["secret"]
    assert (one.design == two.design).all()
    three = make_mechanism(cfg, 16, private_generator(1), secret_rng=secret_generator(10))
    assert (three.design != one.design).any()


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    """A finished DPZero run with TensorBoard and the held-out attack, and its console."""
    out = tmp_path_factory.mktemp("dp") / "run"
    console: list[str] = []
    cfg = TrainConfig(model="tiny-llama", task="demo", n_train=16, n_dev=4, n_test=4, steps=6, mechanism="dpzero",
                      epsilon=2.0, sample_rate=0.5, eval_every=3, checkpoint_every=2, private_seed=1, progress=False,
                      report_to="tensorboard", heldout_attack=True, out_dir=str(out))
    train(cfg, log=lambda *a: console.append(" ".join(map(str, a))))
    return out, console


def _birth(path: Path) -> float | None:
    """The birth time of ``path`` (statx, through GNU stat: Python has no st_birthtime on Linux); None where the
    file system does not keep it."""
    import subprocess

    out = subprocess.run(["stat", "--format=%W %w", str(path)], capture_output=True, text=True).stdout.split()
    if not out or out[0] in ("0", "-", "?"):
        return None
    fraction = out[2].split(".")[1] if "." in out[2] else "0"
    return int(out[0]) + int(fraction) / 10 ** len(fraction)


def test_a_dp_run_publishes_every_path_at_one_time(dp_run):
    """Every path of a finished DP run has one modification time, and change times within a blink; every path
    but the folder, its lock and private/ (made when the run began) was born in the blink of the publication,
    after the run's steps: no time says when a step, an evaluation or the best weights came (their spacing
    follows the private batches). Red if the outputs are written into the run folder as the run goes (the
    files are born over the run's seconds), or if publish renamed the staged files (a rename keeps a file's
    birth time) instead of copying them."""
    out, _ = dp_run
    paths = [out, *out.rglob("*")]
    assert not (out / "private" / "stage").exists() and (out / "log.jsonl").exists()
    assert len({p.stat().st_mtime_ns for p in paths}) == 1
    ctimes = [p.stat().st_ctime for p in paths]
    assert max(ctimes) - min(ctimes) < 0.5
    born_at_start = {out, out / ".paczero.lock", out / "private"}
    births = {p: _birth(p) for p in paths if p not in born_at_start}
    if None in births.values():
        pytest.skip("this file system keeps no birth times")
    assert max(births.values()) - min(births.values()) < 0.5, sorted(births.items(), key=lambda kv: kv[1])[:3]
    assert min(births.values()) > _birth(out / "private")  # published after the stage began


def test_a_dp_runs_tensorboard_holds_the_public_values_only_without_a_clock(dp_run):
    """A DP run's TensorBoard: one event file whose name carries no clock, every event (the file's first one and
    the config's included) with its global step as wall time, and the scalars exactly the public values the
    run folder holds, tag for tag: each step's learning rate and free fraction (log.jsonl), each evaluation's
    dev metrics and the epsilon spent by then (evals.jsonl; the accountant from the published calibration),
    the test metrics, the statement's epsilons and MIA bound and the selected step (summary.json). Red if the
    tracker writes as the steps come (real wall times), keeps TensorBoard's own file name (the epoch time in
    it), or holds a scalar whose value or name is a clock (``time/now``, or the clock in place of a published
    value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from paczero.run.trackers import dp_epsilon

    out, _ = dp_run
    files = sorted((out / "tensorboard").iterdir())
    assert [f.name for f in files] == ["events.out.tfevents.0.paczero"]
    raw = list(EventFileLoader(str(files[0])).Load())
    assert len(raw) > 6 and all(e.wall_time == float(e.step) for e in raw)
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    privacy, end = summary["privacy"], summary["config"]["steps"]
    calibration = {"mechanism": "dpzero", "noise_multiplier": privacy["noise_multiplier"],
                   "sample_rate": privacy["sample_rate"], "delta": privacy["delta"], "accountant": "rdp"}
    want = {f"{group}/{key}": [(r["step"] + 1, r[key]) for r in log] for group, key in (("train", "lr"),
                                                                                        ("release", "free_frac"))}
    for metric in evals[0]["dev"]:
        want[f"dev/{metric}"] = [(r["step"], r["dev"][metric]) for r in evals]
    want["privacy/epsilon"] = [(r["step"], dp_epsilon(calibration, r["step"])) for r in evals]
    for group in ("test", "zero_shot"):
        values = summary[group] if group == "test" else summary[group]["test"]
        want.update({f"{group}/{k}": [(end, v)] for k, v in values.items()})
    want.update({f"privacy/{k}": [(end, privacy[k])] for k in ("epsilon_rdp", "epsilon_pld", "epsilon_target", "delta",
                                                                "mia_bound")})
    want["selected_step"] = [(end, summary["selected_step"])]
    assert sorted(got) == sorted(want)
    for tag, series in want.items():
        assert got[tag] == [(s, pytest.approx(v, rel=1e-6, abs=1e-9)) for s, v in series], tag


def test_a_dp_run_keeps_the_heldout_attack_private_and_prints_no_time(dp_run):
    """A DP run with ``heldout_attack``: summary.json (and every file others can read, and the console) holds
    no statistic of U (the count of its records, their mean loss, the attack's AUC), only where the
    measurement is: private/heldout_attack.json, mode 0600 in the owner-only private/. The console holds no
    time (``setup 6.1s``) either. Red if the measurement is published as a PAC run publishes it (U is public
    there, the private data here, and no epsilon covers it), or if the console names the set-up time."""
    out, console = dp_run
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["heldout_attack"]) == {"file", "published", "why"}
    assert "epsilon" in summary["heldout_attack"]["why"]
    kept = out / "private" / "heldout_attack.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    measured = json.loads(kept.read_text())
    assert measured["members"] == 16 and 0.0 <= measured["auc"] <= 1.0
    for path in out.rglob("*"):
        if path.is_file() and _readable_by_others(path, out) and path.suffix in (".json", ".jsonl", ".md") \
                and not path.name.startswith("tokenizer"):  # the base model's vocabulary has a token "members"
            text = path.read_text()
            assert not re.search(r"member_loss_mean|heldout_loss_mean|auc_ci95|\"members\": *\d", text), path
    assert not any(re.search(r"AUC \d|\d+(\.\d+)?\s*s\b", line) for line in console), console


def test_a_dp_shape_error_names_no_batch_size():
    """DPZero's error for scalars of the wrong shape names K and the shape's meaning, not the private batch size
    B (a message that reached a log would publish it). Red if it shows the expected shape ``(1, B)``."""
    from paczero.mechanisms.dp import DPZero

    mech = DPZero(1000, 2.0, 1e-5, 10, 0.5, 1.0, seed=np.random.default_rng(0))
    size = len(mech.batch_indices(1000))
    with pytest.raises(ValueError) as err:
        mech.step(np.zeros((1, size + 1)))
    assert "shape [K, B]" in str(err.value)
    assert not re.search(rf"\b({size}|{size + 1})\b", str(err.value)), str(err.value)
