"""z on CPU (paczero/cpu_directions.py): the compiled kernel against its definition.

Three independent checks: the kernel equals, bit for bit, the same float32 operations done by numpy
(``mirror_values``); that mirror is within float32 rounding of a float64 evaluation of the definition
(``cuda_directions.reference_values``: numpy's float64 log, sin and cos), exhaustively for the logarithm
and the quarter-turn functions over all 2^24 inputs; and the values are standard normal by their moments
and a Kolmogorov-Smirnov test. Negative controls: one constant moved by one unit in the last place, or an
offset moved by one, breaks the bit-exact comparison.
"""
import shutil

import numpy as np
import pytest
import torch
from scipy import stats

from paczero import cpu_directions as cpu
from paczero.cuda_directions import reference_values


@pytest.fixture(scope="module")
def lib():
    lib = cpu.library()
    assert lib is not None, "the C kernel must build on the test machines (gcc is part of their set-up)"
    return lib


def _kernel(seed: int, first: int, n: int) -> np.ndarray:
    out = torch.empty(n)
    cpu.normals(seed, first, out)
    return out.numpy()


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_kernel_is_its_float32_mirror_bit_for_bit(lib):
    rng = np.random.default_rng(0)
    cases = [(0, 0, 1), (1, 0, 1024), (2**63 - 1, 1023, 2), (5, 255, 2), (5, 256, 256), (7, 100, 60),
             (9, 5000, 4096), (11, 0, 1 << 14)]
    cases += [(int(rng.integers(0, 2**63)), int(rng.integers(0, 1 << 14)), int(rng.integers(1, 5000)))
              for _ in range(20)]
    for seed, first, n in cases:
        got, want = _kernel(seed, first, n), cpu.mirror_values(seed, np.arange(first, first + n))
        assert np.array_equal(_bits(got), _bits(want)), (seed, first, n)
    # negative controls: a neighbouring offset; one constant moved by one unit in the last place
    seed, first, n = cases[-1]
    assert not np.array_equal(_kernel(seed, first + 1, n), cpu.mirror_values(seed, np.arange(first, first + n)))
    for name in ("S5", "L3", "C4"):
        saved = cpu.CONSTANTS[name]
        try:
            cpu.CONSTANTS[name] = np.nextafter(saved, np.float32(np.inf))
            moved = cpu.mirror_values(11, np.arange(1 << 14))
        finally:
            cpu.CONSTANTS[name] = saved
        assert not np.array_equal(_bits(moved), _bits(_kernel(11, 0, 1 << 14))), name


def test_chunks_and_rows_are_the_values_at_their_offsets(lib):
    seeds = np.array([3, 2**63 - 5, 12345, 99], dtype=np.uint64)
    per_chunk_rows, row = 7, 100  # 700 values per chunk: chunks straddle blocks of 1024
    n = 3 * 700 + 300  # the last chunk is short
    out = torch.empty(n)
    cpu.chunks(seeds, 0, 4, per_chunk_rows * row, out)
    want = np.concatenate([cpu.mirror_values(int(s), np.arange(700 if c < 3 else 300)) for c, s in enumerate(seeds)])
    assert np.array_equal(_bits(out.numpy()), _bits(want))
    part = torch.empty(700 + 300)
    cpu.chunks(seeds, 2, 4, per_chunk_rows * row, part)
    assert torch.equal(part, out[1400:])
    z = out.view(-1, row)
    rows = torch.tensor([0, 6, 7, 23, 3, 3, 13])
    got = torch.empty(len(rows), row)
    cpu.rows(seeds, per_chunk_rows, row, rows, got)
    assert torch.equal(got, z[rows])
    with pytest.raises(ValueError):
        cpu.rows(seeds, per_chunk_rows, row, torch.tensor([28]), torch.empty(1, row))
    with pytest.raises(ValueError):
        cpu.chunks(seeds, 0, 5, 700, torch.empty(3500))
    with pytest.raises(ValueError):
        cpu.normals(1, 0, torch.empty(4, 4).t())


