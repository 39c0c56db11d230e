"""One zeroth-order step: :func:`zo_step`, the only place where a step is assembled.

Algorithm 1 of the paper: the per-sample two-point scalars along the step's K public
directions (lines 1-3, :func:`two_point_scalars`, gathered over the data-parallel ranks),
the stability clip (line 4), the release (lines 5-14: the mechanism's, on rank 0), and the
update along z (line 15, :meth:`paczero.zo.perturb.Perturber.apply_update`). The training
loop, the data-parallel ranks, ``paczero bench`` and ``paczero audit`` all call it.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from paczero.zo.perturb import Perturber


@torch.inference_mode()
def two_point_scalars(perturber: Perturber, step: int, num_directions: int, mu: float,
                      batches: Sequence, loss_fn: Callable, n_rows: int, device,
                      batch_losses: list | None = None) -> tuple[np.ndarray, float]:
    """Per-sample scalars g[k, r] = (l_r(theta + mu z_k) - l_r(theta - mu z_k)) / (2 mu) (eq. zo-scalar).

    ``batches`` hold row positions ``batch.index`` in [0, n_rows). Returns the
    float64 array [K, n_rows] and the mean of (l+ + l-)/2 over rows for
    direction 0 (the train loss for the log, at no extra forward pass).
    ``batch_losses``, if given, receives each batch's sum of (l+ + l-)/2
    (data parallelism adds them up in the single process's order).
    """
    g = np.zeros((num_directions, n_rows), dtype=np.float64)
    loss_sum, count = 0.0, 0
    target = torch.device(device)
    moved = [batch if _on(batch, target) else batch.to(device) for batch in batches]
    # one perturbed block per sign over every micro-batch (cached, or lockstep 0); otherwise waves
    # of micro-batches whose + and - forwards share each draw of z
    waves = None if perturber.cache or perturber.lockstep == 0 else lockstep_waves(batches, perturber)
    for k in range(num_directions):
        if waves is None:
            with perturber.perturbed(step, k, +mu):
                plus = [loss_fn(b) for b in moved]
            with perturber.perturbed(step, k, -mu):
                minus = [loss_fn(b) for b in moved]
        else:
            plus, minus = [], []
            for start, stop in waves:
                part = moved[start:stop]
                out = perturber.evaluate(step, k, [(+mu, partial(loss_fn, b)) for b in part]
                                         + [(-mu, partial(loss_fn, b)) for b in part])
                plus += out[:len(part)]
                minus += out[len(part):]
        if not batches:
            continue
        # every micro-batch's scalars at once, one copy to the host per direction: the same element-wise
        # arithmetic as batch by batch, and each batch's loss sum reduced over a tensor of its own as before
        lp, lm = torch.cat(plus).double(), torch.cat(minus).double()
        g[k, np.concatenate([np.asarray(b.index) for b in batches])] = ((lp - lm) / (2.0 * mu)).cpu().numpy()
        if k == 0:
            sizes = [len(b.index) for b in batches]
            sums = torch.stack([(a + b).sum() for a, b in zip(lp.split(sizes), lm.split(sizes))]).tolist()
            for size, total in zip(sizes, sums):
                batch_sum = float(total) / 2.0
                loss_sum += batch_sum
                count += size
                if batch_losses is not None:
                    batch_losses.append(batch_sum)
    return g, loss_sum / max(count, 1)


def _on(batch, device: torch.device) -> bool:
    """Every tensor of ``batch`` already on ``device`` (then no copy of the batch is made)."""
    return all(v.device == device for v in vars(batch).values() if isinstance(v, torch.Tensor))


def lockstep_waves(batches: Sequence, perturber: Perturber) -> list[tuple[int, int]]:
    """The lock-step waves of an uncached step, as [start, stop) ranges of ``batches``.

    ``perturber.lockstep`` micro-batches each; with ``perturber.wave_tokens``, as
    many consecutive micro-batches as fit in that many padded tokens (at least one).
    """
    if perturber.wave_tokens is None:
        L = perturber.lockstep
        return [(a, min(a + L, len(batches))) for a in range(0, len(batches), L)]
    waves, start, tokens = [], 0, 0
    for j, b in enumerate(batches):
        if j > start and tokens + b.num_tokens > perturber.wave_tokens:
            waves.append((start, j))
            start, tokens = j, 0
        tokens += b.num_tokens
    if len(batches) > start:
        waves.append((start, len(batches)))
    return waves


def stability_clip(g: np.ndarray, c: float | None) -> np.ndarray:
    """Algorithm 1, line 4: sgn(g) * min(|g|, c); a utility stabiliser, not a privacy device."""
    if c is None:
        return g
    return np.clip(g, -c, c)


@dataclass
class StepResult:
    """What one step computed: the raw per-sample scalars ``[K, rows]`` (before the clip), the train loss
    (mean of (l+ + l-)/2 over the rows, direction 0), the released coefficients and learning rate, and
    the seconds of its parts."""
    scalars: np.ndarray
    train_loss: float
    coefs: list[float]
    lr: float
    seconds: dict[str, float] = field(default_factory=dict)


def zo_step(step: int, batches: Sequence, rows: int, *, perturber: Perturber, ranks, loss_fn: Callable,
            num_directions: int, mu: float, clip: float | None, weight_decay: float, device,
            release: Callable[[np.ndarray], tuple[Sequence[float], float]], stop: bool = False) -> StepResult:
    """One step of Algorithm 1 over ``batches`` (``rows`` examples): scalars, clip, release, update.

    ``ranks`` computes the scalars (:meth:`paczero.run.distributed.SingleProcess.two_point_scalars`: this
    process alone, or this rank's share gathered with the others'; ``stop`` travels with them).
    ``release(clipped)`` returns the K coefficients and the learning rate of the update
    ``theta <- (1 - lr wd) theta - (lr / K) sum_k coef_k z_k``: the mechanism's release on rank 0
    (which publishes it to the other ranks), rank 0's published release on the others, the logged
    release when a run is replayed.
    """
    t0 = time.perf_counter()
    g, train_loss = ranks.two_point_scalars(perturber, step, num_directions, mu, batches, loss_fn, rows, device,
                                            stop=stop)
    t1 = time.perf_counter()
    coefs, lr = release(stability_clip(g, clip))
    t2 = time.perf_counter()
    perturber.apply_update(step, coefs, lr, weight_decay)
    t3 = time.perf_counter()
    return StepResult(g, train_loss, [float(c) for c in coefs], float(lr),
                      {"scalars_s": t1 - t0, "release_s": t2 - t1, "update_s": t3 - t2})
