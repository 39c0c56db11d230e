"""What this machine computes fast: the dtype ``auto`` stands for, the μ that fits it, and the CPU threads.

``dtype: auto`` is bf16 where the device computes bf16 natively (a CUDA GPU of compute capability 8.0 or
more; a CPU whose flags hold ``avx512_bf16`` or ``amx_bf16``, or ``bf16`` on Arm) and fp32 everywhere else:
on a CPU without native bf16 every bf16 matmul is emulated, and a step runs several times slower than in
fp32 (docs/performance.md, "bf16 on a CPU without native bf16"). ``mu`` left unset (None) is the one that
fits the dtype: 1e-2 for bf16 (at 1e-3 the two-point difference drowns in bf16's rounding), 1e-3 otherwise.
The run records what they resolved to (run.json ``config``).

A paczero process uses the cores it is allowed (``os.sched_getaffinity``) for torch's intra-op threads;
``threads`` (``--threads``) sets the number, a local sweep divides the cores between its workers, and
trainings and regime maps that chose no number share the cores they overlap on (paczero/machine/thread_share.py).
"""
from __future__ import annotations

import io
import json
import os
import platform
import sys
from pathlib import Path

from paczero.config import FIRST_ORDER, ConfigError, TrainConfig

#: the perturbation scale μ that fits each dtype (docs/performance.md, "bf16 on CPU")
MU_FOR_DTYPE = {"fp32": 1e-3, "fp16": 1e-3, "bf16": 1e-2}
#: CPU flags (/proc/cpuinfo) of native bf16 arithmetic: x86's AVX512-BF16 and AMX, Arm's BF16
_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
#: what emulated bf16 costs (2-core AMD EPYC, AVX2, 2026-11-26; docs/performance.md, bf16 on CPU)
BF16_EMULATED = ("bf16 is emulated there and runs several times slower than fp32 (a SmolLM2-135M forward 6x, "
                 "a matmul 34x on an AVX2 AMD EPYC; docs/performance.md)")


def resolve_device(device: str) -> str:
    """``auto``: a CUDA GPU where there is one, else the CPU; a CUDA device named where there is none: an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available")
    return device


#: an environment variable that stands in for the CPU's flags (space- or comma-separated; empty: none), read by
#: :func:`cpu_flags` in this process and in every process it starts: ``PACZERO_CPU_FLAGS= paczero train ...`` resolves
#: ``dtype: auto`` as on a CPU without native bf16, ``PACZERO_CPU_FLAGS=avx512_bf16`` as on one with it
CPU_FLAGS_ENV = "PACZERO_CPU_FLAGS"


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere), or those :data:`CPU_FLAGS_ENV` names."""
    if CPU_FLAGS_ENV in os.environ:
        return set(os.environ[CPU_FLAGS_ENV].replace(",", " ").split())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        if name:
            return name
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_bf16(device: str, flags: set[str] | None = None) -> tuple[bool, str]:
    """Whether ``device`` (``cpu``, ``cuda``, ``cuda:N``) computes bf16 natively, and why, in words."""
    import torch

    if str(device).startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        name = torch.cuda.get_device_name(torch.device(device))
        has = (major, minor) >= (8, 0)
        return has, f"{name}, compute capability {major}.{minor} {'>=' if has else '<'} 8.0"
    told = f" (flags from {CPU_FLAGS_ENV})" if flags is None and CPU_FLAGS_ENV in os.environ else ""
    flags = cpu_flags() if flags is None else flags
    found = [f for f in _BF16_FLAGS if f in flags]
    capability = torch.backends.cpu.get_cpu_capability()
    if found:
        return True, f"{cpu_name()}: {', '.join(found)}{told}"
    return False, f"{cpu_name()}: {capability}, no avx512_bf16, amx_bf16 or bf16 among its flags{told}"


#: the lines :func:`fit_to_machine` holds back until :func:`announce` (after the inputs are checked)
_PENDING: list[str] = []


