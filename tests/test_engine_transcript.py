"""The engine's output is pinned: fixed-seed runs reproduce a stored transcript and stored weights.

``tests/data/engine_transcripts.json`` holds, for each run below, the public records of its log
(minus the step time; ``train_loss``, a float32 diagnostic, rounded to 5 digits), the sha256 of its
selected weights, two float64 figures of the weights' change (sum and L2 norm of selected − initial)
and its privacy statement's MI fields, as produced by the engine when the file was written
(``python tests/test_engine_transcript.py [NAME ...]`` rewrites them, each with the environment it was
written in; do that only for a change that is meant to move z, the arithmetic or the private streams,
and say so in the commit).
z on CPU comes from torch's generator per chunk. Red on any change to z, to the perturbation or
update arithmetic, to the scalars, to the mechanisms or to the private stream.

What is compared exactly and what to a tolerance:

* exactly, everywhere: what paczero defines with integers or exact rationals: steps, branches,
  released bits, PAC coefficients (±1), the agreement and unanimity fractions, the learning-rate
  schedule, row counts, the MI budget;
* exactly, in the environment that wrote the file (same torch/numpy/scipy/transformers/peft/
  dp-accounting and CPU capability): everything, the weights' sha256 included. Two runs in any one
  environment are identical bit for bit (``test_a_run_is_bit_identical_when_repeated``);
* to a stated relative tolerance across environments, because a library owns the last digits:
  ``FLOAT64_RTOL`` for values that go through scipy/numpy/dp-accounting transcendental functions
  (PAC-MI's σ, β, charges, posterior q⁺ and ỹ = s + γ·X, whose discrete Gaussian X has the scale σ/γ, the
  MIA bound, RDP ε): a new scipy can move them by an ulp; ``FORWARD_RTOL`` for values computed from float32 forwards through a
  finite difference (DP coefficients, the weights' change of a DP run, the train loss): another
  CPU kernel or transformers release reorders float32 sums, and the difference
  (f(θ+μz) − f(θ−μz)) / 2μ at μ = 1e-2 magnifies that rounding about 100×, step after step.
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from paczero.config import TrainConfig
from paczero.train import train

DATA = Path(__file__).parent / "data" / "engine_transcripts.json"
BASE = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=6, num_subsets=8,
            eval_every=3, checkpoint_every=3, private_seed=5, seed=2, progress=False, eval_zero_shot=False,
            device="cpu", mu=1e-2, lr=1e-2, threads=2)  # the stored transcripts: 2 threads (DP sums by float)
RUNS = {
    "ft-pac-mi-k2": dict(track="ft", mechanism="pac-mi", mi_budget=0.5, num_directions=2),
    "lora-pac-zpl-opt": dict(model="tiny-opt", track="lora", mechanism="pac-zpl"),
    "ft-dpzero": dict(track="ft", mechanism="dpzero", epsilon=2.0, sample_rate=0.5),
}
# Record fields paczero defines exactly (integers, branches, exact rationals, the lr schedule).
EXACT_FIELDS = {"step", "branch", "bit", "agreement", "free_frac", "unanimity", "lr", "rows"}
FLOAT64_RTOL = 1e-9   # library transcendental functions (ndtri, log, exp, quadrature, RDP)
FORWARD_RTOL = 1e-3   # float32 forwards through a μ = 1e-2 finite difference, compounded over 6 steps
PACKAGES = ("torch", "numpy", "scipy", "transformers", "peft", "dp-accounting")


def environment() -> dict:
    """What owns the last digits of a run: the numeric libraries and the CPU kernels torch dispatches."""
    env = {name: metadata.version(name) for name in PACKAGES}
    env["python"] = platform.python_version()
    env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return env


def _weights_change(name: str, out: Path) -> dict:
    """Sum and L2 norm, in float64, of the selected trainable weights minus the initial ones."""
    from safetensors.torch import load_file

    from paczero.models import load_model, trainable_parameters

    cfg = {**BASE, **RUNS[name]}
    model = load_model(cfg["model"], track=cfg["track"], init_seed=cfg["seed"]).model
    initial = dict(trainable_parameters(model, cfg["track"]))
    selected = load_file(str(out / "selected.safetensors"))
    delta = torch.cat([(selected[k].double() - initial[k].detach().double()).flatten() for k in sorted(selected)])
    return {"sum": float(delta.sum()), "norm": float(delta.norm())}


def _run(name: str, out: Path) -> dict:
    cfg = TrainConfig(**{**BASE, **RUNS[name]}, out_dir=str(out))
    summary = train(cfg, log=lambda *a: None)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    for r in records:
        r.pop("seconds")
        if r["train_loss"] is not None:
            r["train_loss"] = float(f"{r['train_loss']:.5g}")
    weights = hashlib.sha256((out / "selected.safetensors").read_bytes()).hexdigest()
    privacy = {k: summary["privacy"].get(k) for k in ("mi_bound", "mia_bound", "mi_spent", "epsilon_rdp")}
    return {"records": records, "selected_sha256": weights, "weights_change": _weights_change(name, out),
            "privacy": privacy}


_RUNS_DONE: dict[str, dict] = {}


def _run_once(name: str, tmp_path_factory) -> dict:
    """One run per configuration per test session (two tests read it)."""
    if name not in _RUNS_DONE:
        threads = torch.get_num_threads()
        try:
            _RUNS_DONE[name] = _run(name, tmp_path_factory.mktemp(name))
        finally:
            torch.set_num_threads(threads)
    return _RUNS_DONE[name]


def _close(got, want, rtol: float, where: str) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, rtol, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert math.isclose(got, want, rel_tol=rtol, abs_tol=rtol * 1e-3), f"{where}: {got!r} vs stored {want!r}"
    else:
        assert got == want, f"{where}: {got!r} vs stored {want!r}"


def _compare_across_environments(got: dict, want: dict) -> None:
    assert len(got["records"]) == len(want["records"])
    for g, w in zip(got["records"], want["records"]):
        assert g.keys() == w.keys()
        dp = w["branch"] == "dp"
        for key in w:
            where = f"step {w['step']} {key}"
            if key in EXACT_FIELDS or (key == "coef" and not dp):
                assert g[key] == w[key], f"{where}: {g[key]!r} vs stored {w[key]!r}"
            elif key in ("train_loss",) or (key == "coef" and dp):
                _close(g[key], w[key], FORWARD_RTOL, where)
            else:
                _close(g[key], w[key], FLOAT64_RTOL, where)
    for key in want["privacy"]:
        if key == "mi_bound":  # the configured budget, exactly
            assert got["privacy"][key] == want["privacy"][key]
        else:
            _close(got["privacy"][key], want["privacy"][key], FLOAT64_RTOL, f"privacy {key}")
    dp = any(r["branch"] == "dp" for r in want["records"])
    _close(got["weights_change"]["sum"], want["weights_change"]["sum"], FORWARD_RTOL if dp else 1e-6, "weights Σ")
    _close(got["weights_change"]["norm"], want["weights_change"]["norm"], FORWARD_RTOL if dp else 1e-6, "weights ‖·‖")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_seed_run_reproduces_the_stored_transcript(name, tmp_path_factory, monkeypatch):
    """Red on a change to z, the arithmetic, the scalars, the mechanisms or the private stream: e.g.
    PAC-ZPL's coin read from the other end of the stream flips stored bits; σ from a budget of 0.49
    moves PAC-MI's σ by far more than ``FLOAT64_RTOL``; a DP clip of 1.1·C moves the coefficients by
    more than ``FORWARD_RTOL``."""
    monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    got = _run_once(name, tmp_path_factory)
    want = json.loads(DATA.read_text())[name]
    if want.get("environment") == environment():
        assert got["records"] == want["records"]
        assert got["privacy"] == want["privacy"]
        assert got["selected_sha256"] == want["selected_sha256"]
    _compare_across_environments(got, want)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_is_bit_identical_when_repeated(name, tmp_path_factory, tmp_path, monkeypatch):
    """Within one environment the engine is deterministic bit for bit: the same records, statement
    and weights' sha256 twice. Red if anything in a run drew from an unseeded source (e.g. the
    private stream keyed from OS entropy despite ``private_seed``) or if the weights' arithmetic
    depended on anything but the inputs (e.g. thread count or uninitialised memory)."""
    monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    first = _run_once(name, tmp_path_factory)
    threads = torch.get_num_threads()
    try:
        second = _run(name, tmp_path / name)
    finally:
        torch.set_num_threads(threads)
    assert second == first


if __name__ == "__main__":  # rewrite the stored transcripts with the engine as it is
    import os
    import tempfile

    os.environ["PACZERO_TORCH_DIRECTIONS"] = "1"
    stored = json.loads(DATA.read_text()) if DATA.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in sys.argv[1:] or sorted(RUNS):
            stored[name] = {**_run(name, Path(tmp) / name), "environment": environment()}
    DATA.write_text(json.dumps(stored, indent=1) + "\n")
    print(f"wrote {DATA}", file=sys.stderr)
