"""The update theta <- (1 - lr wd) theta - (lr / K) sum_k coef_k z_k, in fp32, with no full-size temporary.

Cached, the step's stored z is subtracted a block of values at a time; uncached,
z is drawn chunk by chunk by the worker threads as it is subtracted (on CUDA with
Triton, one fused kernel draws every direction's z as it is used). Every path is
the same element-wise arithmetic: ``fl(fl(theta (1 - lr wd)) - fl(z_k s_k))`` for
k in order, then one rounding to the parameter's dtype.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from paczero.zo import cuda_directions as _cd
from paczero.zo.directions import WORKERS

#: values per block of the cached update's arithmetic (no full-size temporary)
_UPDATE_BLOCK = 1 << 16


class Update:
    """The update of the trained tensors (a mixin of :class:`paczero.zo.perturb.Perturber`)."""

    @torch.no_grad()
    def apply_update(self, step: int, coefs: Sequence[float], lr: float, weight_decay: float = 0.0) -> None:
        """theta <- (1 - lr*wd) theta - (lr/K) sum_k coef_k z_k, one chunk at a time (fp32 arithmetic)."""
        self._drop_small_copies()  # perturbed copies of the weights before this update
        K = len(coefs)
        if K == 0:
            return
        scales = [lr * float(c) / K for c in coefs]
        decay = lr * weight_decay
        if all(s == 0.0 for s in scales) and decay == 0.0:
            return  # lr = 0 or all coefficients 0: the weights stay bit-identical
        small = self._update_small(step, scales, decay) if self.cache else set()
        for i, p in enumerate(self.params):
            if i in small:
                continue
            if self.cache and p.dtype != torch.float32 and p.data.is_contiguous() and p.numel() > _UPDATE_BLOCK:
                self._update_blocks(p, [(self.direction(step, k, i), s) for k, s in enumerate(scales) if s], decay)
            elif self.cache:
                fp32 = p.dtype == torch.float32
                acc = p.data if fp32 else p.data.to(torch.float32)  # fp32: updated in place
                if decay:
                    acc.mul_(1.0 - decay)
                for k, s in enumerate(scales):
                    if s:
                        self._sub_scaled(acc, self.direction(step, k, i), s)
                if not fp32:
                    p.data.copy_(acc.to(p.dtype))
            else:
                self._update_chunked(step, i, p, scales, decay)

    def _update_small(self, step: int, scales: list[float], decay: float) -> set[int]:
        """Cached: the update of every small fp32 tensor (at most ``_UPDATE_BLOCK`` values, or not contiguous:
        those :meth:`_sub_scaled` updates in one operation) in multi-tensor operations, one per term instead of
        one per term and tensor: theta <- fl(theta (1 - decay)), then theta <- fl(theta - fl(z_k s_k)) for k in
        order, the same element-wise arithmetic as the loop below. Returns the indices it updated."""
        group = [i for i, p in enumerate(self.params) if p.dtype == torch.float32
                 and (p.numel() <= _UPDATE_BLOCK or not p.data.is_contiguous())]
        if len(group) < 2:
            return set()
        thetas = [self.params[i].data for i in group]
        if decay:
            torch._foreach_mul_(thetas, 1.0 - decay)
        for k, s in enumerate(scales):
            if s:
                torch._foreach_sub_(thetas, torch._foreach_mul(self._directions(step, k, group), s))
        return set(group)

    def _update_blocks(self, p: torch.nn.Parameter, terms: list[tuple[torch.Tensor, float]], decay: float) -> None:
        """A low-precision tensor's cached update a block of values at a time, through fp32 scratch: the same
        arithmetic as widening the whole tensor (each value widened exactly, decayed, the terms subtracted in
        order, rounded once), with no full-size fp32 copy to allocate and fault in every step."""
        flat = p.data.view(-1)
        acc = self._scratch("update-acc", (_UPDATE_BLOCK,), p.device)
        tmp = self._scratch("update", (_UPDATE_BLOCK,), p.device)
        for lo in range(0, flat.numel(), _UPDATE_BLOCK):
            hi = min(lo + _UPDATE_BLOCK, flat.numel())
            a = acc[:hi - lo]
            a.copy_(flat[lo:hi])
            if decay:
                a.mul_(1.0 - decay)
            for z, s in terms:
                a.sub_(torch.mul(z.reshape(-1)[lo:hi], s, out=tmp[:hi - lo]))
            flat[lo:hi].copy_(a)

    def _sub_scaled(self, acc: torch.Tensor, z: torch.Tensor, s: float) -> None:
        """acc <- fl(acc - fl(z * s)) (the update's arithmetic), a block of values at a time, so that no
        full-size temporary of z * s exists."""
        if acc.numel() <= _UPDATE_BLOCK or not acc.is_contiguous():
            acc.sub_(z * s)
            return
        a, zf = acc.view(-1), z.reshape(-1)
        tmp = self._scratch("update", (_UPDATE_BLOCK,), acc.device)
        for lo in range(0, a.numel(), _UPDATE_BLOCK):
            hi = min(lo + _UPDATE_BLOCK, a.numel())
            a[lo:hi].sub_(torch.mul(zf[lo:hi], s, out=tmp[:hi - lo]))

    def _update_chunked(self, step: int, i: int, p: torch.nn.Parameter, scales: list[float], decay: float) -> None:
        """The same element-wise arithmetic as the cached update, chunk by chunk (no whole z)."""
        lay = self._layouts[i]
        device = p.device
        if self._fused[i]:  # one kernel: every direction's z drawn as it is used, theta rounded once
            live = [(k, s) for k, s in enumerate(scales) if s]
            seeds = torch.stack([self._device_seeds((step, k, i)) for k, _ in live]) if live else \
                torch.zeros((0, lay.n_chunks), dtype=torch.int64, device=device)
            coefs = torch.tensor([s for _, s in live], dtype=torch.float32).to(device)
            data = p.data if p.data.is_contiguous() else p.data.contiguous()
            _cd.update(seeds, coefs, lay.per_chunk * lay.row, data, 1.0 - decay)
            if data is not p.data:
                p.data.copy_(data)
            return
        flat = p.data.view(-1, lay.row) if lay.shape else p.data.view(1, 1)
        fp32 = p.dtype == torch.float32
        seeds = [self._chunk_seeds((step, k, i)) if s else None for k, s in enumerate(scales)]

        def work(lo: int, hi: int) -> None:
            gen = WORKERS.generator(device)
            for c in range(lo, hi):
                a, b = lay.chunk_rows(c)
                acc = flat[a:b] if fp32 else flat[a:b].to(torch.float32)
                if decay:
                    acc.mul_(1.0 - decay)
                for s, sd in zip(scales, seeds):
                    if s:
                        z = torch.empty(acc.shape, device=device)
                        gen.manual_seed(int(sd[c]))
                        z.normal_(generator=gen)
                        acc.sub_(z.mul_(s))
                if not fp32:
                    flat[a:b].copy_(acc.to(p.dtype))

        WORKERS.run(work, lay.n_chunks, device)
