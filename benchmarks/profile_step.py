"""Where one zeroth-order step's time goes: wall time against device busy time, the top kernels, the top
Python functions.

    python benchmarks/profile_step.py --model ARCH --random-init --device cuda --dtype bf16 --track ft \
        --n 1000 [--lockstep L] [--out DIR]

One warm-up step, then one step under ``torch.profiler`` (kernel times) and one under ``cProfile``
(Python time, including waits for the device). On a GPU, a step whose wall time is well above the sum
of its kernel times is bound by the host (launches and Python), not by the device.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> int:
    from paczero.bench import BenchConfig, Harness

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-opt")
    p.add_argument("--track", default="ft")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--lockstep", type=int, default=1)
    p.add_argument("--random-init", action="store_true")
    p.add_argument("--out", default=None, help="directory for profile.json and the traces")
    a = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    cfg = BenchConfig(model=a.model, track=a.track, n=a.n, dtype=a.dtype, device=a.device, lockstep=a.lockstep,
                      random_init=a.random_init, memory=False, scaling=False)
    h = Harness(cfg)
    one_step = h.runner(cfg.num_subsets)
    h.floor_pass()
    one_step(0)
    floor = h.floor_pass()
    plain = one_step(1)
    res = {"config": vars(a), "floor_s": floor, "step_s": plain["step_s"], "ratio": plain["step_s"] / (2 * floor)}
    cuda = a.device.startswith("cuda")
    if cuda:  # device activity only (host-side recording would slow the host it measures)
        from torch.autograd import DeviceType
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            one_step(2)
            res["profiled_step_s"] = time.perf_counter() - t0
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        spans = sorted((e.time_range.start, e.time_range.end, e.name[:60]) for e in kernels)
        busy, end, gaps, prev = 0.0, None, [], ""
        for lo, hi, name in spans:  # the union of kernel intervals: time the device computed anything
            if end is None or lo > end:
                if end is not None:
                    gaps.append((lo - end, prev, name))
                busy, end = busy + hi - lo, hi
            elif hi > end:
                busy, end = busy + hi - end, hi
            prev = name
        gaps.sort(reverse=True)
        # where the device waited on the host: idle gaps between kernels (largest first, and their sum by size)
        res["idle_gaps_us_top"] = [[round(x, 1), a, b] for x, a, b in gaps[:20]]
        res["idle_by_size_s"] = {f">= {lim} us": round(sum(x for x, _, _ in gaps if x >= lim) / 1e6, 4)
                                 for lim in (10, 100, 1000, 10000)}
        res["device_busy_s"] = busy / 1e6
        res["device_span_s"] = (spans[-1][1] - spans[0][0]) / 1e6 if spans else 0.0
        totals: dict = {}
        for e in kernels:
            n, t = totals.get(e.name[:90], (0, 0.0))
            totals[e.name[:90]] = (n + 1, t + (e.time_range.end - e.time_range.start) / 1e3)
        res["top_kernels_ms"] = sorted(([k, n, round(t, 3)] for k, (n, t) in totals.items()), key=lambda r: -r[2])[:25]
        res["launches"] = len(kernels)
    pr = cProfile.Profile()
    pr.enable()
    t0 = time.perf_counter()
    one_step(3)
    res["cprofiled_step_s"] = time.perf_counter() - t0
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    res["python_tottime"] = s.getvalue()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(40)
    res["python_cumtime"] = s.getvalue()
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("python_")}, indent=1))
    print(res["python_tottime"])
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "profile.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
