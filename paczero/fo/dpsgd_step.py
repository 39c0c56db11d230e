"""One DP-SGD step: per-example gradients by Opacus, each clipped to L2 norm C, summed, noised, one AdamW step.

The first-order counterpart of :func:`paczero.zo.zo_step`, in one view:

1. for each micro-batch of the step's Poisson sample: the per-example losses, one backward; Opacus clips every
   example's whole gradient to norm ``C`` (``dp_clip``) and the clipped gradients are summed;
2. the mechanism (:class:`paczero.mechanisms.dpsgd.DPSGD`) draws Gaussian noise of scale ``sigma C`` per
   coordinate from the private generator; the noisy sum divided by the public ``q * n_train`` is the gradient;
3. AdamW (decoupled weight decay ``weight_decay``) takes one step at the scheduled learning rate.

Two ways to the clipped sum (:func:`grad_sample_mode`): on the LoRA track Opacus's per-sample gradient hooks
(``GradSampleHooks``: each example's adapter gradient is small, ``r (d_in + d_out)`` per layer); on the full
track ghost clipping (``GradSampleHooksFastGradientClipping``: per-example norms without per-example
gradients, then a second backward of the loss reweighted by the clip factors), since a per-example copy
of every weight needs memory of the micro-batch's rows times the model. Opacus's ghost clipping refuses
tied weights (SmolLM2 ties its input and output embeddings): such a model is fine-tuned with per-example
hooks, and a smaller ``token_budget`` (fewer rows per micro-batch) bounds their memory. Opacus's own noise and Poisson loader are not used: the Poisson
sample and the noise come from paczero's private generator (:mod:`paczero.privacy.secure_random`).
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from paczero.fo.state import Resumable
from paczero.mechanisms.base import Release

GRAD_SAMPLE_MODES = ("hooks", "ghost")


class OpacusError(ValueError):
    """A model whose trainable layers Opacus cannot give per-example gradients (one line)."""


@dataclass
class FirstOrder(Resumable):
    """What a DP-SGD run keeps between steps: Opacus's hooks, the optimizer, the trainable parameters (and, for a
    resume, the optimizer's state and each step's update: :mod:`paczero.fo.state`)."""

    hooks: object
    optimizer: object  # an Opacus DPOptimizer (clipping only) around torch's AdamW
    params: list[torch.nn.Parameter]
    mode: str
    clip: float

    @property
    def adamw(self) -> torch.optim.AdamW:
        return self.optimizer.original_optimizer

    def step(self, batches: Sequence, *, mechanism, loss_fn: Callable, lr: float, device,
             step: int | None = None) -> "FirstOrderResult":
        return dpsgd_step(batches, fo=self, mechanism=mechanism, loss_fn=loss_fn, lr=lr, device=device, step=step)

    def close(self) -> None:
        """Remove Opacus's hooks and the parameters' gradients (the model is inference-only again)."""
        self.hooks.remove_hooks()
        for p in self.params:
            p.grad = None
            p.requires_grad_(False)


def wrap(model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]], *, lr: float,
         weight_decay: float, clip: float, mode: str = "hooks") -> FirstOrder:
    """Attach Opacus to ``model`` for the trainable ``params`` (the others stay frozen); raises
    :class:`OpacusError` where Opacus cannot compute per-example gradients of a trainable layer."""
    from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"mode must be one of {GRAD_SAMPLE_MODES}, got {mode!r}")
    tensors = [p for _, p in params]
    trainable = {id(p) for p in tensors}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)
    problems = GradSampleHooks.validate(model, strict=False)
    if problems:
        raise OpacusError(f"Opacus cannot compute per-example gradients for this model: {_first_line(problems[0])}")
    for module in model.modules():  # Opacus records activations of training-mode layers; dropout elsewhere stays off
        if any(id(p) in trainable for p in module.parameters(recurse=False)):
            module.train()
    adamw = torch.optim.AdamW(tensors, lr=lr, weight_decay=weight_decay)
    if mode == "ghost":
        hooks = GradSampleHooksFastGradientClipping(model, batch_first=True, loss_reduction="sum", strict=False,
                                                    max_grad_norm=clip, use_ghost_clipping=True)
        optimizer = DPOptimizerFastGradientClipping(adamw, noise_multiplier=0.0, max_grad_norm=clip,
                                                    expected_batch_size=None, loss_reduction="sum")
    else:
        hooks = GradSampleHooks(model, batch_first=True, loss_reduction="sum", strict=False)
        optimizer = DPOptimizer(adamw, noise_multiplier=0.0, max_grad_norm=clip, expected_batch_size=None,
                                loss_reduction="sum")
    return FirstOrder(hooks, optimizer, tensors, mode, float(clip))


def attach(cfg, ranks, setup, params: Sequence[tuple[str, torch.nn.Parameter]]) -> FirstOrder:
    """A DP-SGD run's :class:`FirstOrder` for ``cfg`` (a :class:`paczero.config.TrainConfig`) on ``setup``'s model
    (a :class:`paczero.run.build.Setup`): one process only. A probe, the clipped gradient of one dev example (public:
    computed once and thrown away), makes a model Opacus cannot wrap (a trainable layer with buffers, or one its
    hooks cannot follow, as OPT's learned positions) or a task it would clip per row bad input
    (:class:`paczero.config.ConfigError`, one line) before the run's first evaluation."""
    from paczero.config import ConfigError

    model = setup.model

    if ranks.world > 1:
        raise ConfigError("dp-sgd runs in one process (torchrun's data parallelism is for the zeroth-order step)")
    try:
        fo = wrap(model, params, lr=cfg.lr, weight_decay=cfg.weight_decay, clip=cfg.dp_clip,
                  mode=grad_sample_mode(model, params, cfg.track))
    except OpacusError as e:
        raise ConfigError(str(e)) from None
    try:
        with torch.enable_grad():
            batch = setup.task.make_batches(setup.dev_enc[:1], token_budget=cfg.token_budget)[0].to(setup.device)
            with rows_read(model) as rows:
                losses = setup.task.losses(model, batch)
            check_rows(batch, losses, max(rows, default=0))
            clipped_sum(fo, losses.float(), [torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in fo.params])
    except ValueError as e:
        fo.close()
        raise ConfigError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - whatever Opacus's hooks meet in this model's forward or backward
        fo.close()
        raise ConfigError(f"Opacus cannot compute per-example gradients for this model ({cfg.track} track): "
                          f"{type(e).__name__}: {_first_line(e)}") from None
    return fo


def grad_sample_mode(model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]], track: str) -> str:
    """``"hooks"`` (per-example gradients) on the LoRA track and for a model that ties trainable weights (its
    input and output embeddings, as SmolLM2: Opacus's ghost clipping refuses tied parameters); ``"ghost"``
    for full fine-tuning otherwise."""
    if track == "lora":
        return "hooks"
    trainable, seen = {id(p) for _, p in params}, set()
    for _, p in model.named_parameters(remove_duplicate=False):
        if id(p) in trainable and id(p) in seen:
            return "hooks"
        seen.add(id(p))
    return "ghost"


