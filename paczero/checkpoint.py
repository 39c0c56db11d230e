"""Run directories and checkpoints: atomic, checksummed, secrets owner-only.

A run directory holds::

    .paczero.lock       held (flock) by the process writing the folder (RunLock)
    run.json            public: paczero marker, resolved config, data fingerprint, secret source, directions
    log.jsonl           one public record per step (the transcript and diagnostics)
    private/            mode 0700: what no one else may read or see the size of
      journal.jsonl     mode 0600: each step's record and the mechanism's state after it, written
                        before the record reaches log.jsonl (paczero.run.journal: a logged step is final);
                        every number fixed-width, so its size says nothing of j*
      updates/step-NNNNNN.safetensors
                        mode 0600, first-order runs (dp-sgd, adamw): the gradient step NNNNNN handed to
                        AdamW, written before its journal line, kept until no checkpoint kept predates it
                        (paczero.fo.state: a resume replays it instead of executing the step again)
      stage/            a DP run's folder until the run ends: every file below is written here first and
                        published once, at the end, as fresh copies (paczero.run.publish)
    evals.jsonl         one record per evaluation
    checkpoints/step-NNNNNN/   (checkpoints/ mode 0700)
        weights.safetensors   trainable parameters only (LoRA: the adapters)
        public.json           step, dev-best bookkeeping, zero-shot metrics, seconds so far
        private.json          mode 0600: mechanism state (secret index, posterior,
                              design, private generator state)
        optimizer.safetensors mode 0600, first-order runs: AdamW's moments and step counts
        manifest.json         sha256 of each file above
    best/weights.safetensors  dev-best trainable weights (selection reads dev metrics only)
    selected.safetensors      the released trainable weights (dev-best, or final)
    rungs/step-N/weights.safetensors, rungs.jsonl
                              a T-ladder's weights at each rung and their evaluations (paczero.run.rungs)
    model/                    the released model (paczero.run.release): save_pretrained format, task.json,
                              a model card (README.md); every file 0644
    summary.json        config, metrics, privacy statement

Every field is described in docs/outputs.md.

A checkpoint is written into a temporary folder and renamed into place, so a
crash leaves either the old or the new checkpoint, never half of one. Loading
verifies the checksums and falls back to the previous checkpoint when the
newest is damaged.
"""
from __future__ import annotations

import base64
import hashlib
import errno
import json
import logging
import os
import platform
import shutil
from pathlib import Path
from typing import Any

import numpy as np

MARKER = "paczero-run"
KEEP = 2
#: every name a run writes in its folder (docs/outputs.md), besides its lock: what ``--overwrite`` deletes
PRIVATE_DIR = "private"
#: where a DP run writes until it ends (paczero.run.publish): inside ``private/``, so no one else sees it grow
STAGE_DIR = f"{PRIVATE_DIR}/stage"
#: where a first-order run keeps each step's update until a checkpoint covers it (paczero.fo.state)
UPDATES_DIR = f"{PRIVATE_DIR}/updates"
RUN_FILES = ("run.json", "log.jsonl", PRIVATE_DIR, "journal.jsonl", "evals.jsonl", "checkpoints", "best", "selected.safetensors",
             "model", "summary.json", "rungs", "rungs.jsonl", "curves.png", "tensorboard", "wandb",
             "lr-candidates", "lr_choice.json")  # the last two: a learning-rate choice's (paczero/run/lr_choice.py)
_log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    pass


# -- a JSON codec that round-trips numpy arrays exactly ----------------------
def encode(obj: Any, fixed: bool = False) -> Any:
    """JSON-able form of ``obj``; numpy arrays as base64 of their bytes (exact). ``fixed``: every int and
    float too, as the base64 of its 8 bytes, so that the encoding's length does not depend on any value
    (private files: their size must not say what they hold, e.g. the number of digits of j*)."""
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {"__ndarray__": base64.b64encode(arr.tobytes()).decode("ascii"),
                "dtype": arr.dtype.str, "shape": list(arr.shape)}
    if isinstance(obj, dict):
        return {str(k): encode(v, fixed) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v, fixed) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if fixed and isinstance(obj, int) and not isinstance(obj, bool) and not -(1 << 63) <= obj < (1 << 63):
        if 0 <= obj < (1 << 256):  # a generator's 128-bit state word, say: 32 bytes
            return {"__uint256__": obj.to_bytes(32, "little").hex()}
        return obj
    if fixed and isinstance(obj, (int, float)) and not isinstance(obj, bool):
        arr = np.asarray([obj], dtype="<i8" if isinstance(obj, int) else "<f8")
        return {"__scalar__": base64.b64encode(arr.tobytes()).decode("ascii"), "dtype": arr.dtype.str}
    return obj


def decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            data = base64.b64decode(obj["__ndarray__"])
            return np.frombuffer(data, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        if "__uint256__" in obj:
            return int.from_bytes(bytes.fromhex(obj["__uint256__"]), "little")
        if "__scalar__" in obj:
            return np.frombuffer(base64.b64decode(obj["__scalar__"]), dtype=np.dtype(obj["dtype"]))[0].item()
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


def public_mode() -> int:
    """The mode the user's umask gives any new file (0644 under the usual umask 022)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_json(path: Path, obj: Any, *, private: bool = False) -> None:
    """``obj`` as JSON; ``private``: mode 0600 and the fixed-width encoding (:func:`encode`), else the mode
    of any new file."""
    _write(path, json.dumps(encode(obj, fixed=private), indent=None if private else 1).encode(),
           0o600 if private else public_mode())


def save_weights(path: Path, tensors: dict) -> None:
    """Tensors to a safetensors file, atomically (a temporary file renamed into place), with the mode of any
    new file: released weights are public."""
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
    os.chmod(tmp, public_mode())
    os.replace(tmp, path)


def set_times(run_dir: Path, when: float) -> None:
    """Give every file and folder of the run (the folder itself included) the access and modification time
    ``when``; each one's change time becomes now (paczero.run.publish)."""
    for path in [Path(run_dir), *Path(run_dir).rglob("*")]:
        os.utime(path, (when, when), follow_symlinks=False)


def run_record(run_dir: Path) -> Path:
    """The run's ``run.json``: in the folder, or in the private stage of a DP run that has not ended."""
    staged = Path(run_dir) / STAGE_DIR / "run.json"
    return staged if staged.exists() else Path(run_dir) / "run.json"


def private_dir(run_dir: Path) -> Path:
    """``RUN/private/``, mode 0700: where a run keeps what no one else may read, or even see the size of."""
    path = Path(run_dir) / PRIVATE_DIR
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write_json(tmp, obj)
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, step: int, weights: dict, public: dict, private: dict,
                    tensors: dict[str, dict] | None = None) -> Path:
    """Write checkpoint ``step`` atomically; keep the newest KEEP checkpoints (and the kept updates that one of
    them needs: :func:`save_update`). ``tensors``: more private state, ``{name: {key: tensor}}``, each written
    to ``name.safetensors`` (mode 0600) and read back into the private part under ``name``. A write that fails
    (a full disk) leaves the earlier checkpoints as they were and raises CheckpointError (one line)."""
    try:
        return _save_checkpoint(run_dir, step, weights, public, private, tensors or {})
    except OSError as e:
        for stale in (run_dir / "checkpoints").glob(f".tmp-step-{step:06d}-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)  # give back the space of the half-written copy
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise CheckpointError(
            f"cannot write the checkpoint of step {step} in {str(run_dir)!r}: {e.strerror or e.__class__.__name__}; "
            + ("free some space, then " if full else "") + "continue the run with --resume (every logged step "
            "is kept)") from None


def _save_checkpoint(run_dir: Path, step: int, weights: dict, public: dict, private: dict,
                     tensors: dict[str, dict]) -> Path:
    from safetensors.torch import save_file

    root = run_dir / "checkpoints"
    root.mkdir(mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)
    final = root / f"step-{step:06d}"
    for stale in root.glob(".tmp-step-*"):  # left by a write that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    tmp.mkdir(mode=0o700)
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / "weights.safetensors"))
    write_json(tmp / "public.json", public)
    write_json(tmp / "private.json", private, private=True)
    for name, values in tensors.items():
        save_file({k: v.detach().contiguous().cpu() for k, v in values.items()}, str(tmp / f"{name}.safetensors"))
        os.chmod(tmp / f"{name}.safetensors", 0o600)
    names = ("weights.safetensors", "public.json", "private.json", *(f"{name}.safetensors" for name in tensors))
    manifest = {name: _sha256(tmp / name) for name in names}
    write_json(tmp / "manifest.json", {"step": step, "sha256": manifest})
    dir_fd = os.open(tmp, os.O_RDONLY)
    os.fsync(dir_fd)
    os.close(dir_fd)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    oldest = int(list_checkpoints(run_dir)[0].name.removeprefix("step-"))
    for update in sorted((run_dir / UPDATES_DIR).glob("step-*.safetensors")):  # each kept checkpoint is past
        if int(update.name.removeprefix("step-").removesuffix(".safetensors")) < oldest:  # it: none replays it
            update.unlink()
    return final


