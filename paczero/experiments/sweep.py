"""Sweeps: a grid of (recipe x seed) cells, each one ``paczero train`` run in its own folder.

    paczero sweep headline/sst2-* --seeds 0 1 2                 # one run after another
    paczero sweep plateau --seeds 0 --gpus auto                  # one run per visible GPU
    paczero sweep cpu-tuned --seeds 0 --workers 2                # two runs at once on this machine's cores
    paczero sweep dp-cliff --seeds 0 --slurm --partition gpu     # one SLURM job per cell (submitit)

Cell ``(recipe, k)`` runs in ``out_root/<recipe>/seed<k>/``; next to it the sweep
writes the materialised config ``seed<k>.yaml`` (recipe + ``--set`` overrides +
seed and folder) and the run's console output ``seed<k>.log``. The seed ``k``
sets the config field the recipe's header names (``recipe: {seed_field: ...}``):
``data_seed`` in the paper's recipes (which examples are drawn, what the
paper's seeds varied; the public ``seed`` of directions and initialisation stays
the recipe's), both in the AG News and SST-5 tables' (``[data_seed, seed]``: seed k
draws other examples and other directions), ``seed`` otherwise. Each cell is a
subprocess (``python -m paczero.cli train --config seed<k>.yaml ...``), so a crash
of one cell does not stop the others.

Resumable: a cell whose folder holds ``summary.json`` is finished and skipped; a
cell whose folder holds ``run.json`` but no summary was killed and resumes from
its latest checkpoint (``--resume``); a cell whose folder another process is
writing (its :class:`~paczero.checkpoint.RunLock`), or whose SLURM job from an
earlier sweep is still queued, is skipped; a worker looks again when it takes a cell,
so two sweeps over one out-root share its cells. Every decision and outcome is
appended to ``out_root/sweep.jsonl``. SLURM jobs (:class:`SlurmCell`) requeue
themselves at a time limit and resume.
"""
from __future__ import annotations

import fnmatch
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from paczero.checkpoint import RunLock, run_record
from paczero.config import DP_MECHANISMS, ConfigError, TrainConfig, load_yaml
from paczero.machine.hardware import allowed_cores
from paczero.experiments.slurm import check_slurm, queued_jobs, submitit_module
from paczero.run.stop import on_stop_signals

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
        """``done`` (summary.json), ``running`` (locked by another process), ``killed`` (run.json only), ``new``."""
        if (self.run_dir / "summary.json").exists():
            return "done"
        if RunLock.held(self.run_dir):
            return "running"
        if run_record(self.run_dir).exists():  # in the folder, or in a DP run's private stage
            return "killed"
        return "new"


# ---------------------------------------------------------------------------- planning
def expand_recipes(patterns: list[str]) -> list[tuple[str, Path]]:
    """Recipe names, globs (``headline/sst2-*``), table names (``plateau``) or YAML paths -> (name, file)."""
    from paczero.recipes import list_recipes, recipes_root

    shipped = list_recipes()
    found: dict[str, Path] = {}
    for pat in patterns:
        path = Path(pat).expanduser()
        if pat.endswith((".yaml", ".yml")) and path.is_file():
            found.setdefault(path.stem, path)  # as typed: the sweep's records name no folder of the machine
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


#: the config fields a sweep seed may set
SEED_FIELDS = ("seed", "data_seed")


def seed_field(source: Path) -> tuple[str, ...]:
    """The config fields a sweep seed sets for the recipe or config file ``source``: its header's
    ``recipe: {seed_field: ...}``, one field or a list (``data_seed`` in the paper's recipes; ``[data_seed, seed]``
    in the CPU tables from a weak start, whose seed k draws other examples and other public directions), else
    ``seed``."""
    try:
        header = (yaml.safe_load(Path(source).read_text()) or {}).get("recipe")
    except (OSError, yaml.YAMLError, AttributeError):
        return ("seed",)  # load_yaml reports an unreadable file in materialise
    field = header.get("seed_field", "seed") if isinstance(header, dict) else "seed"
    fields = tuple(field) if isinstance(field, list) else (field,)
    if not fields or len(set(fields)) != len(fields) or any(f not in SEED_FIELDS for f in fields):
        raise ConfigError(f"{source}: recipe seed_field must be one of {', '.join(SEED_FIELDS)} or a list of them, "
                          f"got {field!r}")
    return fields


