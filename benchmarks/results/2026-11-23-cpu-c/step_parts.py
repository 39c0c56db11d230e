"""Where one cached FT step's time goes: Perturber methods timed inside the bench's loop body.

    PYTHONPATH=. python benchmarks/results/2026-11-23-cpu-c/step_parts.py [tiny-opt]    # from the repository root;
    medians of 15 steps, floor passes between
"""
import time, statistics, sys, torch
from benchmarks.step import BenchConfig, Harness
from paczero import zo
h = Harness(BenchConfig(model=sys.argv[1] if len(sys.argv) > 1 else "tiny-opt", track="ft", n=1000))
acc = {}
def wrap(cls, name):
    f = getattr(cls, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[name] = acc.get(name, 0) + time.perf_counter() - t; return r
    setattr(cls, name, g)
for n in ("_draw_all", "_perturbed_value", "apply_update", "evaluate", "_embedding"):
    wrap(zo.Perturber, n)
one = h.runner(128)
one(0)
rows, floors = [], []
for s in range(1, 16):
    floors.append(h.floor_pass())
    acc.clear(); r = one(s); r.update({k: v for k, v in acc.items()}); rows.append(r)
m = statistics.median
print(f"floor {m(floors)*1e3:.1f} ms")
for k in rows[0]:
    print(f"  {k:18s} {m(x.get(k,0) for x in rows)*1e3:7.2f} ms")