def _update_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / UPDATES_DIR / f"step-{step:06d}.safetensors"


def save_update(run_dir: Path, step: int, tensors: dict) -> None:
    """Keep step ``step``'s update (a first-order run's gradient, owner-only) in ``private/updates/``, on disk
    (``fsync``) when this returns: the step's journal line comes after it (paczero.fo.state)."""
    from safetensors.torch import save_file

    folder = private_dir(run_dir) / Path(UPDATES_DIR).name
    folder.mkdir(mode=0o700, exist_ok=True)
    path = _update_path(run_dir, step)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
    os.chmod(tmp, 0o600)
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, path)
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def check_updates(run_dir: Path, steps) -> None:
    """CheckpointError (one line) unless the update of each of ``steps`` is kept."""
    for step in steps:
        if not _update_path(run_dir, step).is_file():
            raise CheckpointError(f"cannot resume: the update of logged step {step} is not in {UPDATES_DIR}/; "
                                  "start the run again in another folder")


def load_update(run_dir: Path, step: int) -> dict:
    """Step ``step``'s kept update; CheckpointError (one line) if it is not there or cannot be read."""
    from safetensors.torch import load_file

    check_updates(run_dir, [step])
    path = _update_path(run_dir, step)
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - OSError, or safetensors' own error for a damaged file
        raise CheckpointError(f"cannot resume: the update of logged step {step} in {UPDATES_DIR}/ cannot be read "
                              f"({e.__class__.__name__}); start the run again in another folder") from None


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


def load_latest_checkpoint(run_dir: Path, warn=None) -> tuple[int, dict, dict, dict] | None:
    """The newest checkpoint that verifies: (step, weights, public, private); None if there is none.
    ``warn`` (default: a logged warning) hears of each damaged checkpoint that is passed over."""
    from safetensors.torch import load_file

    warn = warn or _log.warning
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            public = decode(json.loads((path / "public.json").read_text()))
            private = decode(json.loads((path / "private.json").read_text()))
            weights = load_file(str(path / "weights.safetensors"))
            for name in json.loads((path / "manifest.json").read_text())["sha256"]:
                if name.endswith(".safetensors") and name != "weights.safetensors":  # save_checkpoint's tensors
                    private[name.removesuffix(".safetensors")] = load_file(str(path / name))
        except (CheckpointError, OSError, ValueError) as e:
            warn(f"{e}; falling back to the previous checkpoint")
            continue
        return int(public["step"]), weights, public, private
    return None