def test_mirror_is_the_definition_within_float32_rounding():
    """Against numpy's float64 log, cos and sin: everywhere the definition is evaluated."""
    for seed in (1, 2**40 + 3, 2**63 - 1):
        offs = np.arange(0, 50_000)
        err = np.abs(cpu.mirror_values(seed, offs).astype(np.float64) - reference_values(seed, offs))
        assert err.max() < 1.5e-6
    k = np.arange(1, (1 << 24) + 1, dtype=np.uint32)  # every 24-bit uniform of the logarithm
    ln = cpu._ln24(k).astype(np.float64)
    exact = np.log(k.astype(np.float64)) - 24 * np.log(2.0)
    assert np.max(np.abs(ln - exact) / np.abs(exact).clip(2.0 ** -24)) < 4e-7
    r = np.sqrt(-2 * exact)
    assert np.max(np.abs(np.sqrt(np.float32(-2) * cpu._ln24(k)).astype(np.float64) - r)) < 1e-6
    del ln, exact, r
    k = np.arange(0, 1 << 24, dtype=np.uint32)  # every angle
    cos, sin = cpu._turn(k)
    angle = 2 * np.pi * k.astype(np.float64) * 2.0 ** -24
    assert np.max(np.abs(cos - np.cos(angle))) < 2e-7 and np.max(np.abs(sin - np.sin(angle))) < 2e-7
    # a wrong quadrant rule would be off by O(1) somewhere: the check above catches it (negative control)
    assert np.max(np.abs(cos - np.sin(angle))) > 0.5


def test_values_are_standard_normal(lib):
    z = _kernel(2024, 0, 1 << 22).astype(np.float64)
    assert abs(z.mean()) < 3 * 1 / 2**11  # 3 standard errors
    assert abs(z.var() - 1) < 3 * np.sqrt(2) / 2**11
    assert abs(stats.kurtosis(z, fisher=False) - 3) < 3 * np.sqrt(24) / 2**11
    assert stats.kstest(z[::4], "norm").pvalue > 1e-3
    assert np.abs(z).max() <= np.sqrt(-2 * np.log(2.0 ** -24)) + 1e-5
    other = _kernel(2025, 0, 1 << 16).astype(np.float64)  # another chunk's seed: uncorrelated
    assert abs(np.corrcoef(z[: 1 << 16], other)[0, 1]) < 4 / 2**8
    # negative control: torch's uniform values fail the same Kolmogorov-Smirnov test
    assert stats.kstest(torch.rand(1 << 20, generator=torch.Generator().manual_seed(0)).numpy(), "norm").pvalue < 1e-3


