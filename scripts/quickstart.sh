#!/usr/bin/env bash
# Quick start: install, then fine-tune SmolLM2-135M-Instruct with PAC-ZPL (MI = 0) LoRA on the
# shipped demo sentiment set, on CPU. Prints zero-shot vs fine-tuned held-out metrics and the
# privacy statement. Extra arguments are passed to `paczero train` (e.g. --steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/paczero train --recipe quickstart/smollm2-demo-zpl-lora --out-dir runs/quickstart --overwrite "$@"
