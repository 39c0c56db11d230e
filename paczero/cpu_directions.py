"""Public directions on CPU: a counter-based generator compiled at first use.

On CPU, chunk ``c`` of a direction (see :mod:`paczero.zo`) is defined value by
value, with the layout of :mod:`paczero.cuda_directions`: the chunk's values
fall in blocks of 1024, and the value at chunk offset ``o = 1024 b + 256 q + j``
(q < 4, j < 256) is output ``q`` of

    i1, i2, i3, i4 = Philox4x32-10(key = seed_c, counter = (256 b + j, 0, 0, 0))
    r1 = sqrt(-2 ln((i1 >> 8) + 1) 2^-24),    r2 = sqrt(-2 ln(((i3 >> 8) + 1) 2^-24))
    outputs = (r1 cos(2 pi (i2 >> 8) 2^-24), r1 sin(...), r2 cos(2 pi (i4 >> 8) 2^-24), r2 sin(...))

(Box-Muller on 24-bit uniforms, |z| <= 5.77). Unlike the GPU's, the
logarithm, sine and cosine here are this module's own: fixed sequences of
IEEE-754 binary32 additions, multiplications, one division and one square root
(series whose truncation error is far below float32's resolution; see
:func:`mirror_values`), compiled without fused multiply-add and without
fast-math. Each operation is correctly rounded, so z is the same bits on every
machine, compiler and vector width, and :func:`mirror_values` (numpy float32,
the same operations in the same order) reproduces it exactly; the tests check
both that and the distance to a float64 evaluation of the definition.

Why compiled: torch's CPU generator (mt19937, then Box-Muller) costs about 3.6
ns per value on this project's machine and a full fine-tuning step needs every
value of z at least once; this kernel costs 1.1 ns on one thread (measured,
docs/performance.md, twelfth session). No maintained library offers a faster
CPU normal generator that torch can fill in place (eleventh session: numpy's
float32 normals 7.7 ns, numpy's Philox bits made normal by torch operators
8.6 ns). The kernel is plain C compiled with the system's C compiler
(``$CC`` or ``cc``) into ``$PACZERO_CACHE/kernels`` and loaded with ctypes, which
releases the GIL, so the worker threads of :mod:`paczero.zo` draw in parallel.

Where no C compiler works (or ``PACZERO_TORCH_DIRECTIONS=1``), CPU directions
fall back to torch's generator (each chunk ``torch.randn`` seeded with its chunk
seed), with a warning: then z is another, equally public, direction, as with a
run resumed on another kind of device. ``Perturber.directions`` names the
generator a run uses (``KERNEL_SOURCE`` for this one); it is recorded in
``run.json``, and the ranks of a data-parallel run must agree on it.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

#: Philox counters per block, and the block's values: part of the definition (as on CUDA)
GROUPS = 256
BLOCK = 4 * GROUPS


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _factorial(n: int) -> float:
    out = 1.0
    for m in range(2, n + 1):
        out *= m
    return out


#: the definition's float32 constants: Taylor coefficients of sin (S) and cos (C) on [0, pi/4], of
#: ln(m) = 2 atanh(s) (L: 1/n), ln 2 split in a short head (exact products with small integers) and a tail,
#: sqrt(2) (the mantissa's range), and the angle of one step of 2^-22 quarter turns
CONSTANTS: dict[str, np.float32] = {
    **{f"S{n}": _f32((-1) ** (i + 1) / _factorial(n)) for i, n in enumerate((3, 5, 7, 9, 11))},
    **{f"C{n}": _f32((-1) ** i / _factorial(n)) for i, n in enumerate((4, 6, 8, 10, 12))},
    **{f"L{n}": _f32(1.0 / n) for n in (3, 5, 7, 9, 11)},
    "LN2_HI": _f32(0.693145751953125),
    "LN2_LO": _f32(0.6931471805599453 - 0.693145751953125),
    "SQRT2": _f32(1.4142135623730951),
    "QUARTER": _f32(1.5707963267948966 * 2.0 ** -22),
}

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>

/* (((a x + b) x + c) x + d) x + e, each operation rounded on its own */
static inline float horner(float x, float a, float b, float c, float d, float e) {
    return (((a * x + b) * x + c) * x + d) * x + e;
}

/* ln(k 2^-24) for 1 <= k <= 2^24 */
static inline float ln24(uint32_t k) {
    float u = (float)k;
    uint32_t bits; memcpy(&bits, &u, 4);
    int32_t e = (int32_t)(bits >> 23) - 127;
    uint32_t mb = (bits & 0x7FFFFFu) | 0x3F800000u;
    float m; memcpy(&m, &mb, 4);
    int32_t big = m > @SQRT2@;
    m = big ? m * 0.5f : m;
    e = e + big - 24;
    float s = (m - 1.0f) / (m + 1.0f);
    float s2 = s * s;
    float p = horner(s2, @L11@, @L9@, @L7@, @L5@, @L3@) * s2 + 1.0f;
    float lnm = (s + s) * p;
    float fe = (float)e;
    return (fe * @LN2_LO@ + lnm) + fe * @LN2_HI@;
}

/* cos and sin of 2 pi k 2^-24 for k < 2^24: quadrant from the top two bits, then an angle in [0, pi/4] */
static inline void turn(uint32_t k, float *cos_out, float *sin_out) {
    uint32_t q = k >> 22, rem = k & 0x3FFFFFu;
    int32_t hi = rem >= 0x200000u;
    uint32_t rr = hi ? 0x400000u - rem : rem;
    float x = (float)rr * @QUARTER@;
    float x2 = x * x;
    float sn = x + (x * x2) * horner(x2, @S11@, @S9@, @S7@, @S5@, @S3@);
    float pc = horner(x2, @C12@, @C10@, @C8@, @C6@, @C4@);
    float cs = (1.0f - x2 * 0.5f) + (x2 * x2) * pc;
    float c0 = hi ? sn : cs, s0 = hi ? cs : sn;
    *cos_out = q == 0 ? c0 : q == 1 ? -s0 : q == 2 ? -c0 : s0;
    *sin_out = q == 0 ? s0 : q == 1 ? c0 : q == 2 ? -s0 : -c0;
}

/* counters j in [jlo, jhi) of block b: output q of counter j at o[256 q + j]. Two loops, each vectorised
   on its own: Philox4x32-10 in 64-bit lanes (each product one 32 x 32 -> 64-bit multiplication, no
   widening or narrowing per round), then Box-Muller in 32-bit lanes (1.07 against 1.58 ns per value in
   one loop; docs/performance.md, twelfth session) */
static void block(uint32_t k0, uint32_t k1, uint32_t b, uint32_t jlo, uint32_t jhi, float *o) {
    uint32_t w0[256], w1[256], w2[256], w3[256];
    const uint64_t M = 0xFFFFFFFFull;
    for (uint32_t j = jlo; j < jhi; j++) {
        uint64_t d0 = b * 256u + j, d1 = 0, d2 = 0, d3 = 0, x0 = k0, x1 = k1;
        for (int r = 0; r < 10; r++) {
            uint64_t pa = 0xD2511F53ull * (d0 & M), pb = 0xCD9E8D57ull * (d2 & M);
            uint64_t n0 = (pb >> 32) ^ d1 ^ x0, n2 = (pa >> 32) ^ d3 ^ x1;
            d1 = pb & M; d3 = pa & M; d0 = n0; d2 = n2;
            x0 = (x0 + 0x9E3779B9ull) & M; x1 = (x1 + 0xBB67AE85ull) & M;
        }
        w0[j] = (uint32_t)d0; w1[j] = (uint32_t)d1; w2[j] = (uint32_t)d2; w3[j] = (uint32_t)d3;
    }
    for (uint32_t j = jlo; j < jhi; j++) {
        float r1 = sqrtf(ln24((w0[j] >> 8) + 1u) * -2.0f);
        float r2 = sqrtf(ln24((w2[j] >> 8) + 1u) * -2.0f);
        float ca, sa, cb, sb;
        turn(w1[j] >> 8, &ca, &sa);
        turn(w3[j] >> 8, &cb, &sb);
        o[j] = r1 * ca; o[256 + j] = r1 * sa; o[512 + j] = r2 * cb; o[768 + j] = r2 * sb;
    }
}

/* out[t] = z at chunk offset first + t (t < n) of the chunk seeded by seed */
void paczero_normals(uint64_t seed, int64_t first, int64_t n, float *out) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    float tmp[1024];
    int64_t o = first, end = first + n;
    while (o < end) {
        int64_t b = o >> 10, lo = o & 1023, take = 1024 - lo;
        if (take > end - o) take = end - o;
        if (take == 1024) {
            block(k0, k1, (uint32_t)b, 0, 256, out + (o - first));
        } else {
            int64_t hi = lo + take;   /* within-block range [lo, hi): only the counters it needs */
            uint32_t jlo = 0, jhi = 256;
            if ((lo >> 8) == ((hi - 1) >> 8)) { jlo = (uint32_t)(lo & 255); jhi = (uint32_t)((hi - 1) & 255) + 1; }
            block(k0, k1, (uint32_t)b, jlo, jhi, tmp);
            memcpy(out + (o - first), tmp + lo, (size_t)take * 4);
        }
        o += take;
    }
}

/* chunks first..last-1 of one direction, contiguous in out from chunk first's first value; chunk c holds
   per_chunk values (the last one may be shorter: n values in all) */
void paczero_chunks(const uint64_t *seeds, int64_t first, int64_t last, int64_t per_chunk, int64_t n,
                    float *out) {
    for (int64_t c = first; c < last; c++) {
        int64_t at = (c - first) * per_chunk, len = per_chunk;
        if (at >= n) break;
        if (len > n - at) len = n - at;
        paczero_normals(seeds[c], 0, len, out + at);
    }
}

/* theta <- fl(theta - fl(z * s)) over chunks first..last-1 (laid out as in paczero_chunks): the update's
   two roundings, z computed a block at a time and never stored */
void paczero_sub_chunks(const uint64_t *seeds, int64_t first, int64_t last, int64_t per_chunk, int64_t n,
                        float *theta, float s) {
    float tmp[1024];
    for (int64_t c = first; c < last; c++) {
        int64_t at = (c - first) * per_chunk, len = per_chunk;
        if (at >= n) break;
        if (len > n - at) len = n - at;
        for (int64_t o = 0; o < len; o += 1024) {
            int64_t m = len - o < 1024 ? len - o : 1024;
            float *th = theta + at + o;
            paczero_normals(seeds[c], o, m, tmp);
            for (int64_t t = 0; t < m; t++) {
                float zs = tmp[t] * s;
                th[t] = th[t] - zs;
            }
        }
    }
}

/* out[i, :] = z[rows[i], :] for a direction whose chunk c holds rows c*per_chunk.. of `row` values each */
void paczero_rows(const uint64_t *seeds, const int64_t *rows, int64_t n_rows, int64_t per_chunk, int64_t row,
                  float *out) {
    for (int64_t i = 0; i < n_rows; i++) {
        int64_t c = rows[i] / per_chunk;
        paczero_normals(seeds[c], (rows[i] - c * per_chunk) * row, row, out + i * row);
    }
}
"""

