"""One non-private first-order step (``--mechanism adamw``): the mean loss of the step's mini-batch, one backward,
one AdamW step. No clipping, no noise: the ceiling a private method's gain is read against.

The same loop, run folder, dev-best selection and report as every other mechanism; the mini-batch comes from
:class:`paczero.mechanisms.reference.NonPrivateAdamW` (``batch_size`` distinct examples a step from a seeded,
public generator, or the whole universe). The model stays in inference mode (no dropout), as in the
zeroth-order step, so the gradient is that of the loss the zeroth-order methods estimate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from paczero.fo.dpsgd_step import FirstOrderResult
from paczero.fo.state import Resumable


@dataclass
class PlainFirstOrder(Resumable):
    """What an adamw run keeps between steps: torch's AdamW and the trainable parameters (and, for a resume,
    the optimizer's state and each step's update: :mod:`paczero.fo.state`)."""

    optimizer: torch.optim.AdamW
    params: list[torch.nn.Parameter]

    @property
    def adamw(self) -> torch.optim.AdamW:
        return self.optimizer

    def step(self, batches: Sequence, *, mechanism, loss_fn: Callable, lr: float, device,
             step: int | None = None) -> FirstOrderResult:
        return adamw_step(batches, fo=self, mechanism=mechanism, loss_fn=loss_fn, lr=lr, device=device, step=step)

    def close(self) -> None:
        for p in self.params:
            p.grad = None
            p.requires_grad_(False)


def attach(cfg, ranks, setup, params) -> PlainFirstOrder:
    """AdamW on the trainable ``params`` of ``setup``'s model (the others frozen); one process only."""
    from paczero.config import ConfigError

    if ranks.world > 1:
        raise ConfigError("adamw runs in one process (torchrun's data parallelism is for the zeroth-order step)")
    tensors = [p for _, p in params]
    trainable = {id(p) for p in tensors}
    for p in setup.model.parameters():
        p.requires_grad_(id(p) in trainable)
    return PlainFirstOrder(torch.optim.AdamW(tensors, lr=cfg.lr, weight_decay=cfg.weight_decay), tensors)


def adamw_step(batches: Sequence, *, fo: PlainFirstOrder, mechanism, loss_fn: Callable, lr: float, device,
               step: int | None = None) -> FirstOrderResult:
    """One step over ``batches`` (the micro-batches of the step's mini-batch): the gradient of the mean
    per-example loss, accumulated in float32 over the micro-batches, then AdamW at ``lr``; ``step``: the run's
    step, whose gradient the engine keeps for a resume (:mod:`paczero.fo.state`)."""
    sums = [torch.zeros(p.shape, dtype=torch.float32, device=p.device) for p in fo.params]
    total, rows = 0.0, 0
    with torch.enable_grad():
        for batch in batches:
            batch = batch.to(device)
            losses = loss_fn(batch).float()
            losses.sum().backward()
            for s, p in zip(sums, fo.params):
                if p.grad is not None:
                    s += p.grad.float()
                p.grad = None
            total, rows = total + float(losses.detach().sum()), rows + losses.numel()
    fo.apply([(s / max(rows, 1)).to(p.dtype) for s, p in zip(sums, fo.params)], lr, step)
    return FirstOrderResult(total / rows if rows else math.nan, lr, mechanism.release())
