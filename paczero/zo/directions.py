"""Public directions z: their seeds, their chunks, and where each chunk's values come from.

For trainable parameter i, z is the concatenation along the parameter's first
dimension of independent *chunks* of whole rows, about ``chunk_values(device)``
values each; chunk c is defined by the seed
``chunk_seeds(direction_seed(seed, step, k, i))[c]``. On CPU (and on CUDA
without Triton, or with ``PACZERO_TORCH_DIRECTIONS=1``) chunk c is
``torch.randn`` from a generator seeded with that chunk seed; on CUDA with
Triton the fused kernels of :mod:`paczero.zo.cuda_directions` compute the same
chunk layout's Philox stream where it is used (no z is stored there).
:func:`source_name` names the generator (a run records it).
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import torch

from paczero.zo import cuda_directions as _cd


def direction_seed(public_seed: int, step: int, k: int, index: int) -> int:
    """The base seed of direction k of step `step` for trainable parameter `index` (public)."""
    ss = np.random.SeedSequence([int(public_seed) & 0xFFFFFFFF, int(step), int(k), int(index), 0x7A0])
    return int(ss.generate_state(1, dtype=np.uint64)[0] & np.uint64(0x7FFFFFFFFFFFFFFF))


#: numpy's SeedSequence constants (numpy/random/bit_generator.pyx): the hash of :func:`direction_seeds`
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4


def direction_seeds(public_seed: int, step: int, k: int, indices) -> np.ndarray:
    """:func:`direction_seed` of every parameter index in ``indices`` at once, the same integers (uint64).

    numpy's ``SeedSequence([seed, step, k, index, 0x7A0]).generate_state(1, uint64)`` is a fixed sequence of
    32-bit multiply-xorshift hashes whose constants do not depend on the data, so it runs on whole arrays of
    indices in uint32 arithmetic; one parameter's seed costs what numpy's set-up of one SeedSequence does.
    Words of 2^32 or more (which SeedSequence splits) and negative values take the scalar path.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    words = [int(public_seed) & 0xFFFFFFFF, int(step), int(k)]
    if min(words[1:]) < 0 or max(words[1:]) >= 1 << 32 or (idx.size and (idx.min() < 0 or idx.max() >= 1 << 32)):
        return np.array([direction_seed(public_seed, step, k, int(i)) for i in idx], dtype=np.uint64)
    u32 = np.uint32
    entropy = [np.full(idx.shape, w, dtype=u32) for w in words] + [idx.astype(u32), np.full(idx.shape, 0x7A0, u32)]
    with np.errstate(over="ignore"):
        const = [_INIT_A]

        def hashmix(value: np.ndarray) -> np.ndarray:
            value = value ^ u32(const[0])
            const[0] = (const[0] * _MULT_A) & 0xFFFFFFFF
            value = value * u32(const[0])
            return value ^ (value >> u32(16))

        def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            r = u32(_MIX_L) * x - u32(_MIX_R) * y
            return r ^ (r >> u32(16))

        pool = [hashmix(entropy[i]) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(_POOL, len(entropy)):
            for dst in range(_POOL):
                pool[dst] = mix(pool[dst], hashmix(entropy[src]))
        out, hconst = [], _INIT_B
        for word in pool[:2]:  # generate_state(1, uint64): two 32-bit words, little-endian
            value = word ^ u32(hconst)
            hconst = (hconst * _MULT_B) & 0xFFFFFFFF
            value = value * u32(hconst)
            out.append(value ^ (value >> u32(16)))
    seeds = out[0].astype(np.uint64) | (out[1].astype(np.uint64) << np.uint64(32))
    return seeds & np.uint64(0x7FFFFFFFFFFFFFFF)


#: from this many parameters on, a step's base seeds are hashed together (numpy's set-up costs more below)
_MANY_SEEDS = 16
#: splitmix64's increment and multipliers (the chunk seeds' definition), and 2^64 - 1
_GOLDEN_INT, _MIX1, _MIX2, _MASK64 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, (1 << 64) - 1
#: directions of at most this many chunks get their chunk seeds from Python integers (same values)
_FEW_CHUNKS = 8
#: values of z drawn at a time (at least one chunk) when only some rows are needed
_ROWS_GROUP_VALUES = 1 << 20
#: cached: a step's draw of fewer values than this runs on the calling thread alone
_INLINE_DRAW_VALUES = 1 << 18


def chunk_seeds(base_seed: int, n_chunks: int) -> np.ndarray:
    """The torch seeds of a direction's chunks: splitmix64 of ``base + (c + 1) * golden`` (public)."""
    if n_chunks <= _FEW_CHUNKS:  # the same arithmetic on Python integers: numpy's set-up costs more here
        out = []
        for c in range(1, n_chunks + 1):
            x = (int(base_seed) + c * _GOLDEN_INT) & _MASK64
            x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
            x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
            out.append((x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF)
        return np.array(out, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = np.uint64(base_seed) + (np.arange(1, n_chunks + 1, dtype=np.uint64) * np.uint64(_GOLDEN_INT))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)
        x = x ^ (x >> np.uint64(31))
    return x & np.uint64(0x7FFFFFFFFFFFFFFF)


def chunk_values(device) -> int:
    """Values per direction chunk on ``device``: small on CPU (threads, row gathers), large elsewhere."""
    return 1 << 14 if torch.device(device).type == "cpu" else 1 << 24


def source_name(device, fused: bool) -> str:
    """How a run records the generator of z on ``device`` (data-parallel ranks must agree on it)."""
    kind = torch.device(device).type
    return f"{_cd.KERNEL_SOURCE} ({kind})" if fused else f"torch generator per chunk ({kind})"


class ChunkLayout:
    """How a parameter's direction splits into chunks of whole rows of its first dimension."""

    __slots__ = ("shape", "rows", "row", "per_chunk", "n_chunks")

    def __init__(self, shape: torch.Size, chunk: int):
        self.shape = tuple(shape)
        self.rows = self.shape[0] if self.shape else 1
        numel = math.prod(self.shape)
        self.row = numel // self.rows if self.rows else 1
        self.per_chunk = max(1, chunk // max(self.row, 1))
        self.n_chunks = max(1, -(-self.rows // self.per_chunk))

    def chunk_rows(self, c: int) -> tuple[int, int]:
        return c * self.per_chunk, min((c + 1) * self.per_chunk, self.rows)


class WorkerPool:
    """Worker threads for the uncached update and a cached step's one draw of z (torch releases the GIL);
    one generator per thread.

    The uncached forwards do not use them: there torch's OpenMP threads still spin
    after each product, and a worker competing with them for the cores was
    measured to cost more than it saves (docs/performance.md).
    """

    def __init__(self):
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._workers = 0

    def generator(self, device: torch.device) -> torch.Generator:
        """This thread's generator on ``device`` (seeded anew for every chunk)."""
        gens = getattr(self._local, "gens", None)
        if gens is None:
            gens = self._local.gens = {}
        g = gens.get(device)
        if g is None:
            g = gens[device] = torch.Generator(device=device)
        return g

    def run(self, fn: Callable[[int, int], None], n: int, device: torch.device, min_per_task: int = 4) -> None:
        """Call ``fn(lo, hi)`` over a partition of range(n): in parallel on CPU, inline elsewhere.

        The ranges are handed out as the threads ask for them, not split in advance: right after an
        operator of torch's, its OpenMP worker still spins on a core, and with fixed halves the thread
        sharing that core finished last (the cached draw after a forward, in one process: median 14.3
        ms with fixed halves, 13.0 handed out; docs/performance.md, 2026-11-23)."""
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
        grain = max(1, n // (8 * workers))
        starts = iter(range(0, n, grain))  # shared between the threads (under the lock)
        lock = threading.Lock()
        inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

        def drain() -> None:
            while True:
                with lock:
                    lo = next(starts, None)
                if lo is None:
                    return
                fn(lo, min(lo + grain, n))

        def task() -> None:  # the caller's autograd modes are thread-local
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                drain()

        futures = [self._pool.submit(task) for _ in range(1, workers)]
        try:
            drain()
        finally:
            for f in futures:
                f.result()


#: the process's worker threads and their generators
WORKERS = WorkerPool()


class DirectionDraws:
    """The Perturber's drawing of z (a mixin of :class:`paczero.zo.perturb.Perturber`).

    Uses the Perturber's ``params``, ``public_seed``, ``cache``, ``_layouts`` (a :class:`ChunkLayout`
    per parameter), ``_fused`` (per parameter: z from the CUDA kernels), the seed caches
    ``_seed_cache``/``_device_seed_cache``, the step's ``_z_cache``/``_z_storage`` and ``_scratch``.
    """

    def _chunk_seeds(self, key: tuple[int, int, int]) -> np.ndarray:
        seeds = self._seed_cache.get(key)
        if seeds is None:
            if len(self._seed_cache) > 4096:
                self._seed_cache.clear()
                self._device_seed_cache.clear()
            seeds = self._seed_cache[key] = chunk_seeds(direction_seed(self.public_seed, *key),
                                                        self._layouts[key[2]].n_chunks)
        return seeds

    def _step_seeds(self, step: int, k: int, indices: list[int]) -> None:
        """The chunk seeds of (step, k) for every parameter in ``indices`` not yet cached, their base seeds
        hashed together (:func:`direction_seeds`) where there are many."""
        todo = [i for i in indices if (step, k, i) not in self._seed_cache]
        if len(todo) < _MANY_SEEDS:
            return
        if len(self._seed_cache) + len(todo) > 4096:
            self._seed_cache.clear()
            self._device_seed_cache.clear()
        for i, base in zip(todo, direction_seeds(self.public_seed, step, k, todo).tolist()):
            self._seed_cache[(step, k, i)] = chunk_seeds(base, self._layouts[i].n_chunks)

    def _device_seeds(self, key: tuple[int, int, int]) -> torch.Tensor:
        """The chunk seeds of ``key`` on its parameter's device (fused kernels)."""
        seeds = self._device_seed_cache.get(key)
        if seeds is None:
            seeds = self._device_seed_cache[key] = _cd.seeds_tensor(self._chunk_seeds(key),
                                                                    self.params[key[2]].device)
        return seeds

    def _fused_chunks(self, key: tuple[int, int, int], first: int, last: int, **kw) -> None:
        """:func:`paczero.zo.cuda_directions.chunks` over chunks ``first..last-1`` of direction ``key``."""
        lay = self._layouts[key[2]]
        _cd.chunks(self._device_seeds(key), lay.per_chunk * lay.row, self.params[key[2]].numel(), first, last, **kw)

    def _fill(self, key: tuple[int, int, int], out: torch.Tensor, first: int, last: int,
              scale: float | None = None, base: torch.Tensor | None = None) -> None:
        """Write z's chunks ``first..last-1`` (whole rows, from the chunks' first row) into fp32 ``out``.

        With ``scale`` and ``base``: ``out = fl(fl(z * scale) + base)`` chunk by chunk, base given
        over the same rows (the perturbed value, computed while the chunk is in cache); fused, ``out``
        may have base's dtype (the fp32 value rounded once as it is stored).
        """
        lay = self._layouts[key[2]]
        if self._fused[key[2]]:
            self._fused_chunks(key, first, last, mode=_cd.MODE_Z if base is None else _cd.MODE_PERTURB, out1=out,
                               theta=None if base is None else base.contiguous(), scale=0.0 if scale is None else scale)
            return
        seeds = self._chunk_seeds(key)
        flat = out.view(-1, lay.row) if lay.shape else out.view(1, 1)
        flat_base = None
        if base is not None:
            flat_base = base.reshape(-1, lay.row) if lay.shape else base.reshape(1, 1)
        r0 = lay.chunk_rows(first)[0]
        gen = WORKERS.generator(out.device)
        for c in range(first, last):
            a, b = lay.chunk_rows(c)
            t = flat[a - r0:b - r0]
            gen.manual_seed(int(seeds[c]))
            t.normal_(generator=gen)
            if flat_base is not None:
                t.mul_(scale).add_(flat_base[a - r0:b - r0])

    def _fill_range(self, key: tuple[int, int, int], out: torch.Tensor, first: int, last: int) -> None:
        """Chunks ``first..last-1`` of z written at their own rows of the whole-parameter tensor ``out``."""
        lay = self._layouts[key[2]]
        flat = out.view(-1, lay.row) if lay.shape else out.view(1, 1)
        a, b = lay.chunk_rows(first)[0], lay.chunk_rows(last - 1)[1]
        self._fill(key, flat[a:b], first, last)

    def _draw_whole(self, key: tuple[int, int, int]) -> torch.Tensor:
        """A fresh fp32 tensor holding all of z for ``key``, its chunks split between the worker threads."""
        p = self.params[key[2]]
        z = torch.empty(p.shape, device=p.device, dtype=torch.float32)
        self._chunk_seeds(key)  # computed once, before the threads read them
        if self._fused[key[2]]:  # one kernel for every chunk
            self._fill_range(key, z, 0, self._layouts[key[2]].n_chunks)
        else:
            WORKERS.run(partial(self._fill_range, key, z), self._layouts[key[2]].n_chunks, p.device)
        return z

    def _draw_step(self, step: int, k: int) -> None:
        """Cached: z of every trained tensor of (step, k) not drawn by the fused kernels, in one partition
        of all their chunks between the worker threads, per device (the step needs them all: the update
        reads every z; drawn at the first block's entry), or on the calling thread when they are few
        values. The same values as one tensor at a time: every chunk is seeded on its own. Each z is
        written into the storage of the previous step's: a fresh tensor's pages are faulted in as they
        are first written, which on this project's CPU machine made the draw 18 ms instead of 9
        (tiny-opt; docs/performance.md, 2026-11-23)."""
        by_device: dict[torch.device, list[tuple[tuple[int, int, int], torch.Tensor, int]]] = {}
        values: dict[torch.device, int] = {}
        self._step_seeds(step, k, [i for i in range(len(self.params)) if not self._fused[i]])
        for i, p in enumerate(self.params):
            key = (step, k, i)
            if self._fused[i] or key in self._z_cache:
                continue
            z = self._z_storage.get((k, i))  # last step's storage, refilled: no fresh pages to fault in
            if z is None:  # a normal tensor even in inference mode: refilled in and out of it (the update)
                with torch.inference_mode(False):
                    z = self._z_storage[(k, i)] = torch.empty(p.shape, device=p.device, dtype=torch.float32)
            self._z_cache[key] = z
            seeds = self._chunk_seeds(key)
            n_chunks = self._layouts[i].n_chunks
            if n_chunks == 1:  # one chunk (a LoRA tensor, a bias, a norm): its seed and all of its storage
                by_device.setdefault(p.device, []).append((None, z.view(-1), int(seeds[0])))
            else:
                flat = z.view(-1, self._layouts[i].row) if z.dim() else z.view(1, 1)
                by_device.setdefault(p.device, []).extend((key, flat, c) for c in range(n_chunks))
            values[p.device] = values.get(p.device, 0) + z.numel()
        for device, tasks in by_device.items():
            def work(lo: int, hi: int, tasks=tasks, device=device) -> None:
                gen = WORKERS.generator(device)
                j = lo
                while j < hi:  # consecutive chunks of one tensor in one call
                    key, flat, c = tasks[j]
                    if key is None:  # a one-chunk tensor: the chunk's draw, without the chunk bookkeeping
                        gen.manual_seed(c)
                        flat.normal_(generator=gen)
                        j += 1
                        continue
                    e = j + 1
                    while e < hi and tasks[e][0] == key:
                        e += 1
                    lay = self._layouts[key[2]]
                    self._fill(key, flat[lay.chunk_rows(c)[0]:lay.chunk_rows(tasks[e - 1][2])[1]], c,
                               tasks[e - 1][2] + 1)
                    j = e
            if values[device] < _INLINE_DRAW_VALUES:  # handing a few small tensors to the threads costs more
                work(0, len(tasks))
            else:
                WORKERS.run(work, len(tasks), device)

    def direction_rows(self, step: int, k: int, i: int, rows: torch.Tensor, *,
                       grouped: bool | None = None) -> torch.Tensor:
        """z[rows] for parameter i (fp32), drawing only the chunks that hold those rows.

        On an accelerator the chunks are drawn a group at a time into one scratch
        tensor of at most ``_ROWS_GROUP_VALUES`` values (at least one chunk) and
        their rows copied out, so the memory is that of the rows asked for, not of
        the chunks drawn (OPT-1.3B's embedding: 64 instead of 412 MiB); on CPU all
        needed chunks at once (:meth:`_direction_rows_at_once`). ``grouped``
        overrides the choice; the values are the same either way.
        """
        lay = self._layouts[i]
        device = self.params[i].device
        rows = rows.to(device=device, dtype=torch.int64).reshape(-1)
        if self.cache:  # the step's z is drawn whole anyway (the update reuses it)
            return torch.index_select(self.direction(step, k, i).view(lay.rows, -1), 0, rows).view(
                -1, *lay.shape[1:])
        if self._fused[i]:  # each row computed where it lies: no chunk is drawn, nothing waits for the device
            return _cd.rows(self._device_seeds((step, k, i)), lay.per_chunk, lay.row, rows).view(-1, *lay.shape[1:])
        if not (device.type != "cpu" if grouped is None else grouped):
            return self._direction_rows_at_once(step, k, i, rows)
        out = torch.empty((rows.numel(), lay.row), device=device)
        if rows.numel() == 0:
            return out.view(-1, *lay.shape[1:])
        order = torch.argsort(rows)
        chunk_of = torch.div(rows[order], lay.per_chunk, rounding_mode="floor")  # ascending
        needed = torch.unique_consecutive(chunk_of)
        per_group = max(1, _ROWS_GROUP_VALUES // (lay.per_chunk * lay.row))
        firsts = needed[::per_group].contiguous()  # the first chunk of every group
        bounds = torch.searchsorted(chunk_of, firsts).tolist() + [rows.numel()]
        needed = needed.tolist()
        buf = self._scratch(("rows", i), (min(per_group, lay.n_chunks) * lay.per_chunk, lay.row), device)
        place = torch.zeros(lay.n_chunks, dtype=torch.int64, device=device)  # chunk -> its place in buf
        for g, lo in enumerate(range(0, len(needed), per_group)):
            group = needed[lo:lo + per_group]
            self._fill_packed((step, k, i), buf, group)
            place[group] = torch.arange(len(group), dtype=torch.int64, device=device)
            r0, r1 = bounds[g], bounds[g + 1]
            co = chunk_of[r0:r1]
            pos = place[co] * lay.per_chunk + (rows[order[r0:r1]] - co * lay.per_chunk)
            out[order[r0:r1]] = buf[pos]
        return out.view(-1, *lay.shape[1:])

    def _fill_packed(self, key: tuple[int, int, int], buf: torch.Tensor, chunks: list[int]) -> None:
        """Draw the given chunks of z into ``buf``, chunk j at rows ``j * per_chunk`` onwards."""
        lay = self._layouts[key[2]]
        for j, c in enumerate(chunks):
            a, b = lay.chunk_rows(c)
            self._fill(key, buf[j * lay.per_chunk:j * lay.per_chunk + (b - a)], c, c + 1)

    def _direction_rows_at_once(self, step: int, k: int, i: int, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`direction_rows` with every needed chunk in one fresh buffer (CPU).

        On CPU one large buffer (mapped by glibc on its own and returned when freed) measured lower
        resident peaks than many group-sized allocations (SmolLM2 FT, N = 1000: training peak
        1207-1267 MiB in three runs against 1201-1373 in four; docs/performance.md, 2026-11-22).
        """
        lay = self._layouts[i]
        chunk_of = torch.div(rows, lay.per_chunk, rounding_mode="floor")
        needed = torch.unique(chunk_of).tolist()
        buf = torch.empty((len(needed) * lay.per_chunk, lay.row), device=rows.device)
        self._fill_packed((step, k, i), buf, needed)
        place = torch.zeros(lay.n_chunks, dtype=torch.int64, device=rows.device)  # chunk -> its place in buf
        place[torch.tensor(needed, dtype=torch.int64, device=rows.device)] = torch.arange(
            len(needed), dtype=torch.int64, device=rows.device)
        pos = place[chunk_of] * lay.per_chunk + (rows - chunk_of * lay.per_chunk)
        return buf[pos].view(-1, *lay.shape[1:])

    def _scratch_z(self, step: int, k: int, p: torch.nn.Parameter, key) -> torch.Tensor:
        """z of trained tensor ``p`` drawn into the reusable scratch tensor ``key`` (see ``_scratch``)."""
        i = self._index[id(p)]
        z = self._scratch(key, p.shape, p.device)
        self._fill((step, k, i), z, 0, self._layouts[i].n_chunks)
        return z
