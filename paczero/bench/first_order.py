"""``paczero bench --mechanism dp-sgd``: a DP-SGD step against the zeroth-order step, on the same rows.

For one model, track, N, dtype and device, in one process: the zeroth-order step (PAC-ZPL's loop body, two
forwards of each of the N examples) and the DP-SGD step (:func:`paczero.fo.dpsgd_step.dpsgd_step` at sample
rate 1, so that its batch is the same N rows: a forward and a backward of each, Opacus's per-example
clipping, the noise, one AdamW step), alternating, each timed on the wall clock and in process CPU time
after one warm-up; ``ratio`` is the median of the per-pair ratios (DP-SGD over zeroth-order). With memory
(the default), each step's peak in its own fresh process (:mod:`paczero.bench.memory`: RSS high-water on
CPU, ``max_memory_allocated`` on CUDA), the phases alternating. ``mfu`` is the zeroth-order step's model
FLOPs utilisation and ``dpsgd_mfu`` the DP-SGD step's (:mod:`paczero.bench.mfu`, which says what each counts).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, replace

from paczero.bench.harness import BenchConfig, Harness, dpsgd_runner
from paczero.bench.mfu import first_order_flops, mfu_figures, mfu_line, utilisation

def zeroth_order_config(cfg: BenchConfig) -> BenchConfig:
    """The harness's configuration: its step is PAC-ZPL's."""
    return replace(cfg, mechanism="pac-zpl")


def measure_first_order(cfg: BenchConfig, log=print) -> dict:
    """The figures of the module docstring, as a JSON-able dict."""
    import torch

    from paczero.models import trainable_parameters

    h = Harness(zeroth_order_config(cfg))
    res: dict = {"config": {**asdict(cfg), "mechanism": "dp-sgd"}, "torch_threads": torch.get_num_threads(),
                 "trainable_params": sum(p.numel() for _, p in trainable_parameters(h.model, cfg.track)),
                 "rows": cfg.n}
    zo, fo = h.runner(cfg.num_subsets), dpsgd_runner(h)
    log(f"bench: dp-sgd against the zeroth-order step, {cfg.model} {cfg.track} {cfg.dtype} on {cfg.device}, "
        f"N={cfg.n} rows each, {torch.get_num_threads()} threads")
    zo(0), fo(0)  # warm-ups
    pairs = [(zo(i + 1), fo(i + 1)) for i in range(cfg.steps)]
    res["zo_step_s"] = statistics.median(z["step_s"] for z, _ in pairs)
    res["dpsgd_step_s"] = statistics.median(f["step_s"] for _, f in pairs)
    res["ratio"] = statistics.median(f["step_s"] / z["step_s"] for z, f in pairs)
    res["cpu_ratio"] = statistics.median(f["step_cpu_s"] / z["step_cpu_s"] for z, f in pairs)
    log(f"  zeroth-order step {res['zo_step_s']:.3f}s  dp-sgd step {res['dpsgd_step_s']:.3f}s  "
        f"ratio {res['ratio']:.2f}  cpu ratio {res['cpu_ratio']:.2f}")
    res.update(mfu_figures(h, res["zo_step_s"]))  # mfu: the zeroth-order step's
    dpsgd = utilisation(first_order_flops(res["forward_flops"], cfg.track), res["dpsgd_step_s"], res)
    res.update(dpsgd_flops=first_order_flops(res["forward_flops"], cfg.track), dpsgd_tflops=dpsgd["tflops"],
               dpsgd_mfu=dpsgd["mfu"], dpsgd_mfu_shape=dpsgd["mfu_shape"])
    log(mfu_line(res) + f"; dp-sgd step {res['dpsgd_mfu']:.1%} (forward and backward)")
    del h, zo, fo
    if cfg.memory:
        from paczero.bench.memory import memory_phase

        peaks: dict[str, list[int]] = {"train": [], "dp-sgd": []}
        for _ in range(max(1, cfg.memory_repeats)):
            for phase in peaks:
                peaks[phase].append(memory_phase(zeroth_order_config(cfg), phase)["peak_bytes"])
        res["zo_peak_bytes"] = int(statistics.median(peaks["train"]))
        res["dpsgd_peak_bytes"] = int(statistics.median(peaks["dp-sgd"]))
        res["memory_ratio"] = res["dpsgd_peak_bytes"] / res["zo_peak_bytes"]
        log(f"  peak memory: zeroth-order {res['zo_peak_bytes'] / 2**20:.0f} MiB, dp-sgd "
            f"{res['dpsgd_peak_bytes'] / 2**20:.0f} MiB ({res['memory_ratio']:.2f}x)")
    return res


def first_order_table(results: list[dict]) -> str:
    """One row per configuration: seconds and peak memory per step, DP-SGD beside the zeroth-order step."""
    head = ("model", "track", "dtype", "rows", "ZO step s", "DP-SGD step s", "ratio", "cpu ratio", "ZO MFU",
            "DP-SGD MFU", "ZO peak MiB", "DP-SGD peak MiB", "memory ratio")
    rows = []
    for r in results:
        c = r["config"]
        mem = "zo_peak_bytes" in r
        rows.append((c["model"], c["track"], c["dtype"], str(r["rows"]), f"{r['zo_step_s']:.3f}",
                     f"{r['dpsgd_step_s']:.3f}", f"{r['ratio']:.2f}", f"{r['cpu_ratio']:.2f}", f"{r['mfu']:.1%}",
                     f"{r['dpsgd_mfu']:.1%}",
                     f"{r['zo_peak_bytes'] / 2**20:.0f}" if mem else "-",
                     f"{r['dpsgd_peak_bytes'] / 2**20:.0f}" if mem else "-",
                     f"{r['memory_ratio']:.2f}" if mem else "-"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
