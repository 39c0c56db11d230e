"""Sweeps: a grid of (recipe x seed) cells, each one ``paczero train`` run in its own folder.

    paczero sweep headline/sst2-* --seeds 0 1 2                 # one run after another
    paczero sweep plateau --seeds 0 --gpus auto                  # one run per visible GPU
    paczero sweep dp-cliff --seeds 0 --slurm --partition gpu     # one SLURM job per cell (submitit)

Cell ``(recipe, k)`` runs in ``out_root/<recipe>/seed<k>/``; next to it the sweep
writes the materialised config ``seed<k>.yaml`` (recipe + ``--set`` overrides +
seed and folder) and the run's console output ``seed<k>.log``. Each cell is a
subprocess (``python -m paczero.cli train --config seed<k>.yaml ...``), so a crash
of one cell does not stop the others.

Resumable: a cell whose folder holds ``summary.json`` is finished and skipped; a
cell whose folder holds ``run.json`` but no summary was killed and resumes from
its latest checkpoint (``--resume``). Every decision and outcome is appended to
``out_root/sweep.jsonl``.
"""
from __future__ import annotations

import fnmatch
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from paczero.config import ConfigError, TrainConfig, load_yaml

#: status values in sweep.jsonl
STATUSES = ("skipped", "started", "done", "failed", "stopped", "submitted")


@dataclass(frozen=True)
class Cell:
    """One (recipe, seed) run of a sweep."""
    recipe: str          # shipped recipe name (e.g. "headline/sst2-opt1.3b-ft-zpl") or a YAML file's stem
    source: Path         # the recipe's YAML file
    seed: int
    out_root: Path

    @property
    def run_dir(self) -> Path:
        return self.out_root / self.recipe / f"seed{self.seed}"

    @property
    def config_path(self) -> Path:
        return self.out_root / self.recipe / f"seed{self.seed}.yaml"

    @property
    def log_path(self) -> Path:
        return self.out_root / self.recipe / f"seed{self.seed}.log"

    def state(self) -> str:
        """``done`` (summary.json), ``killed`` (run.json, no summary) or ``new``."""
        if (self.run_dir / "summary.json").exists():
            return "done"
        if (self.run_dir / "run.json").exists():
            return "killed"
        return "new"