_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno", "-fPIC", "-shared"]
_NATIVE = ["-march=native"]

_LOCK = threading.Lock()
_LIB: dict = {}


def source_code() -> str:
    """The C source with the definition's constants written in (exact hexadecimal float literals)."""
    src = _SOURCE
    for name, value in CONSTANTS.items():
        src = src.replace(f"@{name}@", float(value).hex() + "f")
    if "@" in src:
        raise AssertionError("a constant of the C source was not substituted")
    return src


def _machine_fingerprint() -> str:
    """What a natively compiled library depends on: the architecture and, on Linux, the CPU's features."""
    parts = [platform.machine(), platform.system()]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                parts.append(line)
                break
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def _compiler() -> list[str] | None:
    """``$CC`` (which may carry flags, as build systems set it) or ``cc``, as a command; None if not found."""
    words = shlex.split(os.environ.get("CC") or "cc")
    if not words:
        return None
    found = shutil.which(words[0]) or (words[0] if os.path.isfile(words[0]) and os.access(words[0], os.X_OK)
                                       else None)
    return None if found is None else [found, *words[1:]]


def _build() -> ctypes.CDLL:
    """Compile the kernel (once per source, compiler and machine; cached) and load it."""
    from paczero.models import cache_dir

    cc = _compiler()
    if cc is None:
        raise RuntimeError(f"no C compiler found ({os.environ.get('CC') or 'cc'})")
    version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    src = source_code()
    out_dir = cache_dir() / "kernels"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(out_dir, os.W_OK):
            raise OSError("not writable")
    except OSError:  # a read-only cache: build into the temporary directory instead
        out_dir = Path(tempfile.gettempdir()) / f"paczero-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"
        out_dir.mkdir(parents=True, exist_ok=True)
    last_error = ""
    for extra in (_NATIVE, []):
        key = hashlib.sha256("\0".join([src, version, " ".join(cc + _FLAGS + extra), _machine_fingerprint()])
                             .encode()).hexdigest()[:20]
        target = out_dir / f"cpu_directions-{key}.so"
        if not target.exists():
            with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
                c_file, so_file = Path(tmp) / "kernel.c", Path(tmp) / "kernel.so"
                c_file.write_text(src)
                done = subprocess.run([*cc, *_FLAGS, *extra, str(c_file), "-o", str(so_file)],
                                      capture_output=True, text=True, timeout=300)
                if done.returncode != 0:
                    lines = (done.stderr or done.stdout).strip().splitlines()
                    last_error = lines[-1] if lines else f"exit code {done.returncode}"
                    continue
                os.replace(so_file, target)  # atomic: concurrent processes each build, one file wins
        lib = ctypes.CDLL(str(target))
        u64, i64, ptr = ctypes.c_uint64, ctypes.c_int64, ctypes.c_void_p
        lib.paczero_normals.argtypes = [u64, i64, i64, ptr]
        lib.paczero_chunks.argtypes = [ptr, i64, i64, i64, i64, ptr]
        lib.paczero_rows.argtypes = [ptr, ptr, i64, i64, i64, ptr]
        lib.paczero_sub_chunks.argtypes = [ptr, i64, i64, i64, i64, ptr, ctypes.c_float]
        for f in (lib.paczero_normals, lib.paczero_chunks, lib.paczero_rows, lib.paczero_sub_chunks):
            f.restype = None
        return lib
    raise RuntimeError(f"the C compiler {' '.join(cc)} failed: {last_error}")


