"""DP runs end to end: what a run publishes about its private data, and what its engine executes.

* **Adjacent files** (``test_adjacent_files_publish_nothing_the_noise_does_not_explain``): two runs of each DP
  mechanism with the same settings and ``--private-seed`` on two files whose training rows differ by one
  (40 and 39). Everything a run publishes (stdout and stderr, run.json, summary.json, the model card,
  task.json, evals.jsonl, log.jsonl, the checkpoints' public files, the config a tracker records) is
  compared: the two may differ only in what the mechanism's noisy outcome decides (metrics, the released
  coefficients, the dev-best step, hashes of weights), never in a size or a noise scale.
* **The DP-SGD engine** (``test_dpsgd_hands_adamw_the_noisy_clipped_sum_of_its_poisson_sample``, with every
  gradient over C; ``test_dpsgd_adds_a_gradient_under_C_as_it_is``, gradients under and over C;
  ``test_dpsgd_full_fine_tuning_with_ghost_clipping_hands_adamw_its_replay``, ghost clipping): the gradient
  a run hands AdamW at each step, taken in the training loop, against the same gradient computed here
  apart from paczero's engine: the Poisson mask and the noise replayed from the private stream, each
  sampled example's gradient by plain autograd, clipped by hand.
* **The DP zeroth-order baselines** (``test_the_released_dp_coefficient_is_the_one_that_moves_the_weights``):
  each released coefficient is the noisy clipped sum replayed from the private stream, and the weights move
  by exactly that coefficient along the public direction.
"""
from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from paczero.cli import main

# ----------------------------------------------------------------------------- adjacent files
WORDS = ["great", "awful", "fine", "bad", "superb", "dull", "lovely", "boring"]


def _rows() -> list[dict]:
    """40 training rows, 8 validation and 8 test rows (a split column: dev and test are the same in both
    files, so the files differ in one training row only)."""
    rows = [{"sentence": f"a {WORDS[i % 8]} film, take {i}", "label": int(i % 2 == 0), "split": "train"}
            for i in range(40)]
    rows += [{"sentence": f"the {WORDS[i]} show {i}", "label": int(i % 2 == 0), "split": "validation"}
             for i in range(8)]
    rows += [{"sentence": f"this {WORDS[(i + 3) % 8]} play {i}", "label": int(i % 2 == 1), "split": "test"}
             for i in range(8)]
    return rows


MECHANISM_FLAGS = {
    "dp-sgd": ["--dp-clip", "0.05"],
    "dpzero": [],
    "dp-aggzo": ["--num-directions", "2"],
    "dpzero-aggzo1": [],
}
SIZES = ["--n-train", "32", "--n-dev", "8", "--n-test", "8"]
#: what a DP run's noisy outcome decides: metrics, released coefficients, the dev-best step
OUTCOME_KEYS = {"loss", "accuracy", "f1", "exact_match", "coef", "selected_step", "best_step"}


def _argv(mechanism: str, data: Path, out: Path, sizes: list[str]) -> list[str]:
    return (["train", "--model", "tiny-gpt2", "--task", "sst2", "--data", str(data), "--mechanism", mechanism,
             "--epsilon", "2", "--sample-rate", "0.5", "--steps", "2", "--eval-every", "2", "--lr", "1e-3",
             "--private-seed", "0", "--dtype", "fp32", "--no-progress", "--out-dir", str(out)]
            + MECHANISM_FLAGS[mechanism] + sizes)


def _published(run: Path) -> dict[str, object]:
    """Every file of the run folder a reader gets (not the owner-only journal and mechanism state): JSON
    parsed, text as lines, other files by their size (weights: their values are the noisy outcome)."""
    out = {}
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run).as_posix()
        if not path.is_file() or rel.startswith("private/") or path.name in ("private.json", ".paczero.lock"):
            continue
        if path.suffix == ".json":
            out[rel] = json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            out[rel] = [json.loads(line) for line in path.read_text().splitlines()]
        elif path.suffix in (".md", ".txt", ".jinja"):
            out[rel] = path.read_text().splitlines()
        else:
            out[rel] = ("bytes", path.stat().st_size if path.suffix != ".png" else None)
    return out