# ---------------------------------------------------------------------------- planning
def expand_recipes(patterns: list[str]) -> list[tuple[str, Path]]:
    """Recipe names, globs (``headline/sst2-*``), table names (``plateau``) or YAML paths -> (name, file)."""
    from paczero.cli import list_recipes, recipes_root

    shipped = list_recipes()
    found: dict[str, Path] = {}
    for pat in patterns:
        path = Path(pat).expanduser()
        if pat.endswith((".yaml", ".yml")) and path.is_file():
            found.setdefault(path.stem, path.resolve())
            continue
        names = [n for n in shipped if fnmatch.fnmatchcase(n, pat) or n.startswith(pat.rstrip("/") + "/")]
        if not names:
            raise ConfigError(f"no recipe matches {pat!r}; list them with 'paczero recipes' (or give a YAML path)")
        for n in names:
            found.setdefault(n, recipes_root() / f"{n}.yaml")
    return list(found.items())


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` pairs; values are YAML scalars (``false``, ``null``, ``4``, ``1e-4``, ``[q_proj, v_proj]``)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip().replace("-", "_")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        out[key] = value
    unknown = sorted(set(out) - set(TrainConfig.field_names()))
    if unknown:
        raise ConfigError(f"--set: unknown key(s) {', '.join(unknown)}")
    return out


def plan(patterns: list[str], seeds: list[int], out_root: str | os.PathLike) -> list[Cell]:
    if not seeds:
        raise ConfigError("give at least one seed (--seeds 0 1 2)")
    root = Path(out_root).expanduser()
    return [Cell(name, path, int(s), root) for name, path in expand_recipes(patterns) for s in seeds]


def materialise(cell: Cell, overrides: dict[str, Any]) -> TrainConfig:
    """The cell's validated config, written to ``cell.config_path`` (fails before any run starts)."""
    values = load_yaml(cell.source)
    values.update(overrides)
    values.update(seed=cell.seed, out_dir=str(cell.run_dir), resume=cell.state() == "killed", overwrite=False)
    cfg = TrainConfig.from_dict(values, source=f"{cell.recipe} (seed {cell.seed})").validate()
    cell.config_path.parent.mkdir(parents=True, exist_ok=True)
    header = {"recipe": {"name": cell.recipe, "source": str(cell.source), "seed": cell.seed,
                         "overrides": overrides}}
    text = ("# materialised by 'paczero sweep': the recipe, the --set overrides, the seed and the run folder\n"
            + yaml.safe_dump(header, sort_keys=False) + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    cell.config_path.write_text(text)
    return cfg


def train_command(cell: Cell, *, resume: bool) -> list[str]:
    cmd = [sys.executable, "-m", "paczero.cli", "train", "--config", str(cell.config_path),
           "--seed", str(cell.seed), "--out-dir", str(cell.run_dir)]
    return cmd + (["--resume"] if resume else [])


def _child_env(gpu: str | None) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def run_command(cmd: list[str], log_path: str, gpu: str | None = None) -> int:
    """Run one cell, its output appended to ``log_path``; the exit status (also the SLURM job function)."""
    env = _child_env(gpu)
    with open(log_path, "a") as log:
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(cmd)}\n")
        log.flush()
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode


def visible_gpus(spec: str | None) -> list[str] | None:
    """``None``: run in this process's environment, one cell at a time; ``auto``: every visible GPU; ``0,1``: those."""
    if spec is None:
        return None
    if spec != "auto":
        gpus = [g.strip() for g in spec.split(",") if g.strip()]
        if not gpus:
            raise ConfigError(f"--gpus expects 'auto' or a list like 0,1, got {spec!r}")
        return gpus
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip()] or None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        n = sum(line.startswith("GPU ") for line in out.stdout.splitlines())
        return [str(i) for i in range(n)] or None
    return None


# ---------------------------------------------------------------------------- running
class _Journal:
    """sweep.jsonl: one JSON record per decision or outcome, written under a lock."""

    def __init__(self, path: Path, echo: Callable[[str], None]):
        self.path, self.echo, self.lock = path, echo, threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, cell: Cell, status: str, **extra: Any) -> dict:
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "recipe": cell.recipe, "seed": cell.seed,
               "run_dir": str(cell.run_dir), "status": status, **extra}
        with self.lock:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            detail = " ".join(f"{k}={v}" for k, v in extra.items() if k in ("gpu", "returncode", "resumed", "job_id"))
            self.echo(f"[{status:>9}] {cell.recipe} seed {cell.seed}" + (f"  ({detail})" if detail else ""))
        return rec


def sweep(patterns: list[str], seeds: list[int], *, out_root: str = "runs", overrides: dict[str, Any] | None = None,
          gpus: str | None = None, slurm: dict[str, Any] | None = None, dry_run: bool = False,
          echo: Callable[[str], None] = print) -> list[dict]:
    """Run (or submit) every (recipe, seed) cell; return the final record of each cell.

    ``gpus``: None (one after another), ``"auto"`` or ``"0,1"`` (one worker per GPU).
    ``slurm``: submitit parameters (``partition``, ``timeout_min``, ...) to submit one job per cell instead.
    """
    overrides = dict(overrides or {})
    cells = plan(patterns, seeds, out_root)
    journal = _Journal(Path(out_root).expanduser() / "sweep.jsonl", echo)
    todo: list[tuple[Cell, bool]] = []
    results: list[dict] = []
    for cell in cells:  # validate every config before starting anything
        state = cell.state()
        if state == "done":
            results.append(journal.write(cell, "skipped", reason="summary.json present"))
            continue
        materialise(cell, overrides)
        todo.append((cell, state == "killed"))
    if dry_run:
        for cell, resume in todo:
            echo(("resume " if resume else "run    ") + " ".join(train_command(cell, resume=resume)))
        return results
    if slurm is not None:
        return results + _submit_slurm(todo, slurm, journal)
    slots = visible_gpus(gpus) or [None]
    work: queue.Queue = queue.Queue()
    for item in todo:
        work.put(item)
    lock = threading.Lock()

    def worker(gpu: str | None) -> None:
        while True:
            try:
                cell, resume = work.get_nowait()
            except queue.Empty:
                return
            journal.write(cell, "started", resumed=resume, gpu=gpu, config=str(cell.config_path),
                          log=str(cell.log_path))
            t0 = time.time()
            rc = run_command(train_command(cell, resume=resume), str(cell.log_path), gpu)
            status = "done" if rc == 0 and cell.state() == "done" else ("stopped" if rc == 130 else "failed")
            rec = journal.write(cell, status, returncode=rc, seconds=round(time.time() - t0, 1), resumed=resume,
                                gpu=gpu, log=str(cell.log_path))
            with lock:
                results.append(rec)

    threads = [threading.Thread(target=worker, args=(g,), daemon=True) for g in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _submit_slurm(todo: list[tuple[Cell, bool]], params: dict[str, Any], journal: _Journal) -> list[dict]:
    """One single-GPU SLURM job per cell through submitit (imported only here)."""
    try:
        import submitit
    except ImportError:
        raise ConfigError("--slurm needs submitit: pip install 'paczero[slurm]' (or pip install submitit)") from None
    if not todo:
        return []
    folder = todo[0][0].out_root / "slurm" / "%j"
    executor = submitit.AutoExecutor(folder=str(folder))
    params = dict(params)
    executor.update_parameters(
        slurm_partition=params.pop("partition", None), timeout_min=params.pop("timeout_min", 24 * 60),
        gpus_per_node=params.pop("gpus_per_node", 1), cpus_per_task=params.pop("cpus_per_task", 8),
        mem_gb=params.pop("mem_gb", 64), name="paczero", **({"slurm_additional_parameters": params} if params else {}))
    records = []
    with executor.batch():
        jobs = [executor.submit(run_command, train_command(c, resume=r), str(c.log_path))
                for c, r in todo]
    for (cell, resume), job in zip(todo, jobs):
        records.append(journal.write(cell, "submitted", job_id=str(job.job_id), resumed=resume,
                                     log=str(cell.log_path)))
    return records
