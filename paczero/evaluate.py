"""``paczero eval`` and ``paczero predict``: a finished run's selected weights, a released model, or any model,
evaluated on a task (with each class's precision, recall and F1 for classification) or labelling a file's rows."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from paczero.config import CLASSIFICATION_TASKS, ConfigError, TrainConfig
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
    overrides = dict(overrides or {})
    examples = _whole_file(_config(target, overrides)[0]) if "data" in overrides else None
    setup, source = _loaded(target, overrides, examples)
    out: dict[str, Any] = {"target": target, "weights": source, "task": setup.cfg.task}
    if examples is not None:  # the whole file, as one evaluation set
        metrics, classes = _metrics(setup, setup.test_enc)
        out.update(data=setup.cfg.data, examples=len(examples[2]), metrics=metrics, **_named("classes", classes))
        return out
    for name in ("dev", "test"):
        if split in (name, "both"):
            out[name], classes = _metrics(setup, getattr(setup, f"{name}_enc"))
            out.update(_named(f"{name}_classes", classes))
    return out


def _metrics(setup, enc: list) -> tuple[dict, dict | None]:
    """The task's metrics of ``enc`` (the numbers training records), and for classification each class's
    precision, recall, F1 and support and the confusion matrix, from the same pass (else None)."""
    from paczero.machine.thread_share import refresh
    from paczero.run.build import evaluate

    if not hasattr(setup.task, "report"):
        return evaluate(setup, enc), None
    refresh()
    report = setup.task.report(setup.model, enc, token_budget=setup.cfg.token_budget)
    return {"loss": report["loss"], "accuracy": report["accuracy"]}, {k: report[k] for k in ("per_class", "confusion")}


def _named(key: str, value) -> dict:
    return {} if value is None else {key: value}


def _config(target: str, overrides: dict[str, Any]) -> tuple[TrainConfig, str]:
    """The config that evaluates ``target`` and what it is: ``"released"`` (a folder with task.json: its task,
    test split and prompt), ``"run"`` (a run folder: its config with ``overrides``) or ``"model"`` (a model
    name or path, zero-shot on ``overrides``' task)."""
    from paczero.run.build import refuse_in_memory
    from paczero.tasks.data import same_columns

    overrides = dict(overrides)  # released_config takes base_model out of its own
    path = Path(target).expanduser()
    run = (path / "run.json").exists()
    released = not run and (path / TASK_FILE).exists()
    if "base_model" in overrides and not released:
        raise ConfigError("--base-model applies to a released LoRA adapter folder (one with task.json)")
    if released:
        return released_config(path, overrides), "released"
    if run:
        record = json.loads((path / "run.json").read_text())
        refuse_in_memory(record, target, "paczero eval", data_given="data" in overrides)
        values = record["config"]
        values.update(overrides)
        values.update(resume=False, overwrite=False)
        if "data" in overrides and "columns" not in overrides:  # the run's names, where the file has those columns
            values["columns"] = same_columns(overrides["data"], record["config"].get("columns"))
        return TrainConfig.from_dict(values).validate(), "run"
    if path.is_dir() and not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
        raise ConfigError(f"{target!r} is neither a paczero run folder (no run.json) nor a model folder "
                          "(no config.json)")
    # a plain model: no training universe is needed, only dev/test (dev 100 unless --n-dev says otherwise)
    return TrainConfig.from_dict({"model": target, "track": "ft", "n_train": 2, "n_dev": 100,
                                  "eval_zero_shot": False, **overrides}).validate(), "model"


def _loaded(target: str, overrides: dict[str, Any], examples=None):
    """The built setup of ``target`` (:func:`_config`) with its weights loaded, and words for those weights.
    ``examples``: (train, dev, test) in place of the config's data."""
    from paczero.checkpoint import load_latest_checkpoint
    from paczero.models import trainable_parameters
    from paczero.run.build import build, load_trainable

    cfg, kind = _config(target, overrides)
    path = Path(target).expanduser()
    setup = build(cfg, examples=examples)
    source = "the model as given (zero-shot)"
    if kind == "released":
        source = attach_adapter(setup, path)
    elif kind == "run":
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
    return setup, source


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



def predict_target(target: str, data: str, *, out: str | None = None, overrides: dict[str, Any] | None = None,
                   say=None) -> dict:
    """Label every row of ``data`` (in file order) with ``target``'s classifier (a released model folder, a run
    or a model, as for :func:`evaluate_target`): a CSV of the row's number in the file, its text, its label
    where the file has a label column, the predicted label and each class's probability (``p_<class>``),
    written to ``out`` (never over an existing file) or to stdout. Returns what was predicted: the rows, and
    the accuracy and loss where the file holds labels."""
    import csv
    import io

    from paczero.run.build import classes_of
    from paczero.tasks.data import canonical_rows, read_records

    overrides = {**(overrides or {}), "data": data}
    if out is not None and Path(out).expanduser().exists():
        raise ConfigError(f"--out {out!r} exists; paczero predict writes a new file (choose another name or "
                          "remove it)")
    cfg, _ = _config(target, overrides)
    if cfg.task not in CLASSIFICATION_TASKS:
        raise ConfigError(f"paczero predict labels rows for a classification model; this one's task is {cfg.task}")
    records = read_records(Path(data).expanduser())
    given = overrides.get("columns")
    columns = dict(given if given is not None else recorded_columns(target) or {})
    present = set(records[0]) if records else set()
    if records:
        columns["sentence"] = text_column(data, present, columns.get("sentence"),
                                          "--columns names" if given is not None else "the model was trained on")
    labelled = columns.get("label", "label") in present
    if not labelled:  # new rows to label: a placeholder class for the task's encoding, never reported
        columns.pop("label", None)
        records = [{**r, "label": min(classes_of(cfg))} for r in records]
    rows = canonical_rows(cfg.task, records, str(data), columns, cfg.labels, classes_of(cfg))
    setup, source = _loaded(target, overrides, ([], [], rows))
    probs = setup.task.probabilities(setup.model, setup.test_enc, token_budget=setup.cfg.token_budget)
    names = setup.task.class_names()
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["row", "text", *(["label"] if labelled else []), "predicted", *(f"p_{n}" for n in names)])
    predicted = probs.argmax(axis=1)
    for i, (row, enc) in enumerate(zip(rows, setup.test_enc)):
        writer.writerow([i + 1, row["sentence"], *([names[enc.label]] if labelled else []), names[predicted[i]],
                         *(f"{p:.6f}" for p in probs[i])])
    if out is None:
        sys.stdout.write(text.getvalue())
    else:
        Path(out).expanduser().write_text(text.getvalue())
    found: dict[str, Any] = {"target": target, "weights": source, "data": data, "rows": len(rows), "out": out}
    if labelled:
        import numpy as np

        truth = np.array([e.label for e in setup.test_enc])
        found["accuracy"] = float((predicted == truth).mean())
        found["loss"] = float(-np.log(np.maximum(probs[np.arange(len(truth)), truth], 1e-45)).mean())
    (say or (lambda line: print(line, file=sys.stderr)))(
        f"paczero: predicted {len(rows)} rows of {data} with {source}"
        + (f" (accuracy {found['accuracy']:.3f}, loss {found['loss']:.3f} against the file's labels)" if labelled
           else "") + (f": {out}" if out else ""))
    return found


