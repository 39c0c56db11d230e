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

import pytest

import paczero.subsets as subsets
from paczero.checkpoint import encode
from paczero.config import TrainConfig
from paczero.secure_random import SecureGenerator
from paczero.subsets import private_generator, secret_generator
from paczero.train import train

TIMING = re.compile(r"seconds|time|elapsed")
WHERE = re.compile(r"^(out_dir|run_dir)$")  # the two runs' folders differ by name
#: files drawn from others that are compared (curves.png from log.jsonl; a manifest holds the checksums of
#: public.json, whose seconds differ, and of private.json, whose size is compared)
DERIVED = ("curves.png", "manifest.json")
#: the files that hold private state (the secret, the posterior, the private stream's state)
PRIVATE = {"journal.jsonl", "private.json"}


class ForcedSecret(SecureGenerator):
    """The run's own secret stream (the design comes from it unchanged), but j* = ``secret``."""

    def __init__(self, seed: int, secret: int):
        super().__init__(SecureGenerator.from_seed(seed, purpose="secret")._key)
        self.secret = secret

    def integers(self, low, high=None, size=None):
        return self.secret


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


def _run_with_secret(tmp_path, monkeypatch, name: str, secret: int, **extra) -> tuple[Path, list[str]]:
    monkeypatch.setattr(subsets, "secret_generator", lambda seed: ForcedSecret(seed, secret))
    out = tmp_path / name
    console: list[str] = []
    cfg = TrainConfig(model="tiny-llama", task="demo", n_train=16, n_dev=4, n_test=4, steps=6, num_subsets=16,
                      eval_every=3, checkpoint_every=2, private_seed=3, progress=False, report_to="tensorboard",
                      out_dir=str(out), **extra)
    train(cfg, log=lambda *a: console.append(" ".join(map(str, a))))
    return out, [re.sub(r"\d+(\.\d+)?\s*(s|min)\b", "<time>", line) for line in console]


def compare_runs(a: Path, b: Path, console_a: list[str], console_b: list[str], *, public_content: bool) -> None:
    """Assert what others can see of runs ``a`` and ``b`` is the same; ``public_content`` False: only modes,
    the private files' sizes and the set of files (PAC-MI's noised releases differ with j*, and so does
    what follows from them)."""
    names_a = {p.relative_to(a) for p in a.rglob("*") if "tensorboard" not in p.parts}
    names_b = {p.relative_to(b) for p in b.rglob("*") if "tensorboard" not in p.parts}
    assert names_a == names_b
    for rel in sorted(names_a):
        pa, pb = a / rel, b / rel
        assert stat.S_IMODE(pa.stat().st_mode) == stat.S_IMODE(pb.stat().st_mode), rel
        if pa.is_dir():
            continue
        if rel.name in PRIVATE:  # not readable by others (checked below); its size must not say anything
            assert pa.stat().st_size == pb.stat().st_size, f"{rel}: its size depends on j*"
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


@pytest.mark.parametrize("mechanism, extra, public_content", [
    ("pac-zpl", {}, True),
    ("pac-zpl", {"coin_step": "skip"}, True),
    ("pac-mi", {"mi_budget": 0.2}, False),
    ("hybrid", {"mi_budget": 0.2, "switch_step": 3}, False),
])
def test_two_runs_that_differ_only_in_the_secret_look_the_same_to_others(mechanism, extra, public_content, tmp_path,
                                                                         monkeypatch):
    """j* = 3 and j* = 12 (one and two digits, M = 16): identical public files, TensorBoard scalars and
    console (PAC-ZPL); for every mechanism the same files with the same modes, and private files of the same
    size in a folder only the owner can enter.

    Red if the journal stores j* in a variable-width encoding (``encode(entry)`` in ``Journal._write``:
    one byte per line more for j* = 12), if the journal lies in the run folder itself (readable size), or
    if a PAC-ZPL coin depended on j*."""
    a, con_a = _run_with_secret(tmp_path, monkeypatch, "ja", 3, mechanism=mechanism, **extra)
    b, con_b = _run_with_secret(tmp_path, monkeypatch, "jb", 12, mechanism=mechanism, **extra)
    assert stat.S_IMODE((a / "private").stat().st_mode) == 0o700
    assert stat.S_IMODE((a / "checkpoints").stat().st_mode) == 0o700
    for name in ("selected.safetensors", "best/weights.safetensors", "log.jsonl", "summary.json"):
        assert _readable_by_others(a / name, a), name  # what the run releases: readable as any new file
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


def test_a_dp_run_publishes_no_step_timing(tmp_path):
    """A DP run's TensorBoard scalars carry the global step as their wall time (constant spacing), and its
    files' times are all the start's (their spread would give the run's length). Red if the tracker writes as the steps come
    (``add_scalar`` without ``walltime``: real times whose gaps follow the private batch sizes)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "dp"
    cfg = TrainConfig(model="tiny-llama", task="demo", n_train=16, n_dev=4, n_test=4, steps=6, mechanism="dpzero",
                      epsilon=2.0, sample_rate=0.5, eval_every=3, private_seed=1, progress=False,
                      report_to="tensorboard", out_dir=str(out))
    train(cfg, log=lambda *a: None)
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    events = [e for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    assert len(events) > 6
    assert all(e.wall_time == float(e.step) for e in events)
    # nor do the run folder's file times: every file and folder has the start's (run.json's) time
    assert len({p.stat().st_mtime for p in [out, *out.rglob("*")]}) == 1
