"""Speed and memory of a zeroth-order step against the inference floor, measured in one run.

The physical floor of a PACZero step is two inference passes over the N
examples of the universe. This benchmark (``paczero bench``) measures, for one model,
task, track, N, dtype and device, in the same process:

(a) ``floor_s``: one inference pass computing the per-sample losses of all N
    examples at theta (``task.losses``, no perturbation) over the inference
    micro-batches (the task's default, padding capped at 10 %), whatever
    batching the step itself uses; median of ``steps`` passes after a warm-up;
(b) ``step_s``: the median time of the real loop body (mechanism subsample,
    two-point scalars, stability clip, ``mechanism.step``, ``apply_update``);
(c) ``ratio = step_s / (2 * floor_s)`` (goal: <= 1.15), the median of the
    ratios of interleaved (floor pass, step) pairs; ``cpu_ratio`` the same in
    process CPU time, the steadier figure on a shared machine (use
    ``--threads 1`` there: idle OpenMP threads spin);
(d) peak memory of a training phase and of an inference phase: on CPU each
    phase runs in its own fresh process and reports its resident high-water
    mark (``VmHWM``, reset after set-up through ``/proc/self/clear_refs`` so
    that model loading does not count); on CUDA ``max_memory_allocated``;
    with ``--memory-repeats K`` each phase runs in K fresh processes, the phases
    alternating, and the medians are compared (a resident peak of the same
    code scatters by tens of MiB between processes on glibc); with
    ``--live-memory``, on CPU also the peak of *live tensor bytes* of each
    phase (the weights and buffers, plus the highest running sum of the
    allocations and frees that torch's profiler records on the calling
    thread), in further fresh processes: the analogue of CUDA's
    ``max_memory_allocated``, which leaves out what the C allocator keeps;
(e) ``privacy_s``: the time of ``mechanism.step`` (subset signs, calibration);
(f) ``floor_vs_plain``: the floor over a plain transformers forward of the same rows
    (``model(**batch)`` under ``torch.inference_mode``, the same dtype, device and threads)
    timed in a fresh process (:mod:`paczero.bench.plain`; goal: <= 1.1), the median of the
    ratios of interleaved (floor pass, plain pass) pairs, and ``floor_vs_plain_cpu`` the same
    in process CPU time; ``--no-plain`` skips it;
(g) ``n_scaling`` and ``m_scaling``: step time at 2N (goal: x2) and at 2M
    (goal: x1) over the step time at N, as medians of the ratios within
    interleaved rounds (N, 2N, 2M steps in turn). These rounds are timed on
    the clock named by ``scaling_clock`` (process CPU time on CPU, wall time
    on accelerators), and ``scaling_base_s``, ``step_2n_s`` and ``step_2m_s``
    are their medians on that clock: they are not comparable with ``step_s``
    (wall time, measured in the earlier rounds against the floor).
(h) ``mfu``: the step's useful model FLOPs per second over the matmul rate measured in the same process
    on the same device, dtype and threads at 2048³ (``matmul_tflops_2048``); ``mfu_shape`` the same over
    the rate at the model's own shape (``matmul_shape``, ``matmul_tflops_shape``); ``floor_mfu`` the
    floor's. What is counted: :mod:`paczero.bench.mfu`, and ``flops_counted`` in each row.
    ``load_average``: the machine's 1-minute load before and after these timings; where it exceeds the
    cores, one line says so (:mod:`paczero.machine.busy`): the timings include other processes' work.
(i) with ``--account``, ``account``: where one floor pass's time goes, from forward hooks on every module
    (exclusive times summed into categories: base linears and their TFLOP/s, LoRA adapters, attention core,
    norms, MLP activation, embedding, layer glue, LM head, outside the model), beside the same pass
    un-hooked (:mod:`paczero.bench.account`).
(j) with ``--host``, ``host``: for PAC-ZPL, MeZO, DP-SGD and AdamW, the step's wall time split into the time
    inside the model's forwards and backwards (``model_s``) and the rest (``host_s``: z draws, perturbation,
    update, loops, release, optimizer), medians in seconds (:mod:`paczero.bench.host`).

Optionally (``--world 2``) the step time of a data-parallel run with that many
gloo/nccl processes on the same machine, and the speedup over one process.
``--mechanism dp-sgd`` times a DP-SGD step against the zeroth-order step instead
(:mod:`paczero.bench.first_order`).

These are benchmarks, not tests: timings on a shared machine are noisy, which
is why every figure of merit is a ratio measured within one run.

The universe is the task's examples cycled to N (the demo set has 400), so N
can grow past the data set without changing the length distribution.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, replace

from paczero.bench.account import account_line, account_table, floor_account
from paczero.bench.harness import BenchConfig, Harness, _median
from paczero.bench.memory import _memory_child, live_peak_bytes, memory_phase
from paczero.bench.mfu import mfu_figures, mfu_line
from paczero.bench.plain import floor_against_plain
from paczero.bench.ranks import dp_step_time
from paczero.flags import TEMPLATE_HELP, items_of, parse_mapping, parse_template, parse_verbalizer

__all__ = ["BenchConfig", "Harness", "measure", "memory_phase", "live_peak_bytes", "_memory_child", "dp_step_time",
           "floor_against_plain", "floor_account", "account_table", "table", "add_arguments", "run", "main"]


def measure(cfg: BenchConfig, log=print) -> dict:
    """All the figures of the module docstring, as a JSON-able dict."""
    import torch

    from paczero.machine.busy import BusyWatch, load_average
    from paczero.machine.hardware import allowed_cores
    from paczero.models import trainable_parameters
    from paczero.tasks.batching import model_device

    if cfg.two_classes:  # every class against two on the same rows (paczero/bench/classes.py)
        from paczero.bench.classes import measure_two_classes

        return measure_two_classes(cfg, log)
    if cfg.mechanism == "dp-sgd":  # the first-order step beside the zeroth-order one (paczero/bench/first_order.py)
        from paczero.bench.first_order import measure_first_order

        return measure_first_order(cfg, log)
    t = time.perf_counter()
    h = Harness(cfg)
    res: dict = {"config": asdict(cfg), "torch_threads": torch.get_num_threads(), "load_average": [load_average()]}
    res["trainable_params"] = sum(p.numel() for _, p in trainable_parameters(h.model, cfg.track))
    res["micro_batches"] = len(h.batches)
    res["tokens"] = sum(int(b.attention_mask.sum()) for b in h.batches)
    res["padded_tokens"] = sum(b.num_tokens for b in h.batches)
    res["floor_micro_batches"] = len(h.floor_batches)
    res["floor_padded_tokens"] = sum(b.num_tokens for b in h.floor_batches)
    res["directions"] = h.get_perturber().directions
    log(f"bench: {cfg.model} {cfg.track} {cfg.dtype} on {model_device(h.model)}, N={cfg.n}, M={cfg.num_subsets}, "
        f"{len(h.batches)} micro-batches ({len(h.floor_batches)} for the floor), {torch.get_num_threads()} threads "
        f"(set-up {time.perf_counter() - t:.1f}s); z from {res['directions']}")
    one_step = h.runner(cfg.num_subsets)
    res.update(_step_against_floor(cfg, h, one_step, log))
    res.update(mfu_figures(h, res["step_s"], res["floor_s"]))  # the matmul rates measured here, now
    log(mfu_line(res))
    if cfg.account:  # where one floor pass's time goes (paczero/bench/account.py)
        res["account"] = floor_account(h)
        log(account_line(res["account"]))
    if cfg.host:  # each method's step, split into the model's time and the host's (paczero/bench/host.py)
        from paczero.bench.host import measure_host

        res["host"] = measure_host(h, cfg.steps, log=log)
    res["load_average"].append(load_average())  # the machine's, before and after the timings above
    BusyWatch(allowed_cores()).check(res["torch_threads"])  # one line where other work shared the cores
    if cfg.scaling:
        res.update(_scaling(cfg, h, one_step, log))
    if cfg.plain:
        # the floor against a plain transformers forward of the same rows in a fresh process, interleaved
        res.update(floor_against_plain(cfg, lambda: (h.floor_pass(), h.last_cpu_s), res["torch_threads"]))
        log(f"  plain transformers forward {res['plain_s']:.4f}s: floor/plain {res['floor_vs_plain']:.3f} "
            f"(pairs {', '.join(f'{x:.3f}' for x in res['floor_vs_plain_pairs'])})  cpu "
            f"{res['floor_vs_plain_cpu']:.3f}  (goal <= 1.1)")
    del h, one_step
    gc.collect()
    if cfg.memory:
        res.update(_memory(cfg, log))
    if cfg.world > 1:
        # both sides spawned the same way: world 1 with all the threads, world W with threads / W each
        res["dp"] = dp_step_time(cfg, cfg.world)
        res["dp"]["single"] = dp_step_time(cfg, 1)
        res["dp"]["speedup"] = res["dp"]["single"]["step_s"] / res["dp"]["step_s"]
        log(f"  data parallel x{cfg.world}: step {res['dp']['step_s']:.4f}s, speedup {res['dp']['speedup']:.2f}")
    return res


def _step_against_floor(cfg: BenchConfig, h: Harness, one_step, log) -> dict:
    """The step against twice the floor. Floor passes and steps alternate, and the ratio is the median of the
    per-pair ratios, so that a change in the machine's load hits both sides of a ratio alike."""
    warm_floor = h.floor_pass(), h.last_cpu_s  # with --compile: the floor's compilation
    warm_step = one_step(0)  # warm-up (with --compile: the step's compilation)
    floors, floors_cpu, steps = [], [], []
    for i in range(cfg.steps):
        floors.append(h.floor_pass())
        floors_cpu.append(h.last_cpu_s)
        steps.append(one_step(i + 1))
    res: dict = {"floor_s": statistics.median(floors)}
    for key in ("step_s", "scalars_s", "privacy_s", "update_s"):
        res[key] = _median(steps, key)
    res["ratio"] = statistics.median(s["step_s"] / (2 * f) for s, f in zip(steps, floors))
    res["ratios"] = [round(s["step_s"] / (2 * f), 4) for s, f in zip(steps, floors)]
    res["floor_cpu_s"] = statistics.median(floors_cpu)
    res["step_cpu_s"] = _median(steps, "step_cpu_s")
    res["cpu_ratio"] = statistics.median(s["step_cpu_s"] / (2 * f) for s, f in zip(steps, floors_cpu))
    log(f"  floor   {res['floor_s']:.4f}s  step {res['step_s']:.4f}s  ratio {res['ratio']:.3f} "
        f"(pairs {', '.join(f'{x:.3f}' for x in res['ratios'])})  cpu ratio {res['cpu_ratio']:.3f}  "
        f"privacy {res['privacy_s'] * 1e3:.2f}ms")
    # the first floor pass and step beyond a timed one: with --compile, the compilation (wall and process CPU)
    res["warmup_extra_s"] = warm_floor[0] - res["floor_s"] + warm_step["step_s"] - res["step_s"]
    res["warmup_extra_cpu_s"] = warm_floor[1] - res["floor_cpu_s"] + warm_step["step_cpu_s"] - res["step_cpu_s"]
    if cfg.compile:
        log(f"  compilation (the warm-up floor pass and step beyond timed ones) {res['warmup_extra_s']:.1f}s, "
            f"cpu {res['warmup_extra_cpu_s']:.1f}s")
    return res


