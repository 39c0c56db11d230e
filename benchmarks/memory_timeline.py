"""The resident size through one memory phase of the step benchmark, sampled, with the step's evaluations and
updates marked.

    python -m benchmarks.memory_timeline --model smollm2-135m-instruct --track ft --n 1000 \
        [--phase train|inference] [--uncached] [--lockstep L] [--trim] [--interval-ms 5] [--json-out FILE]

This process runs what a memory phase of ``paczero bench`` runs in a fresh one (every weight made resident,
the resident high-water mark reset, then two loop bodies of the step, or two floor passes for
``--phase inference``), while a thread reads the resident size from ``/proc/self/statm`` every
``--interval-ms``. The marks are the outermost evaluation blocks (a lock-step wave, or a perturbed block of
one sign when z is cached) and the updates. ``--uncached`` regenerates z per lock-step wave, as the step does
for a trainable set above the cache limit (2^28 values on CPU); ``--trim`` calls glibc's ``malloc_trim(0)``
after every evaluation block. The summary (printed; with ``--json-out`` written with the samples and marks)
holds the high-water mark, the highest sample inside evaluations and inside updates, and the resident size
after each update. Linux only (``/proc``).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from contextlib import contextmanager

from paczero.bench.harness import BenchConfig, Harness
from paczero.bench.memory import _make_resident, _rss_peak, _rss_peak_reset

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Timeline:
    """Samples of the resident size from a background thread, and marks of named moments, on one clock."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.t0 = time.perf_counter()
        self.samples: list[tuple[float, int]] = []
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self.t0, _rss_now()))
            self._stop.wait(self.interval_s)

    def mark(self, name: str) -> None:
        self.samples.append((time.perf_counter() - self.t0, _rss_now()))  # the size at the mark itself
        self.marks.append((self.samples[-1][0], name))

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.sort()

    def spans(self, start: str, end: str) -> list[tuple[float, float]]:
        opened, out = None, []
        for t, name in self.marks:
            if name == start:
                opened = t
            elif name == end and opened is not None:
                out.append((opened, t))
                opened = None
        return out

    def peak_within(self, spans: list[tuple[float, float]]) -> int | None:
        inside = [b for t, b in self.samples if any(lo <= t <= hi for lo, hi in spans)]
        return max(inside) if inside else None

    def after(self, name: str) -> list[int]:
        """The resident size at each mark ``name``."""
        at = dict(self.samples)
        return [at[t] for t, n in self.marks if n == name]


def _instrument(perturber, timeline: Timeline, trim) -> None:
    """Mark the perturber's outermost evaluation blocks and its updates (on this instance only)."""
    depth = [0]
    evaluate, perturbed, apply_update = perturber.evaluate, perturber.perturbed, perturber.apply_update

    @contextmanager
    def outermost():
        depth[0] += 1
        if depth[0] == 1:
            timeline.mark("evaluate")
        try:
            yield
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                if trim is not None:
                    trim(0)
                timeline.mark("evaluated")

    def marked_evaluate(*args, **kwargs):
        with outermost():
            return evaluate(*args, **kwargs)

    @contextmanager
    def marked_perturbed(*args, **kwargs):
        with outermost(), perturbed(*args, **kwargs):
            yield

    def marked_update(*args, **kwargs):
        timeline.mark("update")
        try:
            return apply_update(*args, **kwargs)
        finally:
            timeline.mark("updated")

    perturber.evaluate, perturber.perturbed, perturber.apply_update = marked_evaluate, marked_perturbed, marked_update


