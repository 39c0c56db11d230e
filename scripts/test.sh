#!/usr/bin/env bash
# Install (as scripts/setup.sh) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Triton, for tests/test_fused_directions.py only: its CPU interpreter runs the CUDA direction kernels here.
# Not a dependency of paczero (torch's CUDA wheels bring their own Triton; CPU runs never import it).
.venv/bin/python -m pip install -q triton==3.9.0 || echo "test.sh: Triton could not be installed; the interpreter test of tests/test_fused_directions.py will be skipped" >&2
exec .venv/bin/python -m pytest -q -p no:cacheprovider -m "slow or not slow" "$@"
