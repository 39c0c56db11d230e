"""A DP run publishes once, at its end: nothing others can see moves with its private batches while it runs.

A DP baseline's steps take a time that grows with their private Poisson batches, and a file's times (birth,
change, modification) record when it was written. So a DP run writes everything in a private stage,
``RUN/private/stage/`` (inside ``private/``, mode 0700: no one else can list it, nor see a file there grow),
with the layout of a run folder; when the run ends, :func:`publish` copies each file into ``RUN`` as a
fresh file (a new inode: a rename would keep the birth time of the file's first write), removes the stage
and gives every path of the folder one access and modification time, the moment of publication, and so a
change time within the few milliseconds that the last step takes. The published files are born in the
seconds the copy takes, which depend on their sizes (public: the model's and the log's) only.

What a published DP run still tells is its length: the folder, its lock and ``private/`` were made when it
began, everything else when it ended. Anyone who watched the folder while the run went on saw that much
anyway. A run stopped before its end (a stop request, a kill) stays in the stage and publishes when a
``--resume`` finishes it. The PAC mechanisms and the non-private references write into ``RUN`` as they go:
their step times do not depend on any private data.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from paczero.checkpoint import STAGE_DIR, private_dir, set_times
from paczero.config import DP_MECHANISMS, TrainConfig

__all__ = ["working_dir", "make_stage", "publish"]
LAST = "summary.json"  # published last: a folder with it holds the whole run


def working_dir(cfg: TrainConfig, run_dir: Path) -> Path:
    """Where the run writes: the private stage for a DP run (a resume continues where the run began: the
    stage, or the folder itself for a DP run that an earlier paczero wrote in place), else ``run_dir``."""
    stage = Path(run_dir) / STAGE_DIR
    if cfg.mechanism not in DP_MECHANISMS:
        return Path(run_dir)
    if cfg.resume and not (stage / "run.json").exists() and (Path(run_dir) / "run.json").exists():
        return Path(run_dir)
    return stage


def make_stage(run_dir: Path) -> Path:
    """``RUN/private/stage/``, mode 0700, inside the owner-only ``private/``."""
    stage = private_dir(run_dir) / Path(STAGE_DIR).name
    stage.mkdir(mode=0o700, exist_ok=True)
    os.chmod(stage, 0o700)
    return stage


def publish(stage: Path, run_dir: Path) -> None:
    """Copy every file of ``stage`` into ``run_dir`` as a fresh file with the stage file's mode (``private/``'s
    files into ``run_dir``'s ``private/``), remove the stage, and give every path one time (module doc)."""
    stage, run_dir = Path(stage), Path(run_dir)
    tmp = run_dir / f".publish-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _copy_tree(stage, tmp)
    private = tmp / Path(STAGE_DIR).parent.name
    if private.is_dir():  # the journal: into the folder's own private/, which holds the stage
        for entry in sorted(private.iterdir()):
            _replace(entry, private_dir(run_dir) / entry.name)
        private.rmdir()
    entries = sorted(tmp.iterdir(), key=lambda p: (p.name == LAST, p.name))
    for entry in entries:
        _replace(entry, run_dir / entry.name)
    tmp.rmdir()
    shutil.rmtree(stage)
    set_times(run_dir, time.time())


def _copy_tree(src: Path, dest: Path) -> None:
    """``src`` into the new folder ``dest``: every file a new inode with its source's mode and content."""
    dest.mkdir(mode=0o700)
    for entry in sorted(src.iterdir()):
        target = dest / entry.name
        if entry.is_dir() and not entry.is_symlink():
            _copy_tree(entry, target)
        else:
            shutil.copyfile(entry, target, follow_symlinks=False)
            os.chmod(target, entry.stat().st_mode & 0o777)
    os.chmod(dest, src.stat().st_mode & 0o777)


def _replace(entry: Path, target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    os.replace(entry, target)