def _one_run(mechanism: str, rows: list[dict], tmp: Path, sizes: list[str], capsys, monkeypatch) -> dict:
    """One `paczero train` in this process on ``rows`` written to ``tmp/d/data.jsonl``; what it published.
    Both runs of a pair use the same paths (run.json records them), one after the other."""
    from paczero import train as train_module
    from paczero.run.trackers import open_tracker, public_config

    where = tmp / "d"
    where.mkdir()
    data, out = where / "data.jsonl", where / "run"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tracked = []
    monkeypatch.setattr(train_module, "open_tracker",
                        lambda cfg, *a, **k: (tracked.append(public_config(cfg)), open_tracker(cfg, *a, **k))[1])
    capsys.readouterr()
    code = main(_argv(mechanism, data, out, sizes))
    captured = capsys.readouterr()
    public = {"exit": code, "stdout": captured.out.splitlines(), "tracker config": tracked,
              "stderr": [line for line in captured.err.splitlines() if not line.startswith("paczero: machine busy")]}
    if out.exists():
        public.update(_published(out))
    where.rename(tmp / f"done-{len(list(tmp.glob('done-*')))}")  # the other run writes to the same paths
    return public


def _outcome_line(a: str, b: str) -> bool:
    """Two lines of text that differ only in a metric's digits or the dev-best step."""
    if not re.search(r"loss|accuracy|\bf1\b|fine-tuned", a):
        return False
    mask = lambda s: re.sub(r"step \d+", "step #", re.sub(r"\d+\.\d+", "#", s))  # noqa: E731
    return mask(a) == mask(b)


def _differences(a, b, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ beyond the noisy outcome (OUTCOME_KEYS, metric lines, weight hashes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())}"]
        found = []
        for key in a:
            if key in OUTCOME_KEYS or ("manifest.json/" in path + "/" and re.fullmatch(r"[0-9a-f]{64}", str(a[key]))):
                continue
            if key == "step" and path.endswith("/best"):  # the dev-best step (public.json)
                continue
            found += _differences(a[key], b[key], f"{path}/{key}")
        return found
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        found = []
        for i, (x, y) in enumerate(zip(a, b)):
            if isinstance(x, str) and isinstance(y, str) and x != y and _outcome_line(x, y):
                continue
            found += _differences(x, y, f"{path}[{i}]")
        return found
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.parametrize("sizes", ["explicit", "default"])
@pytest.mark.parametrize("mechanism", list(MECHANISM_FLAGS))
def test_adjacent_files_publish_nothing_the_noise_does_not_explain(mechanism, sizes, tmp_path, capsys, monkeypatch):
    """Two runs, same settings and private seed, on files whose training rows are 40 and 39 (one row
    removed): every public place compared, and the only differences are the noisy outcome's. ``default`` (no
    --n-train/--n-dev/--n-test) is the small-file path: both runs are refused in the same one line naming
    --n-train (exit 2, before any model loads, no run folder), so they publish the same. ``explicit``: the runs
    go through with U of exactly the public n_train rows; sizes, sigma and every setting agree, and sigma is
    sigma C / (q n_train) of the published noise multiplier (DP-AggZO's: over its Laplace-noised size, the same
    draw in both runs). Red with the old ``sizes_as_given`` that sets n_train = len(train) for DP (stderr
    'U = 40 rows' vs 39, config.n_train, sizes.universe, task.json, the card, the tracker's config, every log
    sigma), and red if a DP run.json carried its data fingerprint (``_private_batches`` ignored in ``_begin``)."""
    rows = _rows()
    given = SIZES if sizes == "explicit" else []
    a = _one_run(mechanism, rows, tmp_path, given, capsys, monkeypatch)
    b = _one_run(mechanism, rows[1:], tmp_path, given, capsys, monkeypatch)
    differences = _differences(a, b)
    assert differences == []
    if sizes == "default":
        assert a["exit"] == 2 and a["stdout"] == [] and "run.json" not in a
        (line,) = a["stderr"]
        assert line.startswith(f"paczero: error: {mechanism} takes no sample size from its data") and "--n-train" in line
        return
    assert a["exit"] in (0, None) and a["run.json"]["config"]["n_train"] == 32
    assert a["summary.json"]["sizes"] == {"universe": 32, "dev": 8, "test": 8}
    assert a["tracker config"][0]["n_train"] == 32 and "training universe of 32 examples" in "\n".join(
        a["model/README.md"])
    privacy = a["summary.json"]["privacy"]
    sigmas = {s for r in a["log.jsonl"] for s in (r["sigma"] if isinstance(r["sigma"], list) else [r["sigma"]])}
    assert len(a["log.jsonl"]) == 2 and len(sigmas) == 1
    clip = 0.05 if mechanism == "dp-sgd" else 25.0
    if mechanism in ("dp-sgd", "dpzero"):
        assert sigmas.pop() == pytest.approx(privacy["noise_multiplier"] * clip / (0.5 * 32), rel=1e-12)
    else:  # K sigma C / (q (N + X)): N is the public n_train here, X the same Laplace draw in both runs
        k = privacy["num_directions"]
        noisy_n = k * privacy["noise_multiplier"] * clip / (0.5 * sigmas.pop())
        assert noisy_n == pytest.approx(round(noisy_n), abs=1e-6)


