"""The engine's output is pinned: fixed-seed runs reproduce a stored transcript and stored weights.

``tests/data/engine_transcripts.json`` holds, for each run below, the public records of its log
(minus the step time; ``train_loss``, a float32 diagnostic, rounded to 5 digits), the sha256 of its
selected weights and its privacy statement's MI fields, as produced by the engine when the file was
written (``python tests/test_engine_transcript.py`` rewrites it; do that only for a change that is
meant to move z or the arithmetic, and say so in the commit). z on CPU comes from torch's generator
per chunk. Red on any change to z, to the perturbation or update arithmetic, to the scalars, to the
mechanisms or to the private stream.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from paczero.config import TrainConfig
from paczero.train import train

DATA = Path(__file__).parent / "data" / "engine_transcripts.json"
BASE = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=6, num_subsets=8,
            eval_every=3, checkpoint_every=3, private_seed=5, seed=2, progress=False, eval_zero_shot=False,
            device="cpu", mu=1e-2, lr=1e-2)
RUNS = {
    "ft-pac-mi-k2": dict(track="ft", mechanism="pac-mi", mi_budget=0.5, num_directions=2),
    "lora-pac-zpl-opt": dict(model="tiny-opt", track="lora", mechanism="pac-zpl"),
    "ft-dpzero": dict(track="ft", mechanism="dpzero", epsilon=2.0, sample_rate=0.5),
}


def _run(name: str, out: Path) -> dict:
    torch.set_num_threads(1)
    cfg = TrainConfig(**{**BASE, **RUNS[name]}, out_dir=str(out))
    summary = train(cfg, log=lambda *a: None)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    for r in records:
        r.pop("seconds")
        if r["train_loss"] is not None:
            r["train_loss"] = float(f"{r['train_loss']:.5g}")
    weights = hashlib.sha256((out / "selected.safetensors").read_bytes()).hexdigest()
    privacy = {k: summary["privacy"].get(k) for k in ("mi_bound", "mia_bound", "mi_spent", "epsilon_rdp")}
    return {"records": records, "selected_sha256": weights, "privacy": privacy}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_seed_run_reproduces_the_stored_transcript(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    threads = torch.get_num_threads()
    try:
        got = _run(name, tmp_path / name)
    finally:
        torch.set_num_threads(threads)
    want = json.loads(DATA.read_text())[name]
    assert got["records"] == want["records"]
    assert got["privacy"] == want["privacy"]
    assert got["selected_sha256"] == want["selected_sha256"]


if __name__ == "__main__":  # rewrite the stored transcripts with the engine as it is
    import os
    import tempfile

    os.environ["PACZERO_TORCH_DIRECTIONS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        stored = {name: _run(name, Path(tmp) / name) for name in sorted(RUNS)}
    DATA.write_text(json.dumps(stored, indent=1) + "\n")
    print(f"wrote {DATA}", file=sys.stderr)
