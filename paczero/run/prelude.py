"""A run's prelude, before the loop: the mechanism the config names, the run folder claimed and locked, a new
run's run.json (``begin``, given the loop's run state); which runs keep their batches private (the DP baselines);
the records run.json and summary.json share."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from paczero.checkpoint import MARKER, atomic_json, clear_run_dir, prepare_run_dir, run_record
from paczero.config import DP_MECHANISMS, TrainConfig
from paczero.privacy.statement import secret_source
from paczero.run.build import Given, Setup
from paczero.run.journal import check_resumed_config
from paczero.run.publish import make_stage

_log = logging.getLogger("paczero.train")  # warnings: on stderr (the CLI prints them as "paczero: warning: ...")


def make_mechanism(cfg: TrainConfig, n_universe: int, private_rng: np.random.Generator,
                   design: np.ndarray | None = None, secret_rng=None):
    """The configured mechanism. The candidate design and the secret index j* come from ``secret_rng``
    (a key of their own, :func:`paczero.privacy.subsets.secret_generator`; default: ``private_rng``), the
    coins, noise and Poisson masks from ``private_rng``.

    ``design`` is given when resuming (the checkpoint's design); otherwise it is drawn. A resumed
    mechanism's j* comes from its saved state.
    """
    from paczero.mechanisms import build_mechanism
    from paczero.privacy.subsets import balanced_design

    name = cfg.mechanism
    if name in DP_MECHANISMS:
        from paczero.mechanisms import DPSGD, DPAggZO, DPZero, DPZeroAggZO1

        if name in ("dpzero", "dp-sgd"):  # normalised by q * n_train: under add-or-remove adjacency N is private
            return (DPSGD if name == "dp-sgd" else DPZero)(
                n_universe, cfg.epsilon, cfg.delta, cfg.steps, cfg.sample_rate, cfg.dp_clip,
                accountant=cfg.accountant, seed=private_rng, public_size=cfg.n_train)
        return (DPAggZO if name == "dp-aggzo" else DPZeroAggZO1)(  # dpzero-aggzo1: DP-AggZO's code at K = 1
            n_universe, cfg.epsilon, cfg.delta, cfg.steps, cfg.sample_rate, cfg.dp_clip, cfg.num_directions,
            accountant=cfg.accountant, seed=private_rng)
    if name in ("mezo", "adamw"):  # mini-batches from the public seed
        return build_mechanism(name, batch_size=cfg.batch_size, seed=cfg.seed)
    secret_rng = private_rng if secret_rng is None else secret_rng
    if design is None:
        design = balanced_design(n_universe, cfg.num_subsets, secret_rng)
    secret = int(secret_rng.integers(cfg.num_subsets))
    common = dict(num_subsets=cfg.num_subsets, design=design, secret=secret, seed=private_rng)
    if name == "pac-zpl":
        return build_mechanism(name, coin_step=cfg.coin_step, **common)
    if name == "pac-mi":
        return build_mechanism(name, total_mi=cfg.mi_budget, total_steps=cfg.steps, schedule=cfg.schedule,
                               coin_step=cfg.coin_step, noised_coef=cfg.noised_coef, **common)
    if name == "hybrid":
        return build_mechanism(name, total_mi=cfg.mi_budget, total_steps=cfg.steps, switch_step=cfg.switch_step,
                               schedule=cfg.schedule, coin_step=cfg.coin_step, noised_coef=cfg.noised_coef, **common)
    return build_mechanism(name, **common)


def resolved(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def claim_run_dir(cfg: TrainConfig, ranks, given: Given | None = None):
    """Rank 0's output folder, checked and locked (``(None, None)`` on the other ranks). The cheap checks
    come first; under torchrun every rank learns of any rank's bad input (``ranks.agree``)."""
    from paczero.run.distributed import shared_settings
    from paczero.models import check_model_source

    problem, run_dir, lock = None, None, None
    try:
        if given is None or given.model is None:  # a model given in memory names no source
            check_model_source(cfg.model)
        if ranks.is_main:
            local_model = Path(cfg.model).expanduser()
            run_dir, lock = prepare_run_dir(cfg.out_dir, overwrite=cfg.overwrite, resume=cfg.resume,
                                            reads={"data file": cfg.data if cfg.data != "demo" else None,
                                                   "model": str(local_model) if local_model.exists() else None})
            if cfg.resume:
                saved = json.loads(run_record(run_dir).read_text())["config"]
                if saved.get("data") not in (None, "demo"):  # recorded as given before paths were resolved
                    saved["data"] = resolved(saved["data"])
                check_resumed_config(saved, cfg)
    except ValueError as e:
        problem = e
    try:
        ranks.agree("settings", shared_settings(cfg), problem)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return run_dir, lock


def begin(run, secrets=None) -> None:
    """A new run's run.json (after ``--overwrite`` cleared the folder: every input is read and checked by now)."""
    cfg = run.cfg
    kept = clear_run_dir(run.out_dir) if cfg.overwrite else []
    if kept:
        _log.warning(f"--overwrite replaced the run in {str(run.out_dir)!r} and kept what paczero did not write "
                     f"there: {', '.join(kept)}")
    if run.run_dir != run.out_dir:  # a DP run: its private stage (made after --overwrite cleared the folder)
        make_stage(run.out_dir)
    if secrets is not None:  # the loop's secrets written before the record (the canaries' bits: paczero/train.py)
        secrets(run)
    public_data = {} if private_batches(cfg) else {"universe_size": run.n, "data_fingerprint": run.fingerprint}
    atomic_json(run.run_dir / "run.json", {"marker": MARKER, "config": cfg.to_dict(), **public_data,
                                           "secret_source": secret_source(cfg, claims_privacy(run.mechanism)),
                                           "directions": run.perturber.directions, **in_memory_record(run.setup),
                                           **prompt_record(run.setup)})


def private_batches(cfg: TrainConfig) -> bool:
    """The DP baselines score a Poisson sample of the universe: its size is private, and so are the train loss
    over it and every time that grows with it (per step, in total, a progress bar's rate)."""
    return cfg.mechanism in DP_MECHANISMS


def claims_privacy(mechanism) -> bool:
    return mechanism.privacy_statement().get("private") is not False


def prompt_record(setup: Setup) -> dict:
    """run.json's and summary.json's ``prompt`` (classification): the template and answer words the run scores,
    where they came from, and template auto's candidates with their zero-shot dev metrics."""
    return {"prompt": setup.prompt} if setup.prompt is not None else {}


def in_memory_record(setup: Setup) -> dict:
    """run.json's and summary.json's note of what was given as objects in memory (the config's ``model``
    then names the model object's ``name_or_path``)."""
    return {**({"in_memory": list(setup.in_memory)} if setup.in_memory else {}),
            **({"data_use": setup.data_use} if setup.data_use else {})}


def fmt(metrics: dict) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