def test_the_python_api_refuses_sizes_taken_from_the_data(tmp_path):
    """PACZeroTrainer, a DP mechanism: a train_dataset without n_train, a train_dataset alone (dev and test drawn
    from it) without n_dev and n_test, and a data file without sizes are each refused in one line naming
    n_train, before a model loads; with the sizes set the check passes (a PAC run needs none). Red if the API
    used every row of train_dataset as U for DP (the run would publish their number)."""
    from paczero import PACZeroTrainer
    from paczero.config import ConfigError, TrainConfig

    rows = [{"sentence": r["sentence"], "label": r["label"]} for r in _rows() if r["split"] == "train"]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    common = dict(task="sst2", config={"model": "tiny-gpt2"}, mechanism="dpzero", epsilon=2.0, steps=2,
                  eval_every=2, progress=False, out_dir=str(tmp_path / "run"))
    for trainer in (PACZeroTrainer(train_dataset=rows, **common),
                    PACZeroTrainer(train_dataset=rows, n_train=16, **common),
                    PACZeroTrainer(train_dataset=rows, eval_dataset=rows[:8], n_dev=8, **common),
                    PACZeroTrainer(data=str(data), **common)):
        with pytest.raises(ConfigError) as error:
            trainer.train(log=lambda line: None)
        message = str(error.value)
        assert "\n" not in message and "n_train" in message and "--n-train" not in message, message
        assert message.startswith("dpzero takes no sample size from its data")
    assert not (tmp_path / "run").exists()
    from paczero.api import _check_dp_sizes

    datasets = {"train_dataset": rows, "eval_dataset": None, "test_dataset": None}
    cfg = TrainConfig(model="tiny-gpt2", task="sst2", mechanism="dpzero", epsilon=2.0).validate()
    _check_dp_sizes(cfg, datasets, {"n_train", "n_dev", "n_test"})
    _check_dp_sizes(cfg, {**datasets, "eval_dataset": rows[:8]}, {"n_train"})
    _check_dp_sizes(cfg.replace(mechanism="pac-zpl", epsilon=None), datasets, set())


# ----------------------------------------------------------------------------- the DP-SGD engine
def _engine_config(tmp_path, **overrides):
    from paczero.config import TrainConfig

    settings = dict(model="tiny-llama", task="demo", data="demo", track="lora", n_train=8, n_dev=4, n_test=4,
                    mechanism="dp-sgd", epsilon=2.0, sample_rate=0.5, dp_clip=1e-3, steps=3, eval_every=3,
                    checkpoint_every=3, lr=1e-2, weight_decay=0.0, private_seed=11, seed=0, dtype="fp32",
                    progress=False, eval_zero_shot=False, device="cpu", out_dir=str(tmp_path / "run"))
    return TrainConfig(**{**settings, **overrides}).validate()


def _replayed_poisson_mask(rng, q: Fraction, n: int) -> np.ndarray:
    """The Poisson sample as the private stream defines it: each of the n examples joins iff a uniform integer
    in [0, den) lies below num (q = num / den exactly)."""
    return np.asarray(rng.integers(0, q.denominator, size=n), dtype=np.int64) < q.numerator


def _example_gradient(setup, params, example) -> torch.Tensor:
    """One example's gradient at the model's current weights, by plain autograd (float64, flattened)."""
    (batch,) = setup.task.make_batches([example], token_budget=4096)
    with torch.enable_grad():
        grads = torch.autograd.grad(setup.task.losses(setup.model, batch)[0], params)
    return torch.cat([x.double().flatten() for x in grads])