def plan(patterns: list[str], seeds: list[int], out_root: str | os.PathLike) -> list[Cell]:
    if not seeds:
        raise ConfigError("give at least one seed (--seeds 0 1 2)")
    root = Path(out_root).expanduser()
    return [Cell(name, path, int(s), root) for name, path in expand_recipes(patterns) for s in seeds]


def materialise(cell: Cell, overrides: dict[str, Any], *, write: bool = True) -> TrainConfig:
    """The cell's validated config, written to ``cell.config_path`` unless ``write`` is false (fails
    before any run starts)."""
    from paczero.recipes import check_data_given

    values = load_yaml(cell.source)
    values.update(overrides)
    check_data_given(cell.source, values, "--set data=PATH")
    fields = seed_field(cell.source)
    values.update({f: cell.seed for f in fields}, out_dir=str(cell.run_dir), resume=cell.state() == "killed",
                  overwrite=False)
    cfg = TrainConfig.from_dict(values, source=f"{cell.recipe} (seed {cell.seed})").validate()
    if not write:
        return cfg
    cell.config_path.parent.mkdir(parents=True, exist_ok=True)
    header = {"recipe": {"name": cell.recipe, "source": recipe_source(cell.source), "seed": cell.seed,
                         "seed_field": fields[0] if len(fields) == 1 else list(fields), "overrides": overrides}}
    text = ("# materialised by 'paczero sweep': the recipe, the --set overrides, the seed and the run folder\n"
            + yaml.safe_dump(header, sort_keys=False) + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    cell.config_path.write_text(text)
    return cfg


def recipe_source(source: Path) -> str:
    """Where a cell's recipe came from, as its config records it: a shipped recipe by its path in the package
    (``paczero/recipes/<name>.yaml``), a YAML file as it was given."""
    from paczero.recipes import recipes_root

    try:
        return (Path("paczero/recipes") / Path(source).resolve().relative_to(recipes_root().resolve())).as_posix()
    except ValueError:
        return str(source)


def train_command(cell: Cell, *, resume: bool) -> list[str]:
    seeds = [a for f in seed_field(cell.source) for a in ("--" + f.replace("_", "-"), str(cell.seed))]
    cmd = [sys.executable, "-m", "paczero.cli", "train", "--config", str(cell.config_path), *seeds,
           "--out-dir", str(cell.run_dir)]
    return cmd + (["--resume"] if resume else [])


def _child_env(gpu: str | None, threads: int | None = None) -> dict[str, str]:
    """The cell's environment: this repository first on the path, its GPU, and its share of the CPU cores
    (``threads``: OMP_NUM_THREADS, which paczero train's torch threads follow, unless the sweep's own
    environment sets it)."""
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if threads is not None and not env.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _start(cmd: list[str], log_path: str, gpu: str | None = None, threads: int | None = None,
           dated: bool = True) -> subprocess.Popen:
    """The cell's process, detached from the terminal's process group: a Ctrl-C reaches it once, forwarded by the
    sweep. The log's header line holds the command, and the clock time unless ``dated`` is false (a sweep with a
    DP cell: the next cell's start would end the DP cell's time)."""
    with open(log_path, "a") as log:
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S') + ' ' if dated else ''}$ {' '.join(cmd)}\n")
        log.flush()
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_child_env(gpu, threads),
                                start_new_session=True)


