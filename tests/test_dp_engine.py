"""DP runs end to end: what their engine executes (what a run publishes about its file:
tests/test_file_adjacency.py).

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
from fractions import Fraction

import numpy as np
import pytest
import torch


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