def _a_clip_between_the_gradients(cfg) -> float:
    """A clip C with about half of the universe's per-example gradient norms (at the initial weights) below it:
    the geometric mean of the two middle norms."""
    from paczero.models import trainable_parameters
    from paczero.run.build import build

    setup = build(cfg)
    params = [p.requires_grad_(True) for _, p in trainable_parameters(setup.model, cfg.track)]
    norms = sorted(float(_example_gradient(setup, params, ex).norm()) for ex in setup.universe)
    middle = len(norms) // 2
    return math.sqrt(norms[middle - 1] * norms[middle])


def _dpsgd_against_its_replay(cfg, monkeypatch) -> tuple[list[float], list[int], str]:
    """``cfg``'s run through ``paczero.train.train``; the gradient on every parameter at the moment AdamW steps
    (torch's AdamW.step intercepted, with the weights it is about to update) against the gradient computed here
    apart from paczero's engine: the private stream replayed (a generator of the same seed: the Poisson mask as
    integers below q's numerator, then the noise, standard normals times sigma C, sigma the noise multiplier
    the run states, itself dp-accounting's), each sampled example's gradient at those weights by plain
    autograd, one example at a time, clipped to C by hand (times min(1, C / norm): a gradient under C enters
    as it is), summed, plus the noise, over the public q n_train. Returns the sampled examples' gradient norms,
    the batch sizes and the engine's way to the clipped sum (hooks or ghost)."""
    from dp_accounting import dp_event, mechanism_calibration
    from dp_accounting.rdp import rdp_privacy_accountant

    from paczero.fo import dpsgd_step
    from paczero.models import trainable_parameters
    from paczero.privacy.subsets import private_generator
    from paczero.run.build import build
    from paczero.train import train

    seen, modes = [], []
    real_step, real_mode = torch.optim.AdamW.step, dpsgd_step.grad_sample_mode

    def step(self, *args, **kwargs):
        params = [p for group in self.param_groups for p in group["params"]]
        seen.append(([p.detach().clone() for p in params], [p.grad.detach().clone() for p in params]))
        return real_step(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch.optim.AdamW, "step", step)
        patch.setattr(dpsgd_step, "grad_sample_mode", lambda *a: modes.append(real_mode(*a)) or modes[-1])
        summary = train(cfg, log=lambda line: None)
    assert len(seen) == cfg.steps and len(modes) == 1
    sigma = summary["privacy"]["noise_multiplier"]
    assert sigma == pytest.approx(mechanism_calibration.calibrate_dp_mechanism(
        rdp_privacy_accountant.RdpAccountant, lambda s: dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(cfg.sample_rate, dp_event.GaussianDpEvent(s)), cfg.steps),
        cfg.epsilon, cfg.delta), rel=1e-5)

    setup = build(cfg)  # the same universe, and a model to compute the reference gradients on
    params = [p.requires_grad_(True) for _, p in trainable_parameters(setup.model, cfg.track)]
    numel = sum(p.numel() for p in params)
    rng = private_generator(cfg.private_seed)
    clip, denominator = cfg.dp_clip, cfg.sample_rate * cfg.n_train
    norms, sizes = [], []
    for weights, got in seen:
        mask = _replayed_poisson_mask(rng, Fraction(cfg.sample_rate), len(setup.universe))
        noise = np.asarray(rng.standard_normal(numel), dtype=np.float64) * (sigma * clip)
        sizes.append(int(mask.sum()))
        with torch.no_grad():
            for p, w in zip(params, weights):
                p.copy_(w)
        total = torch.zeros(numel, dtype=torch.float64)
        for i in np.flatnonzero(mask):
            g = _example_gradient(setup, params, setup.universe[i])
            norms.append(float(g.norm()))
            total += g * min(1.0, clip / norms[-1])
        want = (total + torch.from_numpy(noise)) / denominator
        got = torch.cat([x.double().flatten() for x in got])
        # float32 gradients: the noise rounded to the parameters' dtype (6e-8 of each coordinate) at most
        assert float((got - want).norm()) <= 1e-3 * clip / denominator + 1e-6 * float(want.norm()), \
            (len(sizes), float((got - want).norm()))
    assert any(0 < b < cfg.n_train for b in sizes), sizes  # a proper sample: the whole universe would differ
    return norms, sizes, modes[0]


