"""DP-SGD (``--mechanism dp-sgd``): calibration, clipping, the end-to-end run, bad input.

The references are computed here, apart from the code under test: the noise multiplier by calling
dp-accounting's calibration on an event built in this file (and Opacus's own calibration as a second
opinion); the clipped gradient sum by plain autograd, one example at a time, clipped by hand.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from paczero.run.build import build
from paczero.cli import main
from paczero.config import TrainConfig
from paczero.mechanisms.base import Release
from paczero.mechanisms.dpsgd import DPSGD
from paczero.models import trainable_parameters


# ----------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("q, steps, epsilon, delta", [(0.0625, 100, 2.0, 1e-5), (0.25, 30, 1.0, 1e-6),
                                                      (0.01, 1000, 8.0, 1e-5)])
def test_noise_multiplier_is_dp_accountings(q, steps, epsilon, delta):
    """sigma equals dp-accounting's calibration of T Poisson-subsampled Gaussians at (q, T, eps, delta) under
    RDP, built here from dp-accounting's own events, and lies within 3 % of Opacus's RDP calibration (other
    orders, another search). Red when the mechanism calibrates for other steps, another rate, another
    epsilon, or a single Gaussian without the subsampling."""
    from dp_accounting import dp_event, mechanism_calibration
    from dp_accounting.rdp import rdp_privacy_accountant
    from opacus.accountants.utils import get_noise_multiplier

    expected = mechanism_calibration.calibrate_dp_mechanism(
        rdp_privacy_accountant.RdpAccountant,
        lambda s: dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), steps),
        epsilon, delta)
    mech = DPSGD(256, epsilon, delta, steps, q, 1.0, seed=0)
    assert mech.noise_multiplier == pytest.approx(expected, rel=1e-5)
    opacus_sigma = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=q, steps=steps,
                                        accountant="rdp")
    assert mech.noise_multiplier == pytest.approx(opacus_sigma, rel=0.03)
    statement = mech.privacy_statement()
    assert statement["epsilon_rdp_planned"] <= epsilon
    assert statement["epsilon_pld_planned"] <= epsilon * 1.01  # PLD: the tighter accountant, its own grid


def test_noise_has_the_calibrated_scale_and_comes_from_the_private_generator():
    """The noise's sample standard deviation is sigma C (200,000 draws: within 1 %), and two mechanisms with
    different private seeds draw different noise. Red when the noise is scaled by sigma alone or by C alone,
    or drawn from a public seed."""
    a, b = DPSGD(100, 2.0, 1e-5, 10, 0.1, 3.0, seed=1), DPSGD(100, 2.0, 1e-5, 10, 0.1, 3.0, seed=2)
    a.batch_indices(100)
    b.batch_indices(100)
    za, release = a.noise(200_000)
    zb, _ = b.noise(200_000)
    assert np.std(za) == pytest.approx(a.noise_multiplier * 3.0, rel=0.01)
    assert not np.allclose(za[:10], zb[:10])
    assert release.coef is None and release.branch == "dp"
    assert a.steps == 1


# ----------------------------------------------------------------------------- clipping
def _setup(track: str, model: str = "tiny-llama"):
    cfg = TrainConfig(model=model, task="demo", data="demo", track=track, n_train=8, n_dev=4, n_test=4,
                      mechanism="dp-sgd", epsilon=2.0, sample_rate=0.5, dp_clip=0.05, dtype="fp32").validate()
    setup = build(cfg)
    return setup, trainable_parameters(setup.model, track)


def _reference_clipped_sum(setup, params, examples, clip, scale):
    """Plain autograd, one example at a time, each gradient clipped to ``clip`` by hand."""
    tensors = [p.requires_grad_(True) for _, p in params]
    total = [torch.zeros_like(p, dtype=torch.float64) for p in tensors]
    norms = []
    for i, ex in enumerate(examples):
        (batch,) = setup.task.make_batches([ex], token_budget=4096)
        with torch.enable_grad():
            loss = setup.task.losses(setup.model, batch)[0] * scale[i]
            grads = torch.autograd.grad(loss, tensors)
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        norms.append(norm)
        for t, g in zip(total, grads):
            t += g.double() * min(1.0, clip / norm)
    return total, norms


@pytest.mark.parametrize("track, model", [("lora", "tiny-llama"), ("ft", "tiny-llama"), ("ft", "tiny-gpt2"),
                                          ("ft", "untied")])
def test_every_example_is_clipped_to_C_even_a_planted_huge_loss(track, model, monkeypatch):
    """Four examples, one with its loss multiplied by 1e6: Opacus's clipped sum (per-example hooks on LoRA and on
    models with tied embeddings, GPT-2's Conv1D included; ghost clipping on full fine-tuning of an untied model)
    equals the sum of the examples'
    gradients clipped one by one by hand, so the planted example moves the sum by at most C. Red when the
    gradient is summed before clipping (the planted example then dominates), or clipped per batch."""
    from paczero import models
    from paczero.fo.dpsgd_step import clipped_sum, grad_sample_mode, wrap

    if model == "untied":  # tiny-llama with its own output head: ghost clipping applies
        tiny = models._tiny_config
        monkeypatch.setattr(models, "_tiny_config", lambda name, v: tiny(name, v).__class__(
            **{**tiny(name, v).to_dict(), "tie_word_embeddings": False}))
        model = "tiny-llama"
    setup, params = _setup(track, model)
    clip = 0.05
    examples = setup.universe[:4]
    scale = torch.tensor([1.0, 1e6, 1.0, 1.0])
    reference, norms = _reference_clipped_sum(setup, params, examples, clip, scale)
    assert norms[1] > 1000 * clip  # the planted example is far above the clip
    mode = grad_sample_mode(setup.model, params, track)
    tied = any(n.endswith("lm_head.weight") for n, _ in setup.model.named_parameters(remove_duplicate=False)) \
        and len(list(setup.model.parameters())) < len(list(setup.model.named_parameters(remove_duplicate=False)))
    assert mode == ("hooks" if track == "lora" or tied else "ghost")
    fo = wrap(setup.model, params, lr=1e-3, weight_decay=0.0, clip=clip, mode=mode)
    try:
        sums = [torch.zeros_like(p, dtype=torch.float64) for p in fo.params]
        (batch,) = setup.task.make_batches(examples, token_budget=4096, max_padding=None)
        with torch.enable_grad():
            clipped_sum(fo, setup.task.losses(setup.model, batch) * scale[torch.as_tensor(batch.index)], sums)
    finally:
        fo.close()
    got = torch.cat([s.flatten() for s in sums])
    want = torch.cat([t.flatten() for t in reference])
    assert float(got.norm()) <= 4 * clip * (1 + 1e-4)
    assert torch.allclose(got, want, rtol=1e-3, atol=1e-6 * clip)


def test_a_planted_example_moves_the_weights_no_more_than_C_allows():
    """One DP-SGD step (noise drawn as zeros) on a batch holding only the planted example (loss times 1e6): the
    gradient handed to the optimizer has norm at most C / (q n_train), whatever the loss. Red without the
    per-example clip."""
    from paczero.fo.dpsgd_step import dpsgd_step, wrap

    setup, params = _setup("lora")
    clip, q, n = 0.05, 0.5, 8

    class ZeroNoise:
        denominator = q * n

        def noise(self, numel):
            return np.zeros(numel), Release(bit=0, branch="dp", coef=None)

    fo = wrap(setup.model, params, lr=1e-3, weight_decay=0.0, clip=clip)
    seen = []
    fo.optimizer.original_optimizer.step = lambda: seen.append(torch.cat([p.grad.flatten() for p in fo.params]))
    try:
        batches = setup.task.make_batches(setup.universe[:1], token_budget=4096)
        dpsgd_step(batches, fo=fo, mechanism=ZeroNoise(), loss_fn=lambda b: setup.task.losses(setup.model, b) * 1e6,
                   lr=1e-3, device="cpu")
    finally:
        fo.close()
    (grad,) = seen
    assert 0 < float(grad.norm()) <= clip / (q * n) * (1 + 1e-4)


def test_state_round_trip_continues_identically():
    """A DPSGD restored from its state draws the same next Poisson batch and the same noise; a state of another
    mechanism or another calibration is refused. Red when the private generator's state is not saved."""
    a = DPSGD(50, 2.0, 1e-5, 10, 0.2, 1.0, seed=4)
    a.batch_indices(50)
    a.noise(5)
    b = DPSGD(50, 2.0, 1e-5, 10, 0.2, 1.0, seed=5)
    b.load_state_dict(a.state_dict())
    assert a.batch_indices(50).tolist() == b.batch_indices(50).tolist()
    assert a.noise(7)[0].tolist() == b.noise(7)[0].tolist()
    with pytest.raises(ValueError):
        DPSGD(50, 1.0, 1e-5, 10, 0.2, 1.0, seed=5).load_state_dict(a.state_dict())
    with pytest.raises(TypeError, match="noisy gradient"):
        a.step(np.zeros((1, 3)))


