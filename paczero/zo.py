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
time (a tied weight, such as an embedding shared with the LM head, is
perturbed once per forward and dropped after its last owner), so memory stays
at the inference level; restoration is bit-exact by construction.

Small trainable sets (LoRA, tiny models: at most ``cache_limit`` values) take
a faster path with the same arithmetic: z is cached for the step (and reused
by the update) and the perturbed tensors are swapped in once per
``perturbed`` block instead of at every module call. Large sets (full
fine-tuning) regenerate z at each module call, so no z is ever stored.
:func:`two_point_scalars` runs every micro-batch under one block per
direction and sign, so the per-pass perturbation cost is paid once, not per
micro-batch, on the fast path.
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


#: trainable sets up to this many values (LoRA, tiny models) cache z for the step
DEFAULT_CACHE_LIMIT = 1 << 24


class Perturber:
    """Owns the trainable parameters' perturbation and update for one model.

    ``params`` is the ordered list of (name, parameter) that is trained
    (see :func:`paczero.models.trainable_parameters`). When their total size
    is at most ``cache_limit`` values, directions are cached for the step and
    perturbation is whole-block (no hooks); otherwise per-module hooks.
    """

    def __init__(self, model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]],
                 public_seed: int, *, cache_limit: int = DEFAULT_CACHE_LIMIT):
        self.model = model
        self.params = [p for _, p in params]
        self.names = [n for n, _ in params]
        self.public_seed = int(public_seed)
        self.numel = sum(p.numel() for p in self.params)
        self.cache = self.numel <= cache_limit
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._active: tuple[int, int, float] | None = None  # (step, k, signed mu)
        self._z_cache: dict[tuple[int, int, int], torch.Tensor] = {}
        self._seeds: dict[tuple[int, int, int], int] = {}
        self._gens: dict[torch.device, torch.Generator] = {}
        self._saved: dict[int, tuple] = {}
        self._live: dict[int, list] = {}  # tied weights: id(p) -> [perturbed tensor, owner calls left]
        self._owners: dict[int, int] = {}
        self._handles = []
        owners: dict[int, torch.nn.Module] = {}
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in self._index]
            if own:
                owners[id(module)] = module
                for p in own:
                    self._owners[id(p)] = self._owners.get(id(p), 0) + 1
                if not self.cache:
                    self._handles.append(module.register_forward_pre_hook(self._make_pre(own)))
                    self._handles.append(module.register_forward_hook(self._make_post(own)))
        self.n_owners = len(owners)

    # -- directions -----------------------------------------------------
    def direction(self, step: int, k: int, i: int) -> torch.Tensor:
        """z for parameter i (fp32, on the parameter's device). Cached: do not modify it."""
        key = (step, k, i)
        if self.cache:
            z = self._z_cache.get(key)
            if z is not None:
                return z
            if self._z_cache and next(iter(self._z_cache))[0] != step:
                self._z_cache.clear()  # a new step: the previous step's directions are done
        return self._generate(key, self.cache)

    def _generate(self, key: tuple[int, int, int], keep: bool) -> torch.Tensor:
        p = self.params[key[2]]
        seed = self._seeds.get(key)
        if seed is None:
            if len(self._seeds) > 4096:
                self._seeds.clear()
            seed = self._seeds[key] = direction_seed(self.public_seed, *key)
        gen = self._gens.get(p.device)
        if gen is None:
            gen = self._gens[p.device] = torch.Generator(device=p.device)
        gen.manual_seed(seed)
        z = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
        if keep:
            self._z_cache[key] = z
        return z

    def clear_cache(self) -> None:
        self._z_cache.clear()

    def _perturbed_value(self, p: torch.nn.Parameter, orig: torch.Tensor, step: int, k: int,
                         scale: float) -> torch.Tensor:
        """(orig + scale * z) rounded to orig's dtype: the same arithmetic on both paths."""
        i = self._index[id(p)]
        if self.cache:
            t = self.direction(step, k, i) * scale
        else:
            t = self._generate((step, k, i), False).mul_(scale)  # a fresh z: scaled in place
        t.add_(orig)
        return t if orig.dtype == torch.float32 else t.to(orig.dtype)

    # -- perturbation via hooks -------------------------------------------
    def _make_pre(self, own: list[torch.nn.Parameter]) -> Callable:
        def pre(module, args):
            if self._active is None:
                return None
            step, k, scale = self._active
            saved = []
            for p in own:
                orig = p.data
                saved.append(orig)
                live = self._live.get(id(p))
                if live is None:
                    live = [self._perturbed_value(p, orig, step, k, scale), self._owners[id(p)]]
                    if live[1] > 1:
                        self._live[id(p)] = live
                p.data = live[0]
            self._saved[id(module)] = (own, saved)
            return None

        return pre

    def _make_post(self, own: list[torch.nn.Parameter]) -> Callable:
        def post(module, args, output):
            entry = self._saved.pop(id(module), None)
            if entry is not None:
                for p, orig in zip(*entry):
                    p.data = orig
                    live = self._live.get(id(p))
                    if live is not None:
                        live[1] -= 1
                        if live[1] <= 0:
                            del self._live[id(p)]
            return None

        return post

    @contextmanager
    def perturbed(self, step: int, k: int, scale: float):
        """Within the block, every forward sees theta + scale * z_{step,k}; theta itself is untouched."""
        if self.cache:  # small trainable set: swap every perturbed tensor in once for the whole block
            originals = [p.data for p in self.params]
            try:
                for p, orig in zip(self.params, originals):
                    p.data = self._perturbed_value(p, orig, int(step), int(k), float(scale))
                yield
            finally:
                for p, orig in zip(self.params, originals):
                    p.data = orig
            return
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
            self._live.clear()

    # -- update -----------------------------------------------------------
    @torch.no_grad()
    def apply_update(self, step: int, coefs: Sequence[float], lr: float, weight_decay: float = 0.0) -> None:
        """theta <- (1 - lr*wd) theta - (lr/K) sum_k coef_k z_k, one parameter at a time (fp32 arithmetic)."""
        K = len(coefs)
        if K == 0:
            return
        scales = [lr * float(c) / K for c in coefs]
        decay = lr * weight_decay
        if all(s == 0.0 for s in scales) and decay == 0.0:
            return  # lr = 0 or all coefficients 0: the weights stay bit-identical
        for i, p in enumerate(self.params):
            fp32 = p.dtype == torch.float32
            acc = p.data if fp32 else p.data.to(torch.float32)  # fp32: updated in place
            if decay:
                acc.mul_(1.0 - decay)
            for k, s in enumerate(scales):
                if s:
                    z = self.direction(step, k, i)
                    acc.sub_(z * s if self.cache else z.mul_(s))
            if not fp32:
                p.data.copy_(acc.to(p.dtype))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


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
    moved = [batch.to(device) for batch in batches]
    for k in range(num_directions):
        # one perturbed block per direction and sign, over every micro-batch
        with perturber.perturbed(step, k, +mu):
            plus = [loss_fn(b).double() for b in moved]
        with perturber.perturbed(step, k, -mu):
            minus = [loss_fn(b).double() for b in moved]
        for batch, lp, lm in zip(batches, plus, minus):
            rows = np.asarray(batch.index)
            g[k, rows] = ((lp - lm) / (2.0 * mu)).cpu().numpy()
            if k == 0:
                batch_sum = float((lp + lm).sum().item()) / 2.0
                loss_sum += batch_sum
                count += len(rows)
                if batch_losses is not None:
                    batch_losses.append(batch_sum)
    return g, loss_sum / max(count, 1)


def padding_cap(perturber: "Perturber | Sequence[tuple[str, torch.nn.Parameter]]", device) -> float | None:
    """The micro-batch padding cap (``max_padding`` of ``task.make_batches``) for the ZO step.

    Micro-batches normally close before padding exceeds 10 %. Full fine-tuning on
    CPU is the exception: it regenerates z at every module call of every
    micro-batch (no z is stored), and on CPU that costs more than padding, so
    there micro-batches are filled to the token budget instead. Takes the
    Perturber, or the trainable (name, parameter) list it would be built from.
    """
    cached = perturber.cache if isinstance(perturber, Perturber) else \
        sum(p.numel() for _, p in perturber) <= DEFAULT_CACHE_LIMIT
    if not cached and str(device).startswith("cpu"):
        return None
    return 0.1


def stability_clip(g: np.ndarray, c: float | None) -> np.ndarray:
    """Algorithm 1, line 4: sgn(g) * min(|g|, c); a utility stabiliser, not a privacy device."""
    if c is None:
        return g
    return np.clip(g, -c, c)