def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None (torch's generator is used: ``PACZERO_TORCH_DIRECTIONS=1``, or no
    working C compiler, which is warned about once per process)."""
    if os.environ.get("PACZERO_TORCH_DIRECTIONS") == "1":
        return None
    with _LOCK:
        if "lib" not in _LIB:
            try:
                _LIB["lib"] = _build()
            except Exception as exc:  # noqa: BLE001 - any failure to build means the fallback
                _LIB["lib"] = None
                warnings.warn(f"paczero: CPU directions from torch's generator (slower, other values): "
                              f"the counter-based kernel could not be built: {exc}", RuntimeWarning, stacklevel=2)
        return _LIB["lib"]


def enabled(device) -> bool:
    """True when directions on ``device`` come from this module's kernel (a CPU device and a kernel)."""
    return torch.device(device).type == "cpu" and library() is not None


#: how :attr:`paczero.zo.Perturber.directions` names this module's kernel
KERNEL_SOURCE = "philox4x32-10 box-muller, float32 series (paczero.cpu_directions)"


def _check(t: torch.Tensor) -> None:
    if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError("the CPU direction kernel writes contiguous float32 CPU tensors")


def normals(seed: int, first: int, out: torch.Tensor) -> None:
    """out (contiguous fp32, CPU) <- z at chunk offsets first, first + 1, ... of the chunk seeded by ``seed``."""
    _check(out)
    library().paczero_normals(int(seed), int(first), out.numel(), out.data_ptr())


