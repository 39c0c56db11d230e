"""The private journal of a run: a published step is final.

``private/journal.jsonl`` (mode 0600, in the run folder's owner-only ``private/``;
every number in it fixed-width, so that not even its size depends on j*) holds one line per step: the
step's public record and the mechanism's state *after* its release (the
secret index, the posterior, the private generator's state, the MI charged so
far). Its first line holds the mechanism's state before the first step,
design included. Each line is flushed to disk (``fsync``) before the step's
record is written to ``log.jsonl``, so whatever a crash interrupts, every
record that can have been seen in the log is in the journal, with the private
state that follows it.

A resumed run therefore never executes a logged step again (executing it
again would re-release the step with the same private noise, and two releases
of the same noise give the secret away). It continues after the last
journaled step, from that step's private state, with every journaled release
charged; the weights are rebuilt from the newest checkpoint at or before it by
replaying the journaled coefficients along the same public directions (the
updates are deterministic; the perturbations in between restore the weights
exactly). A record that was journaled but did not reach the log (a crash
between the two writes, or a torn last line) is written to the log from the
journal: it counts as published. A step that was computed but not journaled was
never published, and runs again from the same private state.

This module reads and writes the journal and checks the log against it; the
replay itself is in :mod:`paczero.run.resume`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paczero.checkpoint import PRIVATE_DIR, CheckpointError, decode, encode, list_checkpoints, private_dir
from paczero.config import DP_MECHANISMS, MI_BUDGETED, ConfigError, TrainConfig

NAME = f"{PRIVATE_DIR}/journal.jsonl"
OLD_NAME = "journal.jsonl"  # where runs written by paczero 0.1 keep it (read and continued there)
#: config keys a resumed run may give other values than the original: where and how fast the same steps
#: run, and what is shown. Every other key changes what the steps compute, release or select, and a resume
#: that changes it is refused (:func:`check_resumed_config`).
RESUME_FREE = frozenset({"device", "device_map", "compile", "threads", "progress", "report_to", "checkpoint_every",
                         "eval_zero_shot", "out_dir", "overwrite", "resume", "push_to_hub", "hub_private"})

__all__ = ["NAME", "RESUME_FREE", "Journal", "journal_path", "ResumePoint", "check_resumed_config", "extends",
           "read_jsonl", "recorded_data", "resume_point"]


def journal_path(run_dir: Path) -> Path:
    """The run's journal: ``private/journal.jsonl``, or ``journal.jsonl`` for a run that began with one there."""
    old = Path(run_dir) / OLD_NAME
    return old if old.exists() and not (Path(run_dir) / NAME).exists() else Path(run_dir) / NAME


def _strip_design(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "design"}


