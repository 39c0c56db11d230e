"""The perturbed value theta + scale * z, and the per-layer paths that evaluate a rerouted module with it.

One arithmetic everywhere: ``fl(fl(z * scale) + theta)`` in fp32, rounded once to
theta's dtype (:func:`_perturb`). The paths differ only in what they hold at once:

* any owner module (:meth:`LayerPaths._generic`): its perturbed tensors swapped
  in for each call's own evaluation;
* a Linear (:meth:`LayerPaths._linear`): the product written straight into the output;
* an embedding (:meth:`LayerPaths._embedding`): only the looked-up rows perturbed;
* a Linear too big to perturb whole (:meth:`LayerPaths._linear_big`, a tied LM
  head): blocks of output rows, z drawn once per block for every call;
* the fused CUDA kernels (:meth:`LayerPaths._fused_values`): both signs from one
  kernel that draws z as it goes; a bias (:meth:`LayerPaths._bias`) through either.

Each path is a generator of ``(position in calls, output)`` over
``calls = [(scale, input), ...]`` (see :meth:`paczero.zo.lockstep.Lockstep._evaluate_owner`).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from paczero.zo import cuda_directions as _cd

#: values per block of output rows of a Linear too big to perturb whole (CPU; on an accelerator 2^24)
_BLOCK_VALUES = 1 << 20
_ACCELERATOR_BLOCK_VALUES = 1 << 24
#: fused kernels (CUDA): a trained tensor of at most this many values (biases, layer norms) keeps its
#: perturbed copies from its first evaluation in a step to the update, so later waves launch nothing for it
_KEEP_PAIR_VALUES = 1 << 16


def _perturb(z: torch.Tensor, scale: float, base: torch.Tensor, out: torch.Tensor | None = None,
             tmp: torch.Tensor | None = None) -> torch.Tensor:
    """fl(fl(z * scale) + base) in fp32, rounded to base's dtype (the one perturbation arithmetic); ``out``
    (base's dtype and shape) and ``tmp`` (fp32, z's shape): storage to write into instead of fresh tensors."""
    t = z * scale if tmp is None else torch.mul(z, scale, out=tmp)
    if base.dtype == torch.float32 and out is None:
        return t.add_(base)
    # the fp32 sum rounded once to base's dtype as it is stored: the same bits as t.add_(base).to(dtype),
    # with one pass less over the tensor (the add computes in fp32, the common dtype of its inputs)
    return torch.add(t, base, out=torch.empty_like(base) if out is None else out)


def _by_scale(calls: list) -> list[tuple[float, list[int]]]:
    """The calls' distinct scales in order of appearance, each with its positions."""
    groups: dict[float, list[int]] = {}
    for j, c in enumerate(calls):
        groups.setdefault(c[0], []).append(j)
    return list(groups.items())


def _premultiply(z: torch.Tensor, scales) -> float | None:
    """For scales +m and/or -m (the two signs of a block): z <- fl(z * m) in place, once for both; return m.

    fl(z * -m) is -fl(z * m) exactly and fl(-t + theta) is fl(theta - t), so
    :meth:`LayerPaths._combine` then forms either sign with one add or subtract, the same bits as
    :func:`_perturb`.
    """
    mags = {abs(s) for s in scales}
    if len(mags) != 1 or 0.0 in mags:
        return None
    m = mags.pop()
    z.mul_(m)
    return m


