"""The zeroth-order step: public directions, exact perturbation, per-sample scalars, update.

Algorithm 1, lines 1-5 and 15 of the paper. The direction z_t ~ N(0, I_d) is
public and never stored for full fine-tuning (MeZO's trick): it is regenerated
from seeds that depend only on the public seed, the step, the direction index
k and the parameter's position, so every rank of a data-parallel run
regenerates the same z.

How z is defined. For trainable parameter i, z is the concatenation along the
parameter's first dimension of independent *chunks* of whole rows, about
``chunk_values(device)`` values each (2^14 on CPU, 2^24 on accelerators);
chunk c is the counter-based Philox stream keyed by the chunk seed
``chunk_seeds(direction_seed(seed, step, k, i))[c]``: on CPU computed by the
compiled kernel of :mod:`paczero.cpu_directions` (bit-identical on every
machine), on CUDA by the fused Triton kernels of :mod:`paczero.cuda_directions`,
which compute it where it is used (no z is stored there). Where neither is
available (no C compiler; no Triton) or ``PACZERO_TORCH_DIRECTIONS=1``, chunk c is
``torch.randn`` from a generator seeded with that chunk seed
(:attr:`Perturber.directions` says which; a run records it).
Chunks let CPU threads fill one direction in parallel, let an embedding draw only the rows a batch
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

Evaluation paths, one arithmetic (bit-identical results, tested):

* cached (LoRA, tiny models: at most ``cache_limit`` trainable values): z is
  cached for the step and reused by the update; the perturbed tensors are
  swapped in once per ± block, except a trained embedding's (full fine-tuning),
  whose forwards perturb only the looked-up rows. With the compiled CPU kernel
  that embedding's z is not stored at all: the kernel computes, once per step,
  the rows the run has looked up (a small table), and the update regenerates z
  as it subtracts it (tiny-opt: 12.6 MB of z no longer held). A tied LM head
  evaluated whole (the SQuAD loss projects positions through it) then draws that
  z once per ± block, for its block's perturbed copy: two draws more per step;
* uncached (full fine-tuning): while a block is open, the forward of every
  module that owns trainable parameters is rerouted: it evaluates the module
  with the perturbed tensor, never writing to the parameter. Linear layers
  write their product straight into the output; an embedding larger than
  ``big_values`` draws only the rows of z that the batch looks up and a larger
  Linear (the tied LM head) is evaluated in blocks of output rows, so no
  full-size perturbed copy of either ever exists;
* lock-step (uncached, ``Perturber.evaluate`` with several jobs; the default):
  the + and - forwards of a *wave* of micro-batches (as many consecutive ones
  as fit in ``lockstep`` token budgets per sign, or ``lockstep`` of them when
  no budget is given) run as greenlets on the calling thread. Each parks at
  every rerouted module; when all have arrived, the module's z is drawn *once*
  and the module is evaluated for every job at its own sign. Without a stored
  z a step draws (2B + 1)·d Gaussian values for B micro-batches; lock-step
  draws (W + 1)·d for W waves, and each job keeps its own micro-batch shape
  (so its arithmetic, and result, are unchanged). On CPU an MLP or attention
  whose trained tensors are all its Linear children's is one such module: its
  children's z are drawn together and the jobs run through it one after
  another, so they never hold its intermediate activations at the same time.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from greenlet import greenlet

from paczero import cpu_directions as _cpu
from paczero import cuda_directions as _cd


def direction_seed(public_seed: int, step: int, k: int, index: int) -> int:
    """The base seed of direction k of step `step` for trainable parameter `index` (public)."""
    ss = np.random.SeedSequence([int(public_seed) & 0xFFFFFFFF, int(step), int(k), int(index), 0x7A0])
    return int(ss.generate_state(1, dtype=np.uint64)[0] & np.uint64(0x7FFFFFFFFFFFFFFF))


#: splitmix64's increment and multipliers (the chunk seeds' definition), and 2^64 - 1
_GOLDEN_INT, _MIX1, _MIX2, _MASK64 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, (1 << 64) - 1
#: directions of at most this many chunks get their chunk seeds from Python integers (same values)
_FEW_CHUNKS = 8


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


#: trainable sets up to this many values (LoRA, tiny models) cache z for the step
DEFAULT_CACHE_LIMIT = 1 << 24
#: uncached: an embedding or Linear above this many values is never perturbed whole (on CPU)
DEFAULT_BIG_VALUES = 1 << 22
#: the same on an accelerator, whose memory is the weights plus little: every Linear of OPT-6.7B's layers
#: (at most 2^26 values) is perturbed whole, one product per call instead of one per block of rows; so is
#: an embedding of at most 2^26 values (SmolLM2's), which spares the row path's wait for torch.unique
ACCELERATOR_BIG_VALUES = 1 << 26
#: uncached: micro-batches whose + and - forwards run in lock-step (one draw of z per module for all)
DEFAULT_LOCKSTEP = 1
#: values per block of output rows of such a Linear (CPU; on an accelerator 2^24)
_BLOCK_VALUES = 1 << 20
_ACCELERATOR_BLOCK_VALUES = 1 << 24
#: cached: a trained embedding of at least this many values is perturbed by looked-up rows
_ROWS_MIN_VALUES = 1 << 16
#: fused kernels (CUDA): a trained tensor of at most this many values (biases, layer norms) keeps its
#: perturbed copies from its first evaluation in a step to the update, so later waves launch nothing for it
_KEEP_PAIR_VALUES = 1 << 16
#: values per block of the cached update's arithmetic (no full-size temporary)
_UPDATE_BLOCK = 1 << 16
#: values of z drawn at a time (at least one chunk) when only some rows are needed
_ROWS_GROUP_VALUES = 1 << 20
#: cached: a step's draw of fewer values than this runs on the calling thread alone
_INLINE_DRAW_VALUES = 1 << 18

class LockstepGroupingError(ValueError):
    """The model calls a Linear of a grouped lock-step owner outside that owner (it would see theta, not
    theta + scale z): a model this option cannot serve. A ValueError, so the command line answers it with
    one line and exit code 2."""


class _Layout:
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


class _Pool:
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
        ms with fixed halves, 13.0 handed out; docs/performance.md, eleventh session)."""
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


