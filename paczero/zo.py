"""The zeroth-order step: public directions, exact perturbation, per-sample scalars, update.

Algorithm 1, lines 1-5 and 15 of the paper. The direction z_t ~ N(0, I_d) is
public and never stored for full fine-tuning (MeZO's trick): it is regenerated
from seeds that depend only on the public seed, the step, the direction index
k and the parameter's position, so every rank of a data-parallel run
regenerates the same z.

How z is defined. For trainable parameter i, z is the concatenation along the
parameter's first dimension of independent *chunks* of whole rows, about
``chunk_values(device)`` values each (2^14 on CPU, 2^24 on accelerators);
chunk c is ``torch.randn`` from a generator seeded with
``chunk_seeds(direction_seed(seed, step, k, i))[c]``. Chunks let CPU threads
fill one direction in parallel, let an embedding draw only the rows a batch
looks up, and let a large LM head be perturbed block by block, so no
full-size copy of it ever exists. (The chunk size depends on the device type,
as torch's generators already do: a run resumed on another kind of device
continues with other, equally public, directions.)

Exact restoration. MeZO perturbs in place (+mu z, -2 mu z, +mu z) and, in
fp16/bf16, the weights drift from their original values. Here the original
parameter tensors are never modified during the two-point evaluation: the
perturbed value ``theta +/- mu z`` (computed as ``fl(fl(z * s) + theta)``, then
rounded to the parameter's dtype) is swapped in for one module call and the
original is swapped back, so restoration is bit-exact by construction.

Three evaluation paths, one arithmetic:

* cached (LoRA, tiny models: at most ``cache_limit`` trainable values): z is
  cached for the step and reused by the update; the perturbed tensors are
  swapped in once per ± block;
* sequential (full fine-tuning): while a ± block is open, the forward of
  every module that owns trainable parameters is rerouted: it swaps the
  perturbed tensor in for its own call only and swaps the original back.
  Linear layers write their product straight into the output; an embedding
  larger than ``big_values`` draws only the rows of z that the batch looks up
  and a larger Linear (the tied LM head) is evaluated in blocks of output
  rows, so no full-size perturbed copy of either ever exists;
* paired (``Perturber.pairable``): the micro-batch is doubled, ``[b; b]``, and
  every rerouted module evaluates the first half at ``theta + mu z`` and the
  second at ``theta - mu z`` from *one* regeneration of its z. This needs
  row-separable owners (Linear, Embedding, LayerNorm/RMSNorm, GPT-2's
  Conv1D) and doubles the activations.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F


def direction_seed(public_seed: int, step: int, k: int, index: int) -> int:
    """The base seed of direction k of step `step` for trainable parameter `index` (public)."""
    ss = np.random.SeedSequence([int(public_seed) & 0xFFFFFFFF, int(step), int(k), int(index), 0x7A0])
    return int(ss.generate_state(1, dtype=np.uint64)[0] & np.uint64(0x7FFFFFFFFFFFFFFF))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def chunk_seeds(base_seed: int, n_chunks: int) -> np.ndarray:
    """The torch seeds of a direction's chunks: splitmix64 of ``base + (c + 1) * golden`` (public)."""
    with np.errstate(over="ignore"):
        x = np.uint64(base_seed) + (np.arange(1, n_chunks + 1, dtype=np.uint64) * _GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x & np.uint64(0x7FFFFFFFFFFFFFFF)


def chunk_values(device) -> int:
    """Values per direction chunk on ``device``: small on CPU (threads, row gathers), large elsewhere."""
    return 1 << 14 if torch.device(device).type == "cpu" else 1 << 24


#: trainable sets up to this many values (LoRA, tiny models) cache z for the step
DEFAULT_CACHE_LIMIT = 1 << 24
#: uncached: an embedding or Linear above this many values is never perturbed whole
DEFAULT_BIG_VALUES = 1 << 22
#: values per block of output rows of such a Linear
_BLOCK_VALUES = 1 << 20

_ROW_SEPARABLE = (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)


def _row_separable(module: torch.nn.Module) -> bool:
    """Modules whose output row r depends only on input row r (safe for the doubled batch)."""
    name = type(module).__name__
    return isinstance(module, _ROW_SEPARABLE) or name.endswith("RMSNorm") or name.endswith("LayerNorm") \
        or name == "Conv1D"


class _Layout:
    """How a parameter's direction splits into chunks of whole rows of its first dimension."""

    __slots__ = ("shape", "rows", "row", "per_chunk", "n_chunks")

    def __init__(self, shape: torch.Size, chunk: int):
        self.shape = tuple(shape)
        self.rows = self.shape[0] if self.shape else 1
        numel = int(np.prod(self.shape)) if self.shape else 1
        self.row = numel // self.rows if self.rows else 1
        self.per_chunk = max(1, chunk // max(self.row, 1))
        self.n_chunks = max(1, -(-self.rows // self.per_chunk))

    def chunk_rows(self, c: int) -> tuple[int, int]:
        return c * self.per_chunk, min((c + 1) * self.per_chunk, self.rows)


class _Pool:
    """Worker threads for the uncached update (torch releases the GIL); one generator per thread.

    Only the update uses them: inside a forward torch's OpenMP threads still spin
    after each product, and a worker competing with them for the cores was
    measured to cost more than it saves (docs/performance.md).
    """

    def __init__(self):
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._workers = 0

    def generator(self, device: torch.device) -> torch.Generator:
        gens = getattr(self._local, "gens", None)
        if gens is None:
            gens = self._local.gens = {}
        g = gens.get(device)
        if g is None:
            g = gens[device] = torch.Generator(device=device)
        return g

    def run(self, fn: Callable[[int, int], None], n: int, device: torch.device, min_per_task: int = 4) -> None:
        """Call ``fn(lo, hi)`` over a partition of range(n): in parallel on CPU, inline elsewhere."""
        workers = 1
        if device.type == "cpu":
            workers = max(1, min(torch.get_num_threads(), os.cpu_count() or 1, n // min_per_task))
        if workers <= 1:
            fn(0, n)
            return
        if self._pool is None or self._workers < workers:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="paczero-z")
            self._workers = workers
        bounds = [n * w // workers for w in range(workers + 1)]
        inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

        def task(lo: int, hi: int) -> None:  # the caller's autograd modes are thread-local
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                fn(lo, hi)

        futures = [self._pool.submit(task, bounds[w], bounds[w + 1]) for w in range(1, workers)]
        fn(bounds[0], bounds[1])
        for f in futures:
            f.result()


_POOL = _Pool()


class Perturber:
    """Owns the trainable parameters' perturbation and update for one model.

    ``params`` is the ordered list of (name, parameter) that is trained
    (see :func:`paczero.models.trainable_parameters`). z is cached for the step
    when the trainable set has at most ``cache_limit`` values (default
    ``DEFAULT_CACHE_LIMIT``: LoRA, tiny models). ``paired``:
    :func:`two_point_scalars` evaluates + and - in one doubled forward where it can
    (uncached, row-separable owners, teacher-forced losses).
    """

    def __init__(self, model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]],
                 public_seed: int, *, cache_limit: int | None = None, big_values: int = DEFAULT_BIG_VALUES,
                 paired: bool = False):
        self.model = model
        self.params = [p for _, p in params]
        self.names = [n for n, _ in params]
        self.public_seed = int(public_seed)
        self.numel = sum(p.numel() for p in self.params)
        self.cache = self.numel <= (DEFAULT_CACHE_LIMIT if cache_limit is None else cache_limit)
        self.big_values = int(big_values)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._layouts = [_Layout(p.shape, chunk_values(p.device)) for p in self.params]
        self._state: tuple[int, int, tuple[float, ...]] | None = None  # (step, k, signs) of the open block
        self._z_cache: dict[tuple[int, int, int], torch.Tensor] = {}
        self._seeds: dict[tuple[int, int, int], np.ndarray] = {}
        self._buffers: dict[tuple, torch.Tensor] = {}  # scratch reused across module calls (no page faults)
        self._owner_modules: list[tuple[torch.nn.Module, list[torch.nn.Parameter]]] = []
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in self._index]
            if own:
                self._owner_modules.append((module, own))
        self.n_owners = len(self._owner_modules)
        #: two_point_scalars evaluates + and - in one doubled forward (``paired=True`` and possible)
        self.pairable = bool(paired) and not self.cache and all(_row_separable(m) for m, _ in self._owner_modules)

    # -- directions -----------------------------------------------------
    def _chunk_seeds(self, key: tuple[int, int, int]) -> np.ndarray:
        seeds = self._seeds.get(key)
        if seeds is None:
            if len(self._seeds) > 4096:
                self._seeds.clear()
            seeds = self._seeds[key] = chunk_seeds(direction_seed(self.public_seed, *key),
                                                   self._layouts[key[2]].n_chunks)
        return seeds

    def _fill(self, key: tuple[int, int, int], out: torch.Tensor, first: int, last: int,
              scale: float | None = None, base: torch.Tensor | None = None) -> None:
        """Write z's chunks ``first..last-1`` (whole rows, from the chunks' first row) into fp32 ``out``.

        With ``scale`` and ``base``: ``out = fl(fl(z * scale) + base)`` chunk by chunk, base given
        over the same rows (the perturbed value, computed while the chunk is in cache).
        """
        lay = self._layouts[key[2]]
        seeds = self._chunk_seeds(key)
        flat = out.view(-1, lay.row) if lay.shape else out.view(1, 1)
        flat_base = None
        if base is not None:
            flat_base = base.reshape(-1, lay.row) if lay.shape else base.reshape(1, 1)
        r0 = lay.chunk_rows(first)[0]
        device = out.device

        def work(lo: int, hi: int) -> None:
            gen = _POOL.generator(device)
            for c in range(first + lo, first + hi):
                a, b = lay.chunk_rows(c)
                t = flat[a - r0:b - r0]
                gen.manual_seed(int(seeds[c]))
                t.normal_(generator=gen)
                if flat_base is not None:
                    t.mul_(scale).add_(flat_base[a - r0:b - r0])

        work(0, last - first)

    def direction(self, step: int, k: int, i: int) -> torch.Tensor:
        """z for parameter i (fp32, on the parameter's device). Cached: do not modify it."""
        key = (step, k, i)
        if self.cache:
            z = self._z_cache.get(key)
            if z is not None:
                return z
            if self._z_cache and next(iter(self._z_cache))[0] != step:
                self._z_cache.clear()  # a new step: the previous step's directions are done
        p = self.params[i]
        z = torch.empty(p.shape, device=p.device, dtype=torch.float32)
        self._fill(key, z, 0, self._layouts[i].n_chunks)
        if self.cache:
            self._z_cache[key] = z
        return z

    def direction_rows(self, step: int, k: int, i: int, rows: torch.Tensor) -> torch.Tensor:
        """z[rows] for parameter i, drawing only the chunks that hold those rows (fp32)."""
        lay = self._layouts[i]
        rows = rows.to(torch.int64)
        chunk_of = torch.div(rows, lay.per_chunk, rounding_mode="floor")
        needed = torch.unique(chunk_of).tolist()
        buf = torch.empty((len(needed) * lay.per_chunk, lay.row), device=self.params[i].device)
        key = (step, k, i)
        lay_seeds = self._chunk_seeds(key)
        device = buf.device

        def work(lo: int, hi: int) -> None:
            gen = _POOL.generator(device)
            for j in range(lo, hi):
                a, b = lay.chunk_rows(needed[j])
                gen.manual_seed(int(lay_seeds[needed[j]]))
                buf[j * lay.per_chunk:j * lay.per_chunk + (b - a)].normal_(generator=gen)

        work(0, len(needed))
        slot = torch.zeros(lay.n_chunks, dtype=torch.int64, device=rows.device)
        slot[torch.tensor(needed, dtype=torch.int64, device=rows.device)] = torch.arange(
            len(needed), dtype=torch.int64, device=rows.device)
        pos = slot[chunk_of] * lay.per_chunk + (rows - chunk_of * lay.per_chunk)
        return buf[pos.to(device)].view(-1, *lay.shape[1:])

    def clear_cache(self) -> None:
        self._z_cache.clear()

    def _buffer(self, slot, shape, device) -> torch.Tensor:
        """An fp32 scratch tensor for ``slot``, reused by every later module call of the same shape."""
        key = (slot, tuple(shape), device)
        buf = self._buffers.get(key)
        if buf is None:
            if len(self._buffers) > 256:
                self._buffers.clear()
            buf = self._buffers[key] = torch.empty(shape, device=device, dtype=torch.float32)
        return buf

    def _perturbed_value(self, p: torch.nn.Parameter, orig: torch.Tensor, step: int, k: int,
                         scale: float, slot="p") -> torch.Tensor:
        """fl(fl(z * scale) + orig), rounded to orig's dtype: the same arithmetic on every path.

        Uncached, the value is written into the reusable scratch tensor ``slot`` (valid until the
        next call with that slot); cached, a fresh tensor (the whole block holds them all).
        """
        i = self._index[id(p)]
        if self.cache:
            t = self.direction(step, k, i) * scale
            t.add_(orig)
        else:
            t = self._buffer(slot, orig.shape, orig.device)
            self._fill((step, k, i), t, 0, self._layouts[i].n_chunks, scale, orig)
        return t if orig.dtype == torch.float32 else t.to(orig.dtype)

    # -- evaluation at theta +/- mu z -----------------------------------------
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
        with self._evaluating(step, k, (float(scale),)):
            yield

    @contextmanager
    def paired(self, step: int, k: int, mu: float):
        """Within the block, a forward of a doubled batch ``[b; b]`` sees theta + mu z_{step,k} in
        its first half and theta - mu z_{step,k} in its second, from one regeneration of z."""
        if not self.pairable:
            raise RuntimeError("paired evaluation needs the uncached path and row-separable parameter owners")
        with self._evaluating(step, k, (float(mu), -float(mu))):
            yield

    @contextmanager
    def _evaluating(self, step: int, k: int, signs: tuple[float, ...]):
        """Route every owner module's forward through :meth:`_evaluate` for the block."""
        if self._state is not None:
            raise RuntimeError("perturbed/paired blocks do not nest")
        self._state = (int(step), int(k), signs)
        patched = []
        try:
            for module, own in self._owner_modules:
                had = "forward" in module.__dict__
                inner = module.forward
                module.forward = self._evaluate(module, own, inner, wrapped=had)
                patched.append((module, had, inner))
            yield
        finally:
            self._state = None
            for module, had, inner in patched:
                if had:
                    module.forward = inner
                else:
                    del module.forward

    def _evaluate(self, module: torch.nn.Module, own: list[torch.nn.Parameter], inner: Callable,
                  wrapped: bool) -> Callable:
        """The forward of one owner module at the block's signs (one sign, or + then - on two halves)."""
        kind = None
        if not wrapped:  # a forward already wrapped (accelerate offloading) must run as it is
            big = sum(p.numel() for p in own) > self.big_values
            if type(module).forward is torch.nn.Linear.forward and own[0] is module.weight:
                kind = self._linear_big if big else self._linear
            elif big and type(module).forward is torch.nn.Embedding.forward and module.max_norm is None \
                    and len(own) == 1:
                kind = self._embedding

        def forward(*args, **kwargs):
            step, k, signs = self._state
            if kind is not None and len(args) == 1 and not kwargs:
                return kind(module, step, k, signs, args[0])
            parts = [(args, kwargs)] if len(signs) == 1 else _split_halves(module, args, kwargs)
            saved = [p.data for p in own]
            zs = [self._z(step, k, p, ("z", n)) for n, p in enumerate(own)] if len(signs) > 1 else None
            outs = []
            try:
                for s, (a, kw) in zip(signs, parts):
                    for n, (p, w) in enumerate(zip(own, saved)):
                        p.data = self._perturbed_value(p, w, step, k, s, ("p", n)) if zs is None \
                            else self._combine(zs[n], s, w, ("p", n))
                    outs.append(inner(*a, **kw))
            finally:
                for p, w in zip(own, saved):
                    p.data = w
            return outs[0] if len(outs) == 1 else _cat_halves(*outs)

        return forward

    def _z(self, step: int, k: int, p: torch.nn.Parameter, slot) -> torch.Tensor:
        i = self._index[id(p)]
        z = self._buffer(slot, p.shape, p.device)
        self._fill((step, k, i), z, 0, self._layouts[i].n_chunks)
        return z

    def _combine(self, z: torch.Tensor, scale: float, base: torch.Tensor, slot) -> torch.Tensor:
        """:func:`_perturb` into a reusable scratch tensor (the same arithmetic)."""
        out = self._buffer(slot, z.shape, z.device)
        torch.mul(z, scale, out=out).add_(base)
        return out if base.dtype == torch.float32 else out.to(base.dtype)

    @staticmethod
    def _parts(x: torch.Tensor, module, signs) -> list[slice]:
        """Row slices of x's leading dimension, one per sign (halves of a doubled batch)."""
        m = len(signs)
        if x.dim() == 0 or x.shape[0] % m:
            raise RuntimeError(f"paired evaluation: {type(module).__name__} received no batch-major tensor input")
        rows = x.numel() // x.shape[-1] if x.dim() > 1 else x.shape[0]
        n = rows // m
        return [slice(j * n, (j + 1) * n) for j in range(m)]

    def _bias(self, module, step: int, k: int, signs) -> dict:
        b = module.bias
        if b is None:
            return {s: None for s in signs}
        if id(b) not in self._index:
            return {s: b.data for s in signs}
        zb = self._z(step, k, b, "zb")
        return {s: _perturb(zb, s, b.data) for s in signs}

    def _linear(self, module, step, k, signs, x):
        """y = x W^T + b at each sign on its rows, written straight into its rows of the output."""
        w = module.weight
        parts = self._parts(x, module, signs)
        y = x.new_empty((*x.shape[:-1], w.shape[0]))
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, w.shape[0])
        bias = self._bias(module, step, k, signs)
        zw = self._z(step, k, w, ("z", 0)) if len(signs) > 1 else None
        for s, rows in zip(signs, parts):
            pw = self._perturbed_value(w, w.data, step, k, s, ("p", 0)) if zw is None \
                else self._combine(zw, s, w.data, ("p", 0))
            if bias[s] is None:
                torch.mm(x2[rows], pw.t(), out=y2[rows])
            else:
                torch.addmm(bias[s], x2[rows], pw.t(), out=y2[rows])
        return y

    def _embedding(self, module, step, k, signs, ids):
        """A big embedding: only the looked-up rows of z are drawn; each sign gathers from its rows."""
        w = module.weight
        parts = self._parts(ids.reshape(-1, 1), module, signs)
        rows, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        z = self.direction_rows(step, k, self._index[id(w)], rows)
        base = w.data[rows]
        y = torch.empty((ids.numel(), w.shape[1]), device=w.device, dtype=w.dtype)
        inverse = inverse.reshape(-1)
        for s, part in zip(signs, parts):
            torch.index_select(_perturb(z, s, base), 0, inverse[part], out=y[part])
        return y.view(*ids.shape, w.shape[1])

    def _linear_big(self, module, step, k, signs, x):
        """A Linear too big to perturb whole (a tied LM head): blocks of output rows, z drawn once per block."""
        w = module.weight
        i = self._index[id(w)]
        lay = self._layouts[i]
        parts = self._parts(x, module, signs)
        bias = self._bias(module, step, k, signs)
        y = x.new_empty((*x.shape[:-1], lay.rows))
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, lay.rows)
        per_block = max(1, _BLOCK_VALUES // (lay.per_chunk * lay.row))
        z = self._buffer("zblock", (per_block * lay.per_chunk, lay.row), w.device)
        for first in range(0, lay.n_chunks, per_block):
            last = min(first + per_block, lay.n_chunks)
            a, e = lay.chunk_rows(first)[0], lay.chunk_rows(last - 1)[1]
            self._fill((step, k, i), z[:e - a], first, last)
            for s, part in zip(signs, parts):
                y2[part, a:e] = F.linear(x2[part], self._combine(z[:e - a], s, w.data[a:e], ("pblock", e - a)),
                                         None if bias[s] is None else bias[s][a:e])
        return y

    # -- update -----------------------------------------------------------
    @torch.no_grad()
    def apply_update(self, step: int, coefs: Sequence[float], lr: float, weight_decay: float = 0.0) -> None:
        """theta <- (1 - lr*wd) theta - (lr/K) sum_k coef_k z_k, one chunk at a time (fp32 arithmetic)."""
        K = len(coefs)
        if K == 0:
            return
        scales = [lr * float(c) / K for c in coefs]
        decay = lr * weight_decay
        if all(s == 0.0 for s in scales) and decay == 0.0:
            return  # lr = 0 or all coefficients 0: the weights stay bit-identical
        for i, p in enumerate(self.params):
            if self.cache:
                fp32 = p.dtype == torch.float32
                acc = p.data if fp32 else p.data.to(torch.float32)  # fp32: updated in place
                if decay:
                    acc.mul_(1.0 - decay)
                for k, s in enumerate(scales):
                    if s:
                        acc.sub_(self.direction(step, k, i) * s)
                if not fp32:
                    p.data.copy_(acc.to(p.dtype))
            else:
                self._update_chunked(step, i, p, scales, decay)

    def _update_chunked(self, step: int, i: int, p: torch.nn.Parameter, scales: list[float], decay: float) -> None:
        """The same element-wise arithmetic as the cached update, chunk by chunk (no whole z)."""
        lay = self._layouts[i]
        flat = p.data.view(-1, lay.row) if lay.shape else p.data.view(1, 1)
        fp32 = p.dtype == torch.float32
        seeds = [self._chunk_seeds((step, k, i)) if s else None for k, s in enumerate(scales)]
        device = p.device

        def work(lo: int, hi: int) -> None:
            gen = _POOL.generator(device)
            for c in range(lo, hi):
                a, b = lay.chunk_rows(c)
                acc = flat[a:b] if fp32 else flat[a:b].to(torch.float32)
                if decay:
                    acc.mul_(1.0 - decay)
                for s, sd in zip(scales, seeds):
                    if s:
                        gen.manual_seed(int(sd[c]))
                        z = torch.empty(acc.shape, device=device).normal_(generator=gen)
                        acc.sub_(z.mul_(s))
                if not fp32:
                    flat[a:b].copy_(acc.to(p.dtype))

        _POOL.run(work, lay.n_chunks, device)

    def remove(self) -> None:
        """Nothing to undo: module forwards are only rerouted inside an evaluation block."""


def _perturb(z: torch.Tensor, scale: float, base: torch.Tensor) -> torch.Tensor:
    """fl(fl(z * scale) + base) in fp32, rounded to base's dtype (the one perturbation arithmetic)."""
    t = z * scale
    t.add_(base)
    return t if base.dtype == torch.float32 else t.to(base.dtype)


def _split_halves(module, args: tuple, kwargs: dict):
    """Split every batch-major tensor argument of a doubled batch into its two halves."""
    found = False

    def halves(x):
        nonlocal found
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] % 2 == 0 and x.shape[0] > 0:
            found = True
            h = x.shape[0] // 2
            return x[:h], x[h:]
        return x, x

    pa, ma = zip(*[halves(a) for a in args]) if args else ((), ())
    pk, mk = {}, {}
    for key, value in kwargs.items():
        pk[key], mk[key] = halves(value)
    if not found:
        raise RuntimeError(f"paired evaluation: {type(module).__name__} received no batch-major tensor input")
    return (tuple(pa), pk), (tuple(ma), mk)


def _cat_halves(plus, minus):
    if isinstance(plus, torch.Tensor):
        return torch.cat([plus, minus], dim=0)
    if isinstance(plus, tuple):
        return tuple(_cat_halves(a, b) for a, b in zip(plus, minus))
    if plus is None:
        return None
    raise RuntimeError(f"paired evaluation: cannot join module outputs of type {type(plus).__name__}")


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
    # full fine-tuning: one doubled forward per micro-batch evaluates both signs from one z
    paired = perturber.pairable and all(b.targets is not None or b.labels is not None for b in moved)
    for k in range(num_directions):
        if paired:
            plus, minus = [], []
            with perturber.paired(step, k, mu):
                for b in moved:
                    both = loss_fn(b.doubled()).double()
                    plus.append(both[:len(b)])
                    minus.append(both[len(b):])
        else:  # one perturbed block per direction and sign, over every micro-batch
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
    there micro-batches are filled to the token budget instead (the paired
    path then doubles each of them). Takes the
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
