"""The host time of a step (``paczero bench --host``), an older commit's code against this tree's, in one run.

    python benchmarks/host_time.py --before REV [--model tiny-llama] [--track lora] [--n 1000] [--rounds 5]
        [--steps 5] [--threads 1] [--methods pac-zpl mezo dp-sgd adamw] [--json-out FILE]

REV's ``paczero/`` is exported (``git archive``) into a temporary folder; where it lacks
``paczero/bench/host.py``, this tree's copy is put beside it (the module uses only interfaces older than
it, so it times REV's own step). Each round starts one fresh process per side, the sides alternating
(before, after, after, before, ...), each timing ``--steps`` steps of every method after a warm-up
(:func:`paczero.bench.host.measure_host`); the figures are medians over the rounds, and ``ratio`` the
median of the per-round ratios before / after, so that a change in the machine's load hits both sides.
Process CPU time (``host_cpu_s``) is the steadier clock on a shared machine; ``--threads 1`` keeps
torch's idle OpenMP threads from spinning into it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("pac-zpl", "mezo", "dp-sgd", "adamw")
KEYS = ("step_s", "model_s", "host_s", "step_cpu_s", "host_cpu_s")


def export(rev: str, into: Path) -> Path:
    """REV's ``paczero/`` under ``into``, with this tree's bench/host.py where REV has none."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "paczero"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    host = into / "paczero" / "bench" / "host.py"
    if not host.exists():
        shutil.copy(ROOT / "paczero" / "bench" / "host.py", host)
    return into


def child(ns: argparse.Namespace) -> int:
    """One side of a round, run with its tree first on the path: the medians of its steps as JSON."""
    from paczero.bench.harness import BenchConfig, Harness
    from paczero.bench.host import measure_host

    h = Harness(BenchConfig(model=ns.model, track=ns.track, n=ns.n, threads=ns.threads, dtype=ns.dtype))
    res = measure_host(h, ns.steps, methods=tuple(ns.methods), log=lambda s: print(s, file=sys.stderr))
    import paczero

    print(json.dumps({"tree": str(Path(paczero.__file__).parents[1]), "host": res}))
    return 0


def side(tree: Path, ns: argparse.Namespace) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", ns.model, "--track", ns.track,
            "--n", str(ns.n), "--steps", str(ns.steps), "--threads", str(ns.threads), "--dtype", ns.dtype,
            "--methods", *ns.methods]
    env = {**os.environ, "PYTHONPATH": str(tree), "PACZERO_BUSY_LINE": "0"}
    out = subprocess.run(argv, env=env, cwd=tempfile.gettempdir(), check=True, capture_output=True, text=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(res["tree"]).resolve() != tree.resolve():
        raise RuntimeError(f"the side meant to run {tree} imported paczero from {res['tree']}")
    return res["host"]


def summarise(rounds: list[dict], methods) -> dict:
    """Medians over rounds per side and method, and the median per-round ratios before / after."""
    out: dict = {}
    for m in methods:
        row = {s: {k: statistics.median(r[s][m][k] for r in rounds) for k in KEYS} for s in ("before", "after")}
        for k in ("host_s", "host_cpu_s"):
            row[f"ratio_{k}"] = statistics.median(r["before"][m][k] / r["after"][m][k] for r in rounds)
        out[m] = row
    return out


def table(summary: dict) -> str:
    lines = ["| method | host ms before | host ms after | ratio | host CPU ms before | host CPU ms after | ratio "
             "| step ms before | step ms after |", "|" + "---|" * 9]
    for m, r in summary.items():
        b, a = r["before"], r["after"]
        lines.append(f"| {m} | {b['host_s'] * 1e3:.2f} | {a['host_s'] * 1e3:.2f} | {r['ratio_host_s']:.2f} "
                     f"| {b['host_cpu_s'] * 1e3:.2f} | {a['host_cpu_s'] * 1e3:.2f} | {r['ratio_host_cpu_s']:.2f} "
                     f"| {b['step_s'] * 1e3:.1f} | {a['step_s'] * 1e3:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="the older commit (any git revision)")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--track", default="lora", choices=["lora", "ft"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--json-out")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        return child(ns)
    if not ns.before:
        p.error("--before REV is required")
    if min(ns.rounds, ns.steps, ns.threads, ns.n) < 1:
        p.error("--rounds, --steps, --threads and --n must be >= 1")
    if ns.json_out and os.path.exists(ns.json_out):
        p.error(f"--json-out {ns.json_out} exists; give a new path")
    with tempfile.TemporaryDirectory(prefix="paczero-before-") as tmp:
        trees = {"before": export(ns.before, Path(tmp)), "after": ROOT}
        rounds = []
        for i in range(ns.rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            rounds.append({s: side(trees[s], ns) for s in order})
            print(f"round {i + 1}/{ns.rounds}: " + ", ".join(
                f"{m} host cpu {rounds[-1]['before'][m]['host_cpu_s'] * 1e3:.2f} -> "
                f"{rounds[-1]['after'][m]['host_cpu_s'] * 1e3:.2f} ms" for m in ns.methods), file=sys.stderr)
    summary = summarise(rounds, ns.methods)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ns.before], capture_output=True,
                         text=True).stdout.strip()
    result = {"before": rev, "config": {k: v for k, v in vars(ns).items() if k not in ("child", "json_out")},
              "summary": summary, "rounds": rounds}
    print(table(summary))
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