def test_dpsgd_hands_adamw_the_noisy_clipped_sum_of_its_poisson_sample(tmp_path, monkeypatch):
    """A 3-step DP-SGD run (tiny-llama, LoRA, C = 1e-3, q = 0.5, N = n_train = 8, a fixed private seed) against
    its replay (:func:`_dpsgd_against_its_replay`), every example's gradient above 2C (every one clipped).
    Planted faults, each tried and each red: the noise drawn and not added (``s + 0.0 * z`` in dpsgd_step); the
    noise scaled by sigma instead of sigma C (DPSGD.noise); one row of a micro-batch unclipped (clipped_sum
    adding back that row's gradient minus its clipped one); the whole universe scored instead of the Poisson
    sample (DPSGD.batch_indices returning every index after drawing its mask)."""
    cfg = _engine_config(tmp_path)
    norms, _, mode = _dpsgd_against_its_replay(cfg, monkeypatch)
    assert mode == "hooks" and min(norms) > 2 * cfg.dp_clip  # every example's gradient is clipped


def test_dpsgd_adds_a_gradient_under_C_as_it_is(tmp_path, monkeypatch):
    """The branch the test above never takes: C set between the examples' gradient norms (the geometric mean of
    the two middle norms at the initial weights), so that the sampled examples mix gradients under C, which
    enter the sum unscaled, with gradients over C, clipped to C; the same 3-step LoRA run against its replay.
    Planted fault, tried and red: every gradient rescaled to C (Opacus's per-example clip factor C / norm without
    its cap at 1, in clipped_sum), which moves the sum by C minus the norm of each gradient under C."""
    cfg = _engine_config(tmp_path)
    cfg = cfg.replace(dp_clip=_a_clip_between_the_gradients(cfg)).validate()
    norms, _, mode = _dpsgd_against_its_replay(cfg, monkeypatch)
    assert mode == "hooks"
    assert min(norms) < 0.9 * cfg.dp_clip and max(norms) > 1.1 * cfg.dp_clip, (norms, cfg.dp_clip)


def test_dpsgd_full_fine_tuning_with_ghost_clipping_hands_adamw_its_replay(tmp_path, monkeypatch):
    """The full fine-tuning path: tiny-llama with its own output head (untied: Opacus's ghost clipping applies,
    per-example norms without per-example gradients, then a second backward reweighted by the clip factors),
    ``--track ft``, 2 steps through ``paczero.train.train``, C between the examples' gradient norms as above,
    against the same replay (every weight of the model, each sampled example's gradient by plain autograd).
    Planted fault, tried and red: ghost clipping dropping the noise (dpsgd_step adding ``z`` only when the engine's
    mode is not ghost)."""
    from paczero import models

    tiny = models._tiny_config
    monkeypatch.setattr(models, "_tiny_config", lambda name, v: tiny(name, v).__class__(
        **{**tiny(name, v).to_dict(), "tie_word_embeddings": False}))
    cfg = _engine_config(tmp_path, track="ft", steps=2, eval_every=2, checkpoint_every=2)
    cfg = cfg.replace(dp_clip=_a_clip_between_the_gradients(cfg)).validate()
    norms, _, mode = _dpsgd_against_its_replay(cfg, monkeypatch)
    assert mode == "ghost"
    assert min(norms) < cfg.dp_clip < max(norms), (norms, cfg.dp_clip)


