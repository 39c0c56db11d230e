"""The membership attack the field measures, beside each guarantee: the released model's loss on the records
of the universe U against held-out records of the same file (Yeom et al., 2018), as an AUC.

DP's (epsilon, delta) bounds this attack: it is a test of whether a record was in the training data. The
PAC guarantee does not: it bounds membership in the secret subset S* given U, and every record of U may
move the model. ``heldout_attack`` in a run's config measures it at the end of training (``summary.json``
``heldout_attack``; a DP run keeps it in ``private/heldout_attack.json``: its U is the private data, and
the measurement is a statistic of U that epsilon does not cover); ``paczero audit --heldout RUN...`` on
finished runs of any mechanism, on the user's request.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from paczero.audit.membership import PAC_TRANSCRIPT, _load_config, auc, auc_interval
from paczero.config import DP_MECHANISMS, ConfigError

__all__ = ["HELDOUT_BOUND", "PRIVATE_FILE", "kept_private", "record_losses", "heldout_attack", "run_heldout_attack",
           "heldout_audit", "format_heldout"]

#: where a DP run keeps its own measurement (``heldout_attack: true``): U is its private data
PRIVATE_FILE = "private/heldout_attack.json"

#: what each kind of guarantee says of the train-vs-held-out attack
HELDOUT_BOUND = {
    "dp": "bounded by the run's (epsilon, delta): DP bounds any test of whether a record was in the training data",
    "pac": "not bounded by the PAC guarantee, which bounds membership in the secret subset S* given the universe U "
           "(every record of U may influence the model)",
    "none": "no guarantee (non-private)",
}


def kept_private() -> str:
    """Why a DP run's measurement is not published: the line ``paczero audit --heldout`` repeats."""
    return ("the AUC, the counts and the mean losses are statistics of the private training data U, released "
            "outside the DP mechanism: epsilon does not cover them")


def record_losses(setup, encoded: list) -> np.ndarray:
    """The per-record losses of ``setup.model`` on ``encoded`` examples, in their order (float64)."""
    import torch

    from paczero.tasks import collect

    batches = setup.task.make_batches(encoded, token_budget=setup.cfg.token_budget)
    out = []
    with torch.inference_mode():
        for b in batches:
            out.append(setup.task.losses(setup.model, b.to(setup.device)))
    return collect(out, batches, len(encoded)).double().numpy()


def heldout_attack(setup, *, bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The loss attack (Yeom et al., 2018) on the model in ``setup``: the records of the universe U against
    the held-out test records of the same file, scored by minus the model's per-record loss. Returns the AUC
    (0.5: no better than chance), its 95 % bootstrap interval over records, the counts and what bounds it.
    Computed with the training data: an auditor's measurement of the run, not a release of it."""
    members = record_losses(setup, setup.universe)
    heldout = record_losses(setup, setup.test_enc)
    scores = -np.concatenate([members, heldout])
    labels = np.concatenate([np.ones(len(members), bool), np.zeros(len(heldout), bool)])
    mech = setup.cfg.mechanism
    kind = "dp" if mech in DP_MECHANISMS else "pac" if mech in PAC_TRANSCRIPT else "none"
    lo, hi = auc_interval(scores, labels, np.zeros(len(scores)), reps=bootstrap, seed=seed)
    return {"auc": auc(scores, labels), "auc_ci95": [lo, hi], "members": len(members), "heldout": len(heldout),
            "member_loss_mean": float(members.mean()), "heldout_loss_mean": float(heldout.mean()),
            "attack": "loss: -loss of the released model, records of U vs held-out test records of the same file",
            "bounded_by": HELDOUT_BOUND[kind]}


def run_heldout_attack(setup, run_dir: Path, log=print, *, private: bool = False) -> dict[str, Any]:
    """A run's own measurement (config ``heldout_attack``), as summary.json holds it: published where U is public
    (PAC, references); ``private`` (a DP run, whose U is the private data): kept in ``PRIVATE_FILE`` (0600, in
    the owner-only ``private/``) and named in summary.json only by where it is, since every statistic of it
    (the AUC, the count, a mean loss) is a function of U that no DP mechanism released."""
    import os

    from paczero.checkpoint import private_dir, write_json

    found = heldout_attack(setup)
    if not private:
        log(f"train-vs-held-out loss attack: AUC {found['auc']:.3f} ({found['bounded_by']})")
        return found
    path = private_dir(run_dir) / Path(PRIVATE_FILE).name
    write_json(path, found)
    os.chmod(path, 0o600)
    log(f"train-vs-held-out loss attack: in {PRIVATE_FILE} (mode 0600), not published: {kept_private()}")
    return {"file": PRIVATE_FILE, "published": False, "why": kept_private()}


def heldout_audit(run_dirs: Sequence[str | Path], *, bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """:func:`heldout_attack` on the released weights of each finished run (any mechanism), and the mean and
    spread of the AUC over the runs (``paczero audit --heldout``)."""
    from safetensors.torch import load_file

    from paczero.run.build import build, load_trainable
    from paczero.models import trainable_parameters

    per_run = []
    for run_dir in run_dirs:
        path = Path(run_dir).expanduser()
        cfg = _load_config(path)
        if not (path / "selected.safetensors").exists():
            raise ConfigError(f"run {str(run_dir)!r} is not finished (no selected.safetensors)")
        setup = build(cfg)
        load_trainable(trainable_parameters(setup.model, cfg.track), load_file(str(path / "selected.safetensors")))
        per_run.append({"run": str(path), "mechanism": cfg.mechanism, **heldout_attack(setup, bootstrap=bootstrap,
                                                                                     seed=seed)})
    aucs = [r["auc"] for r in per_run]
    return {"per_run": per_run, "auc_mean": float(np.mean(aucs)),
            "auc_std": float(np.std(aucs, ddof=1)) if len(aucs) > 1 else None}


def format_heldout(rep: dict) -> str:
    lines = ["Train-vs-held-out loss attack (computed with the training data: which records are in U):"]
    if any(r["mechanism"] in DP_MECHANISMS for r in rep["per_run"]):
        lines.append(f"  DP runs: {kept_private()}; keep what follows private.")
    for r in rep["per_run"]:
        lo, hi = r["auc_ci95"]
        lines.append(f"  {r['run']}: AUC {r['auc']:.3f} [{lo:.3f}, {hi:.3f}] ({r['members']} records of U, "
                     f"{r['heldout']} held out; mean loss {r['member_loss_mean']:.4f} vs {r['heldout_loss_mean']:.4f}); "
                     f"{r['bounded_by']}")
    if len(rep["per_run"]) > 1:
        lines.append(f"  mean AUC {rep['auc_mean']:.3f} ± {rep['auc_std']:.3f} over {len(rep['per_run'])} runs")
    return "\n".join(lines)
