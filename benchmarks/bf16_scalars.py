"""bf16 against fp32 on CPU: the floor, the step, and the per-example two-point scalars g.

    python -m benchmarks.bf16_scalars DTYPE ADAPTERS [MU] [--model M] [--n N] [--steps S] [--out-dir DIR]
    python -m benchmarks.bf16_scalars --compare REF.json OTHER.json...

DTYPE is fp32|bf16; ADAPTERS ``same`` keeps the LoRA weights in DTYPE, ``fp32`` casts them to fp32. The
first form loads the model (default SmolLM2-135M-Instruct) with LoRA, cycles the demo sentences to N
(default 256), times one inference pass (floor) and one step's two perturbed passes (medians of 3 and of
S = 3 steps), and writes g of each step (float64, one list per step) with the timings and the settings to
``DIR/g_{DTYPE}_{ADAPTERS}_{MU}.json``. ``--compare`` prints each file's per-step correlation with REF's g and
the means of both. The directions are the same in every run (public seed 0), so the scalars are comparable
run to run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def measure(dtype: str, adapters: str, mu: float, model: str = "smollm2-135m-instruct", n: int = 256,
            steps: int = 3, out_dir: str = ".") -> str:
    """Time the floor and the step, write g of ``steps`` steps; the path written."""
    import torch

    from paczero.models import load_model, trainable_parameters
    from paczero.tasks import build_task, load_splits
    from paczero.zo import Perturber

    path = os.path.join(out_dir, f"g_{dtype}_{adapters}_{mu}.json")
    if os.path.exists(path):
        raise SystemExit(f"bf16_scalars: {path} exists; give another --out-dir")
    lm = load_model(model, dtype=dtype, track="lora")
    if adapters == "fp32":
        for name, p in lm.model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
    task = build_task("demo", lm.tokenizer)
    pool, _, _ = load_splits("demo", n_train=None, n_dev=0, n_test=0, seed=0)
    batches = task.make_batches(task.encode([pool[i % len(pool)] for i in range(n)]), token_budget=4096)
    perturber = Perturber(lm.model, trainable_parameters(lm.model, "lora"), 0)

    def floor() -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            [task.losses(lm.model, b) for b in batches]
        return time.perf_counter() - t

    def step(s: int):
        t = time.perf_counter()
        with torch.inference_mode():
            with perturber.perturbed(s, 0, mu):
                plus = [task.losses(lm.model, b) for b in batches]
            with perturber.perturbed(s, 0, -mu):
                minus = [task.losses(lm.model, b) for b in batches]
        g = torch.cat([(a.double() - b.double()) / (2 * mu) for a, b in zip(plus, minus)])
        return time.perf_counter() - t, g

    floor()
    floors = [floor() for _ in range(3)]
    timed = [step(s) for s in range(steps)]
    res = {"config": {"model": model, "track": "lora", "dtype": dtype, "adapters": adapters, "mu": mu, "n": n,
                      "steps": steps, "public_seed": 0, "torch_threads": torch.get_num_threads()},
           "floor_s": statistics.median(floors), "step_s": statistics.median(t for t, _ in timed),
           "g": [g.tolist() for _, g in timed]}
    print(f"{dtype} adapters={adapters} mu={mu}: floor {res['floor_s']:.2f} s, step {res['step_s']:.2f} s")
    with open(path, "x") as f:
        json.dump(res, f)
    return path


def _corr(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return cov / (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5


def compare(ref: str, others: list[str]) -> list[str]:
    """One line per file of ``others``: per step, the correlation of its g with REF's, and both means."""
    with open(ref) as f:
        r = json.load(f)["g"]
    lines = []
    for name in others:
        with open(name) as f:
            g = json.load(f)["g"]
        rows = [f"corr {_corr(r[s], g[s]):.3f} mean {statistics.fmean(r[s]):.3f}/{statistics.fmean(g[s]):.3f}"
                for s in range(min(len(r), len(g)))]
        lines.append(f"{os.path.basename(name)} {'; '.join(rows)}")
        print(lines[-1])
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bf16_scalars", description=__doc__.splitlines()[0])
    ap.add_argument("dtype", nargs="?", choices=["fp32", "bf16"])
    ap.add_argument("adapters", nargs="?", choices=["same", "fp32"])
    ap.add_argument("mu", nargs="?", type=float, default=1e-3)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=256, help="the demo sentences cycled to N")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--compare", nargs="+", metavar="FILE", help="REF.json OTHER.json...")
    a = ap.parse_args(argv)
    if a.compare:
        if a.dtype or len(a.compare) < 2:
            ap.error("--compare takes REF.json and at least one other file, and no DTYPE")
        compare(a.compare[0], a.compare[1:])
        return 0
    if not (a.dtype and a.adapters):
        ap.error("give DTYPE and ADAPTERS (or --compare)")
    if a.n < 1 or a.steps < 1:
        ap.error("--n and --steps must be >= 1")
    measure(a.dtype, a.adapters, a.mu, a.model, a.n, a.steps, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