class SlurmCell:
    """The function of one cell's SLURM job (submitit pickles it and runs it on the node): the cell's
    ``paczero train``, its output appended to the cell's log. SLURM warns of the time limit (and of a
    preemption) with SIGUSR2, ``--signal-delay-s`` seconds ahead; the run then finishes its step and
    writes a checkpoint, and :meth:`checkpoint` (submitit's requeue protocol) waits for that and has the
    job requeued to continue with ``--resume``, up to ``--max-requeues`` time limits."""

    def __init__(self, cell: Cell, dated: bool = True):
        self.cell, self.dated = cell, dated
        self._pid: int | None = None

    def __call__(self, resume: bool) -> int:
        with _start(train_command(self.cell, resume=resume), str(self.cell.log_path), dated=self.dated) as proc:
            self._pid = proc.pid
            return proc.wait()

    def checkpoint(self, resume: bool):
        submitit = submitit_module()
        if self._pid is not None:
            try:  # SLURM may have signalled the whole job already; SIGUSR2 twice is still one clean stop
                os.kill(self._pid, signal.SIGUSR2)
                # wait for the run's checkpoint without reaping it (the waiting __call__ does that)
                os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOWAIT)
            except (ProcessLookupError, ChildProcessError):
                pass
        begun = run_record(self.cell.run_dir).exists()  # in the folder, or in a DP run's private stage
        return submitit.helpers.DelayedSubmission(SlurmCell(self.cell, self.dated), begun)

    def __getstate__(self) -> dict:
        return {"cell": self.cell, "dated": self.dated, "_pid": None}


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
    """sweep.jsonl: one JSON record per decision or outcome, written under a lock.

    A cell's record carries no clock time: a DP baseline's run time depends on its private Poisson
    batches, and the times of its neighbours' records would bracket it. Only the sweep's own start and
    end are timed (``{"sweep": "start" | "end", "time": ...}``), and ``seconds`` (a cell's duration)
    only in a sweep without DP cells (``private_time`` False): with the sweep's span, the other cells'
    durations would give a DP cell's."""

    def __init__(self, path: Path, echo: Callable[[str], None]):
        self.path, self.echo, self.lock = path, echo, threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def mark(self, what: str) -> None:
        """The sweep's own start or end, with the clock time."""
        with self.lock:
            with open(self.path, "a") as f:
                f.write(json.dumps({"sweep": what, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")

    def write(self, cell: Cell, status: str, private_time: bool = False, **extra: Any) -> dict:
        if private_time:
            extra.pop("seconds", None)
        rec = {"recipe": cell.recipe, "seed": cell.seed, "run_dir": str(cell.run_dir), "status": status, **extra}
        with self.lock:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            detail = " ".join(f"{k}={v}" for k, v in extra.items() if k in ("gpu", "returncode", "resumed", "job_id"))
            detail = "; ".join(part for part in (detail, extra.get("reason")) if part)
            self.echo(f"[{status:>9}] {cell.recipe} seed {cell.seed}" + (f"  ({detail})" if detail else ""))
        return rec


def sweep(patterns: list[str], seeds: list[int], *, out_root: str = "runs", overrides: dict[str, Any] | None = None,
          gpus: str | None = None, workers: int = 1, slurm: dict[str, Any] | None = None, dry_run: bool = False,
          echo: Callable[[str], None] = print) -> list[dict]:
    """Run (or submit) every (recipe, seed) cell; return the final record of each cell.

    ``gpus``: None (one after another), ``"auto"`` or ``"0,1"`` (one worker per GPU).
    ``workers``: without GPUs, how many cells run at once on this machine's cores; the trainings divide the
    cores among themselves before every step (:mod:`paczero.machine.thread_share`), so the last cell gets them all.
    ``slurm``: the parameters of :func:`slurm_parameters`, to submit one SLURM job per cell instead.
    A cell is skipped when it is finished, when another process is writing its folder, or when the
    SLURM job a previous sweep submitted for it is still queued or running.
    """
    overrides = dict(overrides or {})
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers expects a whole number of at least 1, got {workers!r}")
    if workers > 1 and (gpus is not None or slurm is not None):
        raise ConfigError("--workers runs cells at once on this machine's CPU cores; with --gpus one cell runs per GPU, "
                          "with --slurm one per job")
    cells = plan(patterns, seeds, out_root)
    if slurm is not None and not dry_run:
        check_slurm()
    if dry_run:
        _dry_run(cells, overrides, echo)
        return []
    journal = _Journal(Path(out_root).expanduser() / "sweep.jsonl", echo)
    queued = queued_jobs(journal.path)  # SLURM jobs a previous sweep submitted
    journal.mark("start")
    todo, results, private_time = _triage(cells, overrides, journal, queued)
    if slurm is not None:
        return results + _submit_slurm(todo, slurm, journal, dated=not private_time)
    slots = [(g, g) for g in visible_gpus(gpus) or []] or [(f"cpu{i}", None) for i in range(workers)]
    results += _run_local(todo, slots, journal, private_time)
    return results


def _dry_run(cells: list[Cell], overrides: dict[str, Any], echo: Callable[[str], None]) -> None:
    """Validate every cell and print its command; write nothing."""
    for cell in cells:
        state = cell.state()
        if state in ("done", "running"):
            echo(f"skip    {cell.recipe} seed {cell.seed} ({'finished' if state == 'done' else 'running'})")
            continue
        materialise(cell, overrides, write=False)
        echo(("resume " if state == "killed" else "run    ") + " ".join(train_command(cell, resume=state == "killed")))


def _triage(cells: list[Cell], overrides: dict[str, Any], journal: _Journal, queued: dict[Path, str]):
    """Validate every cell's config before anything starts; returns the cells to run (with whether each resumes),
    the records of those skipped, and the run folders of DP cells (their duration depends on private batches)."""
    todo: list[tuple[Cell, bool]] = []
    results: list[dict] = []
    private_time: set[Path] = set()
    for cell in cells:
        state = cell.state()
        if state == "done":
            try:
                other = _other_settings(cell, materialise(cell, overrides, write=False))
            except ConfigError:  # a finished cell needs no valid config (its data may be gone)
                other = ""
            results.append(journal.write(cell, "skipped", reason="summary.json present" + (
                f"; it ran with other settings ({other}): use another --out-root for these" if other else "")))
            continue
        if state == "running":
            results.append(journal.write(cell, "skipped", reason="another process is writing the run folder"))
            continue
        if cell.run_dir in queued:
            results.append(journal.write(cell, "skipped", reason=f"SLURM job {queued[cell.run_dir]} is still queued",
                                         job_id=queued[cell.run_dir]))
            continue
        cfg = materialise(cell, overrides)
        if cfg.mechanism in DP_MECHANISMS:
            private_time.add(cell.run_dir)
        todo.append((cell, state == "killed"))
    return todo, results, private_time


def _run_local(todo: list[tuple[Cell, bool]], slots: list[tuple[str, str | None]], journal: _Journal,
               private_time: set[Path]) -> list[dict]:
    """Run the cells on this machine, one per slot at a time (a slot: a label and its GPU, or None for the CPU);
    returns their final records. A worker looks at a cell's folder again when it takes the cell: one that another
    sweep finished or is running meanwhile is skipped. Ctrl-C or SIGTERM stops the running cells after their step
    (with a checkpoint), a second one at once."""
    work: queue.Queue = queue.Queue()
    for item in todo:
        work.put(item)
    lock = threading.Lock()
    running: dict[str, subprocess.Popen] = {}
    stopping = threading.Event()
    results: list[dict] = []
    on_gpus = any(gpu is not None for _, gpu in slots)
    # GPU workers divide the cores once; CPU workers let the trainings divide them step by step (thread_share)
    threads = max(1, allowed_cores() // len(slots)) if on_gpus and len(slots) > 1 else None

    def worker(label: str, gpu: str | None) -> None:
        try:
            _work(label, gpu)
        finally:
            with lock:
                alive.remove(label)

    def _work(label: str, gpu: str | None) -> None:
        while not stopping.is_set():
            try:
                cell, resume = work.get_nowait()
            except queue.Empty:
                return
            state = cell.state()
            if state in ("done", "running"):
                with lock:
                    results.append(journal.write(cell, "skipped", reason="summary.json present" if state == "done"
                                                 else "another process is writing the run folder"))
                continue
            resume = state == "killed"
            journal.write(cell, "started", resumed=resume, gpu=gpu, config=str(cell.config_path), log=str(cell.log_path))
            t0 = time.time()
            with _start(train_command(cell, resume=resume), str(cell.log_path), gpu, threads,
                        dated=not private_time) as proc:
                with lock:  # one SIGINT per stop, whether it came before or after this cell started
                    running[label] = proc
                    if stopping.is_set():
                        proc.send_signal(signal.SIGINT)
                rc = proc.wait()
            running.pop(label, None)
            status = "done" if rc == 0 and cell.state() == "done" else ("stopped" if rc == 130 else "failed")
            rec = journal.write(cell, status, bool(private_time), returncode=rc,
                                seconds=round(time.time() - t0, 1), resumed=resume, gpu=gpu, log=str(cell.log_path))
            with lock:
                results.append(rec)

    def stop(signum, frame) -> None:  # each Ctrl-C or SIGTERM to the sweep goes on to the running cells:
        with lock:                     # the first stops them after their step with a checkpoint, a second at once
            stopping.set()
            for proc in list(running.values()):
                proc.send_signal(signal.SIGINT)

    alive = [label for label, _ in slots]
    with on_stop_signals(stop):  # polled, with no exception in flight: every stopped cell is recorded
        for label, gpu in slots:
            threading.Thread(target=worker, args=(label, gpu), daemon=True).start()
        while alive:
            time.sleep(0.2)
    journal.mark("end")
    if stopping.is_set():
        raise KeyboardInterrupt
    return results


def _other_settings(cell: Cell, wanted: TrainConfig) -> str:
    """How the finished run in ``cell`` differs from ``wanted`` (seed, folder and other execution keys aside),
    as ``key (there -> now)``; empty when it does not."""
    from paczero.experiments.report import experiment
    from paczero.experiments.report.cells import Run

    try:
        summary = json.loads((cell.run_dir / "summary.json").read_text())
        summary["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    now = experiment(json.loads(json.dumps(wanted.to_dict())))
    if now.get("data") not in (None, "demo"):  # recorded resolved by the run
        now["data"] = str(Path(now["data"]).expanduser().resolve())
    # as asked: template auto's chosen prompt and words read as auto (a key the finished run predates: its default)
    ran = experiment(Run("", "", cell.run_dir, summary).asked)
    resolved = {k for k, v in (("dtype", "auto"), ("mu", None)) if now.get(k) == v}  # the run recorded what they became
    return ", ".join(f"{k} {ran.get(k)!r} -> {now[k]!r}" for k in sorted(now) if ran.get(k) != now[k] and k not in resolved)


def _submit_slurm(todo: list[tuple[Cell, bool]], params: dict[str, Any], journal: _Journal,
                  dated: bool = True) -> list[dict]:
    """One SLURM job per cell through submitit (imported only here), by sbatch, never a local fallback."""
    submitit = submitit_module()
    if not todo:
        return []
    folder = todo[0][0].out_root / "slurm" / "%j"
    params = dict(params)
    executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm",
                                     slurm_max_num_timeout=params.pop("slurm_max_num_timeout"))
    executor.update_parameters(**params)
    records = []
    with executor.batch():
        jobs = [executor.submit(SlurmCell(c, dated), r) for c, r in todo]
    for (cell, resume), job in zip(todo, jobs):
        records.append(journal.write(cell, "submitted", job_id=str(job.job_id), resumed=resume,
                                     log=str(cell.log_path)))
    return records