def run(cfg: BenchConfig, phase: str = "train", uncached: bool = False, trim: bool = False,
        interval_s: float = 0.005) -> dict:
    """One memory phase of ``cfg`` in this process, timed and sampled; the summary, samples and marks."""
    from paczero.models import trainable_parameters
    from paczero.zo import Perturber

    if not os.path.exists("/proc/self/statm"):
        raise SystemExit("memory_timeline: needs Linux's /proc/self/statm")
    libc_trim = None
    if trim:
        try:
            libc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            raise SystemExit("memory_timeline: --trim needs glibc's malloc_trim") from None
    h = Harness(cfg)
    if uncached:
        h.perturber = Perturber(h.model, trainable_parameters(h.model, cfg.track), cfg.seed, cache_limit=0,
                                lockstep=cfg.lockstep, token_budget=cfg.token_budget)
    perturber = h.get_perturber()
    _make_resident(h.model)
    import gc

    gc.collect()
    before = _rss_now()
    reset = _rss_peak_reset()
    with Timeline(interval_s) as timeline:
        _instrument(perturber, timeline, libc_trim)
        if phase == "inference":
            for _ in range(2):
                timeline.mark("floor")
                h.floor_pass()
                timeline.mark("floored")
        else:
            h.steps(cfg.num_subsets, 1)
    evaluations, updates = timeline.spans("evaluate", "evaluated"), timeline.spans("update", "updated")
    summary = {
        "phase": phase, "cached": bool(perturber.cache), "trim": trim, "peak_reset": reset,
        "before_bytes": before, "peak_bytes": _rss_peak(),
        "sampled_peak_bytes": max(b for _, b in timeline.samples),
        "evaluations": len(evaluations), "updates": len(updates),
        "evaluation_peak_bytes": timeline.peak_within(evaluations),
        "update_peak_bytes": timeline.peak_within(updates),
        "after_update_bytes": timeline.after("updated"),
    }
    return {"config": {**cfg.__dict__, "uncached": uncached, "interval_ms": interval_s * 1e3}, "summary": summary,
            "samples": [[round(t, 6), b] for t, b in timeline.samples],
            "marks": [[round(t, 6), name] for t, name in timeline.marks]}


def main(argv: list[str] | None = None) -> int:
    d = BenchConfig()
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory_timeline", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=d.model)
    ap.add_argument("--track", default="ft", choices=["lora", "ft"])
    ap.add_argument("--task", default=d.task)
    ap.add_argument("--n", type=int, default=d.n, help="universe size N")
    ap.add_argument("--dtype", default=d.dtype, choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--num-subsets", type=int, default=d.num_subsets, help="M")
    ap.add_argument("--lockstep", type=int, default=d.lockstep, help="uncached: token budgets per sign in a wave")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--phase", default="train", choices=["train", "inference"])
    ap.add_argument("--uncached", action="store_true", help="regenerate z per lock-step wave (no cached z)")
    ap.add_argument("--trim", action="store_true", help="glibc's malloc_trim(0) after every evaluation block")
    ap.add_argument("--interval-ms", type=float, default=5.0, help="sampling interval")
    ap.add_argument("--json-out", help="write the summary, samples and marks here (never over a file)")
    a = ap.parse_args(argv)
    if a.json_out and os.path.exists(a.json_out):
        ap.error(f"--json-out {a.json_out} exists; give a new path")
    if a.interval_ms <= 0 or a.n < 2:
        ap.error("--interval-ms must be > 0 and --n >= 2")
    cfg = BenchConfig(model=a.model, track=a.track, task=a.task, n=a.n, dtype=a.dtype, num_subsets=a.num_subsets,
                      lockstep=a.lockstep, threads=a.threads, steps=1, scaling=False)
    res = run(cfg, a.phase, uncached=a.uncached, trim=a.trim, interval_s=a.interval_ms / 1e3)
    s = res["summary"]
    mib = lambda b: "-" if b is None else f"{b / 2**20:.0f} MiB"  # noqa: E731
    print(f"{a.model} {a.track} {a.phase}{' uncached' if a.uncached else ''}{' trim' if a.trim else ''}: "
          f"high-water {mib(s['peak_bytes'])} (from {mib(s['before_bytes'])}), {len(res['samples'])} samples; "
          f"{s['evaluations']} evaluation blocks, peak {mib(s['evaluation_peak_bytes'])}; {s['updates']} updates, "
          f"peak {mib(s['update_peak_bytes'])}, after: {', '.join(mib(b) for b in s['after_update_bytes']) or '-'}")
    if a.json_out:
        with open(a.json_out, "x") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
