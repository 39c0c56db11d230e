"""The floor against a plain transformers forward: the same rows, ``model(**batch)``, in a fresh process.

The benchmark's floor (:meth:`Harness.floor_pass`) is paczero's own inference pass: the task's per-sample
losses through the model as paczero prepares it (LoRA adapters, their hooks). Its reference here is what a
transformers user runs: the model loaded without adapters, called as ``model(input_ids=..., attention_mask=...)``
on the same micro-batches, under ``torch.inference_mode``, with the same dtype, device and threads, in a
process of its own (nothing paczero set up in the benchmark's process reaches it).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict

from paczero.bench.harness import BenchConfig


def _plain_child(cfg_dict: dict, threads: int) -> dict:
    """In a fresh process: ``cfg.steps`` timed plain forwards over the universe (after one warm-up)."""
    import torch

    from paczero.models import load_model
    from paczero.tasks import build_task, load_splits

    torch.set_num_threads(threads)
    cfg = BenchConfig(**cfg_dict)
    lm = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device, track="ft", init_seed=cfg.seed,
                    random_init=cfg.random_init)
    model = lm.model.eval()
    task = build_task(cfg.task, lm.tokenizer)
    pool, _, _ = load_splits(cfg.task, n_train=None, n_dev=0, n_test=0, seed=cfg.seed)
    universe = task.encode([pool[i % len(pool)] for i in range(cfg.n)])
    inputs = [{"input_ids": b.input_ids.to(cfg.device), "attention_mask": b.attention_mask.to(cfg.device)}
              for b in task.make_batches(universe, token_budget=cfg.token_budget)]

    def one_pass() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            for batch in inputs:
                model(**batch)
        if str(cfg.device).startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, time.process_time() - c0

    one_pass()  # warm-up
    passes = [one_pass() for _ in range(cfg.steps)]
    return {"plain_s": statistics.median(w for w, _ in passes), "plain_cpu_s": statistics.median(c for _, c in passes),
            "plain_threads": torch.get_num_threads(), "plain_micro_batches": len(inputs)}


def plain_forward(cfg: BenchConfig, threads: int) -> dict:
    """:func:`_plain_child` in a fresh (spawned) process with ``threads`` intra-op threads."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(_plain_child, asdict(cfg), threads).result()
