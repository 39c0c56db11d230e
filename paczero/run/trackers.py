"""Live monitoring: a run's public values, as it trains, to TensorBoard or Weights & Biases.

``report_to`` (config key, flag ``--report-to``) picks the tracker: ``none`` (the default), ``tensorboard``
(event files in ``RUN/tensorboard/``, through the ``tensorboard`` package: ``pip install
'paczero[tensorboard]'``) or ``wandb`` (a W&B run whose files go to ``RUN/wandb/``: ``pip install
'paczero[wandb]'``; ``WANDB_MODE=offline`` keeps it on this machine, ``WANDB_PROJECT`` names the project,
``paczero`` by default).

A tracker is handed only what the run folder publishes: each step's record as ``log.jsonl`` holds it, each
dev evaluation as ``evals.jsonl`` holds it, the metrics and privacy statement of ``summary.json``, and the
config without ``private_seed``. Never the secret, the mechanism's state, ``journal.jsonl`` or
``private.json``. For the DP baselines the spent epsilon is the accountant's for the steps taken, a function
of the public calibration (noise multiplier, sampling rate, delta), logged at each dev evaluation.

Tags (TensorBoard scalars; W&B history keys), at the global step ``steps done``: see :data:`STEP_TAGS`;
``dev/<metric>`` per evaluation; ``privacy/epsilon`` (DP) per evaluation; ``test/<metric>`` and the
privacy statement's numbers (``privacy/mi_bound``, ``privacy/mia_bound``, ``privacy/epsilon_rdp``, ...) at
the end.

A DP baseline's step time grows with its private Poisson batch, so a DP run's tracker publishes no timing:
its values are held back and the tracker is opened only when the run ends. TensorBoard's event file is then
rewritten with the global step as every event's wall time (constant spacing) under a name without a clock
(``events.out.tfevents.0.paczero``); W&B's run is opened at the end without console capture or system
metrics and logs the held values in one burst (its own ``_runtime`` and folder name then say only when the
run ended, as the run folder's file times do: paczero/run/publish.py).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from paczero.config import DP_MECHANISMS, ConfigError, TrainConfig

_log = logging.getLogger(__name__)

#: the per-step record's keys (log.jsonl) a tracker logs, and their tags
STEP_TAGS = {"train_loss": "train/loss", "lr": "train/lr", "cum_mi": "privacy/cum_mi", "mi_step": "privacy/mi_step",
             "agreement": "release/agreement", "unanimity": "release/unanimity", "free_frac": "release/free_frac",
             "seconds": "time/seconds_per_step"}
#: the numbers of a privacy statement (summary.json ``privacy``) logged at the end of a run
FINAL_PRIVACY = ("mi_bound", "mi_total_budget", "mi_spent", "mia_bound", "matched_dp_epsilon", "unanimity_rate",
                 "epsilon_rdp", "epsilon_pld", "epsilon_target", "delta")
#: the Python package each tracker needs, and the extra that installs it
LIBRARIES = {"tensorboard": ("tensorboard", "paczero[tensorboard]"), "wandb": ("wandb", "paczero[wandb]")}
WANDB_ID = "paczero-run-id"  # in RUN/wandb/: the W&B run id, kept for --resume


def check_report_to(cfg: TrainConfig) -> None:
    """Raise ConfigError (one line) unless the library ``cfg.report_to`` needs is installed: checked before any
    model loads."""
    if cfg.report_to in LIBRARIES:
        module, extra = LIBRARIES[cfg.report_to]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"report_to {cfg.report_to} needs the {module} package, which is not installed: "
                              f"pip install '{extra}' (or --report-to none)")


def public_config(cfg: TrainConfig) -> dict[str, Any]:
    """The config a tracker records: run.json's, without the private seed."""
    return {k: v for k, v in cfg.to_dict().items() if k != "private_seed"}


