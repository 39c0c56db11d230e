"""T-ladder rungs: the weights of one trajectory at chosen steps, saved and evaluated on the way.

A config with ``rungs: [500, 1000, 1500]`` trains one run of ``steps`` steps (the learning-rate schedule
spans all of them: a ladder's ``steps`` is its last rung) and, when step t of ``rungs`` is done,

1. evaluates the weights on dev (the loop's dev evaluation is due at every rung);
2. saves the trainable weights (the LoRA adapter, or every weight under full fine-tuning) to
   ``rungs/step-<t>/weights.safetensors``;
3. evaluates them on test;
4. with ``dev_best``, also evaluates on test the dev-best weights of the prefix: the best of the dev
   evaluations at steps <= t and of the weights before training, step 0 (the run's ``best/`` weights at that moment);
5. appends the record to ``rungs.jsonl``; ``summary.json`` lists the records under ``rungs``.

A record: ``{"step", "dev", "test", "weights", "dev_best": {"step", "dev", "test"} | None,
"mi_spent_realised"}`` (metrics as fractions, as everywhere in a run folder). The test evaluations choose
nothing: every rung is recorded.

Privacy: the weights at rung t are a function of the base model, the public directions and the first t
releases, so of the transcript: post-processing. Each rung carries the run's guarantee (the first t
releases tell no more about S* than all of them), and no smaller one is claimed. ``mi_spent_realised``
is the realised spend of the first t releases, one run's value, not a bound.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from paczero.checkpoint import save_weights

RUNGS_FILE = "rungs.jsonl"


def rung_weights(run_dir: Path, step: int) -> Path:
    """Where the weights of rung ``step`` are saved."""
    return Path(run_dir) / "rungs" / f"step-{step}" / "weights.safetensors"


def read_rungs(run_dir: Path) -> list[dict]:
    """The rung records of a run folder, in step order ([] for none)."""
    from paczero.run.journal import read_jsonl

    return sorted(read_jsonl(Path(run_dir) / RUNGS_FILE, RUNGS_FILE), key=lambda r: r["step"])


class Ladder:
    """The rungs of one run: which steps are due, and recording them (see the module docstring)."""

    def __init__(self, cfg, setup, run_dir: Path, params, *, upto: int = 0):
        self.steps = frozenset(cfg.rungs or ())
        self.setup, self.run_dir, self.params, self.dev_best = setup, Path(run_dir), params, cfg.dev_best
        path = self.run_dir / RUNGS_FILE
        if self.steps and path.exists():  # a resumed run: keep the rungs of steps <= upto (later ones are redone)
            kept = [r for r in read_rungs(self.run_dir) if r["step"] <= upto]
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            os.replace(tmp, path)
        self.done = {r["step"] for r in read_rungs(self.run_dir)} if self.steps else set()

    def due(self, step: int) -> bool:
        """Whether ``step`` is a rung (its dev evaluation is due)."""
        return step in self.steps

    def record(self, step: int, dev: dict | None, best: dict | None, mi_spent: float | None) -> dict | None:
        """Save and evaluate rung ``step`` if it is one and not recorded yet; return its record.

        ``dev``: the dev metrics of the current weights at ``step`` (None: read from evals.jsonl, else
        evaluated); ``best``: the run's dev-best bookkeeping ``{"step", "dev"}`` at this moment."""
        from paczero.run.build import evaluate, load_trainable

        if step not in self.steps or step in self.done:
            return None
        setup = self.setup
        if dev is None:
            dev = _recorded_dev(self.run_dir / "evals.jsonl", step) or evaluate(setup, setup.dev_enc)
        path = rung_weights(self.run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        _save(path, self.params)
        test = evaluate(setup, setup.test_enc)
        chosen = None
        if self.dev_best and best is not None:
            if best["step"] == step:
                chosen = {"step": step, "dev": dev, "test": test}
            elif (self.run_dir / "best" / "weights.safetensors").exists():
                from safetensors.torch import load_file

                load_trainable(self.params, load_file(str(self.run_dir / "best" / "weights.safetensors")))
                chosen = {"step": best["step"], "dev": best["dev"], "test": evaluate(setup, setup.test_enc)}
                load_trainable(self.params, load_file(str(path)))  # back to the trajectory's weights
        record = {"step": step, "dev": dev, "test": test, "weights": str(path.relative_to(self.run_dir)),
                  "dev_best": chosen, "mi_spent_realised": mi_spent}
        with open(self.run_dir / RUNGS_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.done.add(step)
        return record


def rungs_privacy(cfg) -> str:
    """The privacy of a ladder's rungs in words (summary.json, ``privacy.rungs``)."""
    return (f"post-processing: the weights of rung t (steps {', '.join(map(str, cfg.rungs))}) are a function of the "
            "public directions and the first t releases of this run's transcript; each rung carries the run's "
            "guarantee, no smaller one")


def _recorded_dev(path: Path, step: int) -> dict | None:
    from paczero.run.journal import read_jsonl

    found = [r.get("dev") for r in read_jsonl(path, "evals.jsonl") if r.get("step") == step]
    return found[-1] if found else None


def _save(path: Path, params) -> None:
    """Trainable weights to a safetensors file, atomically, readable as any new file is."""
    save_weights(path, dict(params))


def log_line(record: dict[str, Any], metric: str) -> str:
    """One console line for a recorded rung."""
    def pct(m: dict | None) -> str:
        return "—" if not m or m.get(metric) is None else f"{100 * m[metric]:.2f}"

    line = f"rung {record['step']}: dev {metric} {pct(record['dev'])} | test {pct(record['test'])}"
    if record.get("dev_best") and record["dev_best"]["step"] != record["step"]:
        line += (f" (dev-best of the prefix: step {record['dev_best']['step']}, "
                 f"test {pct(record['dev_best']['test'])})")
    return line