def announce(echo=None) -> None:
    """Say the lines of the dtype chosen (or of bf16's cost) that :func:`fit_to_machine` held back: when the
    model is about to load, so that bad input still ends in one error line."""
    while _PENDING:
        print(_PENDING.pop(0), file=echo or sys.stderr)


def resolve_precision(cfg: TrainConfig, device: str, saved: dict | None = None, echo=None,
                      mu_applies: bool = True) -> TrainConfig:
    """``cfg`` with ``dtype: auto`` and an unset ``mu`` resolved for ``device``; one line on ``echo`` (stderr)
    says which and why (and mu only where it applies: a zeroth-order training, not ``mu_applies=False``'s
    evaluation nor a first-order mechanism). ``saved``: the recorded config of the run being resumed, whose values auto keeps.
    A bf16 named on a CPU without native bf16 is kept, with one line saying what it costs."""
    echo = echo or sys.stderr
    changes: dict = {}
    if cfg.dtype == "auto":
        if saved and saved.get("dtype") in MU_FOR_DTYPE:
            changes["dtype"] = saved["dtype"]
        else:
            has, why = native_bf16(device)
            changes["dtype"] = "bf16" if has else "fp32"
            mu = cfg.mu if cfg.mu is not None else MU_FOR_DTYPE[changes["dtype"]]
            said_mu = f", mu {mu:g}" if mu_applies and cfg.mechanism not in FIRST_ORDER else ""
            print(f"paczero: dtype auto: {changes['dtype']}{said_mu} ({'native' if has else 'no native'} bf16 on "
                  f"{why}; --dtype fp32 or bf16 chooses)", file=echo)
    dtype = changes.get("dtype", cfg.dtype)
    if cfg.mu is None:
        changes["mu"] = saved["mu"] if saved and isinstance(saved.get("mu"), (int, float)) else MU_FOR_DTYPE[dtype]
    if cfg.dtype == "bf16" and not str(device).startswith("cuda") and not native_bf16(device)[0]:
        print(f"paczero: warning: dtype bf16 on a CPU without native bf16 ({native_bf16(device)[1]}): "
              f"{BF16_EMULATED}; --dtype auto, or --dtype fp32 --mu 1e-3, trains in fp32", file=echo)
    return cfg.replace(**changes) if changes else cfg


def allowed_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; the machine's count where none is known)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def set_threads(threads: int | None) -> int:
    """Give torch ``threads`` intra-op threads; None: ``OMP_NUM_THREADS`` where it is set (torchrun sets it
    per rank, a local sweep per worker), else the cores this process is allowed. Returns the number."""
    import torch

    n = threads or omp_threads() or allowed_cores()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def omp_threads() -> int | None:
    """``OMP_NUM_THREADS`` as a count (torchrun and a local sweep set it per process), or None."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return n if n >= 1 else None


def fit_to_machine(cfg: TrainConfig) -> TrainConfig:
    """A run's config with ``dtype: auto`` and an unset ``mu`` resolved for its device (a resumed run keeps
    what its run.json recorded), and torch's intra-op threads set; rank 0 says which dtype, and why, when the
    model loads (:func:`announce`)."""
    from paczero.checkpoint import run_record

    saved = None
    record = run_record(Path(cfg.out_dir).expanduser())  # a DP run's stays in its private stage until it ends
    if cfg.resume and record.is_file():
        try:
            saved = json.loads(record.read_text()).get("config")
        except (OSError, ValueError, AttributeError):
            saved = None  # the resume's own checks name what is wrong with the folder
    set_threads(cfg.threads)
    said = io.StringIO()
    cfg = resolve_precision(cfg, resolve_device(cfg.device), saved=saved if isinstance(saved, dict) else None,
                            echo=said)
    if os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0":  # said by build() when the model loads
        _PENDING[:] = said.getvalue().splitlines()
    return cfg
