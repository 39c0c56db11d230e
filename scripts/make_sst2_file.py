"""Write SST-2 as one file in the paper's protocol: the training sentences as split "train" (U and dev are drawn
from them) and GLUE's validation sentences as split "test".

    python scripts/make_sst2_file.py SST2_FOLDER OUT.jsonl

SST2_FOLDER holds train.jsonl and validation.jsonl, rows {"text", "label"} (as the data folder beside this
project does); OUT.jsonl gets rows {"text", "label", "split"}. An existing OUT is not overwritten.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    folder, out = Path(argv[0]), Path(argv[1])
    if out.exists():
        print(f"make_sst2_file: {out} exists; remove it or name another file", file=sys.stderr)
        return 2
    rows = []
    for name, split in (("train.jsonl", "train"), ("validation.jsonl", "test")):
        path = folder / name
        if not path.is_file():
            print(f"make_sst2_file: {path} is missing", file=sys.stderr)
            return 2
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                rows.append({"text": record["text"], "label": int(record["label"]), "split": split})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {out}: {sum(r['split'] == 'train' for r in rows)} train, {sum(r['split'] == 'test' for r in rows)} "
          "test rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