# ----------------------------------------------------------------------------- the DP zeroth-order baselines
@pytest.mark.parametrize("mechanism, k", [("dpzero", 1), ("dp-aggzo", 2), ("dpzero-aggzo1", 1)])
def test_the_released_dp_coefficient_is_the_one_that_moves_the_weights(mechanism, k, tmp_path, monkeypatch):
    """A 3-step run of a DP zeroth-order baseline (tiny-llama, LoRA, q = 0.5, C = 0.5, a fixed private seed)
    through ``paczero.train.train``. Replayed here from the private stream (a generator of the same seed: for
    DP-AggZO first the discrete Laplace of the noisy size, then per step the Poisson mask as integers below q's
    numerator, then K exact discrete Gaussians of scale sigma 2^40, sigma the run's stated noise multiplier)
    with the per-example scalars the engine handed the mechanism, clipped by hand (DPZero: into [-C, C];
    DP-AggZO: each example's K-vector over K to L2 norm C) and put on the C 2^-40 grid: every coefficient the run
    releases (and log.jsonl publishes) is, to a grid unit per example, that noisy sum over q n_train (DPZero) or q (N + X) times K (DP-AggZO),
    the examples scored are the replayed sample, and the weights move from one step to the next by exactly
    -(lr / K) sum_k coef_k z_k, z the public direction of (seed, step, k). Planted faults, each tried and red:
    the discrete Gaussian drawn and not added (``s + 0 * discrete_gaussian(...)`` in ``noisy_grid_sum``); the
    weights moved by another coefficient than the one released (``1.01 * c`` in ``train``'s release). Red too if
    a step scored another sample than the replayed one."""
    from paczero import zo
    from paczero import train as train_module
    from paczero.models import trainable_parameters
    from paczero.privacy.exact_noise import GRID_BITS, discrete_gaussian, discrete_laplace
    from paczero.privacy.subsets import private_generator
    from paczero.run.build import build

    cfg = _engine_config(tmp_path, mechanism=mechanism, num_directions=k, dp_clip=0.5, mu=1e-2, lr=1e-3)
    seen = {"batches": [], "scalars": [], "coefs": [], "weights": []}
    perturbers = []

    class Recorded(zo.Perturber):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            perturbers.append(self)

    real_make = train_module.make_mechanism

    def make(*args, **kwargs):
        mech = real_make(*args, **kwargs)
        batch_indices, step = mech.batch_indices, mech.step

        def recorded_batch(n):
            seen["weights"].append([p.detach().clone() for p in perturbers[0].params])  # theta_t
            idx = batch_indices(n)
            seen["batches"].append(idx.tolist())
            return idx

        def recorded_step(scalars):
            seen["scalars"].append(np.array(scalars, dtype=np.float64))
            releases = step(scalars)
            seen["coefs"].append([r.coef for r in releases])
            return releases

        mech.batch_indices, mech.step = recorded_batch, recorded_step
        return mech

    monkeypatch.setattr(zo, "Perturber", Recorded)
    monkeypatch.setattr(train_module, "make_mechanism", make)
    summary = train_module.train(cfg, log=lambda line: None)
    monkeypatch.undo()
    logged = [json.loads(line)["coef"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [c if isinstance(c, list) else [c] for c in logged] == seen["coefs"]

    privacy, n, q, clip = summary["privacy"], cfg.n_train, Fraction(cfg.sample_rate), cfg.dp_clip
    rng = private_generator(cfg.private_seed)
    if mechanism == "dpzero":
        denominator = cfg.sample_rate * n
    else:
        denominator = cfg.sample_rate * max(n + discrete_laplace(rng, privacy["laplace_scale"]), 1)
    unit, scale = 2 ** GRID_BITS, Fraction(privacy["noise_multiplier"]) * 2 ** GRID_BITS
    for t in range(cfg.steps):
        mask = _replayed_poisson_mask(rng, q, n)
        assert seen["batches"][t] == np.flatnonzero(mask).tolist()
        per_example = seen["scalars"][t].T / k  # [B, K]
        norms = np.linalg.norm(per_example, axis=1, keepdims=True)
        clipped = per_example * np.minimum(1.0, clip / np.maximum(norms, 1e-300))
        sums = np.rint(clipped * (unit / clip)).astype(np.int64).sum(axis=0) if len(clipped) else np.zeros(k, int)
        noisy = [int(s) + discrete_gaussian(rng, scale * scale) for s in sums]
        want = [k * math.ldexp(float(v), -GRID_BITS) * clip / denominator for v in noisy]
        grid_unit = k * math.ldexp(clip, -GRID_BITS) / denominator  # a row rounded over C is pulled back a unit
        assert seen["coefs"][t] == pytest.approx(want, rel=1e-12, abs=(len(clipped) + 1) * grid_unit)

    reference = build(cfg, with_model=True)
    params = trainable_parameters(reference.model, cfg.track)
    directions = zo.Perturber(reference.model, params, cfg.seed)
    for t in range(cfg.steps - 1):
        before, after = seen["weights"][t], seen["weights"][t + 1]
        for i, (b, a) in enumerate(zip(before, after)):
            move = sum(float(c) * directions.direction(t, j, i).double() for j, c in enumerate(seen["coefs"][t]))
            want = b.double() - cfg.lr / k * move
            assert torch.allclose(a.double(), want, rtol=0, atol=1e-6 * float(b.abs().max() + move.abs().max())), (t, i)
        assert any(not torch.equal(a, b) for a, b in zip(after, before))