class Tracker:
    """``report_to none``: logs nothing. The base of the trackers: which public values go out, and when."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, accounting: dict | None = None):
        self.cfg, self.run_dir, self.accounting = cfg, run_dir, accounting
        #: a DP run's values, held back until the run ends (their times would follow the private batches)
        self._held: list[tuple[dict[str, float], int]] | None = [] if cfg.mechanism in DP_MECHANISMS else None

    def _emit(self, values: dict[str, float], step: int) -> None:
        if self._held is not None:
            self._held.append((values, step))
        else:
            self._scalars(values, step)

    def _release_held(self) -> None:
        held, self._held = self._held, None
        for values, step in held or ():
            self._scalars(values, step, walltime=float(step))

    # -- what the training loop calls
    def step(self, record: dict) -> None:
        """One step's public record (log.jsonl's line)."""
        values = {tag: record[key] for key, tag in STEP_TAGS.items() if _number(record.get(key))}
        if self.cfg.mechanism in DP_MECHANISMS:
            values = {t: v for t, v in values.items() if not t.startswith("privacy/")}  # DP: MI is not its measure
        self._emit(values, record["step"] + 1)

    def evaluation(self, step: int, dev: dict) -> None:
        """One dev evaluation after ``step`` steps (evals.jsonl's record); DP: the epsilon spent so far."""
        values = {f"dev/{k}": v for k, v in dev.items() if _number(v)}
        if self.accounting is not None:
            values["privacy/epsilon"] = dp_epsilon(self.accounting, step)
        self._emit(values, step)

    def close(self, summary: dict | None = None) -> None:
        """End the tracker; ``summary`` (summary.json) adds the test metrics and the privacy statement's numbers."""
        self._release_held()
        if summary is not None:
            final = {f"test/{k}": v for k, v in (summary.get("test") or {}).items() if _number(v)}
            final.update({f"zero_shot/{k}": v for k, v in ((summary.get("zero_shot") or {}).get("test") or {}).items()
                          if _number(v)})
            privacy = summary.get("privacy") or {}
            final.update({f"privacy/{k}": privacy[k] for k in FINAL_PRIVACY if _number(privacy.get(k))})
            if _number(summary.get("selected_step")):
                final["selected_step"] = summary["selected_step"]
            self._final(final, self.cfg.steps)
        self._end(failed=False)

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:  # a run that stops on an error ends its tracker here (close() ends the others)
            self._release_held()
            self._end(failed=True)

    # -- what a tracker implements
    def _scalars(self, values: dict[str, float], step: int, walltime: float | None = None) -> None:
        pass

    def _final(self, values: dict[str, float], step: int) -> None:
        self._scalars(values, step, walltime=float(step) if self.cfg.mechanism in DP_MECHANISMS else None)

    def _end(self, failed: bool) -> None:
        pass


class TensorBoardTracker(Tracker):
    """Event files in ``RUN/tensorboard/`` (``tensorboard --logdir RUN/tensorboard``); a DP run's written at
    its end, as one file with no clock in its name or events (:func:`timeless_events`)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, accounting: dict | None = None):
        super().__init__(cfg, run_dir, accounting)
        self.writer = None if self._held is not None else self._open()

    def _open(self):
        from torch.utils.tensorboard import SummaryWriter  # writes with the tensorboard package

        writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        writer.add_text("config", "```\n" + json.dumps(public_config(self.cfg), indent=1, default=str) + "\n```")
        return writer

    def _release_held(self) -> None:
        if self._held is not None and self.writer is None:
            self.writer = self._open()
        super()._release_held()

    def _scalars(self, values: dict[str, float], step: int, walltime: float | None = None) -> None:
        for tag, v in values.items():
            self.writer.add_scalar(tag, float(v), global_step=step, walltime=walltime)

    def _end(self, failed: bool) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            if self.cfg.mechanism in DP_MECHANISMS:
                for path in sorted((self.run_dir / "tensorboard").glob("events.out.tfevents.*")):
                    if not path.name.endswith(".paczero"):
                        timeless_events(path)


def timeless_events(path: Path) -> Path:
    """Rewrite the TensorBoard event file ``path`` with each event's global step as its wall time, under a
    name without a clock, ``events.out.tfevents.<n>.paczero`` beside it (n: 0, or 1, 2, ... for a resumed
    run's later files); TensorBoard's own names carry the clock time, as do its first events. Returns the
    new file."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    events = [Event.FromString(record) for record in RawEventFileLoader(str(path)).Load()]
    n = len(list(path.parent.glob("events.out.tfevents.*.paczero")))
    target = path.with_name(f"events.out.tfevents.{n}.paczero")
    with open(target, "wb") as f:
        writer = RecordWriter(f)
        for event in events:
            event.wall_time = float(event.step)
            writer.write(event.SerializeToString())
    path.unlink()
    return target


class WandbTracker(Tracker):
    """A W&B run (``wandb.init``) with the run folder's name, its files in ``RUN/wandb/``; a resumed run
    continues the same W&B run (its id is kept in ``RUN/wandb/paczero-run-id``). A DP run's W&B run is opened
    when the run ends, without console capture or system metrics (module doc)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, accounting: dict | None = None, *, wandb=None):
        super().__init__(cfg, run_dir, accounting)
        if wandb is None:
            import wandb
        self.wandb = wandb
        folder = run_dir / "wandb"
        folder.mkdir(exist_ok=True)
        id_file = folder / WANDB_ID
        self.run_id = id_file.read_text().strip() if cfg.resume and id_file.exists() else None
        if self.run_id is None:
            self.run_id = secrets.token_hex(6)  # letters and digits, as W&B ids are
            id_file.write_text(self.run_id + "\n")
        self.run = None if self._held is not None else self._open()

    def _open(self):
        quiet = {}
        if self._held is not None:  # DP: nothing on a clock (console lines, system metrics)
            quiet["settings"] = _quiet_settings(self.wandb)
        return self.wandb.init(project=os.environ.get("WANDB_PROJECT", "paczero"), name=self.run_dir.name,
                               id=self.run_id, resume="allow", dir=str(self.run_dir), config=public_config(self.cfg),
                               **quiet)

    def _release_held(self) -> None:
        if self._held is not None and self.run is None:
            self.run = self._open()
        super()._release_held()

    def _scalars(self, values: dict[str, float], step: int, walltime: float | None = None) -> None:
        if values:
            self.run.log(values, step=step)

    def _final(self, values: dict[str, float], step: int) -> None:
        self.run.summary.update(values)

    def _end(self, failed: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None


def _quiet_settings(wandb):
    """W&B settings without console capture and system metrics (the name of the latter moved between versions)."""
    for stats in ("x_disable_stats", "_disable_stats"):
        try:
            return wandb.Settings(console="off", **{stats: True})
        except Exception:  # an older or newer W&B that names it the other way
            continue
    return wandb.Settings(console="off")


def open_tracker(cfg: TrainConfig, run_dir: Path, mechanism=None) -> Tracker:
    """The tracker ``cfg.report_to`` names. From ``mechanism`` it keeps only a DP baseline's public
    calibration (:func:`dp_accounting`)."""
    accounting = dp_accounting(mechanism) if mechanism is not None else None
    kind = {"none": Tracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker}[cfg.report_to]
    return kind(cfg, run_dir, accounting)


def dp_accounting(mechanism) -> dict | None:
    """A DP baseline's public calibration (what its privacy statement publishes), or None for the others."""
    if getattr(mechanism, "noise_multiplier", None) is None or mechanism.name not in DP_MECHANISMS:
        return None
    return {"mechanism": mechanism.name, "noise_multiplier": mechanism.noise_multiplier,
            "sample_rate": mechanism.sample_rate, "delta": mechanism.delta, "accountant": mechanism.accountant,
            "laplace_scale": getattr(mechanism, "laplace_scale", None)}


def dp_epsilon(accounting: dict, steps: int) -> float:
    """Epsilon spent after ``steps`` steps by the calibrating accountant, from the public calibration (a
    privacy statement's ``noise_multiplier``, ``sample_rate``, ``delta``, ``accountant``, DP-AggZO's
    ``laplace_scale``)."""
    from paczero.privacy import dp

    a = accounting
    if a.get("laplace_scale") is not None:  # DP-AggZO and its K = 1 form: the Laplace count is spent at step 0
        return dp.dp_aggzo_epsilon(a["noise_multiplier"], a["laplace_scale"], a["sample_rate"], steps, a["delta"],
                                   a.get("accountant", "rdp"))
    return dp.dpzero_epsilon(a["noise_multiplier"], a["sample_rate"], steps, a["delta"], a.get("accountant", "rdp"))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