def test_without_a_compiler_torch_generator_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "_LIB", {})
    monkeypatch.setenv("PACZERO_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="could not be built"):
        assert cpu.library() is None
    assert not cpu.enabled("cpu")
    monkeypatch.setattr(cpu, "_LIB", {})
    monkeypatch.setenv("CC", "false")  # a compiler that runs and fails
    with pytest.warns(RuntimeWarning, match="failed: exit code 1"):
        assert cpu.library() is None
    monkeypatch.setattr(cpu, "_LIB", {})
    monkeypatch.setenv("CC", "cc -O1")  # a compiler with flags, as build systems set $CC
    assert cpu.library() is not None
    monkeypatch.setattr(cpu, "_LIB", {})
    monkeypatch.delenv("CC")
    assert cpu.library() is not None and cpu.enabled("cpu")
    assert list((tmp_path / "kernels").glob("cpu_directions-*.so"))  # built into the cache
    monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    assert cpu.library() is None and not cpu.enabled("cpu")


@pytest.mark.slow
def test_an_unwritable_cache_builds_into_the_temporary_directory(monkeypatch, tmp_path):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setattr(cpu, "_LIB", {})
    monkeypatch.setenv("PACZERO_CACHE", str(blocked))
    monkeypatch.setattr(cpu.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert cpu.library() is not None
    assert list((tmp_path / "tmp").glob("paczero-kernels-*/cpu_directions-*.so"))
    assert blocked.read_text().startswith("a file")  # nothing of the user's was touched


@pytest.mark.slow
def test_the_same_bits_whatever_the_vector_width_and_optimisation(lib, monkeypatch, tmp_path):
    """The definition uses only correctly rounded operations and no contraction: the kernel built for this
    CPU's widest vectors (-march=native -O3), for the baseline ISA (-O3, SSE2 on x86-64) and without
    optimisation (-O0, scalar code) gives the same bits."""
    import ctypes

    monkeypatch.setenv("PACZERO_CACHE", str(tmp_path))
    n, seed = 50_000, 0xFEEDFACE12345
    want = _kernel(seed, 3, n)
    base = list(cpu._FLAGS)
    for native, flags in (([], base), ([], [f if f != "-O3" else "-O0" for f in base])):
        monkeypatch.setattr(cpu, "_NATIVE", native)
        monkeypatch.setattr(cpu, "_FLAGS", flags)
        other = cpu._build()
        assert other._name != lib._name  # another build
        out = torch.empty(n)
        other.paczero_normals(ctypes.c_uint64(seed), 3, n, out.data_ptr())
        assert np.array_equal(_bits(out.numpy()), _bits(want)), flags
    if " fma" in cpu._machine_fingerprint():  # negative control: contraction into fused multiply-adds
        monkeypatch.setattr(cpu, "_NATIVE", ["-march=native"])
        monkeypatch.setattr(cpu, "_FLAGS", [f if f != "-ffp-contract=off" else "-ffp-contract=fast" for f in base])
        fused = cpu._build()
        out = torch.empty(n)
        fused.paczero_normals(ctypes.c_uint64(seed), 3, n, out.data_ptr())
        assert not np.array_equal(_bits(out.numpy()), _bits(want))


_DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
void paczero_normals(uint64_t seed, int64_t first, int64_t n, float *out);
int main(int argc, char **argv) {
    uint64_t seed = strtoull(argv[1], 0, 10);
    int64_t first = strtoll(argv[2], 0, 10), n = strtoll(argv[3], 0, 10);
    float *out = malloc((size_t)n * sizeof(float));
    paczero_normals(seed, first, n, out);
    fwrite(out, sizeof(float), (size_t)n, stdout);
    return 0;
}
"""


@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64-static")),
                    reason="needs a cross compiler for aarch64 and qemu-user (Debian: gcc-aarch64-linux-gnu, "
                           "qemu-user-static)")
@pytest.mark.slow
def test_the_same_bits_on_aarch64(lib, tmp_path):
    """The kernel cross-compiled for 64-bit ARM (GCC, the build's flags, static) and run under qemu gives this
    machine's bits: for the baseline ISA (NEON), for SVE vectors, and without optimisation. Negative control:
    the same build contracting into fused multiply-adds (every aarch64 CPU has them) gives other bits."""
    import subprocess

    (tmp_path / "kernel.c").write_text(cpu.source_code())
    (tmp_path / "driver.c").write_text(_DRIVER)
    flags = [f for f in cpu._FLAGS if f not in ("-fPIC", "-shared")]
    n, seed, first = 50_000, 0xFEEDFACE12345, 3
    want = _bits(_kernel(seed, first, n))

    def run(name: str, extra: list[str], cpu_model: str = "max") -> np.ndarray:
        exe = tmp_path / name
        subprocess.run(["aarch64-linux-gnu-gcc", *flags, *extra, "-static", str(tmp_path / "kernel.c"),
                        str(tmp_path / "driver.c"), "-lm", "-o", str(exe)], check=True, capture_output=True)
        done = subprocess.run(["qemu-aarch64-static", "-cpu", cpu_model, str(exe), str(seed), str(first), str(n)],
                              check=True, capture_output=True, timeout=600)
        return np.frombuffer(done.stdout, dtype=np.uint32)

    assert np.array_equal(run("neon", [], "cortex-a57"), want)
    assert np.array_equal(run("sve", ["-march=armv8.2-a+sve"]), want)
    assert np.array_equal(run("o0", ["-O0"], "cortex-a57"), want)
    fused = run("fused", ["-ffp-contract=fast"], "cortex-a57")
    assert fused.shape == want.shape and not np.array_equal(fused, want)
