"""The fused CUDA direction kernels (paczero/zo/cuda_directions.py) against torch's draw-then-combine, on one
weight: time per call and whether the bits agree.

    python benchmarks/kernels_cuda.py [--rows 2048 --cols 8192 --dtype bf16]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np
import torch

from paczero.zo import cuda_directions as cd
from paczero.zo import chunk_seeds, chunk_values


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--cols", type=int, default=8192)
    p.add_argument("--dtype", default="bf16")
    a = p.parse_args()
    import triton
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    dev = torch.device("cuda")
    theta = torch.randn(a.rows, a.cols, device=dev).to(dt)
    numel = theta.numel()
    per_chunk = max(1, chunk_values(dev) // a.cols)
    CH = per_chunk * a.cols
    n_chunks = -(-a.rows // per_chunk)
    seeds_np = chunk_seeds(12345, n_chunks)
    seeds = cd.seeds_tensor(seeds_np, dev)
    m = 1e-3
    res = {"triton": triton.__version__, "torch": torch.__version__, "shape": [a.rows, a.cols], "dtype": a.dtype}
    z = torch.empty(a.rows, a.cols, device=dev)
    zt = torch.empty_like(z)
    p1, p2 = torch.empty_like(theta), torch.empty_like(theta)
    gen = torch.Generator(device=dev)

    def torch_draw():
        for c in range(n_chunks):
            gen.manual_seed(int(seeds_np[c]))
            zt.view(-1)[c * CH:min((c + 1) * CH, numel)].normal_(generator=gen)

    def torch_pair():
        torch_draw()
        zt.mul_(m)
        torch.add(zt, theta, out=p1)
        torch.sub(theta, zt, out=p2)

    res["torch_draw_ms"] = timed(torch_draw)
    res["torch_pair_ms"] = timed(torch_pair)
    res["triton_draw_ms"] = timed(lambda: cd.chunks(seeds, CH, numel, 0, n_chunks, mode=cd.MODE_Z, out1=z))
    res["triton_pair_ms"] = timed(lambda: cd.chunks(seeds, CH, numel, 0, n_chunks, mode=cd.MODE_PAIR, out1=p1,
                                                    out2=p2, theta=theta, scale=m))
    th = theta.clone()
    one = torch.tensor([1e-9], device=dev)
    res["triton_update_ms"] = timed(lambda: cd.update(seeds.view(1, -1), one, CH, th, 1.0))
    res["torch_update_ms"] = timed(lambda: (torch_draw(), th.copy_((th.float() - zt * 1e-9).to(dt))))
    res["copy_ms"] = timed(lambda: p1.copy_(theta))
    tiny = torch.randn(2048, device=dev).to(dt)
    tp1, tp2 = torch.empty_like(tiny), torch.empty_like(tiny)
    res["triton_pair_2048_values_ms"] = timed(lambda: cd.chunks(seeds, 2048, 2048, 0, 1, mode=cd.MODE_PAIR, out1=tp1,
                                                               out2=tp2, theta=tiny, scale=m), reps=200)
    tz = torch.empty(2048, device=dev)

    def torch_tiny_pair():
        gen.manual_seed(int(seeds_np[0]))
        tz.normal_(generator=gen).mul_(m)
        torch.add(tz, tiny, out=tp1)
        torch.sub(tiny, tz, out=tp2)

    res["torch_pair_2048_values_ms"] = timed(torch_tiny_pair, reps=200)
    for name, fn in (("triton", lambda: cd.chunks(seeds, 2048, 2048, 0, 1, mode=cd.MODE_PAIR, out1=tp1, out2=tp2,
                                                  theta=tiny, scale=m)), ("torch", torch_tiny_pair)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        res[f"{name}_pair_host_us_per_call"] = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
    res["bytes_per_param"] = theta.element_size()
    # bits: every output against torch arithmetic on the kernel's own z
    cd.chunks(seeds, CH, numel, 0, n_chunks, mode=cd.MODE_Z, out1=z)
    cd.chunks(seeds, CH, numel, 0, n_chunks, mode=cd.MODE_PAIR, out1=p1, out2=p2, theta=theta, scale=m)
    t = z * m
    res["pair_plus_exact"] = bool(torch.equal(p1, torch.add(t, theta, out=torch.empty_like(theta))))
    res["pair_minus_exact"] = bool(torch.equal(p2, torch.sub(theta, t, out=torch.empty_like(theta))))
    q = torch.empty_like(theta)
    cd.chunks(seeds, CH, numel, 0, n_chunks, mode=cd.MODE_PERTURB, out1=q, theta=theta, scale=-m)
    res["perturb_exact"] = bool(torch.equal(q, p2))
    idx = torch.tensor([0, 5, a.rows - 1, 3, 5], device=dev)
    rz = cd.rows(seeds, per_chunk, a.cols, idx)
    res["rows_exact"] = bool(torch.equal(rz, z[idx]))
    th = theta.clone()
    seeds2 = cd.seeds_tensor(chunk_seeds(999, n_chunks), dev)
    z2 = torch.empty_like(z)
    cd.chunks(seeds2, CH, numel, 0, n_chunks, mode=cd.MODE_Z, out1=z2)
    cd.update(torch.stack([seeds, seeds2]), torch.tensor([0.5, -0.25], device=dev), CH, th, 0.99)
    ref = ((theta.float() * 0.99) - z * 0.5) - z2 * (-0.25)
    res["update_exact"] = bool(torch.equal(th, ref.to(dt)))
    # z against the float64 reference definition (first 4096 values of chunk 0)
    ref0 = cd.reference_values(int(seeds_np[0]), np.arange(4096))
    res["z_vs_reference_max_abs"] = float(np.abs(z.view(-1)[:4096].double().cpu().numpy() - ref0).max())
    zz = z.view(-1)
    res["z_mean"], res["z_std"] = float(zz.mean()), float(zz.std())
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
