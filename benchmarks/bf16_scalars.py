"""bf16 against fp32 on CPU: the floor, the step, and the per-example two-point scalars g.

``python benchmarks/bf16_scalars.py DTYPE ADAPTERS [MU]`` (DTYPE fp32|bf16; ADAPTERS ``same`` keeps the
LoRA weights in DTYPE, ``fp32`` casts them to fp32) loads SmolLM2-135M-Instruct with LoRA, cycles the demo
sentences to N = 256, times one inference pass (floor) and one step's two perturbed passes (median of 3),
and saves g of 3 steps (float64, one tensor per step) to ``g_{DTYPE}_{ADAPTERS}_{MU}.pt`` in the current
folder; ``--compare REF OTHER...`` prints each file's per-step correlation with REF and the means of g.
The directions are the same in every run (public seed 0), so the scalars are comparable run to run.
"""
import statistics
import sys
import time

import torch


def measure(dtype: str, adapters: str, mu: float) -> None:
    from paczero.models import load_model, trainable_parameters
    from paczero.tasks import build_task, load_splits
    from paczero.zo import Perturber

    lm = load_model("smollm2-135m-instruct", dtype=dtype, track="lora")
    if adapters == "fp32":
        for name, p in lm.model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
    task = build_task("demo", lm.tokenizer)
    pool, _, _ = load_splits("demo", n_train=None, n_dev=0, n_test=0, seed=0)
    batches = task.make_batches(task.encode([pool[i % len(pool)] for i in range(256)]), token_budget=4096)
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
    steps = [step(s) for s in range(3)]
    print(f"{dtype} adapters={adapters} mu={mu}: floor {statistics.median(floors):.2f} s, "
          f"step {statistics.median(t for t, _ in steps):.2f} s")
    torch.save([g for _, g in steps], f"g_{dtype}_{adapters}_{mu}.pt")


def compare(ref: str, others: list[str]) -> None:
    r = torch.load(ref)
    for name in others:
        g = torch.load(name)
        rows = [f"corr {float(torch.corrcoef(torch.stack([r[s], g[s]]))[0, 1]):.3f} "
                f"mean {float(r[s].mean()):.3f}/{float(g[s].mean()):.3f}" for s in range(len(r))]
        print(name, "; ".join(rows))


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3:])
    else:
        measure(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3)
