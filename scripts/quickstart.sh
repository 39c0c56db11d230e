#!/usr/bin/env bash
# Quick start: install, then fine-tune SmolLM2-135M-Instruct with PAC-ZPL (MI = 0) LoRA on the
# shipped demo sentiment set, on CPU. Prints zero-shot vs fine-tuned held-out metrics and the
# privacy statement. Extra arguments are passed to `paczero train` (e.g. --steps 50; --overwrite to
# replace an earlier quick start's run in runs/quickstart).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/paczero train --recipe quickstart/smollm2-demo-zpl-lora --out-dir runs/quickstart "$@"
cat <<'NEXT'

The run is in runs/quickstart/ (its released model in runs/quickstart/model/). Next, in this shell:
  source .venv/bin/activate
  paczero eval runs/quickstart                  # the released weights on dev and test again
  paczero audit runs/quickstart --heldout       # the loss attack: U's sentences against held-out ones
  python examples/use_released_model.py runs/quickstart/model paczero/data/demo_sentiment.jsonl
                                                # plain transformers + peft, offline (the file's test rows)
  paczero train --help                          # every setting; README.md: training on your own file
NEXT
