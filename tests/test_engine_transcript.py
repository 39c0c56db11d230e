"""The engine's output is pinned: fixed-seed runs reproduce a stored transcript, on every CPU kind.

``tests/data/engine_transcripts.json`` holds, for each run below, the public records of its log (minus
the step time; ``train_loss``, a float32 diagnostic, rounded to 5 digits), the per-example scalars the
mechanism was handed at each step (after the stability clip, float64, as JSON's exact decimal form) and
the examples each step scored, the sha256 of the selected weights, two float64 figures of the weights'
change (sum and L2 norm of selected − initial), the privacy statement's MI fields, and the environment
that wrote them (``python tests/test_engine_transcript.py [NAME ...]`` rewrites them; do that only for a
change that is meant to move z, the arithmetic or the private streams, and say so in the commit).

A run has two parts, pinned in two ways:

* **The mechanism's part, exactly, on every machine** (``test_the_mechanism_replays_the_stored_scalars``):
  given a step's scalars, everything released follows from integers, exact rationals, the private stream
  and IEEE arithmetic. The stored scalars are replayed through a mechanism built as a run builds it
  (``paczero.train.make_mechanism``, the same private seed): the examples each step scores, every bit,
  branch, coefficient, grid, noised value ỹ, agreement and unanimity figure, the learning rate and the MI
  charged are compared exactly, and so is σ: the released scale is the calibrated one rounded up to 20
  significant bits (``paczero.privacy.exact_noise.public_sigma``), and the exact sampler's draw depends on every
  bit of it. β, q⁺, the posterior mean and the MI charges go through numpy/scipy transcendental functions
  (exp, log, quadrature) whose last bits belong to the libraries and to the CPU (numpy's dispatched loops,
  the BLAS kernels): those to ``FLOAT64_RTOL``.
* **The model's part, to a tolerance with a margin rule** (``test_fixed_seed_run_reproduces_the_stored_
  transcript``): the scalars come from float32 forwards, whose sums another CPU kind's kernels reorder,
  and the two-point difference (f(θ+μz) − f(θ−μz)) / 2μ at μ = 1e-2 magnifies that rounding about 100×.
  Each step's scalars must lie within ``SCALAR_ATOL`` plus ``FORWARD_RTOL`` of the step's largest stored
  scalar (the tolerance) of the stored ones, and each candidate subset's mean (computed here with ``math.fsum``) must keep its stored sign. A
  subset mean that lies within the tolerance of 0 may change its sign on another CPU kind, and with it
  s_{j*}, the branch and everything after: there the test says so and stops comparing (a skip that names
  the step, the subset and the mean), rather than failing. A sign change farther than that from 0 fails.
  In the environment that wrote the file everything is compared exactly, the weights' sha256 included,
  and two runs in one environment are identical bit for bit (``test_a_run_is_bit_identical_when_repeated``).

``bash scripts/test_cpu_kinds.sh`` runs these tests under several of torch's CPU kernel settings on one
machine and demands the same verdict from each: a forward whose last bits move with the kernels shows
there before a machine of another kind shows it.
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
from importlib import metadata
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from paczero import train as train_module
from paczero.config import TrainConfig
from paczero.run.step_record import step_record
from paczero.privacy.subsets import private_generator, secret_generator
from paczero.train import lr_at, make_mechanism, train

DATA = Path(__file__).parent / "data" / "engine_transcripts.json"
BASE = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=6, num_subsets=8,
            eval_every=3, checkpoint_every=3, private_seed=5, seed=2, progress=False, eval_zero_shot=False,
            device="cpu", dtype="fp32", mu=1e-2, lr=1e-2, threads=2,  # 2 threads (DP sums by float)
            select_metric="accuracy")  # the dev-best rule the stored transcripts were recorded with
RUNS = {
    "ft-pac-mi-k2": dict(track="ft", mechanism="pac-mi", mi_budget=0.5, num_directions=2),
    "lora-pac-zpl-opt": dict(model="tiny-opt", track="lora", mechanism="pac-zpl"),
    "ft-dpzero": dict(track="ft", mechanism="dpzero", epsilon=2.0, sample_rate=0.5),
}
# Record fields paczero defines exactly given the scalars (integers, branches, exact rationals, lattice
# points, the lr schedule, IEEE sums of those).
EXACT_FIELDS = {"step", "branch", "bit", "coef", "y_tilde", "grid", "sigma", "agreement", "free_frac", "unanimity",
                "lr", "rows"}
# Record fields through library transcendental functions (the posterior's exp/log, the charges' quadrature).
LIBRARY_FIELDS = {"q_plus", "beta", "mi_step", "cum_mi"}
FLOAT64_RTOL = 1e-9   # library transcendental functions (ndtri, log, exp, quadrature, RDP)
FORWARD_RTOL = 1e-3   # float32 forwards through a μ = 1e-2 finite difference, compounded over 6 steps
UPDATE_RTOL = 1e-5    # float32 updates θ − lr·coef·z with the same coefficients: kernels with and without FMA
SCALAR_ATOL = 2e-3    # a per-example scalar's float32 rounding through the μ = 1e-2 difference, compounded
# (measured on a 2-core AMD EPYC with AVX-512, 2026-11-27, between torch's AVX-512, AVX2 and plain kernels:
# at most 1.5e-5 on the PAC runs' scalars of size 2-20, 4.3e-2 on DPZero's of size 320 at its sixth step)
PACKAGES = ("torch", "numpy", "scipy", "transformers", "peft", "dp-accounting")


def environment() -> dict:
    """What owns the last digits of a run: the numeric libraries, the CPU kernels torch dispatches and the CPU
    they run on (an AMD EPYC and an Intel Xeon both report torch's "AVX512" and sum a forward in another order)."""
    env = {name: metadata.version(name) for name in PACKAGES}
    env["python"] = platform.python_version()
    env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    env["cpu"] = _cpu_model()
    return env


def _cpu_model() -> str:
    """The CPU's vendor and model name as the kernel reports them (empty where it does not)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return " ".join(fields.get(key, "").strip() for key in ("vendor_id", "model name")).strip()


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


def _recording_mechanism(seen: dict):
    """``make_mechanism`` whose mechanism hands the test what the engine gave it: scalars and batches."""
    def make(*args, **kwargs):
        mech = make_mechanism(*args, **kwargs)
        step, batch_indices = mech.step, mech.batch_indices
        seen["design"] = getattr(mech, "design", None)

        def recorded_step(scalars):
            seen["scalars"].append(np.asarray(scalars, dtype=np.float64).tolist())
            return step(scalars)

        def recorded_batch(n):
            idx = batch_indices(n)
            seen["batches"].append(None if idx is None else [int(i) for i in idx])
            return idx

        mech.step, mech.batch_indices = recorded_step, recorded_batch
        return mech
    return make


def _run(name: str, out: Path) -> dict:
    cfg = TrainConfig(**{**BASE, **RUNS[name]}, out_dir=str(out))
    seen: dict = {"scalars": [], "batches": [], "design": None}
    with mock.patch.object(train_module, "make_mechanism", _recording_mechanism(seen)):
        summary = train(cfg, log=lambda *a: None)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    for r in records:
        r.pop("seconds")
        if r["train_loss"] is not None:
            r["train_loss"] = float(f"{r['train_loss']:.5g}")
    weights = hashlib.sha256((out / "selected.safetensors").read_bytes()).hexdigest()
    privacy = {k: summary["privacy"].get(k) for k in ("mi_bound", "mia_bound", "mi_spent", "epsilon_rdp")}
    return {"records": records, "scalars": seen["scalars"], "batches": seen["batches"],
            "selected_sha256": weights, "weights_change": _weights_change(name, out), "privacy": privacy,
            "design": None if seen["design"] is None else np.asarray(seen["design"]).astype(int).tolist()}


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


def _stored(name: str) -> dict:
    return json.loads(DATA.read_text())[name]


def _close(got, want, rtol: float, where: str) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, rtol, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert math.isclose(got, want, rel_tol=rtol, abs_tol=rtol * 1e-3), f"{where}: {got!r} vs stored {want!r}"
    else:
        assert got == want, f"{where}: {got!r} vs stored {want!r}"


def _compare_record(got: dict, want: dict, *, forward_rtol: float) -> None:
    """One step's record: exact fields exactly, library fields to ``FLOAT64_RTOL``, the float32
    diagnostics (train loss; a DP coefficient, a noised sum of forward scalars) to ``forward_rtol``."""
    assert got.keys() == want.keys(), f"step {want['step']}: fields {sorted(got)} vs stored {sorted(want)}"
    dp = want["branch"] == "dp"
    for key in want:
        where = f"step {want['step']} {key}"
        if key == "train_loss" or (key == "coef" and dp):
            _close(got[key], want[key], forward_rtol, where)
        elif key in LIBRARY_FIELDS:
            _close(got[key], want[key], FLOAT64_RTOL, where)
        else:
            assert got[key] == want[key], f"{where}: {got[key]!r} vs stored {want[key]!r}"


# ------------------------------------------------------------------ the mechanism's part, exactly

def replay(name: str, want: dict) -> list[dict]:
    """The records a mechanism built as the run built it releases from the stored scalars, step by step."""
    cfg = TrainConfig(**{**BASE, **RUNS[name]})
    mech = make_mechanism(cfg, cfg.n_train, private_generator(cfg.private_seed),
                          secret_rng=secret_generator(cfg.private_seed))
    records = []
    for step, (scalars, batch, stored) in enumerate(zip(want["scalars"], want["batches"], want["records"])):
        idx = mech.batch_indices(cfg.n_train)
        assert (None if idx is None else [int(i) for i in idx]) == batch, f"step {step}: examples scored"
        releases = mech.step(np.asarray(scalars, dtype=np.float64))
        records.append(step_record(step, releases, mech, lr_at(cfg, step), stored["train_loss"], None,
                                   stored["rows"]))
        records[-1].pop("seconds")
    return records


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_mechanism_replays_the_stored_scalars(name):
    """Given the stored scalars, the mechanism's releases are the stored ones on every machine: the
    examples scored, every bit, branch, coefficient, σ, grid, ỹ, agreement and unanimity figure and the lr
    exactly; β, q⁺ and the charges to ``FLOAT64_RTOL``.
    Red on any change to a mechanism's arithmetic or to a private stream: e.g. PAC-ZPL's coin read from the
    other end of the stream flips stored bits; j* drawn from the private stream instead of the secret key
    moves the released s_{j*}; σ from a budget of 0.49 moves PAC-MI's σ, its grid and ỹ; a DP clip of 1.1·C
    or a Poisson mask drawn otherwise moves the DP coefficients or the examples scored."""
    want = _stored(name)
    got = replay(name, want)
    assert len(got) == len(want["records"])
    for g, w in zip(got, want["records"]):
        _compare_record(g, w, forward_rtol=0.0)


# ------------------------------------------------------------------ the model's part, with the margin rule

def _subset_means(scalars: list, design: list) -> list[list[float]]:
    """Each direction's candidate-subset means, each a correctly rounded sum (``math.fsum``) over its members."""
    return [[math.fsum(g for g, member in zip(row, members) if member) / sum(members) for members in design]
            for row in scalars]


def _sign(x: float) -> int:
    return 1 if x >= 0.0 else -1  # sgn(0) = +1 (Appendix B)


def compare_model_part(got: dict, want: dict) -> str | None:
    """Step by step: the scalars to the tolerance, the subset means' signs, then the step's records. Returns
    why the comparison stopped early (a subset mean within the tolerance of 0 changed sign), else None."""
    design = want["design"]
    for step, (g_s, w_s, g_r, w_r) in enumerate(zip(got["scalars"], want["scalars"], got["records"],
                                                    want["records"])):
        assert got["batches"][step] == want["batches"][step], f"step {step}: examples scored"
        g_arr, w_arr = np.asarray(g_s), np.asarray(w_s)
        assert g_arr.shape == w_arr.shape, f"step {step}: scalars' shape"
        tol = SCALAR_ATOL + FORWARD_RTOL * float(np.abs(w_arr).max())
        off = float(np.abs(g_arr - w_arr).max())
        assert off <= tol, f"step {step}: a scalar {off:.3g} off the stored one (tolerance {tol:.3g})"
        if design is not None:
            for k, (g_m, w_m) in enumerate(zip(_subset_means(g_s, design), _subset_means(w_s, design))):
                for j, (a, b) in enumerate(zip(g_m, w_m)):
                    if _sign(a) != _sign(b):
                        assert abs(b) <= tol, (f"step {step}: direction {k} subset {j}'s mean {a!r} vs "
                                               f"stored {b!r}: a sign change beyond the tolerance {tol:.3g}")
                        return (f"steps 0..{step - 1} compared; at step {step} direction {k}'s subset {j} has mean "
                                f"{a:.3g} here and {b:.3g} stored, within {tol:.3g} of 0: its sign (and what "
                                "follows) belongs to the CPU's float32 rounding")
        _compare_record(g_r, w_r, forward_rtol=FORWARD_RTOL)
    return None


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_seed_run_reproduces_the_stored_transcript(name, tmp_path_factory, monkeypatch):
    """The engine reproduces the stored run: scalars to the tolerance, subset signs, released records and
    the weights' change (bit for bit where the environment is the one that wrote the file). Red on a change
    to z, the perturbation or update arithmetic or the scalars: e.g. z drawn from another seed moves the
    scalars far beyond ``SCALAR_ATOL``; a learning rate of 1.1·lr moves the weights' change; a sign
    convention sgn(0) = −1 or a mean over the complement flips subset signs far from 0."""
    monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    got = _run_once(name, tmp_path_factory)
    want = _stored(name)
    if want.get("environment") == environment():
        for key in ("records", "scalars", "batches", "privacy", "selected_sha256", "weights_change"):
            assert got[key] == want[key], key
        return
    stopped = compare_model_part(got, want)
    if stopped:
        pytest.skip(stopped)
    for key in want["privacy"]:
        if key == "mi_bound":  # the configured budget, exactly
            assert got["privacy"][key] == want["privacy"][key]
        else:
            _close(got["privacy"][key], want["privacy"][key], FLOAT64_RTOL, f"privacy {key}")
    rtol = FORWARD_RTOL if any(r["branch"] == "dp" for r in want["records"]) else UPDATE_RTOL
    g, w = got["weights_change"], want["weights_change"]
    _close(g["norm"], w["norm"], rtol, "weights ‖·‖")
    # the sum cancels (it can be far smaller than the norm): its tolerance is relative to the norm
    assert abs(g["sum"] - w["sum"]) <= rtol * w["norm"], f"weights Σ: {g['sum']!r} vs stored {w['sum']!r}"


def test_the_margin_rule_fails_a_sign_change_far_from_zero_and_reports_one_near_it():
    """The margin rule itself, on a stored run with its scalars moved: a sign change of a subset mean that
    lay within the tolerance of 0 stops the comparison with a reason; moving a mean far across 0 fails.
    Red if the rule forgave every sign change (the second case passes) or none (the first fails)."""
    want = _stored("lora-pac-zpl-opt")
    design, scalars = want["design"], want["scalars"]
    means = _subset_means(scalars[0], design)[0]
    j = int(np.argmin(np.abs(means)))
    members = [i for i, m in enumerate(design[j]) if m]

    def moved(by: float) -> dict:
        rows = [list(r) for r in scalars[0]]
        for i in members:
            rows[0][i] -= by
        return {**want, "scalars": [rows, *scalars[1:]]}

    near = moved(means[j] + math.copysign(SCALAR_ATOL / 4, means[j]))  # just across 0, still within tolerance
    if abs(means[j]) <= SCALAR_ATOL / 2:
        assert "within" in compare_model_part(near, want)
    far = moved(means[j] + math.copysign(0.5, means[j]))
    with pytest.raises(AssertionError):
        compare_model_part(far, want)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_is_bit_identical_when_repeated(name, tmp_path_factory, tmp_path, monkeypatch):
    """Within one environment the engine is deterministic bit for bit: the same records, scalars,
    statement and weights' sha256 twice. Red if anything in a run drew from an unseeded source (e.g. the
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
