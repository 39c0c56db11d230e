"""How often a gloo rank aborts at exit: two processes meet in ``all_gather_object``, then exit with code 2,
having destroyed the process group (``destroy``), passed a barrier first (``barrier``) or neither (``none``).
Prints the exit codes counted as one JSON object per mode.

    python -m benchmarks.gloo_exit --modes destroy none --runs 60      # from the repository root

An abort (exit code -6, "terminate called without an active exception") under load without
``destroy_process_group`` is why ``DataParallel.close`` destroys the group, and ``train()`` calls it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter

_RANK = r'''
import os, sys, torch.distributed as tdist
r = int(sys.argv[1]); os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
tdist.init_process_group("gloo", rank=r, world_size=2)
out = [None, None]
tdist.all_gather_object(out, ("x" if r == 0 else "y", None))
if sys.argv[3] == "barrier": tdist.barrier()
if sys.argv[3] != "none": tdist.destroy_process_group()
sys.exit(2)
'''


def exit_codes(mode: str, runs: int) -> dict[int, int]:
    """The exit codes of ``runs`` pairs of ranks that end in ``mode``, counted (2: a clean exit)."""
    from paczero.run.distributed import free_port

    counted: Counter = Counter()
    for _ in range(runs):
        port = str(free_port())
        ranks = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), port, mode], stderr=subprocess.PIPE)
                 for r in (0, 1)]
        for p in ranks:
            p.communicate()
            counted[p.returncode] += 1
    return dict(counted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", choices=["destroy", "barrier", "none"], default=["destroy", "none"])
    ap.add_argument("--runs", type=int, default=60, help="pairs of ranks per mode")
    args = ap.parse_args(argv)
    for mode in args.modes:
        print(json.dumps({"mode": mode, "runs": args.runs, "exit_codes": exit_codes(mode, args.runs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