class Journal:
    """Append-only, owner-only, fsync'd: :meth:`start` once per run, :meth:`step` once per step."""

    def __init__(self, run_dir: Path):
        self.path = journal_path(run_dir)
        if self.path.parent != Path(run_dir):
            private_dir(run_dir)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        self._file = os.fdopen(fd, "a")

    def _write(self, entry: dict[str, Any]) -> None:
        self._file.write(json.dumps(encode(entry, fixed=True)) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def start(self, after_steps: int, state: dict[str, Any], data_fingerprint: str | None = None) -> None:
        """The mechanism's full state (design included) after ``after_steps`` steps: the journal's first line.
        ``data_fingerprint`` identifies the data for a resume (run.json does not carry it where the data's
        identity is private: the DP baselines)."""
        self._write({"start": int(after_steps), "mechanism": state, "data_fingerprint": data_fingerprint})

    def step(self, record: dict[str, Any], state: dict[str, Any]) -> None:
        """Step ``record["step"]``'s public record and the mechanism's state after it (design left out)."""
        self._write({"step": int(record["step"]), "record": record, "mechanism": _strip_design(state)})

    def close(self) -> None:
        self._file.close()


def recorded_data(run_dir: Path) -> dict[str, Any]:
    """What identifies a run's data for a resume: run.json's ``data_fingerprint``, else the journal's."""
    record = json.loads((Path(run_dir) / "run.json").read_text())
    if record.get("data_fingerprint") is None:
        entries = read_jsonl(journal_path(run_dir), NAME)
        if entries:
            record["data_fingerprint"] = decode(entries[0]).get("data_fingerprint")
    return record


def read_jsonl(path: Path, what: str) -> list[dict]:
    """The records of a JSON-lines file; a torn last line (a crash mid-write) is left out, a damaged
    line before it raises CheckpointError."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:
                break
            raise CheckpointError(f"cannot resume: {what} is damaged at line {i + 1}") from None
        if not isinstance(rec, dict):
            raise CheckpointError(f"cannot resume: {what} is damaged at line {i + 1}")
        out.append(rec)
    return out


def check_resumed_config(saved: dict[str, Any], cfg: TrainConfig) -> None:
    """Raise ConfigError (one line naming every differing key) unless ``cfg`` keeps each setting of the run's
    recorded config ``saved`` outside RESUME_FREE. A key that the original run did not record (it predates
    the key) counts as its default."""
    defaults = TrainConfig().to_dict()
    now = json.loads(json.dumps(cfg.to_dict()))  # as run.json holds it (verbalizer keys as strings)
    differ = [key for key in now if key not in RESUME_FREE and saved.get(key, defaults[key]) != now[key]]
    if differ == ["steps"] and extends(saved.get("steps", defaults["steps"]), cfg):
        return
    if differ:
        values = "; ".join(f"{key} {saved.get(key, defaults[key])!r} there, {now[key]!r} now"
                           for key in differ if key != "private_seed")  # under torchrun: sent to every rank
        why = "" if differ != ["steps"] else (
            " (steps may grow only for mechanisms whose releases do not depend on the run's length, with a "
            "constant learning rate: not for an MI budget or a DP accounting spread over the steps)")
        raise ConfigError(f"cannot resume: {', '.join(differ)} differ{'s' if len(differ) == 1 else ''} from the "
                          f"original run" + (f" ({values})" if values else "") + why + "; resume with the original "
                          "values (run.json holds them), or start a new run in another folder")


def extends(steps: int, cfg: TrainConfig) -> bool:
    """Whether ``cfg`` continues a run of ``steps`` steps to more steps, where its releases would be the same
    in a run planned that long from the start: a mechanism that does not spread an MI budget or a DP
    accounting over the steps (PAC-ZPL, MeZO, the non-private references) and a constant learning rate."""
    return (cfg.steps > steps and cfg.mechanism not in MI_BUDGETED + DP_MECHANISMS
            and cfg.lr_schedule == "constant")


@dataclass
class ResumePoint:
    """Where a resumed run stands, from its journal, its log and its newest checkpoint."""
    #: steps done according to the journal (the next step to run)
    steps_done: int
    #: the mechanism's state after ``steps_done`` steps (design included); None: keep the checkpoint's
    mechanism: dict[str, Any] | None
    #: the public records of steps 0..steps_done-1 (those the journal holds; others from the log)
    records: list[dict] = field(default_factory=list)
    #: how many leading records of ``records`` log.jsonl already holds intact
    logged: int = 0
    #: whether the run has a journal (runs written by paczero 0.1 have none)
    journaled: bool = True


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def resume_point(run_dir: Path, checkpoint_step: int | None) -> ResumePoint:
    """Read the journal and the log of ``run_dir`` and check them against each other.

    Raises CheckpointError (one line) when they cannot be reconciled: a logged record that the
    journal lacks or that differs from the journal's, a damaged line, a checkpoint newer than the
    journal, checkpoints none of which verifies (``checkpoint_step`` None), or (a run without a journal) logged steps after the newest checkpoint, which could not
    be continued without executing them again.
    """
    run_dir = Path(run_dir)
    log = read_jsonl(run_dir / "log.jsonl", "log.jsonl")
    if checkpoint_step is None and list_checkpoints(run_dir):  # each one damaged: never passed over in silence
        journaled = bool(read_jsonl(journal_path(run_dir), NAME))
        raise CheckpointError(
            f"cannot resume {str(run_dir)!r}: none of its {len(list_checkpoints(run_dir))} checkpoints verifies (see "
            "the warnings above); restore its checkpoints/ folder from a backup, or " + (
                "move checkpoints/ out of the run folder and --resume again to rebuild the weights from the base "
                "model by replaying its logged steps" if journaled else
                "start a new run in another folder (this run has no private journal to continue from without them)"))
    for i, rec in enumerate(log):
        if rec.get("step") != i:
            raise CheckpointError(f"cannot resume: log.jsonl line {i + 1} is not step {i}")
    entries = read_jsonl(journal_path(run_dir), NAME)
    if not entries:
        last = checkpoint_step or 0
        if len(log) > last:
            raise CheckpointError(
                f"cannot resume: log.jsonl holds steps up to {len(log)} but the newest checkpoint is step {last} and "
                f"the run has no private journal ({NAME}) to continue after them without executing them again")
        return ResumePoint(steps_done=last, mechanism=None, records=log[:last], logged=len(log[:last]),
                           journaled=False)
    head = decode(entries[0])
    if "start" not in head:
        raise CheckpointError(f"cannot resume: {NAME} does not begin with the run's starting state")
    start, state = int(head["start"]), head["mechanism"]
    design = state.get("design")
    steps = [decode(e) for e in entries[1:]]
    for j, e in enumerate(steps):
        if e.get("step") != start + j:
            raise CheckpointError(f"cannot resume: {NAME} line {j + 2} is not step {start + j}")
    done = start + len(steps)
    if steps:
        state = {**steps[-1]["mechanism"], "design": design}
    if len(log) > done:
        raise CheckpointError(f"cannot resume: log.jsonl holds step {done} but the private journal ends before it")
    if len(log) < start:
        raise CheckpointError(f"cannot resume: log.jsonl ends at step {len(log)}, before the journal begins ({start})")
    journaled = {e["step"]: e["record"] for e in steps}
    for rec in log[start:]:
        if not _same(rec, journaled[rec["step"]]):
            raise CheckpointError(f"cannot resume: log.jsonl step {rec['step']} differs from the run's private journal")
    if checkpoint_step is not None and checkpoint_step > done:
        raise CheckpointError(f"cannot resume: the checkpoint of step {checkpoint_step} is newer than the journal "
                              f"({done} steps)")
    records = log[:start] + [journaled[s] for s in range(start, done)]
    return ResumePoint(steps_done=done, mechanism=state, records=records, logged=len(log))
