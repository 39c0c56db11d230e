"""A pass over a universe on the CPU: micro-batches cut tight (``max_padding`` 0.1) against filled to the token
budget (``max_padding`` None), in one run.

    python benchmarks/cpu_batching.py --data agnews=PATH/agnews/train.jsonl:64 sst5=PATH/sst5/train.jsonl:128 \
        [--dtypes bf16 fp32] [--token-budget 2048] [--rounds 3] [--threads 2] [--json-out FILE]

Each ``NAME=FILE:N`` draws N rows of FILE (seed 0; rows ``{"text", "label"}``), builds the classification task
with the plain prompt ``"{sentence}\\nTopic:"`` and the file's label names as answer words (" World", " Sci/Tech":
the packed layout where a word is several tokens), and times one no-grad pass of the task's per-example losses
over all N rows of SmolLM2-135M-Instruct with LoRA, under each batching rule, the rules alternating within each
round (tight, filled, filled, tight, ...) so that a change in the machine's load hits both. Printed: micro-batches,
padded tokens, the median seconds a pass and the ratio tight / filled (the median of the rounds' ratios).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

RULES = {"tight": 0.1, "filled": None}


def _rows(path: str, n: int) -> list[dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    pick = np.random.default_rng(0).choice(len(rows), size=min(n, len(rows)), replace=False)
    return [rows[i] for i in pick]


def _pass(task, model, batches) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        for b in batches:
            task.losses(model, b)
    return time.perf_counter() - t0


def measure(name: str, path: str, n: int, dtype: str, budget: int, rounds: int, tok) -> dict:
    from paczero.models import load_model
    from paczero.tasks import build_task

    rows = _rows(path, n)
    names = sorted({str(r["label"]) for r in rows}, key=str)
    task = build_task("classification", tok, template="{sentence}\nTopic:",
                      verbalizer={i: f" {x}" for i, x in enumerate(names)}, labels=names)
    enc = task.encode([{"sentence": r["text"], "label": names.index(str(r["label"]))} for r in rows])
    model = load_model("smollm2-135m-instruct", dtype=dtype, track="lora", tokenizer=tok).model
    batches = {rule: task.make_batches(enc, token_budget=budget, max_padding=pad) for rule, pad in RULES.items()}
    for rule in RULES:  # warm-up: one pass each
        _pass(task, model, batches[rule])
    times = {rule: [] for rule in RULES}
    for r in range(rounds):
        order = list(RULES) if r % 2 == 0 else list(reversed(RULES))
        for rule in order:
            times[rule].append(_pass(task, model, batches[rule]))
    out = {"data": name, "n": len(rows), "dtype": dtype, "token_budget": budget, "layout": task.layout is not None}
    for rule in RULES:
        out[rule] = {"micro_batches": len(batches[rule]),
                     "padded_tokens": int(sum(b.input_ids.numel() for b in batches[rule])),
                     "pass_s": statistics.median(times[rule]), "rounds_s": times[rule]}
    out["ratio_tight_over_filled"] = statistics.median(a / b for a, b in zip(times["tight"], times["filled"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="NAME=FILE:N")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from paczero.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    results = []
    for spec in args.data:
        name, rest = spec.split("=", 1)
        path, n = rest.rsplit(":", 1)
        for dtype in args.dtypes:
            r = measure(name, path, int(n), dtype, args.token_budget, args.rounds, tok)
            results.append(r)
            t, f = r["tight"], r["filled"]
            print(f"{name} N={r['n']} {dtype}: tight {t['micro_batches']} batches {t['padded_tokens']} tokens "
                  f"{t['pass_s']:.3f}s | filled {f['micro_batches']} batches {f['padded_tokens']} tokens "
                  f"{f['pass_s']:.3f}s | tight/filled {r['ratio_tight_over_filled']:.2f}", flush=True)
    meta = {"cpu": _cpu(), "torch": torch.__version__, "threads": args.threads,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = [f for f in ("avx512_bf16", "amx_bf16", "avx2") if f in info]
    return f"{model} ({', '.join(flags)})"


if __name__ == "__main__":
    main()
