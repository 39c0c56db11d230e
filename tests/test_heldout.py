"""The train-vs-held-out loss attack (paczero/audit/heldout.py), the out-of-domain test file, and `paczero audit --heldout`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from paczero.run.build import build
from paczero.cli import main
from paczero.config import TrainConfig
from paczero.audit.heldout import heldout_attack, record_losses
from paczero.train import train

DEMO = Path(__file__).resolve().parents[1] / "paczero" / "data" / "demo_sentiment.jsonl"


def _pairwise_auc(members: np.ndarray, heldout: np.ndarray) -> float:
    """P(a member's score beats a held-out record's) + half the ties, over every pair: the AUC's definition."""
    m, h = -members[:, None], -heldout[None, :]
    return float(((m > h).sum() + 0.5 * (m == h).sum()) / (len(members) * len(heldout)))


def test_the_attack_is_the_pairwise_auc_of_the_released_models_losses(tmp_path):
    """A tiny run with heldout_attack and ood_data: summary.json holds the attack (AUC equal to the pairwise
    definition over the model's per-record losses, recomputed here from a fresh build with the released
    weights), what bounds it, and the out-of-domain test figures, zero-shot and final. Red if the attack
    scored the wrong records (e.g. dev for held-out) or ranked by the wrong sign."""
    from safetensors.torch import load_file

    from paczero.run.build import load_trainable
    from paczero.models import trainable_parameters

    out = tmp_path / "run"
    cfg = TrainConfig(model="tiny-llama", task="sst2", data=str(DEMO), columns={"sentence": "text"}, n_train=16,
                      n_dev=8, n_test=24, steps=3, num_subsets=4, eval_every=3, private_seed=1, progress=False,
                      ood_data=str(DEMO), heldout_attack=True, out_dir=str(out))
    summary = train(cfg, log=lambda *a: None)
    att = summary["heldout_attack"]
    assert (att["members"], att["heldout"]) == (16, 24) and "not bounded by the PAC guarantee" in att["bounded_by"]
    assert att["auc_ci95"][0] <= att["auc"] <= att["auc_ci95"][1]
    assert summary["ood_test"]["accuracy"] >= 0 and "ood_test" in summary["zero_shot"]

    setup = build(cfg.replace(out_dir=str(tmp_path / "other")))
    load_trainable(trainable_parameters(setup.model, cfg.track), load_file(str(out / "selected.safetensors")))
    members, heldout = record_losses(setup, setup.universe), record_losses(setup, setup.test_enc)
    assert abs(att["auc"] - _pairwise_auc(members, heldout)) < 1e-12
    assert heldout_attack(setup)["auc"] == att["auc"]

    assert main(["audit", str(out), "--heldout", "--json", "--bootstrap", "50"]) == 0


def test_audit_heldout_refuses_to_mix_with_reveal_secret(tmp_path, capsys):
    assert main(["audit", str(tmp_path), "--heldout", "--reveal-secret"]) == 2
    assert "one at a time" in capsys.readouterr().err
    assert main(["audit", str(tmp_path), "--heldout", "--last-bits"]) == 2
    assert "one at a time" in capsys.readouterr().err


def test_audit_heldout_says_a_dp_runs_measurement_is_not_covered_by_epsilon():
    """``paczero audit --heldout`` on a DP run (the user's request: the run itself keeps it private) says that
    what it prints is a statistic of the private data that epsilon does not cover; on a PAC run it does not.
    Red if the line were dropped."""
    from paczero.audit.heldout import format_heldout

    def report(mechanism: str) -> str:
        run = {"run": "r", "mechanism": mechanism, "auc": 0.6, "auc_ci95": [0.5, 0.7], "members": 16, "heldout": 24,
               "member_loss_mean": 0.5, "heldout_loss_mean": 0.6, "bounded_by": "-"}
        return format_heldout({"per_run": [run], "auc_mean": 0.6, "auc_std": None})

    assert "epsilon does not cover them" in report("dpzero")
    assert "epsilon" not in report("pac-zpl")
