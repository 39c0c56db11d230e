#!/usr/bin/env bash
# The GPU checks and benchmarks of docs/performance.md ("GPU"), on a CUDA machine with no network.
#
#   bash benchmarks/gpu.sh OUT_DIR [tests|small|opt13|opt67|host|all]
#
# host: the host time a step (`paczero bench --host`: PAC-ZPL, MeZO, DP-SGD and AdamW, each step split into the
# time inside the model's forwards and backwards and the host time around them) of HOST_MODELS (default tiny-llama
# and SmolLM2's architecture folder, random weights) at N = HOST_N (default 1000) on DEVICE (default cuda; cpu
# runs it anywhere, as tests/test_benchmarks_scripts.py does).
# Needs paczero importable (pip install -e ., or PYTHONPATH=. from the repo root), and, offline, architecture
# folders from benchmarks/arch_folders.py in $ARCH (default .devcarry/arch) plus the SmolLM2 tokenizer in
# $PACZERO_CACHE. Every benchmark writes its JSON and log into OUT_DIR; one that fails does not stop the rest.
set -u
out=${1:?usage: gpu.sh OUT_DIR [tests|small|opt13|opt67|host|all]}
what=${2:-all}
arch=${ARCH:-.devcarry/arch}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
bench() {  # name, then paczero bench arguments; each row's MFU (docs/performance.md, "MFU") closes its log
  local name=$1; shift
  echo "== $name: paczero bench $*"
  timeout "${BENCH_TIMEOUT:-400}" "$py" -m paczero.cli bench --device "$device" --json-out "$out/$name.json" "$@" \
    2>&1 | tee "$out/$name.log"
  "$py" - "$out/$name.json" <<'PY' 2>&1 | tee -a "$out/$name.log"
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"MFU: no results ({e})")
for r in rows:
    c = r["config"]
    if "mfu" not in r:
        print(f"MFU: missing for {c['model']} {c['track']}")
        continue
    print(f"MFU {c['model']} {c['track']} {c['dtype']} on {c['device']}: step {r['mfu']:.1%} of "
          f"{r['matmul_tflops_2048']:.3g} TFLOP/s (2048^3), {r['mfu_shape']:.1%} of {r['matmul_tflops_shape']:.3g} "
          f"(shape {'x'.join(map(str, r['matmul_shape']))}); floor {r.get('floor_mfu', float('nan')):.1%}")
    for method, h in r.get("host", {}).items():  # paczero bench --host: the step's host time, in ms
        print(f"HOST {c['model']} {c['track']} {c['dtype']} N={c['n']} {method}: step {h['step_s'] * 1e3:.2f} ms, "
              f"model {h['model_s'] * 1e3:.2f} ms, host {h['host_s'] * 1e3:.2f} ms")
PY
}
if [[ $what == tests || $what == all ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$py" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
  "$py" -m pytest -q -rfE tests/test_cuda.py 2>&1 | tee "$out/test_cuda.log"
  "$py" benchmarks/kernels_cuda.py 2>&1 | tee "$out/kernels.json"  # fused direction kernels against torch's
fi
if [[ $what == small || $what == all ]]; then
  bench tiny-opt --model tiny-opt --track lora ft --n 1000 --dtype bf16 --steps 5
  bench smollm2-arch --model "$arch/smollm2-135m-arch" --random-init --track lora ft --n 1000 --dtype bf16 --steps 5 \
    --account  # where the floor pass's time goes (hooks synchronise the device: the account has no overlap)
fi
if [[ $what == opt13 || $what == all ]]; then
  bench opt-1.3b --model "$arch/opt-1.3b" --random-init --track lora ft --n 1000 --dtype bf16 --steps 3
  "$py" benchmarks/profile_step.py --model "$arch/opt-1.3b" --random-init --device cuda --dtype bf16 --track ft \
    --n 1000 --out "$out/profile-opt-1.3b" 2>&1 | tail -60
fi
if [[ $what == opt67 || $what == all ]]; then
  bench opt-6.7b --model "$arch/opt-6.7b" --random-init --track lora ft --n 1000 --dtype bf16 --steps 3 --no-scaling
fi
if [[ $what == host || $what == all ]]; then
  for m in ${HOST_MODELS:-tiny-llama $arch/smollm2-135m-arch}; do
    init=(); [[ $m == */* ]] && init=(--random-init)
    bench "host-$(basename "$m")" --model "$m" "${init[@]}" --track lora --n "${HOST_N:-1000}" --dtype "${HOST_DTYPE:-bf16}" \
      --steps 3 --no-scaling --no-memory --no-plain --host
  done
fi
