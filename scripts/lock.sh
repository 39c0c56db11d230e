#!/usr/bin/env bash
# Refresh constraints.txt: resolve pyproject.toml's ranges afresh in a new virtual environment
# (torch stays at the setup's 2.13.0 CPU wheel), run the whole suite there, and only if it passes
# write the resolved versions, with the date, to constraints.txt. Run it by hand or on a schedule
# (e.g. weekly cron: `bash scripts/lock.sh && git commit -am "constraints: refresh"`).
# Extra arguments go to pytest (e.g. -x). Exit status: the suite's.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(mktemp -d "${TMPDIR:-/tmp}/paczero-lock.XXXXXX")
trap 'rm -rf "$VENV"' EXIT
export VENV CONSTRAINTS=""
if ! bash scripts/test.sh "$@"; then
  echo "lock.sh: the suite failed with the newest versions the ranges admit; constraints.txt is unchanged" >&2
  exit 1
fi
{
  echo "# The exact versions the whole suite last passed with (scripts/lock.sh, $(date -u +%Y-%m-%d), Python $("$VENV/bin/python" -c 'import platform; print(platform.python_version())'))."
  echo "# Used by scripts/setup.sh as pip constraints; pyproject.toml keeps ranges for library users."
  "$VENV/bin/python" -m pip freeze --exclude-editable --all | grep -v -i -E "^(paczero|setuptools|wheel)==" | sed -E "s/^(torch==[^+]*)\+.*/\1/"
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "lock.sh: wrote constraints.txt" >&2