# ----------------------------------------------------------------------------- the command line
TINY = ["train", "--model", "tiny-llama", "--task", "demo", "--data", "demo", "--mechanism", "dp-sgd",
        "--n-train", "32", "--n-dev", "8", "--n-test", "8", "--dtype", "fp32", "--no-progress", "--private-seed", "0"]


def test_tiny_run_end_to_end_with_its_statement(tmp_path, capsys):
    """`paczero train --mechanism dp-sgd` runs on the LoRA track and states (epsilon, delta) by RDP and by PLD,
    both at most the target, at the noise multiplier dp-accounting calibrates; the log keeps the Poisson batch
    private (no train loss, rows or time), as DPZero's does. Red when a statement loses an accountant, or the
    log shows the batch."""
    from paczero.privacy.dp import calibrate_noise_multiplier

    out = tmp_path / "run"
    code = main(TINY + ["--epsilon", "2", "--sample-rate", "0.25", "--dp-clip", "1", "--steps", "3",
                        "--eval-every", "3", "--lr", "1e-3", "--out-dir", str(out)])
    assert code in (0, None)
    summary = json.loads((out / "summary.json").read_text())
    p = summary["privacy"]
    assert p["mechanism"] == "dp-sgd" and p["steps"] == 3
    assert 0 < p["epsilon_pld"] <= p["epsilon_rdp"] <= 2.0
    assert p["noise_multiplier"] == pytest.approx(calibrate_noise_multiplier(2.0, 1e-5, 0.25, 3), rel=1e-12)
    assert "by the RDP accountant" in summary["privacy_text"] and "by PLD" in summary["privacy_text"]
    assert "float Gaussian" in summary["privacy_text"]
    assert summary["train_seconds"] is None
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert len(records) == 3
    assert all(r["train_loss"] is None and r["rows"] is None and r["seconds"] is None for r in records)
    card = (out / "model" / "README.md").read_text()
    assert "dp-sgd" in card and "DP-SGD (first-order" in card and "candidate subsets" not in card
    capsys.readouterr()