def recorded_columns(target: str) -> dict | None:
    """The column names ``target`` was trained with: a run folder's run.json's; a released folder's task.json's,
    else those of the run whose folder holds it; None where nothing records them (the task's own names)."""
    path = Path(target).expanduser()
    if (path / "run.json").exists():
        sources = [(path / "run.json", "config")]
    else:
        sources = [(path / TASK_FILE, "paczero"), (path.parent / "run.json", "config")]
    for record, key in sources:
        try:
            found = (json.loads(record.read_text()).get(key) or {}).get("columns")
        except (OSError, ValueError, AttributeError):
            continue
        if found:
            return dict(found)
    return None


def text_column(data: str, present: set, name: str | None, whose: str) -> str:
    """The column of ``data`` (whose columns are ``present``) that ``paczero predict`` reads as the sentence:
    ``name`` (the one ``whose`` words say it comes from), else ``sentence`` or ``text``. A file without it is one
    line naming the column, the file's own columns and --columns; no other column is read in its place."""
    if name is None:
        found = next((c for c in ("sentence", "text") if c in present), None)
        if found is not None:
            return found
        wanted = "a 'sentence' or 'text' column"
    elif name in present:
        return name
    else:
        wanted = f"column {name!r}, the text column {whose}"
    raise ConfigError(f"{data} has no {wanted}; its columns are {sorted(present)}: name its text column with "
                      "--columns sentence=COLUMN")
