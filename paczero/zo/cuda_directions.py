"""Public directions on CUDA: a counter-based generator fused with the perturbation and the update.

On CUDA (when Triton is importable) chunk ``c`` of a direction is not drawn by
``torch.randn`` but defined value by value. The chunk's values (row-major over
its whole rows) fall in blocks of 1024; the value at offset ``o`` of the chunk,
with ``o = 1024 b + 256 q + j`` (q < 4, j < 256), is output ``q`` of

    i1, i2, i3, i4 = Philox4x32-10(key = seed_c, counter = (256 b + j, 0, 0, 0))
    a = (i1 >> 8) + 1,  b' = i2 >> 8,  c' = (i3 >> 8) + 1,  d = i4 >> 8      (24-bit integers)
    r1 = sqrt(-2 ln(a 2^-24)),  r2 = sqrt(-2 ln(c' 2^-24))
    outputs = (r1 cos(2 pi b' 2^-24), r1 sin(2 pi b' 2^-24), r2 cos(2 pi d 2^-24), r2 sin(2 pi d 2^-24))

(Box-Muller on 24-bit uniforms; |z| <= 5.77), with ``seed_c`` the chunk's seed of
:func:`paczero.zo.chunk_seeds`, split into two 32-bit key words (low, high) as
Triton's ``tl.randint4x`` does. Because any value can be computed from its
position alone, one kernel draws z and writes what the step needs from it
without z ever being stored: the two perturbed copies ``fl(theta + fl(z m))``
and ``fl(theta - fl(z m))`` in the weights' dtype (6 bytes of memory traffic per
bf16 weight instead of about 28 for draw, scale and two combines in torch), the
rows of z an embedding looks up, and the update ``fl(fl(theta (1 - lr wd)) -
fl(z s))``. The kernels are compiled without multiply-add fusion, so every value
is the same two fp32 roundings as :func:`paczero.zo._perturb` and the update.
(The transcendental functions are the GPU's, so the last bits of z are the
device's; every path on the device computes z with the same code and agrees bit
for bit, which the CUDA tests check.)
"""
from __future__ import annotations

import os

import numpy as np
import torch

_KERNELS: dict = {}  # Triton's availability and the kernels, looked up at first use (never on CPU-only runs)


def _triton_available() -> bool:
    if "available" not in _KERNELS:
        try:  # Triton ships with torch's CUDA wheels; without it CUDA falls back to torch.randn chunks
            import triton  # noqa: F401
            _KERNELS["available"] = True
        except ImportError:
            _KERNELS["available"] = False
    return _KERNELS["available"]


#: Philox counters per block: part of the definition of z (blocks of 1024 values; one program each)
_GROUPS = 256
_TWO_PI = 6.283185307179586

MODE_Z, MODE_PERTURB, MODE_PAIR, MODE_UPDATE = 0, 1, 2, 3
#: how :attr:`paczero.zo.Perturber.directions` names this module's kernels (with the device type)
KERNEL_SOURCE = "philox4x32-10 box-muller, Triton"


def enabled(device) -> bool:
    """True when directions on ``device`` are this module's (a CUDA device and Triton importable,
    unless ``PACZERO_TORCH_DIRECTIONS=1`` asks for torch's generator)."""
    if os.environ.get("PACZERO_TORCH_DIRECTIONS") == "1":
        return False
    dev = torch.device(device)
    on = dev.type == "cuda" or (dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
                                and os.environ.get("PACZERO_TRITON_CPU") == "1")
    return on and _triton_available()


def _kernel(name: str):
    if "kernels" not in _KERNELS:
        from paczero.zo import _direction_kernels
        _KERNELS["kernels"] = {"chunks": _direction_kernels._chunks_kernel, "rows": _direction_kernels._rows_kernel}
    return _KERNELS["kernels"][name]


def _launch(kernel, grid, device: torch.device, *args, **meta):
    """Launch on ``device`` (Triton launches on the current CUDA device: with a model sharded over several
    GPUs, the tensors' device need not be the current one)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            kernel[grid](*args, enable_fp_fusion=False, **meta)
    else:
        kernel[grid](*args, enable_fp_fusion=False, **meta)


def seeds_tensor(seeds: np.ndarray, device) -> torch.Tensor:
    """A direction's chunk seeds (uint64, below 2^63) as an int64 tensor on ``device``, for the kernels."""
    return torch.from_numpy(np.ascontiguousarray(seeds).view(np.int64)).to(device)


