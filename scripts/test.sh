#!/usr/bin/env bash
# Install (as scripts/setup.sh, at the versions of constraints.txt) and run the whole test suite.
# Environment: VENV and CONSTRAINTS as scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${VENV:-.venv}
CONSTRAINTS=${CONSTRAINTS-constraints.txt}
PIN=()
if [ -n "$CONSTRAINTS" ]; then PIN=(-c "$CONSTRAINTS"); fi
# Triton, for tests/test_fused_directions.py only: its CPU interpreter runs the CUDA direction kernels here.
# Not a dependency of paczero (torch's CUDA wheels bring their own Triton; CPU runs never import it).
"$VENV/bin/python" -m pip install -q triton==3.9.0 "${PIN[@]}" || echo "test.sh: Triton could not be installed; the interpreter test of tests/test_fused_directions.py will be skipped" >&2
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "slow or not slow" "$@"
