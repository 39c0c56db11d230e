"""A run's progress bar on stderr: a DP run's shows no rate and no time, which grow with its private batches."""
from __future__ import annotations

import sys

from paczero.config import DP_MECHANISMS, TrainConfig


def progress_bar(cfg: TrainConfig, start: int):
    """tqdm over the run's steps from ``start`` (off with ``progress: false``)."""
    from tqdm.auto import tqdm

    # into a file (a sweep's cell log, a batch job's output) a line a minute, not ten a second
    pace = {"mininterval": 0.1 if sys.stderr.isatty() else 60.0}
    if cfg.mechanism in DP_MECHANISMS:  # no rate, no elapsed time; into a file a line every tenth of the run
        pace = {"bar_format": "{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}"}
        if not sys.stderr.isatty():
            pace.update(mininterval=0.0, maxinterval=float("inf"), miniters=max(1, cfg.steps // 10))
    return tqdm(total=cfg.steps, initial=start, disable=not cfg.progress, unit="step", dynamic_ncols=True,
                file=sys.stderr, **pace)
