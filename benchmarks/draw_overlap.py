"""Does the cached step's draw of z hide behind a floor pass when a second thread runs it?

    python -m benchmarks.draw_overlap --model tiny-opt --track ft --n 1000 [--rounds 15] [--threads T] [--json-out FILE]

Each round times a floor pass alone (one inference pass over the universe), the draw of every trained
tensor's z for a new step alone (the Perturber's cached draw, its chunks handed to the worker threads), and
the two at once: the draw started on a second thread, then the floor pass on this one. Medians over the rounds
after one warm-up; ``overlapped / (floor + draw)`` near 1 means the draw does not hide (the cores are busy
with the forward's products), near ``floor / (floor + draw)`` that it hides entirely. The step draws z
between forwards, not during them (``paczero.zo.directions.WorkerPool``); this measures that choice on a
machine. The draw is the cached step's: a trainable set within the cache limit (LoRA, or full fine-tuning
up to 2^28 values on CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

from paczero.bench.harness import BenchConfig, Harness


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(cfg: BenchConfig, rounds: int) -> dict:
    """Floor, draw and both at once, ``rounds`` times after a warm-up; medians in seconds."""
    h = Harness(cfg)
    perturber = h.get_perturber()
    if not perturber.cache:
        raise SystemExit(f"draw_overlap: {cfg.model} {cfg.track} trains {perturber.numel} values, above the cache "
                         "limit: its step draws z per wave, not once (use LoRA or a smaller model)")
    step = [0]

    def draw() -> None:  # z of every trained tensor for a new step, into the previous step's storage
        step[0] += 1
        perturber.direction(step[0], 0, 0)

    h.floor_pass()
    draw()
    floors, draws, both = [], [], []
    for _ in range(rounds):
        floors.append(_timed(h.floor_pass))
        draws.append(_timed(draw))
        second = threading.Thread(target=draw)
        t = time.perf_counter()
        second.start()
        h.floor_pass()
        second.join()
        both.append(time.perf_counter() - t)
    m = statistics.median
    res = {"config": {**cfg.__dict__, "rounds": rounds}, "trained_values": perturber.numel,
           "floor_s": m(floors), "draw_s": m(draws), "overlapped_s": m(both)}
    res["overlapped_over_sum"] = res["overlapped_s"] / (res["floor_s"] + res["draw_s"])
    res["hidden_entirely"] = res["floor_s"] / (res["floor_s"] + res["draw_s"])
    return res


def main(argv: list[str] | None = None) -> int:
    d = BenchConfig()
    ap = argparse.ArgumentParser(prog="python -m benchmarks.draw_overlap", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=d.model)
    ap.add_argument("--track", default="ft", choices=["lora", "ft"])
    ap.add_argument("--task", default=d.task)
    ap.add_argument("--n", type=int, default=1000, help="universe size N")
    ap.add_argument("--dtype", default=d.dtype, choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--json-out", help="write the result here (never over a file)")
    a = ap.parse_args(argv)
    if a.json_out and os.path.exists(a.json_out):
        ap.error(f"--json-out {a.json_out} exists; give a new path")
    if a.rounds < 1 or a.n < 2:
        ap.error("--rounds must be >= 1 and --n >= 2")
    cfg = BenchConfig(model=a.model, track=a.track, task=a.task, n=a.n, dtype=a.dtype, threads=a.threads,
                      memory=False, scaling=False)
    res = run(cfg, a.rounds)
    print(f"{a.model} {a.track}, {res['trained_values']} values: floor {res['floor_s'] * 1e3:.1f} ms, "
          f"draw {res['draw_s'] * 1e3:.1f} ms, sum {(res['floor_s'] + res['draw_s']) * 1e3:.1f} ms, "
          f"overlapped {res['overlapped_s'] * 1e3:.1f} ms ({res['overlapped_over_sum']:.3f} of the sum; "
          f"{res['hidden_entirely']:.3f} if the draw hid entirely)")
    if a.json_out:
        with open(a.json_out, "x") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