def _scaling(cfg: BenchConfig, h: Harness, one_step, log) -> dict:
    """A step at 2N and at 2M against the base step, rounds interleaved."""
    runs = {"base": one_step, "2n": h.runner(cfg.num_subsets, n=2 * cfg.n), "2m": h.runner(2 * cfg.num_subsets)}
    runs["2n"](0), runs["2m"](0)  # warm-up
    key = "step_cpu_s" if cfg.device == "cpu" else "step_s"
    rounds = [{name: run(i + 1)[key] for name, run in runs.items()} for i in range(cfg.steps)]
    res = {"scaling_clock": "cpu" if cfg.device == "cpu" else "wall",
           "scaling_base_s": statistics.median(r["base"] for r in rounds),
           "step_2n_s": statistics.median(r["2n"] for r in rounds),
           "step_2m_s": statistics.median(r["2m"] for r in rounds),
           "n_scaling": statistics.median(r["2n"] / r["base"] for r in rounds),
           "m_scaling": statistics.median(r["2m"] / r["base"] for r in rounds)}
    log(f"  2N {res['n_scaling']:.3f}x   2M {res['m_scaling']:.3f}x")
    return res


def _memory(cfg: BenchConfig, log) -> dict:
    """Peak memory of training against inference, one fresh process per phase. The phases alternate
    (inference, train, inference, ...): a resident peak of the same code scatters by tens of MiB between
    processes (glibc's heap), so with repeats each phase reports its median."""
    memory = {}
    for phase, rs in _alternating_phases(cfg).items():
        peaks = sorted(r["peak_bytes"] for r in rs)
        memory[phase] = {**rs[0], "peak_bytes": int(statistics.median(peaks)), "peaks_bytes": peaks,
                         "before_bytes": int(statistics.median(r["before_bytes"] for r in rs))}
    res: dict = {"memory": memory, "memory_ratio": memory["train"]["peak_bytes"] / memory["inference"]["peak_bytes"]}
    spread = ""
    if cfg.memory_repeats > 1:
        spread = "  (" + "; ".join(f"{p} {min(r['peaks_bytes']) / 2**20:.0f}-{max(r['peaks_bytes']) / 2**20:.0f} MiB"
                                   for p, r in memory.items()) + f", {cfg.memory_repeats} runs each)"
    log(f"  memory  train/inference peak {res['memory_ratio']:.3f}{spread}")
    if cfg.live_memory and not str(cfg.device).startswith("cuda"):  # CUDA's figure is live bytes already
        live = {phase: [r["peak_bytes"] for r in rs] for phase, rs in _alternating_phases(cfg, live=True).items()}
        for phase, peaks in live.items():
            memory[phase]["live_peak_bytes"] = int(statistics.median(peaks))
            memory[phase]["live_peaks_bytes"] = sorted(peaks)
        res["live_memory_ratio"] = memory["train"]["live_peak_bytes"] / memory["inference"]["live_peak_bytes"]
        log(f"  memory  train/inference peak of live tensor bytes {res['live_memory_ratio']:.3f} ("
            + "; ".join(f"{p} {memory[p]['live_peak_bytes'] / 2**20:.0f} MiB" for p in live) + ")")
    return res