@pytest.mark.parametrize("extra, words", [
    (["--epsilon", "0"], "epsilon must be"),
    (["--epsilon", "-1"], "epsilon must be"),
    (["--sample-rate", "0"], "sample_rate must be in (0, 1]"),
    (["--sample-rate", "1.5"], "sample_rate must be in (0, 1]"),
    (["--num-directions", "4"], "num_directions"),
    (["--task", "squad", "--objective", "f1"], "objective nll"),
    (["--compile"], "compile does not apply to dp-sgd"),
])
def test_bad_input_one_line_exit_2(extra, words, tmp_path, capsys):
    """Bad dp-sgd settings: exit code 2 and one line naming the problem, before any model loads."""
    code = main(TINY + ["--epsilon", "2", "--steps", "2", "--out-dir", str(tmp_path / "run")] + extra)  # last wins
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and words in err[0] and err[0].startswith("paczero: error:")


def test_a_model_opacus_cannot_wrap_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """A trainable layer that keeps a buffer (a running statistic, as batch norm does: per-example clipping
    cannot cover what it accumulates) is refused with one line and exit code 2. Red when the model is wrapped
    without Opacus's validation."""
    from paczero import models

    load = models.load_model

    def with_a_buffer(*args, **kwargs):
        loaded = load(*args, **kwargs)
        name = next(n for n, _ in loaded.model.named_modules() if n.endswith("lora_A.default"))
        loaded.model.get_submodule(name).register_buffer("running_mean", torch.zeros(1))
        return loaded

    monkeypatch.setattr(models, "load_model", with_a_buffer)
    code = main(TINY + ["--epsilon", "2", "--steps", "2", "--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("paczero: error: Opacus cannot compute per-example gradients")
    assert sum(line.startswith("paczero: error") for line in err) == 1


def test_a_model_whose_layers_opacus_hooks_cannot_follow_is_one_line_exit_2(tmp_path, capsys):
    """Full fine-tuning of OPT: its learned position embedding is called with an integer beside the mask, which
    Opacus's hooks cannot record. The probe before the first evaluation turns that into one line and exit code 2,
    with no traceback and no evaluation. Red without the probe (the run fails in its first step, a traceback)."""
    code = main(TINY + ["--model", "tiny-opt", "--track", "ft", "--epsilon", "2", "--steps", "2",
                        "--out-dir", str(tmp_path / "run")])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("paczero: error: Opacus cannot compute per-example gradients for this model (ft track)")
    assert "Traceback" not in captured.err and "zero-shot" not in captured.out


def test_options_of_several_tokens_read_one_row_per_option_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """A model that reads options of several tokens one row per option (a model type the packed layout of
    paczero/tasks/options.py is not known to suit) puts each example on several model rows; Opacus would clip
    each row to C, so an example could move the sum by up to 2C. Refused with one line and exit code 2 before
    any evaluation. Red without the rows the probe sees the embedding read (``check_rows`` reading the batch's
    rows alone: the packed batch has one row an example, and the run trains, clipping per row)."""
    import paczero.tasks.options as options

    monkeypatch.setattr(options, "PACKED_TYPES", frozenset())
    code = main(TINY + ["--epsilon", "2", "--steps", "2", "--verbalizer", "0= terrible movie,1= great film",
                        "--out-dir", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.strip().splitlines()[-1].startswith("paczero: error: dp-sgd clips per model row")
    assert "zero-shot" not in captured.out


def test_options_of_several_tokens_packed_train_one_row_an_example(tmp_path, capsys):
    """Options of several tokens packed after the prompt (one model row an example) train under DP-SGD: each
    example's gradient is clipped once. Red when the probe refuses every task whose options have several
    tokens."""
    code = main(TINY + ["--epsilon", "2", "--steps", "2", "--verbalizer", "0= terrible movie,1= great film",
                        "--out-dir", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "zero-shot" in captured.out


def test_dp_sgd_from_the_command_line_takes_its_own_defaults(capsys):
    """`paczero train --mechanism dp-sgd --epsilon 2` with nothing else set: DP-SGD's gradient clip 1.0 (not the
    zeroth-order scalar's 25), rate 0.5, 25 steps, lr 1e-3, said in one line; a value the user names is kept,
    and dpzero keeps the zeroth-order defaults. Red if dp-sgd falls back to dp_clip 25 or overrides a flag."""
    import json

    from paczero.cli import main

    assert main(["train", "--mechanism", "dp-sgd", "--epsilon", "2", "--print-config"]) == 0
    captured = capsys.readouterr()
    cfg = json.loads(captured.out)
    assert (cfg["dp_clip"], cfg["sample_rate"], cfg["steps"], cfg["lr"]) == (1.0, 0.5, 25, 1e-3)
    assert "dp-sgd defaults: dp_clip 1" in captured.err
    assert main(["train", "--mechanism", "dp-sgd", "--epsilon", "2", "--dp-clip", "3", "--steps", "7",
                 "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert (cfg["dp_clip"], cfg["steps"], cfg["lr"]) == (3.0, 7, 1e-3)
    assert main(["train", "--mechanism", "dpzero", "--epsilon", "2", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["dp_clip"] == 25.0
