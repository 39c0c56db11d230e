"""The Perturber: a model's trained tensors evaluated at theta + scale * z, and updated along z.

Its parts are mixins, each in the file named after it: the drawing of z
(:mod:`.directions`), the per-layer evaluation of rerouted modules
(:mod:`.layers`), the lock-step schedule (:mod:`.lockstep`) and the update
(:mod:`.update`). This file holds its construction, the step's cache of z,
the scratch tensors, and the two ways in: :meth:`Perturber.perturbed` (a block
in which every forward sees the perturbed weights) and
:meth:`Perturber.evaluate` (several jobs at their own scales, in lock-step).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from paczero.zo import cuda_directions as _cd
from paczero.zo.directions import ChunkLayout, DirectionDraws, chunk_values, source_name
from paczero.zo import layers as _layers
from paczero.zo.layers import LayerPaths
from paczero.zo.lockstep import Lockstep
from paczero.zo.update import Update

#: on an accelerator, trainable sets up to this many values (LoRA, tiny models) cache z for the step
DEFAULT_CACHE_LIMIT = 1 << 24
#: on CPU, up to this many (1 GiB of fp32 z): full fine-tuning of a ~100M-parameter model keeps its z for the
#: step, drawn once for every forward and the update instead of once per wave and again for the update
#: (SmolLM2-135M FT bf16, N = 256: step / floor 1.61 uncached, 1.08-1.21 cached; 0.49 GB more resident;
#: docs/performance.md)
CPU_CACHE_LIMIT = 1 << 28
#: uncached: an embedding or Linear above this many values is never perturbed whole (on CPU)
DEFAULT_BIG_VALUES = 1 << 22
#: the same on an accelerator, whose memory is the weights plus little: every Linear of OPT-6.7B's layers
#: (at most 2^26 values) is perturbed whole, one product per call instead of one per block of rows; so is
#: an embedding of at most 2^26 values (SmolLM2's), which spares the row path's wait for torch.unique
ACCELERATOR_BIG_VALUES = 1 << 26
#: uncached: micro-batches whose + and - forwards run in lock-step (one draw of z per module for all)
DEFAULT_LOCKSTEP = 1
#: cached: values per block of a whole perturbed tensor's arithmetic (:meth:`Perturber._perturbed_whole`)
_PERTURB_BLOCK = 1 << 16
#: cached: a trained embedding of at least this many values is perturbed by looked-up rows
_ROWS_MIN_VALUES = 1 << 16


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


class Perturber(DirectionDraws, LayerPaths, Lockstep, Update):
    """Owns the trainable parameters' perturbation and update for one model.

    ``params`` is the ordered list of (name, parameter) that is trained
    (see :func:`paczero.models.trainable_parameters`). z is cached for the step
    when the trainable set has at most ``cache_limit`` values (default
    ``CPU_CACHE_LIMIT`` on CPU: full fine-tuning of small models too;
    ``DEFAULT_CACHE_LIMIT`` elsewhere: LoRA, tiny models). Uncached, ``lockstep`` is the
    number of micro-batches whose + and - forwards :func:`paczero.zo.two_point_scalars`
    runs in lock-step (one draw of z per wave; 0: every forward on its own).
    With ``token_budget`` (the micro-batches' budget), a wave is instead as many
    consecutive micro-batches as fit in ``lockstep * token_budget`` padded tokens
    per sign (at least one): small micro-batches share a draw, and no wave holds
    more tokens than ``lockstep`` full micro-batches would.
    """

    def __init__(self, model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]],
                 public_seed: int, *, cache_limit: int | None = None, big_values: int | None = None,
                 lockstep: int = DEFAULT_LOCKSTEP, token_budget: int | None = None):
        refuse_offloaded(params)
        self.model = model
        self.params = [p for _, p in params]
        self.names = [n for n, _ in params]
        self.public_seed = int(public_seed)
        self.numel = sum(p.numel() for p in self.params)
        if cache_limit is None:
            on_cpu = all(p.device.type == "cpu" for p in self.params)
            cache_limit = CPU_CACHE_LIMIT if on_cpu else DEFAULT_CACHE_LIMIT
        self.cache = self.numel <= cache_limit
        #: None: ``DEFAULT_BIG_VALUES`` on CPU, ``ACCELERATOR_BIG_VALUES`` elsewhere
        self.big_values = None if big_values is None else int(big_values)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._layouts = [ChunkLayout(p.shape, chunk_values(p.device)) for p in self.params]
        #: parameters whose z is :mod:`paczero.zo.cuda_directions`' (CUDA with Triton): fused kernels
        self._fused = [_cd.enabled(p.device) for p in self.params]
        #: which generator defines z here (recorded with a run; data-parallel ranks must agree)
        self.directions = "; ".join(sorted({source_name(p.device, fused)
                                            for p, fused in zip(self.params, self._fused)}))
        self._seed_cache: dict[tuple[int, int, int], np.ndarray] = {}  # (step, k, i) -> chunk seeds
        self._device_seed_cache: dict[tuple[int, int, int], torch.Tensor] = {}  # the same on the device
        self._open_block: tuple[int, int] | None = None  # (step, k) of the open block
        self._scale: float | None = None  # the scale of a forward that is not a lock-step member
        self._owner_depth = 0  # nesting of owner-module evaluations (scratch tensors per level)
        self._hub = None  # the greenlet running the lock-step schedule
        self._members: set = set()  # its member greenlets
        self._z_cache: dict[tuple[int, int, int], torch.Tensor] = {}
        #: cached, drawn on CPU: the storage of z per (k, i), reused from step to step (see :meth:`_draw_step`)
        self._z_storage: dict[tuple[int, int], torch.Tensor] = {}
        #: cached: the storage of each whole perturbed tensor, reused from block to block
        self._perturbed_storage: dict[int, torch.Tensor] = {}
        self._scratch_tensors: dict[tuple, torch.Tensor] = {}  # reused across module calls (no page faults)
        #: fused: small tensors' perturbed copies, kept for the rest of (step, k) (see ``layers._KEEP_PAIR_VALUES``)
        self._small_copies: dict[tuple, dict] = {}
        self._small_copies_for: tuple[int, int] | None = None
        self._owner_modules: list[tuple[torch.nn.Module, list[torch.nn.Parameter]]] = []
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in self._index]
            if own:
                self._owner_modules.append((module, own))
        #: cached: trained embedding weights perturbed by looked-up rows (see :meth:`perturbed`), and their owners
        self._rows_params, self._rows_modules = self._rows_route() if self.cache else (set(), [])
        #: cached, inside a block with such embeddings: the perturbed tensors formed so far, one per (i, scale)
        self._block_values: dict | None = None
        if int(lockstep) < 0:
            raise ValueError("lockstep must be >= 0")
        #: micro-batches per lock-step wave of two_point_scalars (uncached; cached: every micro-batch)
        self.lockstep = int(lockstep)
        #: padded tokens per sign in one wave (None: ``lockstep`` micro-batches, whatever their size)
        self.wave_tokens = None if token_budget is None or not self.lockstep else self.lockstep * int(token_budget)

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

    # -- the step's z ----------------------------------------------------
    def direction(self, step: int, k: int, i: int) -> torch.Tensor:
        """z for parameter i (fp32, on the parameter's device). Cached: do not modify it; it is valid
        until a later step's directions are drawn (their storage is reused)."""
        key = (step, k, i)
        if not self.cache:
            return self._draw_whole(key)
        z = self._z_cache.get(key)
        if z is not None:
            return z
        if self._z_cache and next(iter(self._z_cache))[0] != step:
            self._z_cache.clear()  # a new step: the previous step's directions are done
        if not self._fused[i]:  # every CPU-drawn tensor of (step, k) at once (see _draw_step)
            self._draw_step(step, k)
            return self._z_cache[key]
        z = self._z_cache[key] = self._draw_whole(key)
        return z

    def _directions(self, step: int, k: int, indices: list[int]) -> list[torch.Tensor]:
        """:meth:`direction` of each parameter in ``indices`` (cached), looked up together once drawn."""
        if not indices:
            return []
        first = self.direction(step, k, indices[0])  # draws the step's z where it is not drawn yet
        cache = self._z_cache
        return [first] + [cache.get((step, k, i)) if (step, k, i) in cache else self.direction(step, k, i)
                          for i in indices[1:]]

    def clear_cache(self) -> None:
        """Drop what is kept for the step (the cached z, small tensors' perturbed copies); needed after
        weights are changed in place other than by :meth:`apply_update` within a step."""
        self._z_cache.clear()
        self._z_storage.clear()
        self._perturbed_storage.clear()
        self._drop_small_copies()

    def _drop_small_copies(self) -> None:
        self._small_copies.clear()
        self._small_copies_for = None

    def _scratch(self, key, shape, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A scratch tensor (fp32 unless told) of ``shape`` for ``key``, reused by every later module call.

        One flat tensor per key (and device and dtype), as large as the largest shape asked of it,
        kept; each call gets a view of its first values. A key is used by one module evaluation at
        a time (nested owners get their own keys, see :meth:`_scratch_key`), so the trained shapes
        share it: SmolLM2's four Linear shapes hold one z and one perturbed tensor of the largest, not
        one of each. Only for shapes from a fixed set (the trained parameters', a block's, a row
        group's), never for shapes that vary with the data.
        """
        full_key = (key, device, dtype)
        need = math.prod(shape)
        buf = self._scratch_tensors.get(full_key)
        if buf is None or buf.numel() < need:
            if len(self._scratch_tensors) > 256:
                self._scratch_tensors.clear()
            buf = self._scratch_tensors[full_key] = torch.empty(need, device=device, dtype=dtype)
        return buf[:need].view(shape)

    def _perturbed_whole(self, p: torch.nn.Parameter, orig: torch.Tensor, step: int, k: int,
                         scale: float) -> torch.Tensor:
        """Cached: fl(fl(z * scale) + orig) for the whole of ``p``, the arithmetic of :func:`.layers._perturb`,
        written a block of values at a time (fp32 scratch) into storage kept from block to block: no full-size
        temporaries to allocate and fault in twice a step (full fine-tuning on CPU)."""
        if orig.numel() <= _PERTURB_BLOCK or not orig.is_contiguous():
            return self._perturbed_value(p, orig, step, k, scale)
        i = self._index[id(p)]
        out = self._perturbed_storage.get(i)
        if out is None or out.shape != orig.shape or out.dtype != orig.dtype or out.device != orig.device:
            with torch.inference_mode(False):
                out = self._perturbed_storage[i] = torch.empty_like(orig)
        z, flat_out, flat_in = self.direction(step, k, i).reshape(-1), out.view(-1), orig.view(-1)
        tmp = self._scratch("perturb", (_PERTURB_BLOCK,), orig.device)
        for lo in range(0, flat_in.numel(), _PERTURB_BLOCK):
            hi = min(lo + _PERTURB_BLOCK, flat_in.numel())
            _layers._perturb(z[lo:hi], scale, flat_in[lo:hi], out=flat_out[lo:hi], tmp=tmp[:hi - lo])
        return out

    def _perturbed_small(self, params: list, originals: list, step: int, k: int, scale: float) -> dict:
        """Cached: the perturbed values of the small fp32 tensors among ``params`` (at most ``_PERTURB_BLOCK``
        values, z drawn by torch's generator), by id of the parameter: fl(fl(z * scale) + theta) for all of them
        in two multi-tensor operations instead of two operations each (the same element-wise arithmetic as
        :func:`.layers._perturb`, so the same bits)."""
        group = [(p, orig) for p, orig in zip(params, originals)
                 if orig.dtype == torch.float32 and orig.numel() <= _PERTURB_BLOCK and not self._fused[self._index[id(p)]]]
        if len(group) < 2:
            return {}
        zs = self._directions(step, k, [self._index[id(p)] for p, _ in group])
        values = torch._foreach_mul(zs, scale)
        torch._foreach_add_(values, [orig for _, orig in group])
        return {id(p): v for (p, _), v in zip(group, values)}

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
                small = self._perturbed_small(swapped, originals, int(step), int(k), float(scale))
                for p, orig in zip(swapped, originals):
                    p.data = small[id(p)] if id(p) in small else \
                        self._perturbed_whole(p, orig, int(step), int(k), float(scale))
                if self._rows_modules:
                    with self._evaluating(step, k, self._rows_modules, rows=True):
                        self._scale = float(scale)
                        yield
                else:
                    yield
            finally:
                for p, orig in zip(swapped, originals):
                    p.data = orig
            return
        with self._evaluating(step, k):
            self._scale = float(scale)
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

    def remove(self) -> None:
        """Nothing to undo: module forwards are only rerouted inside an evaluation block."""