def check_rows(batch, losses: torch.Tensor, read: int = 0) -> None:
    """Opacus clips each row of the model's batch: a task that scores one example on several rows (options of
    several tokens read one row each) would be clipped per row, and an example could move the sum by more than
    C. ``read``: the most rows the model's input embedding was seen to read (:func:`rows_read`), where known."""
    rows = max(batch.input_ids.shape[0], read)
    if rows != losses.numel():
        raise ValueError(f"dp-sgd clips per model row, and this task scores each example on "
                         f"{rows // max(losses.numel(), 1)} rows (options of several tokens, one row each with "
                         "this model); choose a verbalizer whose options are one token each")


@contextmanager
def rows_read(model):
    """The batch sizes the model's input embedding reads inside the block (a list, filled as it runs)."""
    from paczero.models import hf_model

    rows: list[int] = []
    embedding = getattr(hf_model(model), "get_input_embeddings", lambda: None)()
    handle = None if embedding is None else embedding.register_forward_hook(
        lambda module, args, out: rows.append(int(out.shape[0])))
    try:
        yield rows
    finally:
        if handle is not None:
            handle.remove()


def _first_line(problem: Exception) -> str:
    return " ".join(str(problem).split())


def clipped_sum(fo: FirstOrder, losses: torch.Tensor, sums: list[torch.Tensor]) -> None:
    """Add to ``sums`` the micro-batch's per-example gradients of ``losses`` (shape [B]), each clipped to
    L2 norm C by Opacus."""
    if fo.mode == "ghost":
        from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
            DPTensorFastGradientClipping(fo.hooks, fo.optimizer, losses, "sum").backward()  # p.grad: the clipped sum
        for s, p in zip(sums, fo.params):
            s += p.grad.to(s.dtype)
            p.grad = None
        return
    with warnings.catch_warnings():  # Opacus's module hooks fire on outputs when no input needs a gradient: expected
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        losses.sum().backward()
    fo.optimizer.clip_and_accumulate()  # p.summed_grad: the clipped per-example gradients, summed
    for s, p in zip(sums, fo.params):
        s += p.summed_grad.to(s.dtype)
        p.summed_grad = p.grad_sample = p.grad = None


@dataclass
class FirstOrderResult:
    """What one step computed: its train loss (mean over the batch; private in a DP run) and learning rate."""

    train_loss: float
    lr: float
    release: Release


def dpsgd_step(batches: Sequence, *, fo: FirstOrder, mechanism, loss_fn: Callable, lr: float, device,
               step: int | None = None) -> FirstOrderResult:
    """One DP-SGD step over ``batches`` (the micro-batches of the mechanism's Poisson sample, maybe none); ``step``:
    the run's step, whose noisy gradient the engine keeps for a resume (:mod:`paczero.fo.state`)."""
    sums = [torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in fo.params]
    total, rows = 0.0, 0
    with torch.enable_grad():
        for batch in batches:
            batch = batch.to(device)
            losses = loss_fn(batch).float()
            check_rows(batch, losses)
            clipped_sum(fo, losses, sums)
            total, rows = total + float(losses.detach().sum()), rows + losses.numel()
    numel = sum(p.numel() for p in fo.params)
    noise, release = mechanism.noise(numel)
    offset, grads = 0, []
    for s, p in zip(sums, fo.params):
        z = torch.from_numpy(noise[offset:offset + p.numel()]).view(p.shape).to(s.device)
        grads.append(((s + z) / mechanism.denominator).to(p.dtype))
        offset += p.numel()
    fo.apply(grads, lr, step)
    return FirstOrderResult(total / rows if rows else math.nan, lr, release)
