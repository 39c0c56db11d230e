"""``paczero bench --against-two-classes``: a step over every class of a file against the same file's
two-class step.

For one model, track, N, dtype and device, in one process: the zeroth-order step (PAC-ZPL's loop body) on
the task as given (``--task classification --data FILE --labels ... --verbalizer ...``: say six classes of
two-token answer words) and on the same N rows scored over two classes only (the first two answer words,
each row's label taken modulo 2, so the prompts, their lengths and the micro-batches are the same and only
the number of options differs), alternating, each timed on the wall clock and in process CPU time after one
warm-up; ``ratio`` is the median of the per-pair ratios (all classes over two; goal <= 1.3: a step's cost
should not grow with the number of classes), ``cpu_ratio`` the same in process CPU time.
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import asdict, replace

from paczero.bench.harness import BenchConfig, Harness


def two_class_harness(h: Harness) -> Harness:
    """``h`` with its task scoring the first two answer words only and every row's label taken modulo 2 (the
    same model, perturber and prompts)."""
    from paczero.tasks import build_task

    two = copy.copy(h)
    words = {k: h.task.verbalizer[k] for k in h.task.labels[:2]}
    two.task = build_task(h.cfg.task, h.lm.tokenizer, template=h.task.template, max_length=h.task.max_length,
                          verbalizer={i: w for i, w in enumerate(words.values())}, fill_batches=h.task.fill_batches)
    two.data = {}
    for n, (universe, _) in h.data.items():
        enc = [replace(e, label=e.label % 2) for e in universe]
        two.data[n] = enc, two.task.make_batches(enc, token_budget=h.cfg.token_budget)
    two.universe, two.batches = two.data[h.cfg.n]
    two.floor_batches = two.batches
    return two


def measure_two_classes(cfg: BenchConfig, log=print) -> dict:
    """The figures of the module docstring, as a JSON-able dict."""
    import torch

    h = Harness(cfg)
    if h.task.num_classes < 3:
        raise ValueError(f"--against-two-classes needs a task of three classes or more, got {h.task.num_classes}")
    h.get_perturber()
    two = two_class_harness(h)
    words = [len(ids) for ids in h.task.option_ids]
    res: dict = {"config": asdict(cfg), "torch_threads": torch.get_num_threads(), "classes": h.task.num_classes,
                 "answer_tokens": words, "rows": cfg.n,
                 "model_rows": sum(b.input_ids.shape[0] for b in h.batches),
                 "two_class_model_rows": sum(b.input_ids.shape[0] for b in two.batches)}
    log(f"bench: {h.task.num_classes} classes (answer words of {words} tokens) against 2, {cfg.model} {cfg.track} "
        f"{cfg.dtype} on {cfg.device}, N={cfg.n} rows ({res['model_rows']} model rows; "
        f"{res['two_class_model_rows']} for two classes), M={cfg.num_subsets}, {torch.get_num_threads()} threads")
    every, pair = h.runner(cfg.num_subsets), two.runner(cfg.num_subsets)
    every(0), pair(0)  # warm-ups
    rounds = [(every(i + 1), pair(i + 1)) for i in range(cfg.steps)]
    res["step_s"] = statistics.median(a["step_s"] for a, _ in rounds)
    res["two_class_step_s"] = statistics.median(b["step_s"] for _, b in rounds)
    res["ratio"] = statistics.median(a["step_s"] / b["step_s"] for a, b in rounds)
    res["ratios"] = [round(a["step_s"] / b["step_s"], 4) for a, b in rounds]
    res["cpu_ratio"] = statistics.median(a["step_cpu_s"] / b["step_cpu_s"] for a, b in rounds)
    log(f"  {res['classes']} classes {res['step_s']:.3f}s  2 classes {res['two_class_step_s']:.3f}s  "
        f"ratio {res['ratio']:.3f} (pairs {', '.join(f'{x:.3f}' for x in res['ratios'])})  cpu ratio "
        f"{res['cpu_ratio']:.3f}  (goal <= 1.3)")
    return res


def classes_table(results: list[dict]) -> str:
    """One row per configuration: the step over every class against the two-class step on the same rows."""
    head = ("model", "track", "dtype", "N", "M", "classes", "answer tokens", "step s", "2-class step s", "ratio",
            "cpu ratio")
    rows = []
    for r in results:
        c = r["config"]
        rows.append((c["model"], c["track"], c["dtype"], str(c["n"]), str(c["num_subsets"]), str(r["classes"]),
                     ",".join(map(str, r["answer_tokens"])), f"{r['step_s']:.3f}", f"{r['two_class_step_s']:.3f}",
                     f"{r['ratio']:.3f}", f"{r['cpu_ratio']:.3f}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
