"""The time of each lookup of the cached step's table of z's embedding rows, inside real steps (tiny-opt FT, N = 1000).

    PYTHONPATH=. python benchmarks/results/2026-11-23-cpu-c/row_table_calls.py    # from the repository root
"""
import time, statistics, torch
from benchmarks.step import BenchConfig, Harness
from paczero import zo, cpu_directions as cpu
h = Harness(BenchConfig(model="tiny-opt", track="ft", n=1000))
calls = []
f = zo.Perturber._row_table
def g(self, step, k, i, ids):
    t = time.perf_counter(); r = f(self, step, k, i, ids); calls.append(time.perf_counter() - t); return r
zo.Perturber._row_table = g
rk = cpu.rows
rows_t = []
def rk2(*a, **kw):
    t = time.perf_counter(); r = rk(*a, **kw); rows_t.append(time.perf_counter() - t); return r
cpu.rows = rk2
uq = torch.unique
one = h.runner(128); one(0)
per = []
for s in range(1, 12):
    calls.clear(); rows_t.clear(); h.floor_pass(); one(s); per.append((list(calls), list(rows_t)))
m = statistics.median
print("per call (+ block):", [round(m(c[0][j] for c in per)*1e3, 3) for j in range(8)])
print("per call (- block):", [round(m(c[0][j] for c in per)*1e3, 3) for j in range(8, 16)])
print("kernel rows per call:", [round(m(c[1][j] for c in per)*1e3, 3) for j in range(len(per[0][1]))])
