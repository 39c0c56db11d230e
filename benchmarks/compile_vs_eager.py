"""torch.compile against eager for the floor and the cached (LoRA) step, alternating in one process.

    python benchmarks/compile_vs_eager.py --model tiny-opt --n 1000 --rounds 7
    python benchmarks/compile_vs_eager.py --model ARCH/opt-1.3b --random-init --device cuda --dtype bf16

The model body is compiled in place (``paczero.models.compile_body``) and switched on and off
between rounds through its compiled call; each round times an eager floor and step, then a
compiled floor and step. Prints each round and the medians. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for `benchmarks`

from paczero.bench import BenchConfig, Harness  # noqa: E402
from paczero.models import compile_body  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-opt")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--random-init", action="store_true", help="the folder's architecture with random weights")
    a = p.parse_args()
    cfg = BenchConfig(model=a.model, track="lora", n=a.n, steps=1, threads=a.threads or None, device=a.device,
                      dtype=a.dtype, random_init=a.random_init)
    h = Harness(cfg)
    run = h.runner(cfg.num_subsets)
    t = time.perf_counter()
    h.floor_pass()
    run(0)
    print(f"eager warm-up {time.perf_counter() - t:.1f}s", flush=True)
    body = compile_body(h.model)
    compiled = body._compiled_call_impl
    t = time.perf_counter()
    h.floor_pass()
    run(1)
    print(f"compiling (first compiled floor and step) {time.perf_counter() - t:.1f}s", flush=True)
    rows = []
    for i in range(a.rounds):
        body._compiled_call_impl = None
        fe, se = h.floor_pass(), run(2 + 2 * i)["step_s"]
        body._compiled_call_impl = compiled
        fc, sc = h.floor_pass(), run(3 + 2 * i)["step_s"]
        rows.append((fe, se, fc, sc))
        print(f"eager floor {fe:.3f} step {se:.3f} | compiled floor {fc:.3f} step {sc:.3f}", flush=True)
    fe, se, fc, sc = (statistics.median(r[j] for r in rows) for j in range(4))
    print(f"median: floor compiled/eager {fc / fe:.3f}; step compiled/eager {sc / se:.3f}; "
          f"step / (2 x floor) eager {se / (2 * fe):.3f}, compiled {sc / (2 * fc):.3f}")


if __name__ == "__main__":
    main()
