#!/usr/bin/env bash
# Run the pinned-output tests (tests/test_engine_transcript.py) under several CPU kernel settings on this
# one machine and demand the same verdict from each: every test passed (or stopped by the margin rule,
# which names its step and subset) under every setting. A forward or a privacy computation whose last
# bits move with the kernels shows here before a machine of another kind shows it.
#
#   native     the machine as it is
#   avx2       as on an AVX2 machine: torch's AVX2 kernels, numpy without its AVX-512 loops, OpenBLAS's
#              Haswell kernels
#   baseline   torch's and numpy's kernels without AVX (SSE only), OpenBLAS's Prescott kernels
#   avx512     torch's AVX-512 kernels (where the CPU has avx512f)
#
# Environment: VENV (default .venv). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
# numpy's dispatched CPU features above a level, as NPY_DISABLE_CPU_FEATURES takes them (its baseline stays)
above() {
  "$PY" - "$1" <<'PY'
import sys
from numpy._core._multiarray_umath import __cpu_baseline__ as base, __cpu_features__ as have
level = sys.argv[1]
keep = {"avx2": ("AVX", "F16C", "FMA3", "AVX2", "X86_V3"), "baseline": ()}[level]
print(" ".join(f for f, on in have.items() if on and f not in base and f not in keep
               and f.startswith(("AVX", "FMA", "F16C", "X86_V"))))
PY
}
settings=(native avx2 baseline)
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then settings+=(avx512); fi
verdicts=()
for s in "${settings[@]}"; do
  case $s in
    native) env=() ;;
    avx2) env=(ATEN_CPU_CAPABILITY=avx2 "NPY_DISABLE_CPU_FEATURES=$(above avx2)" OPENBLAS_CORETYPE=Haswell) ;;
    baseline) env=(ATEN_CPU_CAPABILITY=default "NPY_DISABLE_CPU_FEATURES=$(above baseline)" OPENBLAS_CORETYPE=Prescott) ;;
    avx512) env=(ATEN_CPU_CAPABILITY=avx512) ;;
  esac
  echo "== $s: ${env[*]:-(no variables)}" >&2
  out=$(env "${env[@]}" "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_engine_transcript.py "$@" 2>&1) || {
    echo "$out" | tail -30 >&2; echo "test_cpu_kinds.sh: red under $s" >&2; exit 1; }
  echo "$out" | grep -E "SKIPPED|passed|failed" >&2 || true
  verdicts+=("$(echo "$out" | tail -1 | sed -E 's/ in [0-9.]+s.*//')")
done
for v in "${verdicts[@]}"; do
  if [ "$v" != "${verdicts[0]}" ]; then
    echo "test_cpu_kinds.sh: the verdicts differ between settings: ${verdicts[*]}" >&2; exit 1
  fi
done
echo "test_cpu_kinds.sh: the same verdict under ${settings[*]}: ${verdicts[0]}" >&2
