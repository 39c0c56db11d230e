"""Resuming a run: what to restore, what to replay, which checks.

A resumed run continues after the last step its private journal holds (:mod:`paczero.run.journal` says why a
published step is never executed again). :func:`read` finds that point and the newest checkpoint;
the mechanism is rebuilt on the checkpoint's (or journal's) design; :func:`restore` loads the weights and
the mechanism's state (a first-order run's: AdamW's state too) and brings log.jsonl and evals.jsonl to the
resume point; :func:`replay` rebuilds the weights of the logged steps after the checkpoint from their
published updates along the same public directions (a first-order run's: from each step's kept gradient,
:mod:`paczero.fo.state`), evaluating and checkpointing as the loop did.

The functions read and update the loop's run state (:class:`paczero.train.Run`): its ``run_dir``,
``cfg``, ``ranks``, ``params``, ``perturber``, ``mechanism``, the bookkeeping ``start``, ``weights_step``,
``best``, ``zero_shot``, ``cum_time``, ``first_order``, and its ``evaluate_due``, ``checkpoint`` and ``ladder``.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paczero.run.build import load_trainable
from paczero.checkpoint import atomic_json, check_updates, load_latest_checkpoint
from paczero.config import ConfigError, TrainConfig
from paczero.run.journal import ResumePoint, read_jsonl, resume_point

_log = logging.getLogger(__name__)  # warnings: on stderr (the CLI prints them as "paczero: warning: ...")

__all__ = ["Resumed", "read", "restore", "replay"]


@dataclass
class Resumed:
    """Where a resumed run stands: the journal's resume point and the newest checkpoint that verifies."""
    point: ResumePoint
    #: (step, trainable weights, public part, private part) of the newest checkpoint; None: none (step 0)
    found: tuple | None
    #: the directions the original run drew z from (run.json's record; None: a run that predates it)
    directions: str | None

    @property
    def design(self):
        """The candidate design of the original run (PAC mechanisms), None for the others."""
        if self.point.mechanism is not None:
            return self.point.mechanism.get("design")
        return self.found[3]["mechanism"].get("design") if self.found else None

    @property
    def weights_step(self) -> int:
        return self.found[0] if self.found else 0


def read(run_dir: Path, ranks, perturber) -> Resumed:
    """The resume point of ``run_dir``. A journal that cannot be reconciled with the log stops every rank
    with one line (CheckpointError)."""
    found = load_latest_checkpoint(run_dir)
    try:
        point = resume_point(run_dir, found[0] if found else None)
    except ValueError as e:
        ranks.agree("directions", perturber.directions, e)  # every rank stops with this line
        raise
    directions = json.loads((Path(run_dir) / "run.json").read_text()).get("directions")
    return Resumed(point, found, directions)


def restore(run, resumed: Resumed) -> None:
    """Load the checkpoint's weights and the journal's mechanism state into ``run``; bring log.jsonl and
    evals.jsonl to the resume point. Refuses (one line, every rank) to replay logged steps along
    directions other than the original run's."""
    point, was, now = resumed.point, resumed.directions, run.perturber.directions
    if resumed.found is not None:
        run.weights_step, weights, public, private = resumed.found
        load_trainable(run.params, weights)
        run.zero_shot, run.cum_time = public.get("zero_shot"), public.get("seconds") or 0.0
    if point.mechanism is not None:  # the state after the last journaled step
        run.mechanism.load_state_dict(point.mechanism)
    elif resumed.found is not None:  # a run without a journal: its checkpoint's state (nothing was logged after it)
        run.mechanism.load_state_dict(resumed.found[3]["mechanism"])
    run.start = point.steps_done
    if run.first_order is not None:  # before anything is written: AdamW's state, and the updates to replay exist
        _restore_first_order(run, resumed)
    elif run.start > run.weights_step and was != now:
        problem = ConfigError(
            f"cannot resume: steps {run.weights_step + 1}..{run.start} must be replayed along the original run's "
            f"directions ({was}), and this process draws z from {now}")
        run.ranks.agree("directions", now, problem)  # every rank stops with this line
    _record_length(run)
    _complete_log(run.run_dir / "log.jsonl", point)
    zero = run.zero_shot if run.cfg.dev_best and (run.run_dir / "best" / "weights.safetensors").exists() else None
    run.best = _best_from_evals(run.run_dir / "evals.jsonl", run.start, zero)
    replayed = run.start - run.weights_step
    run.log(f"resuming from step {run.start}" + (f" (weights of step {run.weights_step}, {replayed} logged "
                                                 f"steps replayed)" if replayed else ""))
    if run.first_order is not None:  # a gradient step draws no direction
        return
    if was is None:  # written before run.json recorded it, when CPU directions came from torch's generator
        _log.warning(f"run.json does not record the original run's directions (runs that predate the record "
                     f"drew z on CPU from torch's generator); the resumed steps use {now}")
    elif was != now:
        _log.warning(f"the directions now come from {now} ({was} in the original run): "
                     "the resumed steps follow other, equally public, directions")