class LayerPaths:
    """The per-layer evaluation paths of the Perturber (a mixin of :class:`paczero.zo.perturb.Perturber`)."""

    def _scratch_key(self, name) -> tuple:
        """A scratch key for ``name`` at the current owner nesting: a nested owner call never reuses its
        caller's scratch."""
        return (name, self._owner_depth)

    def _perturbed_value(self, p: torch.nn.Parameter, orig: torch.Tensor, step: int, k: int,
                         scale: float, scratch="p") -> torch.Tensor:
        """fl(fl(z * scale) + orig), rounded to orig's dtype: the same arithmetic on every path.

        Uncached, the value is written into the reusable scratch tensor ``scratch`` (valid until the
        next call with that key); cached, a fresh tensor (the whole block holds them all).
        """
        i = self._index[id(p)]
        if self.cache:
            if self._block_values is None:
                return _perturb(self.direction(step, k, i), scale, orig)
            value = self._block_values.get((i, scale))
            if value is None:
                value = self._block_values[(i, scale)] = _perturb(self.direction(step, k, i), scale, orig)
            return value
        t = self._scratch(scratch, orig.shape, orig.device, orig.dtype if self._fused[i] else torch.float32)
        self._fill((step, k, i), t, 0, self._layouts[i].n_chunks, scale, orig)
        return t if orig.dtype == t.dtype else t.to(orig.dtype)

    def _combine(self, z: torch.Tensor, scale: float, base: torch.Tensor, scratch,
                 premultiplied: float | None = None) -> torch.Tensor:
        """:func:`_perturb` into a reusable scratch tensor (the same arithmetic); with ``premultiplied``
        (see :func:`_premultiply`), z already holds fl(z * |scale|)."""
        out = self._scratch(scratch, z.shape, z.device, base.dtype)
        if premultiplied is not None:
            return torch.add(z, base, out=out) if scale > 0 else torch.sub(base, z, out=out)
        if base.dtype == torch.float32:
            return torch.mul(z, scale, out=out).add_(base)
        t = torch.mul(z, scale, out=self._scratch(scratch, z.shape, z.device))
        return torch.add(t, base, out=out)

    def _fused_values(self, p: torch.nn.Parameter, base: torch.Tensor, step: int, k: int, scales, scratch,
                      first: int = 0, last: int | None = None) -> dict | None:
        """Fused kernels (see :mod:`paczero.zo.cuda_directions`): {scale: fl(fl(z * scale) + base)} in base's
        dtype, written into scratch by kernels that draw z as they go; both signs of a block from one kernel
        and one product. ``base`` is p's data over chunks ``first..last-1``. None where p's z is torch's."""
        i = self._index[id(p)]
        if not self._fused[i]:
            return None
        key = (step, k, i)
        keep = None
        if first == 0 and last is None and p.numel() <= _KEEP_PAIR_VALUES:
            if self._small_copies_for != (step, k):
                self._drop_small_copies()
                self._small_copies_for = (step, k)
            keep = (i, tuple(scales), base.data_ptr())
            if keep in self._small_copies:
                return self._small_copies[keep]
        last = self._layouts[i].n_chunks if last is None else last
        base = base.contiguous()

        def out(name):  # kept values get their own tensors; the others scratch, reused by the next module
            return torch.empty_like(base) if keep else self._scratch((scratch, name), base.shape, base.device,
                                                                     base.dtype)

        mags = {abs(s) for s in scales}
        if len(scales) == 2 and len(mags) == 1 and 0.0 not in mags:
            m = mags.pop()
            plus, minus = out("+"), out("-")
            self._fused_chunks(key, first, last, mode=_cd.MODE_PAIR, out1=plus, out2=minus, theta=base, scale=m)
            values = {m: plus, -m: minus}
        else:
            values = {}
            for n, s in enumerate(scales):
                values[s] = out(n)
                self._fused_chunks(key, first, last, mode=_cd.MODE_PERTURB, out1=values[s], theta=base, scale=s)
        if keep:
            self._small_copies[keep] = values
        return values

    def _generic(self, own, inner, step, k, calls):
        """Any owner module: its perturbed tensors swapped in for each call's own evaluation only."""
        groups = _by_scale(calls)
        scales = [s for s, _ in groups]
        saved = [p.data for p in own]
        fused = [self._fused_values(p, w, step, k, scales, self._scratch_key(("p", n)))
                 for n, (p, w) in enumerate(zip(own, saved))]
        zs = [self._scratch_z(step, k, p, self._scratch_key(("z", n))) if fused[n] is None else None
              for n, p in enumerate(own)] if len(groups) > 1 else None
        ms = None if zs is None else [None if z is None else _premultiply(z, scales) for z in zs]
        for s, positions in groups:
            values = [fused[n][s] if fused[n] is not None
                      else self._perturbed_value(p, w, step, k, s, self._scratch_key(("p", n))) if zs is None
                      else self._combine(zs[n], s, w, self._scratch_key(("p", n)), ms[n])
                      for n, (p, w) in enumerate(zip(own, saved))]
            for j in positions:
                _, a, kw = calls[j]
                calls[j] = None
                scale = self._scale
                try:
                    for p, v in zip(own, values):
                        p.data = v
                    self._scale = s  # an owner module called inside this one evaluates at the same scale
                    out = inner(*a, **kw)
                finally:  # restored before the job resumes: nothing else ever sees the perturbed tensor
                    self._scale = scale
                    for p, w in zip(own, saved):
                        p.data = w
                del a, kw
                yield j, out
                del out

    def _bias(self, module, step: int, k: int, scales) -> dict:
        b = module.bias
        if b is None:
            return {s: None for s in scales}
        if id(b) not in self._index:
            return {s: b.data for s in scales}
        fused = self._fused_values(b, b.data, step, k, scales, self._scratch_key("pb"))
        if fused is not None:
            return fused
        zb = self._scratch_z(step, k, b, self._scratch_key("zb"))
        return {s: _perturb(zb, s, b.data) for s in scales}

    def _linear(self, module, step, k, calls):
        """y = x W^T + b at each call's scale, the product written straight into the output."""
        w = module.weight
        groups = _by_scale(calls)
        scales = [s for s, _ in groups]
        bias = self._bias(module, step, k, scales)
        fused = self._fused_values(w, w.data, step, k, scales, self._scratch_key(("p", 0)))
        zw = self._scratch_z(step, k, w, self._scratch_key(("z", 0))) if len(groups) > 1 and fused is None else None
        m = None if zw is None else _premultiply(zw, scales)
        for s, positions in groups:
            pw = fused[s] if fused is not None \
                else self._perturbed_value(w, w.data, step, k, s, self._scratch_key(("p", 0))) if zw is None \
                else self._combine(zw, s, w.data, self._scratch_key(("p", 0)), m)
            for j in positions:
                x = calls[j][1]
                calls[j] = None
                y = x.new_empty((*x.shape[:-1], w.shape[0]))
                x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, w.shape[0])
                if bias[s] is None:
                    torch.mm(x2, pw.t(), out=y2)
                else:
                    torch.addmm(bias[s], x2, pw.t(), out=y2)
                del x, x2, y2
                yield j, y
                del y

    def _embedding(self, module, step, k, calls):
        """A trained embedding evaluated by looked-up rows. Cached (z whole for the step): each call
        gathers its tokens' rows of z and of theta. Uncached (a big embedding): only the chunks of z that
        hold the calls' distinct rows are drawn, once for all calls."""
        w = module.weight
        if self.cache:  # each call gathers its tokens' rows of z and of theta, with no sort for distinct rows
            # (3x faster on tiny-opt's micro-batches); the same roundings
            z = self.direction(step, k, self._index[id(w)])
            for j, (s, ids) in enumerate(calls):
                calls[j] = None
                out = _perturb(F.embedding(ids, z), s, F.embedding(ids, w.data))
                yield j, out
                del out
            return
        flat = [ids.reshape(-1) for _, ids in calls]
        shapes = [ids.shape for _, ids in calls]
        rows, inverse = torch.unique(torch.cat(flat), return_inverse=True)
        offsets = np.cumsum([0] + [f.numel() for f in flat])
        del flat
        z = self.direction_rows(step, k, self._index[id(w)], rows)
        base = w.data[rows]
        # fresh tensors, not scratch: the number of rows changes with every call (scratch kept per shape
        # accumulated, and scratch re-allocated as it grew raised the CPU resident peak by ≈ 170 MiB at
        # SmolLM2 FT N = 1000: docs/performance.md, 2026-11-22)
        for s, positions in _by_scale(calls):
            value = _perturb(z, s, base)
            for j in positions:
                calls[j] = None
                out = torch.index_select(value, 0, inverse[offsets[j]:offsets[j + 1]]).view(*shapes[j], w.shape[1])
                yield j, out
                del out

    def _linear_big(self, module, step, k, calls):
        """A Linear too big to perturb whole (a tied LM head): blocks of output rows, z drawn once per block
        for every call (so every call's output exists until the last block)."""
        w = module.weight
        i = self._index[id(w)]
        lay = self._layouts[i]
        groups = _by_scale(calls)
        scales = [s for s, _ in groups]
        bias = self._bias(module, step, k, scales)
        xs = [x.reshape(-1, x.shape[-1]) for _, x in calls]
        ys = [x.new_empty((*x.shape[:-1], lay.rows)) for _, x in calls]
        calls[:] = [None] * len(calls)
        block = _BLOCK_VALUES if w.device.type == "cpu" else _ACCELERATOR_BLOCK_VALUES
        per_block = max(1, block // (lay.per_chunk * lay.row))
        fused = self._fused[i]
        z = None if fused else self._scratch(self._scratch_key("zblock"), (per_block * lay.per_chunk, lay.row),
                                             w.device)
        for first in range(0, lay.n_chunks, per_block):
            last = min(first + per_block, lay.n_chunks)
            a, e = lay.chunk_rows(first)[0], lay.chunk_rows(last - 1)[1]
            if fused:
                values = self._fused_values(w, w.data[a:e], step, k, scales, self._scratch_key(("pblock", e - a)),
                                            first, last)
            else:
                self._fill((step, k, i), z[:e - a], first, last)
                m = _premultiply(z[:e - a], scales) if len(groups) > 1 else None
            for s, positions in groups:
                pw = values[s] if fused else \
                    self._combine(z[:e - a], s, w.data[a:e], self._scratch_key(("pblock", e - a)), m)
                b = None if bias[s] is None else bias[s][a:e]
                for j in positions:
                    ys[j].view(-1, lay.rows)[:, a:e] = F.linear(xs[j], pw, b)
        del xs
        for j in range(len(ys)):
            y, ys[j] = ys[j], None
            yield j, y
            del y