class RunLock:
    """The claim of one process on a run folder while it writes there: an exclusive ``flock`` on the
    folder's ``.paczero.lock``, released when the process ends in any way (also SIGKILL), so no lock is
    ever stale. A second ``paczero train`` on the same folder (a double launch, a resume while the run
    is still going, a sweep started twice, a SLURM job submitted again) is refused with one line
    instead of two processes writing the same transcript. Advisory, and a no-op where ``fcntl`` is
    missing (Windows); on NFS Linux maps it to a POSIX lock of the file."""

    NAME = ".paczero.lock"

    def __init__(self, run_dir: Path, *, created: bool = False):
        self.path = Path(run_dir) / self.NAME
        self._fd: int | None = None
        self._created = created  # this process made the folder: release() removes it if nothing was written
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise CheckpointError(f"run folder {str(run_dir)!r} is in use by another paczero process"
                                  + (f" ({holder})" if holder else "") + "; wait for it to end, or stop it") from None
        except OSError:  # a file system without locks: write unguarded, as before locks existed
            os.close(fd)
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}".encode(), 0)
        self._fd = fd

    @staticmethod
    def held(run_dir: Path) -> bool:
        """True while another process holds ``run_dir``'s lock (this process must not hold it itself)."""
        try:
            import fcntl
            fd = os.open(Path(run_dir) / RunLock.NAME, os.O_RDWR)
        except (ImportError, OSError):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing also drops the lock this probe took
        return False

    def release(self) -> None:
        folder = self.path.parent
        try:
            if self._created and self._fd is not None and [p.name for p in folder.iterdir()] == [self.NAME]:
                self.path.unlink()  # a run that stopped before writing anything leaves no folder behind
                folder.rmdir()
        except OSError:  # the folder went away (or changed) meanwhile: nothing of ours to tidy
            pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def prepare_run_dir(out_dir: str, *, overwrite: bool, resume: bool,
                    reads: dict[str, str | None] | None = None) -> tuple[Path, RunLock]:
    """Check the output folder before any expensive work, never clobber a user's files, and claim it.

    A fresh run needs an empty or absent folder. ``overwrite`` allows an earlier
    paczero run there (and refuses a folder that is not one, or one where an
    input of this run is among the files a run writes: ``reads`` names them, e.g.
    ``{"data file": path}``); the earlier run's files are deleted only by
    :func:`clear_run_dir`, once every input has been read and checked. ``resume`` needs an earlier run. A folder that another
    process holds (:class:`RunLock`) is refused in every case. The caller releases
    the returned lock when done.
    """
    path = Path(out_dir).expanduser()
    try:
        return _prepare_run_dir(path, out_dir, overwrite=overwrite, resume=resume, reads=reads or {})
    except OSError as e:  # no permission, a file where a folder should be, a read-only file system, ...
        raise CheckpointError(f"output folder {out_dir!r}: {e.strerror or e.__class__.__name__}"
                              + (f" ({e.filename})" if e.filename and str(e.filename) != str(path) else "")) from None


def _prepare_run_dir(path: Path, out_dir: str, *, overwrite: bool, resume: bool,
                     reads: dict[str, str | None]) -> tuple[Path, RunLock]:
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"output path {out_dir!r} is a file")
    is_run = run_record(path).exists()
    if resume:
        if not is_run:
            raise CheckpointError(f"cannot resume: {out_dir!r} holds no paczero run")
        return path, RunLock(path)
    entries = [p for p in path.iterdir() if p.name != RunLock.NAME] if path.exists() else []
    if entries:
        if not overwrite:
            raise CheckpointError(f"output folder {out_dir!r} is not empty; pass --overwrite to replace an earlier run, or --resume to continue it")
        if not is_run:
            raise CheckpointError(f"refusing to overwrite {out_dir!r}: it is not a paczero run folder")
        try:
            marker = json.loads(run_record(path).read_text()).get("marker")
        except (OSError, ValueError):
            marker = None
        if marker != MARKER:
            raise CheckpointError(f"refusing to overwrite {out_dir!r}: run.json is not a paczero marker")
        ours = [(path / name).resolve() for name in RUN_FILES]
        for what, value in reads.items():
            given = Path(value).expanduser().resolve() if value else None
            if given is not None and any(own == given or own in given.parents for own in ours):
                raise CheckpointError(f"refusing to overwrite {out_dir!r}: it holds this run's {what} ({value}); "
                                      "move it out of the folder first")
        return path, RunLock(path)  # never touch a run that is still being written
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    return path, RunLock(path, created=created)


def own_entry(name: str) -> bool:
    """Whether a run writes ``name`` in its folder: one of RUN_FILES, or a temporary of one of them
    (``.run.json.tmp1234``: an atomic write that a crash interrupted)."""
    return name in RUN_FILES or any(name.startswith(f".{own}.tmp") for own in RUN_FILES)


def clear_run_dir(path: Path) -> list[str]:
    """Delete the earlier run that ``--overwrite`` replaces: the files a run writes (RUN_FILES and their
    temporaries). Everything else in the folder (a user's notes, data, anything paczero did not write)
    stays; its names are returned, sorted."""
    kept = []
    for entry in sorted(path.iterdir()):
        if entry.name == RunLock.NAME:
            continue
        if not own_entry(entry.name):
            kept.append(entry.name)
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return kept