def _restore_first_order(run, resumed: Resumed) -> None:
    """AdamW's state at the checkpoint (none before the first step); CheckpointError (one line) where it is
    missing, or where a logged step after it has no kept gradient to replay (:mod:`paczero.fo.state`)."""
    if resumed.found is not None:
        run.first_order.load_optimizer_state(resumed.found[3], run.weights_step)
    check_updates(run.run_dir, range(run.weights_step, run.start))


def _record_length(run) -> None:
    """A run continued to more steps than run.json records (:func:`paczero.run.journal.extends`) records its new
    length there, and its earlier ones (``extended_from``): a later ``--resume`` goes on to the new length."""
    path = run.run_dir / "run.json"
    record = json.loads(path.read_text())
    was = record["config"].get("steps")
    if was == run.cfg.steps:
        return
    record["config"]["steps"] = run.cfg.steps
    record["extended_from"] = [*record.get("extended_from", []), was]
    atomic_json(path, record)
    run.log(f"extending the run from {was} to {run.cfg.steps} steps")


def replay(run, resumed: Resumed) -> None:
    """Rebuild the weights of the logged steps after the checkpoint from their published updates (not their
    releases: nothing is released again), evaluating where the loop did (an evaluation evals.jsonl holds
    is not repeated) and recording rungs; then checkpoint the resume point."""
    if run.start <= run.weights_step:
        return
    recorded = {r["step"] for r in read_jsonl(run.run_dir / "evals.jsonl", "evals.jsonl")}
    for rec in resumed.point.records[run.weights_step:run.start]:
        if run.first_order is not None:  # the same AdamW step on the step's kept gradient
            run.first_order.replay(rec["step"], rec["lr"])
        else:
            coefs = rec["coef"] if isinstance(rec["coef"], list) else [rec["coef"]]
            run.perturber.apply_update(rec["step"], coefs, rec["lr"], run.cfg.weight_decay)
        run.cum_time += rec.get("seconds") or 0.0
        done = rec["step"] + 1
        run.ladder.record(done, run.evaluate_due(done, recorded), run.best, rec.get("cum_mi"))
    run.checkpoint(run.start)


def _complete_log(log_path: Path, point: ResumePoint) -> None:
    """log.jsonl holds exactly the resumed run's published records: those it holds, then those the journal
    holds and the log lacks (a crash between the two writes, or a torn last line)."""
    tmp = log_path.with_name(f".{log_path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in point.records))
    os.replace(tmp, log_path)


def _best_from_evals(path: Path, upto: int, zero_shot: dict | None = None) -> dict[str, Any] | None:
    """The dev-best bookkeeping of a resumed run, from its evaluations of steps <= ``upto`` (later ones,
    if any, are dropped from evals.jsonl) and its zero-shot metrics (``zero_shot``: the weights before
    training, step 0, which evals.jsonl does not hold)."""
    records = [r for r in read_jsonl(path, "evals.jsonl") if r.get("step", upto + 1) <= upto]
    if path.exists():
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, path)
    base = {"step": 0, "dev": zero_shot["dev"]} if zero_shot and zero_shot.get("dev") else None
    if not records or records[-1].get("best_step") is None:
        return base if not records else None
    step = records[-1]["best_step"]
    if step == 0:
        return base
    dev = next((r["dev"] for r in records if r["step"] == step), None)
    return None if dev is None else {"step": step, "dev": dev}


def recorded_choice(cfg: TrainConfig) -> TrainConfig:
    """A resumed run begun with template auto goes on with the prompt it chose (run.json ``prompt``); a folder
    without such a record leaves the config as it is (the resume then names what differs, or what is missing)."""
    from paczero.checkpoint import run_record

    try:
        prompt = json.loads(run_record(Path(cfg.out_dir).expanduser()).read_text()).get("prompt") or {}
    except (OSError, ValueError, AttributeError):
        return cfg
    if prompt.get("source") != "auto":
        return cfg
    return cfg.replace(template=prompt["template"], verbalizer={int(k): v for k, v in prompt["verbalizer"].items()})
