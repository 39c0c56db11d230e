"""The non-private first-order reference (``--mechanism adamw``): the gradient it hands AdamW, the update, the
mini-batch, the statement, bad input.

The references are computed here, apart from the code under test: the gradient by plain autograd, one example at
a time on the live model, averaged by hand; AdamW's first update in closed form.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from paczero.cli import main

TINY = ["train", "--model", "tiny-llama", "--task", "demo", "--data", "demo", "--mechanism", "adamw",
        "--n-train", "12", "--n-dev", "8", "--n-test", "8", "--dtype", "fp32", "--no-progress"]


def _independent_mean_gradient(setup, params, examples):
    """The mean over ``examples`` of each example's loss gradient: one forward and backward per example."""
    tensors = [p for p in params]
    total = [torch.zeros_like(p, dtype=torch.float64) for p in tensors]
    for ex in examples:
        (batch,) = setup.task.make_batches([ex], token_budget=4096)
        with torch.enable_grad():
            loss = setup.task.losses(setup.model, batch)[0]
            grads = torch.autograd.grad(loss, tensors)
        for t, g in zip(total, grads):
            t += g.double()
    return [t / len(examples) for t in total]


@pytest.mark.parametrize("track, batch_size", [("lora", None), ("ft", 5)])
def test_adamw_hands_the_optimizer_the_true_mean_gradient_and_moves_by_its_update(track, batch_size, tmp_path,
                                                                                 monkeypatch, capsys):
    """At every step of `paczero train --mechanism adamw`, the gradient handed to AdamW equals the mean over the
    step's mini-batch (the whole universe, or `--batch-size` rows drawn from the public seed) of each example's
    gradient, computed here one example at a time; after the first step each weight equals AdamW's closed-form
    first update of that gradient (p (1 - lr wd) - lr g / (|g| + eps)). Red when the gradient is the sum instead
    of the mean, when a micro-batch's gradient is dropped or counted twice, when the mini-batch scored is not the
    one drawn, or when the step leaves the weights unchanged."""
    import paczero.fo.adamw_step as adamw_step

    seen = {}
    real_attach = adamw_step.attach

    def attach(cfg, ranks, setup, params):
        fo = real_attach(cfg, ranks, setup, params)
        seen.update(setup=setup, fo=fo, checks=[])
        real_step = fo.optimizer.step
        real_indices = None

        def checked_step(*a, **k):
            mech = seen["mechanism"]
            idx = mech.last
            examples = setup.universe if idx is None else [setup.universe[i] for i in idx]
            grads = [p.grad.detach().double().clone() for p in fo.params]
            saved = [p.grad for p in fo.params]
            for p in fo.params:
                p.grad = None
            want = _independent_mean_gradient(setup, fo.params, examples)
            for p, g in zip(fo.params, saved):
                p.grad = g
            before = [p.detach().double().clone() for p in fo.params]
            out = real_step(*a, **k)
            after = [p.detach().double().clone() for p in fo.params]
            seen["checks"].append((grads, want, before, after, fo.optimizer.param_groups[0]["lr"]))
            return out

        fo.optimizer.step = checked_step
        return fo

    monkeypatch.setattr(adamw_step, "attach", attach)
    from paczero.mechanisms import reference

    real_batch = reference.NonPrivateAdamW.batch_indices

    def batch_indices(self, n):
        seen["mechanism"] = self
        self.last = real_batch(self, n)
        return self.last

    monkeypatch.setattr(reference.NonPrivateAdamW, "batch_indices", batch_indices)
    extra = ["--batch-size", str(batch_size)] if batch_size else []
    code = main(TINY + ["--track", track, "--steps", "2", "--eval-every", "2", "--lr", "1e-3", "--lr-schedule",
                        "constant", "--weight-decay", "0.1", "--out-dir", str(tmp_path / "run")] + extra)
    assert code in (0, None)
    checks = seen["checks"]
    assert len(checks) == 2
    if batch_size:
        assert len(seen["mechanism"].last) == batch_size
    for grads, want, _, _, _ in checks:
        got = torch.cat([g.flatten() for g in grads])
        ref = torch.cat([w.flatten() for w in want])
        assert float(ref.norm()) > 0
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-7 * float(ref.abs().max()))
    grads, _, before, after, lr = checks[0]
    for g, b, a in zip(grads, before, after):
        update = b * (1 - lr * 0.1) - lr * g / (g.abs() + 1e-8)
        assert torch.allclose(a, update, rtol=1e-5, atol=1e-7)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy"]["private"] is False
    capsys.readouterr()


def test_adamw_states_no_privacy_everywhere_a_guarantee_is_printed(tmp_path, capsys):
    """A run's printed statement, summary.json and model card say plainly that adamw makes no privacy claim,
    and its log keeps the (public) train loss. Red when the statement or the card claims a guarantee, or
    when the run is logged as a private-batch run."""
    out = tmp_path / "run"
    code = main(TINY + ["--steps", "2", "--eval-every", "2", "--lr", "1e-3", "--batch-size", "4",
                        "--out-dir", str(out)])
    assert code in (0, None)
    printed = capsys.readouterr().out
    assert "Privacy: none" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["privacy"]["private"] is False and summary["privacy"]["mia_bound"] is None
    assert "no privacy" in summary["privacy"]["note"]
    card = (out / "model" / "README.md").read_text()
    assert "adamw" in card and "-DP" not in card and "Privacy: none" in card
    assert "first-order AdamW" in card and "zeroth-order" not in card and "candidate subsets" not in card
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["train_loss"] is not None and r["rows"] == 4 for r in records)


@pytest.mark.parametrize("extra, words", [
    (["--epsilon", "2"], "epsilon applies to"),
    (["--num-directions", "4"], "num_directions"),
    (["--batch-size", "0"], "batch_size"),
])
def test_adamw_bad_input_one_line_exit_2(extra, words, tmp_path, capsys):
    """Settings that do not apply to adamw are refused in one line, exit 2, before a model loads."""
    code = main(TINY + ["--steps", "1", "--out-dir", str(tmp_path / "run")] + extra)
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_the_mechanism_draws_public_seeded_batches():
    """The mini-batch comes from the public seed: the same seed draws the same batches, another seed others,
    and the batch is `batch_size` distinct rows. Red when the batches come from the private generator."""
    from paczero.mechanisms import NonPrivateAdamW

    a, b, c = NonPrivateAdamW(4, seed=1), NonPrivateAdamW(4, seed=1), NonPrivateAdamW(4, seed=2)
    xa = [a.batch_indices(20).tolist() for _ in range(3)]
    assert xa == [b.batch_indices(20).tolist() for _ in range(3)]
    assert xa != [c.batch_indices(20).tolist() for _ in range(3)]
    assert all(len(set(x)) == 4 for x in xa)
    assert a.release().coef is None and a.steps == 1
    with pytest.raises(TypeError, match="gradient step"):
        a.step(np.zeros((1, 3)))
