"""Does a draw of z on a second thread hide behind a floor pass? (tiny-opt FT, N = 1000; torch's generator.)

    PYTHONPATH=. python benchmarks/results/2026-11-23-cpu-c/overlap.py    # from the repository root
"""
import time, threading, statistics, torch
from benchmarks.step import BenchConfig, Harness
h = Harness(BenchConfig(model="tiny-opt", track="ft", n=1000))
z = torch.empty(3_300_000)
g = torch.Generator()
def draw():
    for lo in range(0, z.numel(), 1<<14):
        z[lo:lo+(1<<14)].normal_(generator=g)
def timed(fn):
    t=time.perf_counter(); fn(); return time.perf_counter()-t
for _ in range(3): h.floor_pass(); draw()
alone_f, alone_d, both = [], [], []
for r in range(15):
    alone_f.append(timed(h.floor_pass))
    alone_d.append(timed(draw))
    th = threading.Thread(target=draw)
    t=time.perf_counter(); th.start(); f=h.floor_pass(); th.join(); both.append(time.perf_counter()-t)
m=statistics.median
print(f"floor {m(alone_f)*1e3:.1f} draw {m(alone_d)*1e3:.1f} sum {(m(alone_f)+m(alone_d))*1e3:.1f} overlapped {m(both)*1e3:.1f}")
