"""Run directories and checkpoints: atomic, checksummed, secrets owner-only.

A run directory holds::

    run.json            public: paczero marker, resolved config, privacy fingerprint
    log.jsonl           one public record per step (the transcript and diagnostics)
    evals.jsonl         one record per evaluation
    checkpoints/step-NNNNNN/
        weights.safetensors   trainable parameters only (LoRA: the adapters)
        public.json           step, dev-best bookkeeping, log length
        private.json          mode 0600: mechanism state (secret index, posterior,
                              design, private generator state)
        manifest.json         sha256 of each file above
    best/weights.safetensors  dev-best trainable weights (selection reads dev metrics only)
    model/                    the final (dev-best) model, save_pretrained format
    summary.json        config, metrics, privacy statement

A checkpoint is written into a temporary folder and renamed into place, so a
crash leaves either the old or the new checkpoint, never half of one. Loading
verifies the checksums and falls back to the previous checkpoint when the
newest is damaged.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

MARKER = "paczero-run"
KEEP = 2


class CheckpointError(ValueError):
    pass


# -- a JSON codec that round-trips numpy arrays exactly ----------------------
def encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {"__ndarray__": base64.b64encode(arr.tobytes()).decode("ascii"),
                "dtype": arr.dtype.str, "shape": list(arr.shape)}
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            data = base64.b64decode(obj["__ndarray__"])
            return np.frombuffer(data, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data) if len(data) < (1 << 30) else None
        if len(data) >= (1 << 30):
            with os.fdopen(os.dup(fd), "wb") as f:
                f.write(data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, mode)


def write_json(path: Path, obj: Any, *, private: bool = False) -> None:
    _write(path, json.dumps(encode(obj), indent=None if private else 1).encode(), 0o600 if private else 0o644)


def atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write_json(tmp, obj)
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, step: int, weights: dict, public: dict, private: dict) -> Path:
    """Write checkpoint ``step`` atomically; keep the newest KEEP checkpoints."""
    from safetensors.torch import save_file

    root = run_dir / "checkpoints"
    root.mkdir(mode=0o700, exist_ok=True)
    final = root / f"step-{step:06d}"
    for stale in root.glob(".tmp-step-*"):  # left by a write that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    tmp.mkdir(mode=0o700)
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / "weights.safetensors"))
    write_json(tmp / "public.json", public)
    write_json(tmp / "private.json", private, private=True)
    manifest = {name: _sha256(tmp / name) for name in ("weights.safetensors", "public.json", "private.json")}
    write_json(tmp / "manifest.json", {"step": step, "sha256": manifest})
    dir_fd = os.open(tmp, os.O_RDONLY)
    os.fsync(dir_fd)
    os.close(dir_fd)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless every file matches its recorded checksum."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path.name}: unreadable manifest ({e.__class__.__name__})") from None
    for name, digest in manifest.get("sha256", {}).items():
        f = path / name
        if not f.exists():
            raise CheckpointError(f"checkpoint {path.name}: {name} is missing")
        if _sha256(f) != digest:
            raise CheckpointError(f"checkpoint {path.name}: {name} is corrupted (checksum mismatch)")


def load_latest_checkpoint(run_dir: Path, warn=print) -> tuple[int, dict, dict, dict] | None:
    """The newest checkpoint that verifies: (step, weights, public, private); None if there is none."""
    from safetensors.torch import load_file

    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            public = decode(json.loads((path / "public.json").read_text()))
            private = decode(json.loads((path / "private.json").read_text()))
            weights = load_file(str(path / "weights.safetensors"))
        except (CheckpointError, OSError, ValueError) as e:
            warn(f"warning: {e}; falling back to the previous checkpoint")
            continue
        return int(public["step"]), weights, public, private
    return None


def prepare_run_dir(out_dir: str, *, overwrite: bool, resume: bool) -> Path:
    """Check the output folder before any expensive work; never clobber a user's files.

    A fresh run needs an empty or absent folder. ``overwrite`` replaces an
    earlier paczero run (and refuses a folder that is not one). ``resume``
    needs an earlier run.
    """
    path = Path(out_dir).expanduser()
    is_run = (path / "run.json").exists()
    if resume:
        if not is_run:
            raise CheckpointError(f"cannot resume: {out_dir!r} holds no paczero run")
        return path
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise CheckpointError(f"output folder {out_dir!r} is not empty; pass --overwrite to replace an earlier run, or --resume to continue it")
        if not is_run:
            raise CheckpointError(f"refusing to overwrite {out_dir!r}: it is not a paczero run folder")
        try:
            marker = json.loads((path / "run.json").read_text()).get("marker")
        except (OSError, ValueError):
            marker = None
        if marker != MARKER:
            raise CheckpointError(f"refusing to overwrite {out_dir!r}: run.json is not a paczero marker")
        shutil.rmtree(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"output path {out_dir!r} is a file")
    path.mkdir(parents=True, exist_ok=True)
    return path


def truncate_jsonl(path: Path, keep_while) -> None:
    """Keep the leading records for which keep_while(record) holds (used on resume)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            break  # a torn last line from a crash
        if not keep_while(rec):
            break
        kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    os.replace(tmp, path)
