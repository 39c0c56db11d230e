"""The secret index, the posterior, the design and the private generator state stay in the private files
(checkpoints' private.json and the run's journal.jsonl, both mode 0600).

A tiny PAC-MI run through the CLI with a known private seed; then every
artefact of the run (log.jsonl, evals.jsonl, run.json, summary.json, public.json,
manifests, weights, the saved model, the CLI's stdout and stderr including the
progress bar) is searched for the secret's tell-tale fields. y~ and the released
bits are public by design.
"""
from __future__ import annotations

import json
import stat

import numpy as np
import torch

from paczero.checkpoint import decode
from paczero.cli import main

FORBIDDEN = ("secret", "j_star", "posterior", "log_posterior", "signs", "rng_state", "design")


def _keys(obj, out: set) -> set:
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(k)
            _keys(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _keys(v, out)
    return out


def _json_values(path):
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return [json.loads(text)]


def test_secrets_stay_in_private_files(tmp_path, capsys):
    torch.set_num_threads(1)
    run = tmp_path / "run"
    args = ["train", "--model", "tiny-llama", "--task", "demo", "--n-train", "16", "--n-dev", "4", "--n-test", "4",
            "--steps", "6", "--num-subsets", "8", "--mechanism", "pac-mi", "--mi-budget", "1.0", "--eval-every", "3",
            "--checkpoint-every", "2", "--private-seed", "11", "--progress", "--out-dir", str(run)]
    assert main(args) == 0
    captured = capsys.readouterr()
    console = captured.out + captured.err

    private_files = sorted(run.glob("checkpoints/*/private.json"))
    assert private_files
    assert stat.S_IMODE((run / "private" / "journal.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((run / "private").stat().st_mode) == 0o700
    for p in private_files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE((run / "checkpoints").stat().st_mode) == 0o700
    raw = json.loads(private_files[-1].read_text())["mechanism"]
    state = decode(raw)
    secret = state["secret"]
    assert isinstance(secret, int) and 0 <= secret < 8 and "log_posterior" in state
    design_b64 = raw["design"]["__ndarray__"]
    rng_word = state["rng_state"]["key"]  # the key of the private stream
    log_post = state["log_posterior"]

    blobs = {"console": console.encode()}
    for path in run.rglob("*"):
        # the saved tokenizer is the public vocabulary (it holds words such as "secret"): skipped
        if path.is_file() and path.name not in ("private.json", "journal.jsonl") \
                and not path.name.startswith(("tokenizer", "chat_template")):
            blobs[str(path.relative_to(run))] = path.read_bytes()
            if path.suffix in (".json", ".jsonl"):
                for value in _json_values(path):
                    bad = sorted(k for k in _keys(value, set()) if k in FORBIDDEN or k.endswith(("posterior", "signs")))
                    assert not bad, (path, bad)
    assert {"log.jsonl", "evals.jsonl", "run.json", "summary.json", "selected.safetensors"} <= set(blobs)
    assert any(name.endswith("public.json") for name in blobs)
    for name, data in blobs.items():
        for key in FORBIDDEN:
            assert f'"{key}"'.encode() not in data, (name, key)
        assert design_b64.encode() not in data, name
        assert rng_word.encode() not in data, name
        for x in log_post[log_post != log_post.max()]:
            assert repr(float(x)).encode() not in data, name
    # the transcript is public by design and is there
    rec = json.loads((run / "log.jsonl").read_text().splitlines()[0])
    assert "y_tilde" in rec and "bit" in rec
