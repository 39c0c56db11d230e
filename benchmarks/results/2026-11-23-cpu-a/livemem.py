import json, sys, time
try:  # a tree with the step benchmark in benchmarks/step; the trees measured here had it in paczero.bench
    from benchmarks.step import BenchConfig, memory_phase
except ImportError:
    from paczero.bench import BenchConfig, memory_phase
import paczero
def main():
  phase = sys.argv[1]
  kw = dict(model="smollm2-135m-instruct", track="ft", n=1000, steps=1, threads=2)
  if len(sys.argv) > 2:
      kw.update(json.loads(sys.argv[2]))
  cfg = BenchConfig(**kw)
  t = time.time()
  r = memory_phase(cfg, phase, live=True)
  print(paczero.__file__, phase, kw, round(r["peak_bytes"] / 2**20, 1), "MiB live", round(time.time() - t), "s", flush=True)

if __name__ == '__main__':
  main()