def chunks(seeds: np.ndarray, first: int, last: int, per_chunk_values: int, out: torch.Tensor) -> None:
    """Chunks ``first..last-1`` of a direction (``seeds``: all its chunk seeds) into ``out``, which starts at
    chunk ``first`` and holds ``per_chunk_values`` values per chunk (the last chunk: what remains of it)."""
    _check(out)
    seeds = np.ascontiguousarray(seeds, dtype=np.uint64)
    if last > len(seeds) or first < 0:
        raise ValueError("chunk range outside the direction")
    library().paczero_chunks(seeds.ctypes.data, int(first), int(last), int(per_chunk_values), out.numel(),
                             out.data_ptr())


def sub_chunks(seeds: np.ndarray, first: int, last: int, per_chunk_values: int, theta: torch.Tensor,
               scale: float) -> None:
    """theta <- fl(theta - fl(z * scale)) in place over chunks ``first..last-1`` (theta laid out as ``out`` of
    :func:`chunks`; ``scale`` rounded to float32 first, as torch's scalar multiplication does)."""
    _check(theta)
    seeds = np.ascontiguousarray(seeds, dtype=np.uint64)
    if last > len(seeds) or first < 0:
        raise ValueError("chunk range outside the direction")
    library().paczero_sub_chunks(seeds.ctypes.data, int(first), int(last), int(per_chunk_values), theta.numel(),
                                 theta.data_ptr(), float(scale))