# -- memory: one fresh process per phase -----------------------------------------------------------


def _alternating_phases(cfg: BenchConfig, live: bool = False) -> dict[str, list[dict]]:
    """``cfg.memory_repeats`` fresh processes per phase, inference and train alternating."""
    runs: dict[str, list[dict]] = {"inference": [], "train": []}
    for _ in range(max(1, cfg.memory_repeats)):
        for phase in runs:
            runs[phase].append(memory_phase(cfg, phase, live=live))
    return runs


def table(results: list[dict]) -> str:
    """A readable table of :func:`measure` results, one row per configuration."""
    head = ("model", "track", "dtype", "N", "M", "floor s", "step s", "ratio", "cpu ratio", "MFU", "MFU shape",
            "privacy ms", "2N x", "2M x", "mem train/inf", "live train/inf", "dp x", "floor/plain")
    rows = []
    for r in results:
        c = r["config"]
        mem = r.get("memory")
        name = c["model"] + (" (random init)" if c.get("random_init") else "")
        rows.append((name, c["track"], c["dtype"], str(c["n"]), str(c["num_subsets"]),
                     f"{r['floor_s']:.3f}", f"{r['step_s']:.3f}", f"{r['ratio']:.3f}", f"{r['cpu_ratio']:.3f}",
                     f"{r['mfu']:.1%}", f"{r['mfu_shape']:.1%}", f"{r['privacy_s'] * 1e3:.2f}",
                     f"{r['n_scaling']:.2f}" if "n_scaling" in r else "-",
                     f"{r['m_scaling']:.2f}" if "m_scaling" in r else "-",
                     (f"{r['memory_ratio']:.3f} ({mem['train']['peak_bytes'] / 2**20:.0f}/"
                      f"{mem['inference']['peak_bytes'] / 2**20:.0f} MiB)") if mem else "-",
                     (f"{r['live_memory_ratio']:.3f} ({mem['train']['live_peak_bytes'] / 2**20:.0f}/"
                      f"{mem['inference']['live_peak_bytes'] / 2**20:.0f} MiB)") if "live_memory_ratio" in r else "-",
                     f"{r['dp']['speedup']:.2f}" if "dp" in r else "-",
                     f"{r['floor_vs_plain']:.3f}" if "floor_vs_plain" in r else "-"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument("--model", nargs="+", default=[d.model], help="one or more models (one table row each)")
    p.add_argument("--track", nargs="+", default=[d.track], choices=["lora", "ft"])
    p.add_argument("--task", default=d.task)
    p.add_argument("--n", type=int, default=d.n, help="universe size N")
    p.add_argument("--dtype", default=d.dtype, choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default=d.device)
    p.add_argument("--token-budget", type=int, default=d.token_budget)
    p.add_argument("--lockstep", type=int, default=d.lockstep,
                   help="full FT: a lock-step wave holds the + and - forwards of as many micro-batches as fit "
                        "in LOCKSTEP token budgets (at least one); they share each draw of z (0: off)")
    p.add_argument("--num-subsets", type=int, default=d.num_subsets, help="M")
    p.add_argument("--mechanism", default=d.mechanism, choices=["pac-zpl", "pac-mi", "dp-sgd"],
                   help="dp-sgd: a DP-SGD step against PAC-ZPL's on the same N rows, seconds and peak memory")
    p.add_argument("--mi-budget", type=float, default=d.mi_budget)
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps (after one warm-up)")
    p.add_argument("--num-directions", type=int, default=d.num_directions, help="K")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: OMP_NUM_THREADS, else the cores this process is allowed)")
    p.add_argument("--world", type=int, default=1, help="also time a data-parallel step with this many processes")
    p.add_argument("--no-scaling", dest="scaling", action="store_false", help="skip the 2N and 2M steps")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory phases")
    p.add_argument("--no-plain", dest="plain", action="store_false",
                   help="skip the plain transformers forward that the floor is compared with")
    p.add_argument("--memory-repeats", type=int, default=d.memory_repeats,
                   help="fresh processes per memory phase, alternating; the medians are compared")
    p.add_argument("--live-memory", action="store_true",
                   help="CPU: also compare the phases' peaks of live tensor bytes (torch's profiler, in further "
                        "fresh processes): what the step holds, without what the C allocator keeps")
    p.add_argument("--compile", action="store_true",
                   help="LoRA: torch.compile the model body (dynamic shapes) for the floor and the step alike; "
                        "compilation happens in the warm-ups")
    p.add_argument("--account", action="store_true",
                   help="also time one floor pass with forward hooks on every module and account for its time "
                        "by category (base linears and their TFLOP/s, LoRA adapters, attention, norms, MLP, "
                        "embedding, glue, LM head, outside the model), beside the same pass without hooks")
    p.add_argument("--host", action="store_true",
                   help="also time a PAC-ZPL, MeZO, DP-SGD and AdamW step over the same N rows, each split into "
                        "the time inside the model's forwards and backwards and the host time around them "
                        "(z draws, perturbation, update, loops, release, optimizer), in ms")
    p.add_argument("--random-init", action="store_true",
                   help="build each model from its config alone with random weights (speed and memory do not "
                        "depend on the weights; a local folder needs only config.json and the tokenizer)")
    p.add_argument("--data", help="the task's data file (--task classification: a labelled file of your own)")
    p.add_argument("--columns", type=parse_mapping, help="the file's columns, as paczero train's (sentence=text,...)")
    p.add_argument("--labels", type=items_of(str), help="the class names, as paczero train's (a,b,c)")
    p.add_argument("--verbalizer", type=parse_verbalizer, help="the answer words, as paczero train's ('0= a,1= b')")
    p.add_argument("--template", type=parse_template, help="the prompt, as paczero train's" + TEMPLATE_HELP)
    p.add_argument("--against-two-classes", dest="two_classes", action="store_true",
                   help="time the step over every class against the same rows' two-class step (the first two answer "
                        "words, labels modulo 2), alternating; the ratio's goal is <= 1.3")
    p.add_argument("--json-out", help="write the results (a JSON list) here")


def run(ns: argparse.Namespace) -> int:
    fields = set(BenchConfig.__dataclass_fields__)
    base = BenchConfig(**{k: v for k, v in vars(ns).items() if k in fields and k not in ("model", "track")})
    if base.n < 2 or base.num_subsets < 2 or base.num_subsets % 2:
        raise ValueError("bench needs N >= 2 and an even M >= 2")
    if base.lockstep < 0:
        raise ValueError("--lockstep must be >= 0")
    if base.live_memory and not base.memory:
        raise ValueError("--live-memory measures within the memory phases: drop --no-memory")
    if base.compile and (ns.track != ["lora"] or base.task == "squad"):
        raise ValueError("--compile applies to --track lora on a classification task only")
    if base.two_classes and (base.mechanism == "dp-sgd" or base.world > 1):
        raise ValueError("--against-two-classes times the zeroth-order step in one process: drop --mechanism dp-sgd "
                         "and --world")
    if base.account and (base.compile or base.mechanism == "dp-sgd"):
        raise ValueError("--account times the eager zeroth-order floor pass: drop --compile and --mechanism dp-sgd")
    if base.host and (base.compile or base.mechanism == "dp-sgd"):
        raise ValueError("--host times every method's eager step itself: drop --compile and --mechanism dp-sgd")
    for flag, value in (("--steps", base.steps), ("--memory-repeats", base.memory_repeats),
                        ("--world", base.world), ("--num-directions", base.num_directions),
                        ("--token-budget", base.token_budget),
                        ("--threads", 1 if base.threads is None else base.threads)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if ns.json_out and os.path.exists(ns.json_out):
        raise ValueError(f"--json-out {ns.json_out} exists; give a new path (results are never written over a file)")
    results = []
    for model in ns.model:
        for track in ns.track:
            results.append(measure(replace(base, model=model, track=track), log=lambda s: print(s, file=sys.stderr)))
            if ns.json_out:  # write as we go: a long run keeps what it measured
                with open(ns.json_out, "w") as f:
                    json.dump(results, f, indent=1)
    if base.two_classes:
        from paczero.bench.classes import classes_table

        print(classes_table(results))
    elif base.mechanism == "dp-sgd":
        from paczero.bench.first_order import first_order_table

        print(first_order_table(results))
    else:
        print(table(results))
        if base.account:
            print(account_table(results))
        if base.host:
            from paczero.bench.host import host_table

            print(host_table(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="paczero bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))
