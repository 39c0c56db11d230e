"""Dev-best selection counts the weights before training (step 0): a run never releases weights that score
worse on dev than the base model, and says so when it releases the base."""
from __future__ import annotations

import json

from paczero.config import TrainConfig
from paczero.train import train

RUN = dict(model="tiny-llama", task="demo", n_train=12, n_dev=8, n_test=8, steps=4, eval_every=2, checkpoint_every=2,
           num_subsets=4, private_seed=3, progress=False, dtype="fp32", select_metric="loss")


def _dev_shifted(monkeypatch, shift: float) -> None:
    """Every dev evaluation after the zero-shot one reports its loss plus ``shift``: trained steps that lose
    (shift > 0) or gain (shift < 0) on dev against the base model, whatever the tiny random model learns."""
    import paczero.train

    real, seen = paczero.train.evaluate, []

    def evaluate(setup, enc):
        metrics = real(setup, enc)
        if enc is setup.dev_enc:
            if seen:
                metrics = {**metrics, "loss": metrics["loss"] + shift}
            seen.append(metrics)
        return metrics

    monkeypatch.setattr(paczero.train, "evaluate", evaluate)


def test_a_run_whose_steps_all_lose_on_dev_releases_the_base(tmp_path, monkeypatch, capsys):
    """Every trained step's dev loss is above the zero-shot one: the run selects step 0, releases the weights
    before training (its test metrics are the zero-shot ones, and `paczero eval` of the released folder finds
    them too), and the log, task.json and the card say so. Red if step 0 is not a candidate (the best trained
    step is released), or if the released folder holds trained weights."""
    from paczero.cli import main

    _dev_shifted(monkeypatch, 1.0)
    lines: list[str] = []
    summary = train(TrainConfig(**RUN, lr=0.5, out_dir=str(tmp_path / "run")), log=lines.append)
    evals = [json.loads(x) for x in (tmp_path / "run" / "evals.jsonl").read_text().splitlines()]
    assert [e["best_step"] for e in evals] == [0, 0]
    assert summary["selected_step"] == 0 and summary["dev"] == summary["zero_shot"]["dev"]
    assert summary["test"] == summary["zero_shot"]["test"]
    assert any(line.startswith("no trained step beat the base model on dev") for line in lines)
    assert "Released: the weights before training (step 0" in summary["privacy_text"]
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "released: the weights before training (step 0)" in card
    assert json.loads((tmp_path / "run" / "model" / "task.json").read_text())["selected_step"] == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run" / "model"), "--split", "test"]) == 0
    test = json.loads(capsys.readouterr().out)["test"]
    assert test["accuracy"] == summary["zero_shot"]["test"]["accuracy"]
    assert abs(test["loss"] - summary["zero_shot"]["test"]["loss"]) < 1e-5


def test_a_run_that_gains_on_dev_releases_its_best_trained_step(tmp_path, monkeypatch):
    """Trained steps whose dev loss is below the zero-shot one: the best of them is released, not step 0. Red
    if step 0 always wins (the comparison inverted)."""
    _dev_shifted(monkeypatch, -1.0)
    summary = train(TrainConfig(**RUN, lr=0.5, out_dir=str(tmp_path / "run")), log=lambda *a: None)
    evals = [json.loads(x) for x in (tmp_path / "run" / "evals.jsonl").read_text().splitlines()]
    assert summary["selected_step"] == min(evals, key=lambda e: e["dev"]["loss"])["step"] != 0


def test_a_resume_keeps_step_0_as_the_best_so_far(tmp_path):
    """The dev-best bookkeeping a resume rebuilds from evals.jsonl: a best_step of 0 is the zero-shot dev metrics
    (which evals.jsonl does not hold), and with no evaluation yet the zero-shot weights are the best so far. Red
    if a resumed run forgets step 0 and releases a worse trained step."""
    from paczero.run.resume import _best_from_evals

    path = tmp_path / "evals.jsonl"
    zero = {"dev": {"loss": 0.5, "accuracy": 0.75}, "test": {"loss": 0.6, "accuracy": 0.7}}
    assert _best_from_evals(path, 4, zero) == {"step": 0, "dev": zero["dev"]}
    path.write_text(json.dumps({"step": 2, "dev": {"loss": 0.9, "accuracy": 0.5}, "best_step": 0}) + "\n")
    assert _best_from_evals(path, 4, zero) == {"step": 0, "dev": zero["dev"]}
    path.write_text(json.dumps({"step": 2, "dev": {"loss": 0.4, "accuracy": 0.8}, "best_step": 2}) + "\n")
    assert _best_from_evals(path, 4, zero) == {"step": 2, "dev": {"loss": 0.4, "accuracy": 0.8}}
