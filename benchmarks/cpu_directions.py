"""The CPU direction kernel (paczero/cpu_directions.py) against torch's generator, in one process.

    python benchmarks/cpu_directions.py [--values 3278464] [--repeats 21] [--json-out FILE]

Per value of z, single-threaded: torch's ``normal_`` chunk by chunk (2^14 values, each chunk seeded, as
the fallback draws them) and the compiled kernel over the same chunks (``cpu_directions.chunks``); then a
whole tiny-opt-sized direction split over two threads, as ``Perturber._draw_all`` does it. Rounds of the
two alternate, and the medians and their ratio are reported: a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> int:
    import numpy as np
    import torch

    from paczero import cpu_directions as cpu
    from paczero.zo import chunk_seeds

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--values", type=int, default=3_278_464, help="values of z (default: tiny-opt's d)")
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--json-out", default=None)
    a = p.parse_args()
    if cpu.library() is None:
        print("the kernel could not be built here", file=sys.stderr)
        return 1
    chunk = 1 << 14
    n_chunks = -(-a.values // chunk)
    seeds = chunk_seeds(12345, n_chunks)
    z = torch.empty(a.values)
    local = threading.local()  # one generator per thread, as paczero's worker pool keeps them

    def torch_draw(lo: int = 0, hi: int = n_chunks) -> None:
        gen = getattr(local, "gen", None) or setattr(local, "gen", torch.Generator()) or local.gen
        for c in range(lo, hi):
            gen.manual_seed(int(seeds[c]))
            z[c * chunk:(c + 1) * chunk].normal_(generator=gen)

    def kernel_draw(lo: int = 0, hi: int = n_chunks) -> None:
        cpu.chunks(seeds, lo, hi, chunk, z[lo * chunk:min(hi * chunk, a.values)])

    def two_threads(fn):
        def run() -> None:
            half = n_chunks // 2
            t = threading.Thread(target=fn, args=(half, n_chunks))
            t.start()
            fn(0, half)
            t.join()
        return run

    fns = {"torch, 1 thread": torch_draw, "kernel, 1 thread": kernel_draw,
           "torch, 2 threads": two_threads(torch_draw), "kernel, 2 threads": two_threads(kernel_draw)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm-up (pages, the library)
    for _ in range(a.repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"values": a.values, "repeats": a.repeats, "torch_threads": torch.get_num_threads(),
           "ns_per_value": {k: v / a.values * 1e9 for k, v in med.items()},
           "kernel_speedup_1_thread": med["torch, 1 thread"] / med["kernel, 1 thread"],
           "kernel_speedup_2_threads": med["torch, 2 threads"] / med["kernel, 2 threads"]}
    for k, v in out["ns_per_value"].items():
        print(f"{k:18s} {v:6.2f} ns per value  ({med[k] * 1e3:.2f} ms for {a.values} values)")
    print(f"kernel / torch: {out['kernel_speedup_1_thread']:.2f}x faster on 1 thread, "
          f"{out['kernel_speedup_2_threads']:.2f}x on 2")
    assert np.isfinite(z.numpy()).all()
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