def rows(seeds: np.ndarray, per_chunk: int, row: int, row_index: torch.Tensor, out: torch.Tensor) -> None:
    """out[i] <- z[row_index[i]] for a direction of rows of ``row`` values, ``per_chunk`` rows per chunk."""
    _check(out)
    seeds = np.ascontiguousarray(seeds, dtype=np.uint64)
    idx = row_index.to(device="cpu", dtype=torch.int64).contiguous()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= len(seeds) * per_chunk):
        raise ValueError("row outside the direction")
    if out.numel() != idx.numel() * row:
        raise ValueError("out must hold len(row_index) rows")
    library().paczero_rows(seeds.ctypes.data, idx.data_ptr(), idx.numel(), int(per_chunk), int(row),
                           out.data_ptr())


# -- the same operations in numpy float32, for the tests (and as the definition's readable form) -------------
def _philox(key: int, counters: np.ndarray) -> tuple[np.ndarray, ...]:
    from paczero.cuda_directions import philox4x32_10

    return philox4x32_10(key, counters)


def _ln24(k: np.ndarray) -> np.ndarray:
    c = CONSTANTS
    u = k.astype(np.float32)
    bits = u.view(np.uint32)
    e = (bits >> np.uint32(23)).astype(np.int32) - 127
    m = ((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(np.float32)
    big = m > c["SQRT2"]
    m = np.where(big, m * np.float32(0.5), m)
    e = e + big.astype(np.int32) - 24
    s = (m - np.float32(1)) / (m + np.float32(1))
    s2 = s * s
    p = c["L11"]
    for name in ("L9", "L7", "L5", "L3"):
        p = p * s2 + c[name]
    p = p * s2 + np.float32(1)
    lnm = (s + s) * p
    fe = e.astype(np.float32)
    return (fe * c["LN2_LO"] + lnm) + fe * c["LN2_HI"]


def _turn(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = CONSTANTS
    q, rem = k >> np.uint32(22), k & np.uint32(0x3FFFFF)
    hi = rem >= np.uint32(0x200000)
    rr = np.where(hi, np.uint32(0x400000) - rem, rem)
    x = rr.astype(np.float32) * c["QUARTER"]
    x2 = x * x
    p = c["S11"]
    for name in ("S9", "S7", "S5", "S3"):
        p = p * x2 + c[name]
    sn = x + (x * x2) * p
    pc = c["C12"]
    for name in ("C10", "C8", "C6", "C4"):
        pc = pc * x2 + c[name]
    cs = (np.float32(1) - x2 * np.float32(0.5)) + (x2 * x2) * pc
    c0, s0 = np.where(hi, sn, cs), np.where(hi, cs, sn)
    cos = np.select([q == 0, q == 1, q == 2], [c0, -s0, -c0], s0)
    sin = np.select([q == 0, q == 1, q == 2], [s0, c0, -s0], -c0)
    return cos, sin


def mirror_values(seed: int, offsets) -> np.ndarray:
    """z at chunk ``offsets`` of the chunk seeded by ``seed``: the kernel's float32 operations in numpy.

    The series: sin and cos by their Taylor polynomials to x^11 and x^12 on [0, pi/4] (remainders below
    1e-11); ln m = 2 atanh(s), s = (m - 1)/(m + 1), |s| <= 0.172 for m in [sqrt(1/2), sqrt(2)], to s^11
    (remainder below 1e-10). So the values differ from a float64 evaluation of the definition only by
    float32 roundings (a few units in the last place; the tests bound it).
    """
    with np.errstate(over="ignore"):
        offsets = np.asarray(offsets, dtype=np.int64)
        block, within = offsets // BLOCK, offsets % BLOCK
        q, j = within // GROUPS, within % GROUPS
        i1, i2, i3, i4 = _philox(seed, block * GROUPS + j)
        r1 = np.sqrt(_ln24((i1 >> np.uint32(8)) + np.uint32(1)) * np.float32(-2))
        r2 = np.sqrt(_ln24((i3 >> np.uint32(8)) + np.uint32(1)) * np.float32(-2))
        ca, sa = _turn(i2 >> np.uint32(8))
        cb, sb = _turn(i4 >> np.uint32(8))
        vals = np.stack([r1 * ca, r1 * sa, r2 * cb, r2 * sb])
    return vals[q, np.arange(len(offsets))]
