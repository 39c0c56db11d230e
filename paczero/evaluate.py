"""``paczero eval``: evaluate a finished run's selected weights, a released model, or any model, on a task."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from paczero.config import ConfigError, TrainConfig
from paczero.run.release import TASK_FILE, attach_adapter, released_config


def evaluate_target(target: str, *, split: str = "both", overrides: dict[str, Any] | None = None) -> dict:
    """Metrics of ``target`` on dev and/or test.

    ``target`` is a run folder (its config is reused, with ``overrides``; the
    weights are the run's selected ones, else its newest checkpoint), a
    released model folder (``RUN/model``: its task.json gives the task and the
    test split; a LoRA adapter is loaded onto its base, ``overrides["base_model"]``
    or the one task.json names) or a model name/path (evaluated as it is,
    zero-shot, with ``overrides``).
    """
    from paczero.checkpoint import load_latest_checkpoint
    from paczero.models import trainable_parameters
    from paczero.run.build import build, evaluate, load_trainable, refuse_in_memory
    from paczero.tasks.data import same_columns

    overrides = dict(overrides or {})
    path = Path(target).expanduser()
    run = (path / "run.json").exists()
    released = not run and (path / TASK_FILE).exists()
    if "base_model" in overrides and not released:
        raise ConfigError("--base-model applies to a released LoRA adapter folder (one with task.json)")
    if released:
        cfg = released_config(path, overrides)
    elif run:
        record = json.loads((path / "run.json").read_text())
        refuse_in_memory(record, target, "paczero eval", data_given="data" in overrides)
        values = record["config"]
        values.update(overrides)
        values.update(resume=False, overwrite=False)
        if "data" in overrides and "columns" not in overrides:  # the run's names, where the file has those columns
            values["columns"] = same_columns(overrides["data"], record["config"].get("columns"))
        cfg = TrainConfig.from_dict(values).validate()
    else:
        if path.is_dir() and not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise ConfigError(f"{target!r} is neither a paczero run folder (no run.json) nor a model folder "
                              "(no config.json)")
        # a plain model: no training universe is needed, only dev/test (dev 100 unless --n-dev says otherwise)
        cfg = TrainConfig.from_dict({"model": target, "track": "ft", "n_train": 2, "n_dev": 100,
                                     "eval_zero_shot": False, **overrides}).validate()
    examples = _whole_file(cfg) if "data" in overrides else None
    setup = build(cfg, examples=examples)
    source = "the model as given (zero-shot)"
    if released:
        source = attach_adapter(setup, path)
    elif run:
        params = trainable_parameters(setup.model, cfg.track)
        selected = path / "selected.safetensors"
        if selected.exists():
            from safetensors.torch import load_file

            load_trainable(params, load_file(str(selected)))
            source = "selected weights"
        else:
            found = load_latest_checkpoint(path, warn=lambda text: print(text, file=sys.stderr))  # stdout: JSON
            if found is None:
                raise ConfigError(f"run {target!r} has neither selected weights nor a checkpoint")
            load_trainable(params, found[1])
            source = f"checkpoint of step {found[0]}"
    out: dict[str, Any] = {"target": target, "weights": source, "task": cfg.task}
    if examples is not None:  # the whole file, as one evaluation set
        out.update(data=cfg.data, examples=len(examples[2]), metrics=evaluate(setup, setup.test_enc))
        return out
    if split in ("dev", "both"):
        out["dev"] = evaluate(setup, setup.dev_enc)
    if split in ("test", "both"):
        out["test"] = evaluate(setup, setup.test_enc)
    return out


def _whole_file(cfg: TrainConfig) -> tuple[list, list, list]:
    """Every example of ``cfg.data`` (its test rows where it has a split column), as the test set."""
    from paczero.run.build import classes_of
    from paczero.tasks import load_splits
    from paczero.tasks.data import read_records

    records = read_records(Path(cfg.data))
    has_split = bool(records) and "split" in records[0]
    _, _, rows = load_splits(cfg.task, source=cfg.data, n_train=0, n_dev=0, columns=cfg.columns,
                             n_test=None if has_split else len(records), labels=cfg.labels, classes=classes_of(cfg))
    return [], [], rows

