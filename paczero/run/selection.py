"""Dev-best selection: which weights a run releases.

The candidates are the weights before training (step 0, scored by the zero-shot dev evaluation) and those of
every dev evaluation; the best by the selection metric is kept in ``RUN/best/`` and released at the end. It
reads dev metrics only: post-processing of the transcript and public inputs, no cost to the guarantee.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from paczero.run.build import trainable_state
from paczero.checkpoint import save_weights


def selection_metric(cfg, task) -> str:
    """The dev metric that dev-best selection reads: ``select_metric``, else the dev loss (a proper score, smooth
    on 40-100 dev rows where accuracy moves in steps of a row) for a classification or completion task, and F1
    for SQuAD (the paper's scripts, ``metric_for_best_model=f1``)."""
    return cfg.select_metric or ("loss" if task.metric in ("accuracy", "loss") else task.metric)


def better(dev: dict, ref: dict, metric: str) -> bool:
    """Whether ``dev`` beats the best so far ``ref``: the lower loss (``metric`` "loss"; a tie keeps the
    earlier), else the higher ``metric`` (a tie goes to the lower loss, then to the earlier)."""
    if metric == "loss":
        return dev.get("loss", math.inf) < ref.get("loss", math.inf)
    a, b = dev.get(metric, -math.inf), ref.get(metric, -math.inf)
    if a != b:
        return a > b
    return dev.get("loss", math.inf) < ref.get("loss", math.inf)


def recorded_dev(path: Path, step: int) -> dict | None:
    """The dev metrics evals.jsonl holds for ``step`` (None if it holds none)."""
    if not path.exists():
        return None
    found = None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("step") == step:
            found = record.get("dev")
    return found


def save_best(run_dir: Path, params) -> None:
    """The dev-best weights so far, to ``RUN/best/weights.safetensors``."""
    (run_dir / "best").mkdir(exist_ok=True)
    save_selected(run_dir / "best" / "weights.safetensors", params)


def save_selected(path: Path, params) -> None:
    """Trainable weights to a safetensors file, atomically, readable as any new file is."""
    save_weights(path, trainable_state(params))


def base_released_line(track: str) -> str:
    """The line of a run whose release is the weights before training (selected step 0)."""
    weights = ("the LoRA adapter at initialisation, whose B = 0 leaves the base model's outputs" if track == "lora"
               else "the base model")
    return (f"no trained step beat the base model on dev: the run released the weights before training (step 0, "
            f"{weights}); a lower lr or more steps may do better (docs/outputs.md, selected_step)")