def chunks(seeds: torch.Tensor, per_chunk_values: int, numel: int, first: int, last: int, *,
           mode: int, out1: torch.Tensor, out2: torch.Tensor | None = None,
           theta: torch.Tensor | None = None, scale: float = 0.0) -> None:
    """Chunks ``first..last-1`` of one direction (``seeds``: its chunk seeds, from :func:`seeds_tensor`;
    ``per_chunk_values``: values per chunk, whole rows; ``numel``: the parameter's) over contiguous tensors
    that start at chunk ``first``:

    * ``MODE_Z``: out1 = z (fp32);
    * ``MODE_PERTURB``: out1 = fl(fl(z * scale) + theta), rounded to out1's dtype;
    * ``MODE_PAIR``: also out2 = fl(theta - fl(z * scale)) (the other sign, from the same product).
    """
    if mode not in (MODE_Z, MODE_PERTURB, MODE_PAIR):
        raise ValueError(f"unknown mode {mode}")
    if mode != MODE_Z and theta is None or mode == MODE_PAIR and out2 is None:
        raise ValueError("this mode needs theta (and out2 for a pair)")
    for t in (out1, out2, theta):
        if t is not None and not t.is_contiguous():
            raise ValueError("the direction kernels need contiguous tensors")
    n_rel = min(last * per_chunk_values, numel) - first * per_chunk_values
    n_blk = -(-per_chunk_values // (4 * _GROUPS))
    _launch(_kernel("chunks"), ((last - first) * n_blk,), out1.device, seeds, first, per_chunk_values, n_blk, n_rel,
            out1 if theta is None else theta, out1, out1 if out2 is None else out2, float(scale), seeds, 1,
            seeds.numel(), 1.0, MODE=mode, B=_GROUPS)


def update(seeds: torch.Tensor, scales: torch.Tensor, per_chunk_values: int, theta: torch.Tensor,
           decay_factor: float) -> None:
    """theta <- fl(... fl(fl(theta * decay_factor) - fl(z_0 * s_0)) ... - fl(z_{K-1} * s_{K-1})) in place,
    in fp32 and rounded once to theta's dtype, over every chunk (no multiplication when ``decay_factor`` is
    1); ``seeds`` [K, n_chunks] the chunk seeds of each direction, ``scales`` [K] fp32 (K may be 0)."""
    if not theta.is_contiguous():
        raise ValueError("the direction kernels need contiguous tensors")
    K, n_chunks = seeds.shape
    n_blk = -(-per_chunk_values // (4 * _GROUPS))
    _launch(_kernel("chunks"), (max(n_chunks, 1) * n_blk,), theta.device, seeds, 0, per_chunk_values, n_blk,
            theta.numel(), theta, theta, theta, 0.0, scales, K, max(n_chunks, 1), float(decay_factor),
            MODE=MODE_UPDATE, B=_GROUPS)


def rows(seeds: torch.Tensor, per_chunk: int, row: int, row_index: torch.Tensor) -> torch.Tensor:
    """z[row_index] as a fresh fp32 [len(row_index), row] tensor (rows of one direction; ``per_chunk`` rows
    per chunk of ``row`` values each)."""
    dev = row_index.device
    out = torch.empty((row_index.numel(), row), dtype=torch.float32, device=dev)
    if row_index.numel():
        n_blk = -(-(row + 4 * _GROUPS) // (4 * _GROUPS))
        _launch(_kernel("rows"), (row_index.numel() * n_blk,), dev, seeds, row_index.to(torch.int64).contiguous(),
                per_chunk, row, n_blk, out, B=_GROUPS)
    return out


# -- an independent reference (numpy, float64 transcendental functions) for the tests -----------------
def _mulhilo(a: int, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    prod = np.uint64(a) * b.astype(np.uint64)
    return (prod >> np.uint64(32)).astype(np.uint32), (prod & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def philox4x32_10(key: int, c0: np.ndarray, c1=0, c2=0, c3=0) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 (Salmon et al., SC 2011) of counters (c0, c1, c2, c3) under the 64-bit ``key``
    (low word first), as uint32 arrays."""
    c0 = np.asarray(c0).astype(np.uint32)
    c1, c2, c3 = (np.broadcast_to(np.asarray(c, dtype=np.uint32), c0.shape).copy() for c in (c1, c2, c3))
    k0, k1 = int(key) & 0xFFFFFFFF, (int(key) >> 32) & 0xFFFFFFFF
    for _ in range(10):
        hi_b, lo_b = _mulhilo(0xCD9E8D57, c2)
        hi_a, lo_a = _mulhilo(0xD2511F53, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ np.uint32(k0), lo_b, hi_a ^ c3 ^ np.uint32(k1), lo_a
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def reference_values(seed: int, offsets: np.ndarray) -> np.ndarray:
    """z at chunk ``offsets`` for chunk seed ``seed`` by the module docstring's definition, in float64."""
    offsets = np.asarray(offsets, dtype=np.int64)
    block, within = offsets // (4 * _GROUPS), offsets % (4 * _GROUPS)
    q, j = within // _GROUPS, within % _GROUPS
    i1, i2, i3, i4 = philox4x32_10(seed, block * _GROUPS + j)
    a = ((i1 >> 8).astype(np.float64) + 1) * 2.0 ** -24
    b = (i2 >> 8).astype(np.float64) * 2.0 ** -24
    c = ((i3 >> 8).astype(np.float64) + 1) * 2.0 ** -24
    d = (i4 >> 8).astype(np.float64) * 2.0 ** -24
    r1, r2 = np.sqrt(-2 * np.log(a)), np.sqrt(-2 * np.log(c))
    vals = np.stack([r1 * np.cos(_TWO_PI * b), r1 * np.sin(_TWO_PI * b),
                     r2 * np.cos(_TWO_PI * d), r2 * np.sin(_TWO_PI * d)])
    return vals[q, np.arange(len(offsets))]
