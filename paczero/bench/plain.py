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


def _plain_child(cfg_dict: dict, threads: int, conn) -> None:
    """In a fresh process: load the plain model and the universe's micro-batches, then time one plain
    forward pass over them for each request on ``conn`` (the first is a warm-up like any other)."""
    import torch

    from paczero.models import load_model
    from paczero.run.build import fills_batches
    from paczero.tasks import build_task, load_splits

    torch.set_num_threads(threads)
    cfg = BenchConfig(**cfg_dict)
    lm = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device, track="ft", init_seed=cfg.seed,
                    random_init=cfg.random_init)
    model = lm.model.eval()
    task = build_task(cfg.task, lm.tokenizer, fill_batches=fills_batches(cfg.device, cfg.dtype),  # as the harness's
                      template=cfg.template, verbalizer=cfg.verbalizer, labels=cfg.labels)
    pool, _, _ = load_splits(cfg.task, cfg.data, n_train=None, n_dev=0, n_test=0, seed=cfg.seed,
                             columns=cfg.columns, labels=cfg.labels)
    universe = task.encode([pool[i % len(pool)] for i in range(cfg.n)])
    inputs = [{"input_ids": b.input_ids.to(cfg.device), "attention_mask": b.attention_mask.to(cfg.device)}
              for b in task.make_batches(universe, token_budget=cfg.token_budget)]
    conn.send({"plain_threads": torch.get_num_threads(), "plain_micro_batches": len(inputs)})
    while conn.recv() == "pass":
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            for batch in inputs:
                model(**batch)
        if str(cfg.device).startswith("cuda"):
            torch.cuda.synchronize()
        conn.send((time.perf_counter() - t0, time.process_time() - c0))


def floor_against_plain(cfg: BenchConfig, floor_pass, threads: int) -> dict:
    """``cfg.steps`` pairs of (``floor_pass()`` here, one plain forward pass in a fresh process with ``threads``
    intra-op threads), after a warm-up pair: the medians of both and of the per-pair ratios, in wall and in
    process CPU time (``floor_pass`` returns both), so that a change in the machine's load hits both sides."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_plain_child, args=(asdict(cfg), threads, there), daemon=True)
    child.start()
    def answer():  # the child's next message; an error, not a wait for ever, where the child has died
        while not here.poll(1.0):
            if not child.is_alive():
                raise RuntimeError(f"the plain forward's process ended (exit code {child.exitcode}): its error is "
                                   "above; --no-plain skips the plain forward")
        return here.recv()

    try:
        res = answer()
        pairs = []
        for i in range(cfg.steps + 1):
            floor = floor_pass()
            here.send("pass")
            plain = answer()
            if i:  # the first pair warms the plain model up
                pairs.append((floor, plain))
        here.send("stop")
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.terminate()
    med = statistics.median
    res.update(plain_s=med(p[0] for _, p in pairs), plain_cpu_s=med(p[1] for _, p in pairs),
               plain_floor_s=med(f[0] for f, _ in pairs),
               floor_vs_plain=med(f[0] / p[0] for f, p in pairs),
               floor_vs_plain_cpu=med(f[1] / p[1] for f, p in pairs),
               floor_vs_plain_pairs=[round(f[0] / p[0], 4) for f, p in pairs])
    return res
