"""SmolLM2 FT memory phase with the grouped lock-step owners on or off (HEAD's code, torch's generator)."""
import json
import os
import sys
import time

sys.path.insert(0, os.environ.get("BEFORE_TREE", "."))  # a tree of commit f1bdc65
os.environ["PACZERO_TORCH_DIRECTIONS"] = "1"
import paczero.zo as zo
assert zo.__file__.endswith("zo.py"), zo.__file__  # the single-file engine of f1bdc65
mode, phase, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
orig = zo.Perturber.__init__
def init(self, *a, group_linears=None, **k):
    orig(self, *a, group_linears=(mode == "on"), **k)
zo.Perturber.__init__ = init
from dataclasses import asdict
from paczero.bench import BenchConfig, _memory_child
cfg = BenchConfig(model="smollm2-135m-instruct", track="ft", n=n, steps=1, scaling=False)
t = time.perf_counter()
res = _memory_child(asdict(cfg), phase, live=(len(sys.argv) > 4))
res["seconds"] = time.perf_counter() - t
res.update(mode=mode, phase=phase, n=n)
print(json.dumps(res))
