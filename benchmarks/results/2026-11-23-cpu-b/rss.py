"""RSS high-water of one memory phase in this fresh process; argv: root phase trim(0/1)."""
import sys, ctypes, json
root, phase, trim = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
sys.path.insert(0, root)
import paczero, paczero.zo as zo
assert paczero.__file__.startswith(root)
try:  # a tree with the step benchmark in benchmarks/step; the trees measured here had it in paczero.bench
    from benchmarks.step import BenchConfig, _memory_child
except ImportError:
    from paczero.bench import BenchConfig, _memory_child
if trim:
    libc = ctypes.CDLL("libc.so.6")
    ev = zo.Perturber.evaluate
    def evaluate(self, *a, **kw):
        out = ev(self, *a, **kw); libc.malloc_trim(0); return out
    zo.Perturber.evaluate = evaluate
cfg = BenchConfig(model="smollm2", track="ft", n=1000, memory=True, scaling=False, steps=1)
from dataclasses import asdict
r = _memory_child(asdict(cfg), phase)
print(json.dumps({"root": root, "phase": phase, "trim": trim, "peak_MiB": r["peak_bytes"] / 2**20, "before_MiB": r["before_bytes"] / 2**20}))