_POOL = _Pool()


class Perturber:
    """Owns the trainable parameters' perturbation and update for one model.

    ``params`` is the ordered list of (name, parameter) that is trained
    (see :func:`paczero.models.trainable_parameters`). z is cached for the step
    when the trainable set has at most ``cache_limit`` values (default
    ``DEFAULT_CACHE_LIMIT``: LoRA, tiny models). Uncached, ``lockstep`` is the
    number of micro-batches whose + and - forwards :func:`two_point_scalars`
    runs in lock-step (one draw of z per wave; 0: every forward on its own).
    With ``token_budget`` (the micro-batches' budget), a wave is instead as many
    consecutive micro-batches as fit in ``lockstep * token_budget`` padded tokens
    per sign (at least one): small micro-batches share a draw, and no wave holds
    more tokens than ``lockstep`` full micro-batches would. ``group_linears``
    (uncached lock-step on CPU; None: on): a module whose trained tensors all sit in
    its direct plain Linear children (an MLP, an attention's projections) is one
    owner, evaluated job after job (see :meth:`_grouped_owners`).
    """

    def __init__(self, model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]],
                 public_seed: int, *, cache_limit: int | None = None, big_values: int | None = None,
                 lockstep: int = DEFAULT_LOCKSTEP, token_budget: int | None = None,
                 group_linears: bool | None = None):
        refuse_offloaded(params)
        self.model = model
        self.params = [p for _, p in params]
        self.names = [n for n, _ in params]
        self.public_seed = int(public_seed)
        self.numel = sum(p.numel() for p in self.params)
        self.cache = self.numel <= (DEFAULT_CACHE_LIMIT if cache_limit is None else cache_limit)
        #: None: ``DEFAULT_BIG_VALUES`` on CPU, ``ACCELERATOR_BIG_VALUES`` elsewhere
        self.big_values = None if big_values is None else int(big_values)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._layouts = [_Layout(p.shape, chunk_values(p.device)) for p in self.params]
        #: parameters whose z is :mod:`paczero.cuda_directions`' (CUDA with Triton): fused kernels
        self._fused = [_cd.enabled(p.device) for p in self.params]
        #: parameters whose z is :mod:`paczero.cpu_directions`' (CPU with a C compiler): the compiled kernel
        self._kernel = [p.device.type == "cpu" and not f and _cpu.enabled(p.device)
                        for p, f in zip(self.params, self._fused)]
        #: which generator defines z here (recorded with a run; data-parallel ranks must agree)
        self.directions = "; ".join(sorted({
            _cpu.KERNEL_SOURCE if kern else f"{_cd.KERNEL_SOURCE} ({p.device.type})" if fused
            else f"torch generator per chunk ({p.device.type})"
            for p, fused, kern in zip(self.params, self._fused, self._kernel)}))
        self._seeds_dev: dict[tuple[int, int, int], torch.Tensor] = {}  # chunk seeds on the parameter's device
        self._state: tuple[int, int] | None = None  # (step, k) of the open block
        self._sign: float | None = None  # the scale of a forward that is not a lock-step member
        self._depth = 0  # nesting of owner-module evaluations (scratch slots per level)
        self._hub = None  # the greenlet running the lock-step schedule
        self._members: set = set()  # its member greenlets
        self._z_cache: dict[tuple[int, int, int], torch.Tensor] = {}
        #: cached, drawn on CPU: the storage of z per (k, i), reused from step to step (see :meth:`_draw_all`)
        self._z_store: dict[tuple[int, int], torch.Tensor] = {}
        self._seeds: dict[tuple[int, int, int], np.ndarray] = {}
        self._buffers: dict[tuple, torch.Tensor] = {}  # scratch reused across module calls (no page faults)
        #: fused: small tensors' perturbed copies, kept for the rest of (step, k) (see ``_KEEP_PAIR_VALUES``)
        self._kept: dict[tuple, dict] = {}
        self._kept_for: tuple[int, int] | None = None
        self._owner_modules: list[tuple[torch.nn.Module, list[torch.nn.Parameter]]] = []
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in self._index]
            if own:
                self._owner_modules.append((module, own))
        #: grouped owners (see :meth:`_grouped_owners`): id(module) -> {id(child): the child's trained tensors}
        self._groups: dict[int, dict[int, list[torch.nn.Parameter]]] = {}
        self._active: set[int] = set()  # children of the grouped owner being evaluated
        if int(lockstep) > 0 and not self.cache and all(p.device.type == "cpu" for p in self.params) \
                and not any(self._fused) and (group_linears is None or group_linears):
            self._owner_modules = self._grouped_owners(model, self._owner_modules)
        #: cached: trained embedding weights perturbed by looked-up rows (see :meth:`perturbed`), and their owners
        self._rows_params, self._rows_modules = self._rows_route() if self.cache else (set(), [])
        self._memo: dict | None = None  # cached, inside such a block: perturbed tensors formed once per block
        #: cached, such an embedding whose z the compiled CPU kernel computes: its z is never stored; each step
        #: computes the rows its forwards look up (:meth:`_row_table`) and the update regenerates the rest
        self._regen = {i for i, p in enumerate(self.params) if id(p) in self._rows_params and self._kernel[i]}
        #: i -> the table of z's looked-up rows of embedding i (see :meth:`_row_table`)
        self._tables: dict[int, dict] = {}
        if int(lockstep) < 0:
            raise ValueError("lockstep must be >= 0")
        #: micro-batches per lock-step wave of two_point_scalars (uncached; cached: every micro-batch)
        self.lockstep = int(lockstep)
        #: padded tokens per sign in one wave (None: ``lockstep`` micro-batches, whatever their size)
        self.wave_tokens = None if token_budget is None or not self.lockstep else self.lockstep * int(token_budget)

    def _grouped_owners(self, model: torch.nn.Module, owners: list) -> list:
        """Uncached lock-step on CPU: a module whose trained parameters all belong to two or more of its
        direct children that are plain Linears (an MLP's gate, up and down projections; an attention's
        q, k, v and o) becomes one owner, evaluated by its own forward with every child's perturbed
        tensors swapped in, job after job (:meth:`_grouped`).
        The jobs of a wave then never hold their intermediate activations inside it at the same time
        (the MLP's, the widest, are what a wave adds to inference's peak), at the price of scratch for
        all of the children's z at once. Each z is still drawn once per wave, and the arithmetic
        (``F.linear`` on the perturbed tensors) is the cached path's: the scalars are bit-identical
        (tests/test_zo.py)."""
        by_module = {id(m): own for m, own in owners}
        limit = self._big_limit(torch.device("cpu"))  # Linears evaluated in blocks stay their own owners
        n_owners: dict[int, int] = {}
        for _, own in owners:
            for p in own:
                n_owners[id(p)] = n_owners.get(id(p), 0) + 1
        groups: dict[int, list] = {}
        taken: set[int] = set()
        for module in model.modules():
            if id(module) in by_module or "forward" in module.__dict__:
                continue
            lin = [c for c in module.children() if id(c) in by_module and "forward" not in c.__dict__
                   and type(c).forward is torch.nn.Linear.forward]
            own = [p for c in lin for p in by_module[id(c)]]
            below = [p for p in module.parameters() if id(p) in self._index]
            if len(lin) < 2 or len(below) != len(own) or any(n_owners[id(p)] != 1 for p in own) \
                    or any(id(c) in taken for c in lin) or max(p.numel() for p in own) > limit:
                continue
            groups[id(module)] = own
            self._groups[id(module)] = {id(c): by_module[id(c)] for c in lin}
            taken.update(id(c) for c in lin)
        out = []
        for module in model.modules():
            if id(module) in groups:
                out.append((module, groups[id(module)]))
            elif id(module) in by_module and id(module) not in taken:
                out.append((module, by_module[id(module)]))
        return out

    def _big_limit(self, device: torch.device) -> int:
        """Values above which a trained tensor on ``device`` is never perturbed whole (uncached)."""
        if self.big_values is not None:
            return self.big_values
        return DEFAULT_BIG_VALUES if device.type == "cpu" else ACCELERATOR_BIG_VALUES

    def _rows_route(self) -> tuple[set[int], list]:
        """Trained parameters of at least ``_ROWS_MIN_VALUES`` values owned only by plain embeddings
        (and plain bias-free Linears: a tied LM head), which a cached block perturbs through their
        modules instead of swapping in a whole perturbed copy; with the modules that own them."""
        owners: dict[int, list] = {}
        for module, own in self._owner_modules:
            for p in own:
                owners.setdefault(id(p), []).append((module, own))
        chosen, modules = set(), []
        for p in self.params:
            if p.numel() < _ROWS_MIN_VALUES:
                continue
            mods = owners.get(id(p), [])
            plain_emb = [m for m, own in mods if type(m).forward is torch.nn.Embedding.forward
                         and m.max_norm is None and len(own) == 1]
            plain_lin = [m for m, own in mods if type(m).forward is torch.nn.Linear.forward
                         and m.weight is p and len(own) == 1]
            if plain_emb and len(plain_emb) + len(plain_lin) == len(mods) \
                    and not any("forward" in m.__dict__ for m, _ in mods):
                chosen.add(id(p))
                modules += mods
        return chosen, modules

    # -- directions -----------------------------------------------------
    def _chunk_seeds(self, key: tuple[int, int, int]) -> np.ndarray:
        seeds = self._seeds.get(key)
        if seeds is None:
            if len(self._seeds) > 4096:
                self._seeds.clear()
                self._seeds_dev.clear()
            seeds = self._seeds[key] = chunk_seeds(direction_seed(self.public_seed, *key),
                                                   self._layouts[key[2]].n_chunks)
        return seeds

    def _device_seeds(self, key: tuple[int, int, int]) -> torch.Tensor:
        """The chunk seeds of ``key`` on its parameter's device (fused kernels)."""
        seeds = self._seeds_dev.get(key)
        if seeds is None:
            seeds = self._seeds_dev[key] = _cd.seeds_tensor(self._chunk_seeds(key), self.params[key[2]].device)
        return seeds

    def _fused_chunks(self, key: tuple[int, int, int], first: int, last: int, **kw) -> None:
        """:func:`paczero.cuda_directions.chunks` over chunks ``first..last-1`` of direction ``key``."""
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
        if self._kernel[key[2]]:  # every chunk in one call of the compiled kernel, then the same arithmetic
            _cpu.chunks(seeds, first, last, lay.per_chunk * lay.row, out)
            if base is not None:
                out.mul_(scale).add_(base.reshape(out.shape))
            return
        flat = out.view(-1, lay.row) if lay.shape else out.view(1, 1)
        flat_base = None
        if base is not None:
            flat_base = base.reshape(-1, lay.row) if lay.shape else base.reshape(1, 1)
        r0 = lay.chunk_rows(first)[0]
        gen = _POOL.generator(out.device)
        for c in range(first, last):
            a, b = lay.chunk_rows(c)
            t = flat[a - r0:b - r0]
            gen.manual_seed(int(seeds[c]))
            t.normal_(generator=gen)
            if flat_base is not None:
                t.mul_(scale).add_(flat_base[a - r0:b - r0])

    def direction(self, step: int, k: int, i: int) -> torch.Tensor:
        """z for parameter i (fp32, on the parameter's device). Cached: do not modify it; it is valid
        until a later step's directions are drawn (their storage is reused)."""
        key = (step, k, i)
        if self.cache:
            z = self._z_cache.get(key)
            if z is not None:
                return z
            if self._z_cache and next(iter(self._z_cache))[0] != step:
                self._z_cache.clear()  # a new step: the previous step's directions are done
        p = self.params[i]
        keep = self.cache and i not in self._regen
        if keep and not self._fused[i]:  # every CPU-drawn tensor of (step, k) at once (see _draw_all)
            self._draw_all(step, k)
            return self._z_cache[key]
        z = torch.empty(p.shape, device=p.device, dtype=torch.float32)
        # split between the worker threads
        self._chunk_seeds(key)  # computed once, before the threads read them
        if self._fused[i]:  # one kernel for every chunk
            self._fill_range(key, z, 0, self._layouts[i].n_chunks)
        else:
            _POOL.run(partial(self._fill_range, key, z), self._layouts[i].n_chunks, p.device)
        if keep:
            self._z_cache[key] = z
        return z

    def _draw_all(self, step: int, k: int) -> None:
        """Cached: z of every stored trained tensor of (step, k) (all but ``_regen``'s) drawn in one
        partition of all their chunks between the worker threads, per device (the step needs them all: the
        update reads every z; drawn at the first block's entry), or on the calling thread when they are
        few values. The same values as one tensor at a time: every chunk is seeded on its own. Each z is written into the storage of the previous step's: a fresh tensor's
        pages are faulted in as they are first written, which on this project's CPU machine made the
        draw 18 ms instead of 9 (tiny-opt; docs/performance.md, eleventh session)."""
        by_device: dict[torch.device, list[tuple[tuple[int, int, int], torch.Tensor, int]]] = {}
        values: dict[torch.device, int] = {}
        for i, p in enumerate(self.params):
            key = (step, k, i)
            if self._fused[i] or key in self._z_cache or i in self._regen:
                continue
            z = self._z_store.get((k, i))  # last step's storage, refilled: no fresh pages to fault in
            if z is None:  # a normal tensor even in inference mode: refilled in and out of it (the update)
                with torch.inference_mode(False):
                    z = self._z_store[(k, i)] = torch.empty(p.shape, device=p.device, dtype=torch.float32)
            self._z_cache[key] = z
            self._chunk_seeds(key)
            flat = z.view(-1, self._layouts[i].row) if z.dim() else z.view(1, 1)
            by_device.setdefault(p.device, []).extend((key, flat, c) for c in range(self._layouts[i].n_chunks))
            values[p.device] = values.get(p.device, 0) + z.numel()
        for device, tasks in by_device.items():
            def work(lo: int, hi: int, tasks=tasks) -> None:
                j = lo
                while j < hi:  # consecutive chunks of one tensor in one call
                    key, flat, c = tasks[j]
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
                _POOL.run(work, len(tasks), device)

    def _fill_range(self, key: tuple[int, int, int], out: torch.Tensor, first: int, last: int) -> None:
        """Chunks ``first..last-1`` of z written at their own rows of the whole-parameter tensor ``out``."""
        lay = self._layouts[key[2]]
        flat = out.view(-1, lay.row) if lay.shape else out.view(1, 1)
        a, b = lay.chunk_rows(first)[0], lay.chunk_rows(last - 1)[1]
        self._fill(key, flat[a:b], first, last)

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
        if self.cache and i not in self._regen:  # the step's z is drawn whole anyway (the update reuses it)
            return torch.index_select(self.direction(step, k, i).view(lay.rows, -1), 0, rows).view(
                -1, *lay.shape[1:])
        if self._fused[i]:  # each row computed where it lies: no chunk is drawn, nothing waits for the device
            return _cd.rows(self._device_seeds((step, k, i)), lay.per_chunk, lay.row, rows).view(-1, *lay.shape[1:])
        if self._kernel[i]:  # each row computed where it lies: no whole chunk is drawn
            out = torch.empty((rows.numel(), lay.row), device=device)
            _cpu.rows(self._chunk_seeds((step, k, i)), lay.per_chunk, lay.row, rows, out)
            return out.view(-1, *lay.shape[1:])
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
        buf = self._buffer(("rows", i), (min(per_group, lay.n_chunks) * lay.per_chunk, lay.row), device)
        slot = torch.zeros(lay.n_chunks, dtype=torch.int64, device=device)
        for g, lo in enumerate(range(0, len(needed), per_group)):
            group = needed[lo:lo + per_group]
            self._fill_packed((step, k, i), buf, group)
            slot[group] = torch.arange(len(group), dtype=torch.int64, device=device)
            r0, r1 = bounds[g], bounds[g + 1]
            co = chunk_of[r0:r1]
            pos = slot[co] * lay.per_chunk + (rows[order[r0:r1]] - co * lay.per_chunk)
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
        1207-1267 MiB in three runs against 1201-1373 in four; docs/performance.md, sixth session).
        """
        lay = self._layouts[i]
        chunk_of = torch.div(rows, lay.per_chunk, rounding_mode="floor")
        needed = torch.unique(chunk_of).tolist()
        buf = torch.empty((len(needed) * lay.per_chunk, lay.row), device=rows.device)
        self._fill_packed((step, k, i), buf, needed)
        slot = torch.zeros(lay.n_chunks, dtype=torch.int64, device=rows.device)
        slot[torch.tensor(needed, dtype=torch.int64, device=rows.device)] = torch.arange(
            len(needed), dtype=torch.int64, device=rows.device)
        pos = slot[chunk_of] * lay.per_chunk + (rows - chunk_of * lay.per_chunk)
        return buf[pos].view(-1, *lay.shape[1:])

    def clear_cache(self) -> None:
        """Drop what is kept for the step (the cached z, small tensors' perturbed copies); needed after
        weights are changed in place other than by :meth:`apply_update` within a step."""
        self._z_cache.clear()
        self._z_store.clear()
        self._tables.clear()
        self._drop_kept()

    def _drop_kept(self) -> None:
        self._kept.clear()
        self._kept_for = None

    def _buffer(self, slot, shape, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A scratch tensor (fp32 unless told) of ``shape`` for ``slot``, reused by every later module call.

        One flat tensor per slot (and device and dtype), as large as the largest shape asked of it,
        kept; each call gets a view of its first values. A slot is used by one module evaluation at
        a time (nested owners get their own slots, see :meth:`_slot`), so the trained shapes share
        it: SmolLM2's four Linear shapes hold one z and one perturbed tensor of the largest, not one
        of each. Only for shapes from a fixed set (the trained parameters', a block's, a row
        group's), never for shapes that vary with the data.
        """
        key = (slot, device, dtype)
        need = math.prod(shape)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < need:
            if len(self._buffers) > 256:
                self._buffers.clear()
            buf = self._buffers[key] = torch.empty(need, device=device, dtype=dtype)
        return buf[:need].view(shape)

    def _perturbed_value(self, p: torch.nn.Parameter, orig: torch.Tensor, step: int, k: int,
                         scale: float, slot="p") -> torch.Tensor:
        """fl(fl(z * scale) + orig), rounded to orig's dtype: the same arithmetic on every path.

        Uncached, the value is written into the reusable scratch tensor ``slot`` (valid until the
        next call with that slot); cached, a fresh tensor (the whole block holds them all).
        """
        i = self._index[id(p)]
        if self.cache:
            if self._memo is None:
                return _perturb(self.direction(step, k, i), scale, orig)
            value = self._memo.get((i, scale))
            if value is None:
                value = self._memo[(i, scale)] = _perturb(self.direction(step, k, i), scale, orig)
            return value
        else:
            t = self._buffer(slot, orig.shape, orig.device, orig.dtype if self._fused[i] else torch.float32)
            self._fill((step, k, i), t, 0, self._layouts[i].n_chunks, scale, orig)
        return t if orig.dtype == t.dtype else t.to(orig.dtype)

    # -- evaluation at theta +/- mu z -----------------------------------------
    @contextmanager
    def perturbed(self, step: int, k: int, scale: float):
        """Within the block, every forward sees theta + scale * z_{step,k}; theta itself is untouched."""
        if self.cache:  # small trainable set: swap every perturbed tensor in once for the whole block
            # (but a trained embedding is evaluated through its modules: only the rows a forward looks up
            # are perturbed, from the cached z; no whole perturbed copy of it exists)
            swapped = [p for p in self.params if id(p) not in self._rows_params]
            originals = [p.data for p in swapped]
            try:
                for p, orig in zip(swapped, originals):
                    p.data = self._perturbed_value(p, orig, int(step), int(k), float(scale))
                if self._rows_modules:
                    with self._evaluating(step, k, self._rows_modules, rows=True):
                        self._sign = float(scale)
                        yield
                else:
                    yield
            finally:
                for p, orig in zip(swapped, originals):
                    p.data = orig
            return
        with self._evaluating(step, k):
            self._sign = float(scale)
            yield

    def evaluate(self, step: int, k: int, jobs: Sequence[tuple[float, Callable[[], object]]]) -> list:
        """Run every ``fn`` of ``jobs = [(scale, fn), ...]`` at theta + scale * z_{step,k}; their results in order.

        Cached: one perturbed block per distinct scale. Uncached: the jobs run in
        lock-step, as coroutines that meet at every module owning trained
        parameters, where that module's z is drawn once for all of them (see
        :meth:`_lockstep`); each job's arithmetic is the one of its own block.
        """
        jobs = [(float(s), fn) for s, fn in jobs]
        if self.cache or len(jobs) == 1:
            results: list = [None] * len(jobs)
            for scale in dict.fromkeys(s for s, _ in jobs):
                with self.perturbed(step, k, scale):
                    for j, (s, fn) in enumerate(jobs):
                        if s == scale:
                            results[j] = fn()
            return results
        with self._evaluating(step, k):
            return self._lockstep(jobs)

    @contextmanager
    def _evaluating(self, step: int, k: int, modules: list | None = None, rows: bool = False):
        """Route the forward of every owner module (or of ``modules``) through :meth:`_collective` for
        the block; ``rows``: a cached block's embeddings perturbed by looked-up rows whatever their size."""
        if self._state is not None:
            raise RuntimeError("perturbed blocks do not nest")
        self._state = (int(step), int(k))
        self._memo = {} if rows else None
        patched, hooks = [], []
        try:
            for module, own in self._owner_modules if modules is None else modules:
                had = "forward" in module.__dict__
                inner = module.forward
                module.forward = self._rerouted(module, own, inner, wrapped=had, rows=rows)
                patched.append((module, had, inner))
                if id(module) in self._groups:  # its children run only inside its evaluation (:meth:`_grouped`)
                    for child in module.children():
                        if id(child) in self._groups[id(module)]:
                            hooks.append(child.register_forward_pre_hook(self._child_in))
            yield
        finally:
            for h in hooks:
                h.remove()
            self._state = None
            self._sign = None
            self._memo = None
            self._depth = 0
            for module, had, inner in patched:
                if had:
                    module.forward = inner
                else:
                    del module.forward

    def _rerouted(self, module: torch.nn.Module, own: list[torch.nn.Parameter], inner: Callable,
                  wrapped: bool, rows: bool = False) -> Callable:
        """The forward of one owner module inside a block: a lock-step member parks at it, any other
        caller evaluates it at once at the current scale."""
        kind = "grouped" if id(module) in self._groups else None
        if not wrapped and kind is None:  # a forward already wrapped (accelerate's device hooks) must run as it is
            big = max(p.numel() for p in own) > self._big_limit(own[0].device)  # a Linear's weight, not + bias
            if type(module).forward is torch.nn.Linear.forward and own[0] is module.weight:
                kind = self._linear_big if big and not rows else self._linear  # rows: from the cached z
            elif (big or rows) and type(module).forward is torch.nn.Embedding.forward \
                    and module.max_norm is None and len(own) == 1:
                kind = self._embedding
        entry = (module, own, inner, kind)

        def forward(*args, **kwargs):
            if self._members and greenlet.getcurrent() in self._members:
                return self._hub.switch((entry, args, kwargs))  # park until the whole group is here
            return self._direct(entry, args, kwargs)

        return forward

    def _lockstep(self, jobs: list[tuple[float, Callable[[], object]]]) -> list:
        """Run the jobs as greenlets (one OS thread, so torch's own threads are undisturbed).

        A job parks when it calls a module that owns trained parameters; when
        every parked job waits at the same module (the usual case: the same
        model on other micro-batches or the other sign), that module is
        evaluated for all of them from one draw of its z, and they resume in
        order. Jobs that wait at different modules (data-dependent routing) are
        served group by group, so the result never depends on the grouping.
        """
        hub = greenlet.getcurrent()
        members = []
        for _, fn in jobs:
            g = greenlet(run=fn, parent=hub)
            g.gr_context = contextvars.copy_context()
            members.append(g)
        parked: dict[int, tuple] = {}
        results: list = [None] * len(jobs)

        def resume(j: int, value=None) -> None:
            message = members[j].switch(value) if members[j] else members[j].switch()
            if members[j].dead:
                results[j] = message
            else:
                parked[j] = message

        self._hub, self._members = hub, set(members)
        try:
            for j in range(len(jobs)):
                resume(j)
            while parked:
                entry = parked[min(parked)][0]
                group = [j for j in sorted(parked) if parked[j][0] is entry]
                calls = [(jobs[j][0], *parked.pop(j)[1:]) for j in group]
                for n, out in self._collective(entry, calls):  # each job resumes as soon as its output exists
                    resume(group[n], out)
                    del out
                del calls
        except BaseException:
            for g in members:
                if g:  # started and parked: unwind it (GreenletExit)
                    g.throw()
            raise
        finally:
            self._hub, self._members = None, set()
        return results

    def _collective(self, entry: tuple, calls: list):
        """One owner module evaluated for ``calls = [(scale, args, kwargs), ...]``, z drawn once.

        A generator of ``(position in calls, output)``: the lock-step hub resumes each
        job as soon as its output exists, so at most one job's output is held here
        (entries of ``calls`` are cleared as they are served). Calls are served
        scale by scale, so each perturbed tensor is formed once per scale.
        """
        module, own, inner, kind = entry
        step, k = self._state
        self._depth += 1
        try:
            if kind == "grouped":
                yield from self._grouped(module, own, inner, step, k, calls)
            elif kind is not None and all(len(a) == 1 and not kw for _, a, kw in calls):
                calls[:] = [(s, a[0]) for s, a, _ in calls]
                yield from kind(module, step, k, calls)
            else:
                yield from self._generic(own, inner, step, k, calls)
        finally:
            self._depth -= 1

    def _direct(self, entry: tuple, args: tuple, kwargs: dict):
        """An owner module called outside lock-step (or inside another owner): evaluated at once."""
        out = None
        for _, out in self._collective(entry, [(self._sign, args, kwargs)]):
            pass
        return out

    def _slot(self, name) -> tuple:
        return (name, self._depth)  # a nested owner call never reuses its caller's scratch

    @staticmethod
    def _by_scale(calls: list) -> list[tuple[float, list[int]]]:
        """The calls' distinct scales in order of appearance, each with its positions."""
        groups: dict[float, list[int]] = {}
        for j, c in enumerate(calls):
            groups.setdefault(c[0], []).append(j)
        return list(groups.items())

    def _generic(self, own, inner, step, k, calls):
        """Any owner module: its perturbed tensors swapped in for each call's own evaluation only."""
        groups = self._by_scale(calls)
        scales = [s for s, _ in groups]
        saved = [p.data for p in own]
        fused = [self._fused_values(p, w, step, k, scales, self._slot(("p", n)))
                 for n, (p, w) in enumerate(zip(own, saved))]
        zs = [self._z(step, k, p, self._slot(("z", n))) if fused[n] is None else None
              for n, p in enumerate(own)] if len(groups) > 1 else None
        ms = None if zs is None else [None if z is None else self._premultiply(z, scales) for z in zs]
        for s, positions in groups:
            values = [fused[n][s] if fused[n] is not None
                      else self._perturbed_value(p, w, step, k, s, self._slot(("p", n))) if zs is None
                      else self._combine(zs[n], s, w, self._slot(("p", n)), ms[n])
                      for n, (p, w) in enumerate(zip(own, saved))]
            for j in positions:
                _, a, kw = calls[j]
                calls[j] = None
                sign = self._sign
                try:
                    for p, v in zip(own, values):
                        p.data = v
                    self._sign = s  # an owner module called inside this one evaluates at the same scale
                    out = inner(*a, **kw)
                finally:  # restored before the job resumes: nothing else ever sees the perturbed tensor
                    self._sign = sign
                    for p, w in zip(own, saved):
                        p.data = w
                del a, kw
                yield j, out
                del out

    def _grouped(self, module, own, inner, step, k, calls):
        """A grouped owner (:meth:`_grouped_owners`), evaluated as any owner (:meth:`_generic`: every
        child's perturbed tensors swapped in for each call's own evaluation); its children may run only
        while it does (see :meth:`_child_in`)."""
        children = self._groups[id(module)]

        def guarded(*args, **kwargs):
            self._active.update(children)
            try:
                return inner(*args, **kwargs)
            finally:
                self._active.difference_update(children)

        yield from self._generic(own, guarded, step, k, calls)

    def _child_in(self, child, args):
        """A grouped child called outside its parent's evaluation would see theta, not the perturbed tensor."""
        if id(child) not in self._active:
            raise LockstepGroupingError(
                f"{type(child).__name__} was called outside the module that owns it in lock-step; build the "
                "Perturber with group_linears=False for this model (command line: --lockstep-batches 0)")

    def _z(self, step: int, k: int, p: torch.nn.Parameter, slot) -> torch.Tensor:
        i = self._index[id(p)]
        z = self._buffer(slot, p.shape, p.device)
        self._fill((step, k, i), z, 0, self._layouts[i].n_chunks)
        return z

    def _fused_values(self, p: torch.nn.Parameter, base: torch.Tensor, step: int, k: int, scales, slot,
                      first: int = 0, last: int | None = None) -> dict | None:
        """Fused kernels (see :mod:`paczero.cuda_directions`): {scale: fl(fl(z * scale) + base)} in base's
        dtype, written into scratch by kernels that draw z as they go; both signs of a block from one kernel
        and one product. ``base`` is p's data over chunks ``first..last-1``. None where p's z is torch's."""
        i = self._index[id(p)]
        if not self._fused[i]:
            return None
        key = (step, k, i)
        keep = None
        if first == 0 and last is None and p.numel() <= _KEEP_PAIR_VALUES:
            if self._kept_for != (step, k):
                self._drop_kept()
                self._kept_for = (step, k)
            keep = (i, tuple(scales), base.data_ptr())
            if keep in self._kept:
                return self._kept[keep]
        last = self._layouts[i].n_chunks if last is None else last
        base = base.contiguous()

        def out(name):  # kept values get their own tensors; the others scratch, reused by the next module
            return torch.empty_like(base) if keep else self._buffer((slot, name), base.shape, base.device, base.dtype)

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
            self._kept[keep] = values
        return values

    @staticmethod
    def _premultiply(z: torch.Tensor, scales) -> float | None:
        """For scales +m and/or -m (the two signs of a block): z <- fl(z * m) in place, once for both; return m.

        fl(z * -m) is -fl(z * m) exactly and fl(-t + theta) is fl(theta - t), so :meth:`_combine`
        then forms either sign with one add or subtract, the same bits as :func:`_perturb`.
        """
        mags = {abs(s) for s in scales}
        if len(mags) != 1 or 0.0 in mags:
            return None
        m = mags.pop()
        z.mul_(m)
        return m

    def _combine(self, z: torch.Tensor, scale: float, base: torch.Tensor, slot,
                 premultiplied: float | None = None) -> torch.Tensor:
        """:func:`_perturb` into a reusable scratch tensor (the same arithmetic); with ``premultiplied``
        (see :meth:`_premultiply`), z already holds fl(z * |scale|)."""
        out = self._buffer(slot, z.shape, z.device, base.dtype)
        if premultiplied is not None:
            return torch.add(z, base, out=out) if scale > 0 else torch.sub(base, z, out=out)
        if base.dtype == torch.float32:
            return torch.mul(z, scale, out=out).add_(base)
        t = torch.mul(z, scale, out=self._buffer(slot, z.shape, z.device))
        return torch.add(t, base, out=out)

    def _bias(self, module, step: int, k: int, scales) -> dict:
        b = module.bias
        if b is None:
            return {s: None for s in scales}
        if id(b) not in self._index:
            return {s: b.data for s in scales}
        fused = self._fused_values(b, b.data, step, k, scales, self._slot("pb"))
        if fused is not None:
            return fused
        zb = self._z(step, k, b, self._slot("zb"))
        return {s: _perturb(zb, s, b.data) for s in scales}

    def _linear(self, module, step, k, calls):
        """y = x W^T + b at each call's scale, the product written straight into the output."""
        w = module.weight
        groups = self._by_scale(calls)
        scales = [s for s, _ in groups]
        bias = self._bias(module, step, k, scales)
        fused = self._fused_values(w, w.data, step, k, scales, self._slot(("p", 0)))
        zw = self._z(step, k, w, self._slot(("z", 0))) if len(groups) > 1 and fused is None else None
        m = None if zw is None else self._premultiply(zw, scales)
        for s, positions in groups:
            pw = fused[s] if fused is not None \
                else self._perturbed_value(w, w.data, step, k, s, self._slot(("p", 0))) if zw is None \
                else self._combine(zw, s, w.data, self._slot(("p", 0)), m)
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
        i = self._index[id(w)]
        if self.cache:  # each call gathers its tokens' rows of z and of theta, with no sort for distinct rows
            # (3x faster on tiny-opt's micro-batches); the same roundings. z is whole for the step, or (not
            # stored, ``_regen``) its looked-up rows come from the step's table (:meth:`_row_table`)
            z = None if i in self._regen else self.direction(step, k, i)
            for j, (s, ids) in enumerate(calls):
                calls[j] = None
                rows = self._row_table(step, k, i, ids) if z is None else F.embedding(ids, z)
                out = _perturb(rows, s, F.embedding(ids, w.data))
                del rows
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
        # SmolLM2 FT N = 1000: docs/performance.md, sixth session)
        for s, positions in self._by_scale(calls):
            value = _perturb(z, s, base)
            for j in positions:
                calls[j] = None
                out = torch.index_select(value, 0, inverse[offsets[j]:offsets[j + 1]]).view(*shapes[j], w.shape[1])
                yield j, out
                del out

    def _row_table(self, step: int, k: int, i: int, ids: torch.Tensor) -> torch.Tensor:
        """Cached, z of embedding i not stored (``_regen``): ``z[ids]`` (fp32, ``ids.shape + (row,)``).

        The table holds z's rows for every row looked up so far in the run (a universe's distinct tokens:
        789 rows of tiny-opt's 49,152 for the demo set at N = 1000). At the first lookup of a new (step, k)
        the kernel computes all of them at once, where they lie; a row first seen later is added then.
        ``pos`` (row -> place in the table) therefore changes only when a row is added, and a lookup is two
        gathers (places, then values) with no check: a missing row's place is -1, which the second gather
        refuses. Storage is kept from step to step.
        """
        lay = self._layouts[i]
        if ids.numel() == 0:
            return torch.empty((*ids.shape, lay.row), device=ids.device)
        t = self._tables.get(i)
        if t is None:
            with torch.inference_mode(False):
                pos = torch.full((lay.rows,), -1, dtype=torch.int64, device=self.params[i].device)
                t = self._tables[i] = {"key": None, "pos": pos, "rows": pos.new_empty(0),
                                       "values": torch.empty((0, lay.row), device=pos.device), "count": 0}
        seeds = self._chunk_seeds((step, k, i))
        count = t["count"]
        if t["key"] != (step, k):  # a new direction: the table's rows, recomputed
            t["key"] = (step, k)
            if count:
                _cpu.rows(seeds, lay.per_chunk, lay.row, t["rows"][:count], t["values"][:count])
        pos = t["pos"]
        at = pos[ids]
        if count:
            try:  # a row not in the table has position -1: the gather refuses it (no check per lookup)
                return F.embedding(at, t["values"][:count])
            except IndexError:
                pass
        new = torch.unique(ids[at < 0])  # rows not in the table yet: computed and added
        if new.numel():
            need = count + new.numel()
            if t["values"].shape[0] < need:  # grow by doubling, the rows already there kept
                cap = max(need, 2 * t["values"].shape[0], 256)
                with torch.inference_mode(False):
                    values, rows = torch.empty((cap, lay.row), device=pos.device), pos.new_empty(cap)
                values[:count], rows[:count] = t["values"][:count], t["rows"][:count]
                t["values"], t["rows"] = values, rows
            t["rows"][count:need] = new
            _cpu.rows(seeds, lay.per_chunk, lay.row, new, t["values"][count:need])
            pos[new] = torch.arange(count, need, device=pos.device)
            t["count"] = count = need
        return F.embedding(pos[ids], t["values"][:count])

    def _linear_big(self, module, step, k, calls):
        """A Linear too big to perturb whole (a tied LM head): blocks of output rows, z drawn once per block
        for every call (so every call's output exists until the last block)."""
        w = module.weight
        i = self._index[id(w)]
        lay = self._layouts[i]
        groups = self._by_scale(calls)
        scales = [s for s, _ in groups]
        bias = self._bias(module, step, k, scales)
        xs = [x.reshape(-1, x.shape[-1]) for _, x in calls]
        ys = [x.new_empty((*x.shape[:-1], lay.rows)) for _, x in calls]
        calls[:] = [None] * len(calls)
        block = _BLOCK_VALUES if w.device.type == "cpu" else _ACCELERATOR_BLOCK_VALUES
        per_block = max(1, block // (lay.per_chunk * lay.row))
        fused = self._fused[i]
        z = None if fused else self._buffer(self._slot("zblock"), (per_block * lay.per_chunk, lay.row), w.device)
        for first in range(0, lay.n_chunks, per_block):
            last = min(first + per_block, lay.n_chunks)
            a, e = lay.chunk_rows(first)[0], lay.chunk_rows(last - 1)[1]
            if fused:
                values = self._fused_values(w, w.data[a:e], step, k, scales, self._slot(("pblock", e - a)),
                                            first, last)
            else:
                self._fill((step, k, i), z[:e - a], first, last)
                m = self._premultiply(z[:e - a], scales) if len(groups) > 1 else None
            for s, positions in groups:
                pw = values[s] if fused else \
                    self._combine(z[:e - a], s, w.data[a:e], self._slot(("pblock", e - a)), m)
                b = None if bias[s] is None else bias[s][a:e]
                for j in positions:
                    ys[j].view(-1, lay.rows)[:, a:e] = F.linear(xs[j], pw, b)
        del xs
        for j in range(len(ys)):
            y, ys[j] = ys[j], None
            yield j, y
            del y

    # -- update -----------------------------------------------------------
    @torch.no_grad()
    def apply_update(self, step: int, coefs: Sequence[float], lr: float, weight_decay: float = 0.0) -> None:
        """theta <- (1 - lr*wd) theta - (lr/K) sum_k coef_k z_k, one chunk at a time (fp32 arithmetic)."""
        self._drop_kept()  # perturbed copies of the weights before this update
        K = len(coefs)
        if K == 0:
            return
        scales = [lr * float(c) / K for c in coefs]
        decay = lr * weight_decay
        if all(s == 0.0 for s in scales) and decay == 0.0:
            return  # lr = 0 or all coefficients 0: the weights stay bit-identical
        for i, p in enumerate(self.params):
            if self.cache and i not in self._regen:
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

    def _sub_scaled(self, acc: torch.Tensor, z: torch.Tensor, s: float) -> None:
        """acc <- fl(acc - fl(z * s)) (the update's arithmetic), a block of values at a time, so that no
        full-size temporary of z * s exists."""
        if acc.numel() <= _UPDATE_BLOCK or not acc.is_contiguous():
            acc.sub_(z * s)
            return
        a, zf = acc.view(-1), z.reshape(-1)
        tmp = self._buffer("update", (_UPDATE_BLOCK,), acc.device)
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
        kernel = self._kernel[i]
        if kernel and fp32 and p.data.is_contiguous():  # z made and subtracted in the kernel, never stored
            if decay:
                p.data.mul_(1.0 - decay)
            values, theta = lay.per_chunk * lay.row, p.data.view(-1)
            for s, sd in zip(scales, seeds):
                if s:
                    _POOL.run(lambda lo, hi, sd=sd, s=s: _cpu.sub_chunks(
                        sd, lo, hi, values, theta[lo * values:min(hi * values, theta.numel())], s),
                        lay.n_chunks, device)
            return

        def work(lo: int, hi: int) -> None:
            gen = _POOL.generator(device)
            for c in range(lo, hi):
                a, b = lay.chunk_rows(c)
                acc = flat[a:b] if fp32 else flat[a:b].to(torch.float32)
                if decay:
                    acc.mul_(1.0 - decay)
                for s, sd in zip(scales, seeds):
                    if s:
                        z = torch.empty(acc.shape, device=device)
                        if kernel:
                            _cpu.chunks(sd, c, c + 1, lay.per_chunk * lay.row, z)
                        else:
                            gen.manual_seed(int(sd[c]))
                            z.normal_(generator=gen)
                        acc.sub_(z.mul_(s))
                if not fp32:
                    flat[a:b].copy_(acc.to(p.dtype))

        _POOL.run(work, lay.n_chunks, device)

    def remove(self) -> None:
        """Nothing to undo: module forwards are only rerouted inside an evaluation block."""


def refuse_offloaded(params: Sequence[tuple[str, torch.nn.Parameter]]) -> None:
    """Refuse trained parameters that a ``device_map`` offloaded (to CPU or disk beside the accelerators).

    They live on the meta device while accelerate's hooks load their stored values
    for each forward: no perturbed tensor can be swapped in and no update reaches
    the stored weights. One clear error instead of a traceback from inside a step.
    Sharding over several accelerators (every trained weight resident) is fine.
    """
    meta = [n for n, p in params if p.device.type == "meta"]
    if meta:
        raise ValueError(f"the device map offloaded {len(meta)} trained tensors (first: {meta[0]}) to CPU or "
                         "disk; zeroth-order training cannot perturb or update them: use more or larger GPUs, "
                         "bf16/fp16, or --track lora")


def _perturb(z: torch.Tensor, scale: float, base: torch.Tensor) -> torch.Tensor:
    """fl(fl(z * scale) + base) in fp32, rounded to base's dtype (the one perturbation arithmetic)."""
    t = z * scale
    if base.dtype == torch.float32:
        return t.add_(base)
    # the fp32 sum rounded once to base's dtype as it is stored: the same bits as t.add_(base).to(dtype),
    # with one pass less over the tensor (the add computes in fp32, the common dtype of its inputs)
    return torch.add(t, base, out=torch.empty_like(base))


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
        for batch, lp, lm in zip(batches, plus, minus):
            lp, lm = lp.double(), lm.double()
            rows = np.asarray(batch.index)
            g[k, rows] = ((lp - lm) / (2.0 * mu)).cpu().numpy()
            if k == 0:
                batch_sum = float((lp + lm).sum().item()) / 2.0
                loss_sum += batch_sum
                count += len(rows)
                if batch_losses is not None:
                    batch_losses.append(batch_sum)
    return g, loss_sum / max(count, 1)


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
