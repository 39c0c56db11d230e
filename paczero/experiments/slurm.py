"""SLURM for ``paczero sweep --slurm``: the checked parameters of one job per cell, submitit imported
without touching the process's logging, and which cells' jobs are still queued (``squeue``). The job
itself, :class:`paczero.experiments.sweep.SlurmCell`, runs the cell's ``paczero train`` and requeues at a time limit."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from paczero.config import ConfigError


#: SLURM settings with a flag of their own in ``paczero sweep`` (``--slurm-arg`` may not set them)
SLURM_FLAGS = {"partition": "--partition", "timeout_min": "--timeout-min", "time": "--timeout-min",
               "signal": "--signal-delay-s", "requeue": "--max-requeues", "no_requeue": "--max-requeues",
               "gpus_per_node": "--gpus-per-node", "gpus": "--gpus-per-node", "gres": "--gpus-per-node",
               "cpus_per_task": "--cpus-per-task", "mem": "--mem-gb", "mem_gb": "--mem-gb"}


def slurm_parameters(*, partition: str | None = None, timeout_min: int = 24 * 60, gpus_per_node: int = 1,
                     cpus_per_task: int = 8, mem_gb: int = 64, signal_delay_s: int = 300, max_requeues: int = 20,
                     extra: list[str] | None = None) -> dict[str, Any]:
    """The checked parameters of one SLURM job per cell: submitit's own, plus ``extra`` sbatch options
    given as ``KEY=VALUE`` strings (``constraint=a100``, ``exclude=node1,node2``, ``qos=high``).
    ``signal_delay_s``: how long before the time limit SLURM warns the job (a step and a checkpoint
    must fit); ``max_requeues``: how many time limits a cell's job may requeue itself after."""
    for name, value, least in (("--timeout-min", timeout_min, 1), ("--gpus-per-node", gpus_per_node, 0),
                               ("--cpus-per-task", cpus_per_task, 1), ("--mem-gb", mem_gb, 1),
                               ("--signal-delay-s", signal_delay_s, 1), ("--max-requeues", max_requeues, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
    additional: dict[str, str] = {}
    for item in extra or []:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key or not value.strip():
            raise ConfigError(f"--slurm-arg expects KEY=VALUE (an sbatch option), got {item!r}")
        if key in SLURM_FLAGS:
            raise ConfigError(f"--slurm-arg {key}: use {SLURM_FLAGS[key]} for it")
        additional[key] = value.strip()
    if signal_delay_s >= timeout_min * 60:
        raise ConfigError(f"--signal-delay-s ({signal_delay_s}) must be shorter than the time limit "
                          f"(--timeout-min {timeout_min} = {timeout_min * 60} s)")
    return {"slurm_partition": partition, "timeout_min": timeout_min, "gpus_per_node": gpus_per_node,
            "cpus_per_task": cpus_per_task, "mem_gb": mem_gb, "name": "paczero",
            "slurm_signal_delay_s": signal_delay_s, "slurm_max_num_timeout": max_requeues,
            **({"slurm_additional_parameters": additional} if additional else {})}


def submitit_module():
    """submitit, imported without the ``logging.config.dictConfig`` it runs at import, which closes every
    logging handler the process has (a user's, pytest's). A job's process imports it afresh and configures
    its logging there (its log then shows the signals the job received)."""
    if "submitit" in sys.modules:
        return sys.modules["submitit"]
    old = os.environ.get("SUBMITIT_LOG_LEVEL")
    os.environ["SUBMITIT_LOG_LEVEL"] = "NOCONFIG"
    try:
        import submitit
    finally:
        if old is None:
            del os.environ["SUBMITIT_LOG_LEVEL"]
        else:
            os.environ["SUBMITIT_LOG_LEVEL"] = old
    return submitit


def check_slurm() -> None:
    try:
        submitit_module()
    except ImportError:
        raise ConfigError("--slurm needs submitit: pip install 'paczero[slurm]' (or pip install submitit)") from None
    if shutil.which("sbatch") is None:
        raise ConfigError("--slurm needs SLURM's sbatch on PATH: run the sweep where jobs are submitted (a login node)")


def queued_jobs(journal: Path) -> dict[Path, str]:
    """The run folders of cells whose latest submitted SLURM job (``submitted`` in the sweep journal at
    ``journal``) is still in the queue (pending or running)."""
    submitted: dict[Path, str] = {}
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("status") == "submitted" and rec.get("job_id"):
                submitted[Path(rec["run_dir"])] = str(rec["job_id"])
    if not submitted or shutil.which("squeue") is None:
        return {}
    out = subprocess.run(["squeue", "--noheader", "--array", "--format=%i"], capture_output=True, text=True)
    if out.returncode != 0:
        raise ConfigError(f"squeue failed, so the sweep cannot tell which submitted cells are still queued: "
                          f"{(out.stderr.strip().splitlines() or ['exit code %d' % out.returncode])[0]}")
    live = set(out.stdout.split())
    return {run_dir: job for run_dir, job in submitted.items() if job in live}
