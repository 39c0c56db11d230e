"""Speed of the privacy core: sigma_for_mi, binary_mi, release(), balanced_design.

    python benchmarks/bench_privacy.py

Targets: sigma_for_mi <= ~0.5 ms per call, release() for M=128 well under 1 ms.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from paczero.mechanisms import PacMI, PacZPL  # noqa: E402
from paczero.privacy import binary_entropy, binary_mi, sigma_for_mi  # noqa: E402
from paczero.privacy.subsets import balanced_design  # noqa: E402


def per_call_us(fn, args, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for a in args:
            fn(*a)
        best = min(best, (time.perf_counter() - t0) / len(args))
    return best * 1e6


def main() -> None:
    grid = []
    for q in (1e-6, 1e-3, 0.1, 0.3, 0.5, 0.9):
        h = binary_entropy(q)
        for b in (1e-14, 1e-9, 1e-6, 1e-4, 1e-2, 0.1, 0.3, 0.6):
            grid.append((q, min(b, 0.999 * h)))
    print(f"sigma_for_mi   {per_call_us(sigma_for_mi, grid):8.1f} us/call  ({len(grid)} (q, beta) pairs)")
    sig = [(q, s) for q in (1e-3, 0.3) for s in (0.1, 0.5, 2.0, 50.0, 5e3)]
    print(f"binary_mi      {per_call_us(binary_mi, sig):8.1f} us/call  (scalar)")

    m = 128
    rng = np.random.default_rng(0)
    signs = np.where(rng.random((2000, m)) < rng.uniform(0.2, 0.8, size=(2000, 1)), 1, -1)
    signs[::3] = 1  # a third unanimous
    for name, mech in (("PacMI", PacMI(m, 1.0, 2000, seed=0)), ("PacZPL", PacZPL(m, seed=0))):
        t0 = time.perf_counter()
        for row in signs:
            mech.release(row)
        us = (time.perf_counter() - t0) / len(signs) * 1e6
        print(f"{name}.release {us:8.1f} us/call  (M={m}, 2/3 disagreement steps)")
    t0 = time.perf_counter()
    balanced_design(1000, 128, rng=0)
    print(f"balanced_design(1000, 128) {1e3 * (time.perf_counter() - t0):.1f} ms")


if __name__ == "__main__":
    main()
