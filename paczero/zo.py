"""The zeroth-order step: public directions, exact perturbation, per-sample scalars, update.

Algorithm 1, lines 1-5 and 15 of the paper. The direction z_t ~ N(0, I_d) is
public: it is regenerated per parameter from a seed that depends only on the
public seed, the step, the direction index k and the parameter's position, so
it is never stored for full fine-tuning (MeZO's trick) and every rank of a
data-parallel run regenerates the same z.

Exact restoration. MeZO perturbs in place (+mu z, -2 mu z, +mu z) and, in
fp16/bf16, the weights drift from their original values. Here the original
parameter tensors are never modified during the two-point evaluation: a
forward pre-hook on each module that owns trainable parameters swaps in the
perturbed tensor ``theta +/- mu z`` for that module's call only, and a forward
hook swaps the original back. Only one module's perturbed weights exist at a
time, so memory stays at the inference level; restoration is bit-exact by
construction. Directions are cached for the step when the trainable
parameters are small (LoRA), and regenerated per call otherwise.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np
import torch


def direction_seed(public_seed: int, step: int, k: int, index: int) -> int:
    """The torch seed of direction k of step `step` for trainable parameter `index` (public)."""
    ss = np.random.SeedSequence([int(public_seed) & 0xFFFFFFFF, int(step), int(k), int(index), 0x7A0])
    return int(ss.generate_state(1, dtype=np.uint64)[0] & np.uint64(0x7FFFFFFFFFFFFFFF))


class Perturber:
    """Owns the trainable parameters' perturbation and update for one model.

    ``params`` is the ordered list of (name, parameter) that is trained
    (see :func:`paczero.models.trainable_parameters`).
    """

    def __init__(self, model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]],
                 public_seed: int, *, cache_limit: int = 1 << 24):
        self.model = model
        self.params = [p for _, p in params]
        self.names = [n for n, _ in params]
        self.public_seed = int(public_seed)
        self.numel = sum(p.numel() for p in self.params)
        self.cache = self.numel <= cache_limit
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._active: tuple[int, int, float] | None = None  # (step, k, signed mu)
        self._z_cache: dict[tuple[int, int, int], torch.Tensor] = {}
        self._saved: dict[int, list[torch.Tensor]] = {}
        self._handles = []
        owners: dict[int, torch.nn.Module] = {}
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in self._index]
            if own:
                owners[id(module)] = module
                self._handles.append(module.register_forward_pre_hook(self._make_pre(own)))
                self._handles.append(module.register_forward_hook(self._make_post(own)))
        self.n_owners = len(owners)

    # -- directions -----------------------------------------------------
    def direction(self, step: int, k: int, i: int) -> torch.Tensor:
        """z for parameter i (fp32, on the parameter's device)."""
        key = (step, k, i)
        if self.cache and key in self._z_cache:
            return self._z_cache[key]
        p = self.params[i]
        gen = torch.Generator(device=p.device)
        gen.manual_seed(direction_seed(self.public_seed, step, k, i))
        z = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
        if self.cache:
            self._z_cache[key] = z
        return z

    def clear_cache(self) -> None:
        self._z_cache.clear()

    # -- perturbation via hooks -------------------------------------------
    def _make_pre(self, own: list[torch.nn.Parameter]) -> Callable:
        def pre(module, args):
            if self._active is None:
                return None
            step, k, scale = self._active
            saved = []
            for p in own:
                i = self._index[id(p)]
                orig = p.data
                saved.append(orig)
                z = self.direction(step, k, i)
                p.data = (orig.to(torch.float32) + scale * z).to(orig.dtype)
            self._saved[id(module)] = (own, saved)
            return None

        return pre

    def _make_post(self, own: list[torch.nn.Parameter]) -> Callable:
        def post(module, args, output):
            entry = self._saved.pop(id(module), None)
            if entry is not None:
                for p, orig in zip(*entry):
                    p.data = orig
            return None

        return post

    @contextmanager
    def perturbed(self, step: int, k: int, scale: float):
        """Within the block, every forward sees theta + scale * z_{step,k}; theta itself is untouched."""
        self._active = (int(step), int(k), float(scale))
        try:
            yield
        finally:
            self._active = None
            # a forward that raised between the two hooks: put the originals back
            for own, saved in self._saved.values():
                for p, orig in zip(own, saved):
                    p.data = orig
            self._saved.clear()

    # -- update -----------------------------------------------------------
    @torch.no_grad()
    def apply_update(self, step: int, coefs: Sequence[float], lr: float, weight_decay: float = 0.0) -> None:
        """theta <- (1 - lr*wd) theta - (lr/K) sum_k coef_k z_k, one parameter at a time."""
        K = len(coefs)
        if K == 0:
            return
        scales = [lr * float(c) / K for c in coefs]
        decay = lr * weight_decay
        if all(s == 0.0 for s in scales) and decay == 0.0:
            return  # lr = 0 or all coefficients 0: the weights stay bit-identical
        for i, p in enumerate(self.params):
            acc = p.data.to(torch.float32)
            if decay:
                acc = acc * (1.0 - decay)
            for k, s in enumerate(scales):
                if s:
                    acc = acc - s * self.direction(step, k, i)
            p.data.copy_(acc.to(p.dtype))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


@torch.inference_mode()
def two_point_scalars(perturber: Perturber, step: int, num_directions: int, mu: float,
                      batches: Sequence, loss_fn: Callable, n_rows: int, device) -> tuple[np.ndarray, float]:
    """Per-sample scalars g[k, r] = (l_r(theta + mu z_k) - l_r(theta - mu z_k)) / (2 mu) (eq. zo-scalar).

    ``batches`` hold row positions ``batch.index`` in [0, n_rows). Returns the
    float64 array [K, n_rows] and the mean of (l+ + l-)/2 over rows for
    direction 0 (the train loss for the log, at no extra forward pass).
    """
    g = np.zeros((num_directions, n_rows), dtype=np.float64)
    loss_sum, count = 0.0, 0
    for batch in batches:
        b = batch.to(device)
        rows = np.asarray(batch.index)
        for k in range(num_directions):
            with perturber.perturbed(step, k, +mu):
                lp = loss_fn(b).double()
            with perturber.perturbed(step, k, -mu):
                lm = loss_fn(b).double()
            g[k, rows] = ((lp - lm) / (2.0 * mu)).cpu().numpy()
            if k == 0:
                loss_sum += float((lp + lm).sum().item()) / 2.0
                count += len(rows)
    perturber.clear_cache()
    return g, loss_sum / max(count, 1)


def stability_clip(g: np.ndarray, c: float | None) -> np.ndarray:
    """Algorithm 1, line 4: sgn(g) * min(|g|, c); a utility stabiliser, not a privacy device."""
    if c is None:
        return g
    return np.clip(g, -c, c)
