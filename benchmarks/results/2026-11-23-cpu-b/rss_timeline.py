import sys, threading, time, json
root, phase = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import paczero.zo as zo
try:  # a tree with the step benchmark in benchmarks/step; the trees measured here had it in paczero.bench
    from benchmarks.step import BenchConfig, _memory_child
except ImportError:
    from paczero.bench import BenchConfig, _memory_child
marks = []
ev = zo.Perturber.evaluate
def evaluate(self, *a, **kw):
    marks.append(("wave", time.perf_counter())); out = ev(self, *a, **kw); marks.append(("end", time.perf_counter())); return out
zo.Perturber.evaluate = evaluate
au = zo.Perturber.apply_update
def apply_update(self, *a, **kw):
    marks.append(("update", time.perf_counter())); out = au(self, *a, **kw); marks.append(("updated", time.perf_counter())); return out
zo.Perturber.apply_update = apply_update
samples = []
stop = False
def sampler():
    while not stop:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * 4096
        samples.append((time.perf_counter(), rss))
        time.sleep(0.005)
threading.Thread(target=sampler, daemon=True).start()
cfg = BenchConfig(model="smollm2", track="ft", n=1000, memory=True, scaling=False, steps=1)
from dataclasses import asdict
r = _memory_child(asdict(cfg), phase)
stop = True
json.dump({"samples": samples, "marks": marks, "r": r}, open(f"/tmp/s11/timeline-{phase}.json", "w"))
print(r["peak_bytes"] / 2**20, r["before_bytes"] / 2**20)
