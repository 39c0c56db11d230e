"""Write model folders that hold an architecture's config and a tokenizer, but no weights.

``paczero bench --random-init`` builds a model from its config alone: speed and
memory of a step do not depend on the weights' values. On a machine that can
reach the Hugging Face hub, ``--model facebook/opt-1.3b --random-init`` reads the
hub's config; offline (a GPU node without network, this project's device
machine) these folders stand in for it::

    python benchmarks/arch_folders.py /tmp/arch
    paczero bench --model /tmp/arch/opt-1.3b --random-init --device cuda --dtype bf16 --track lora ft --n 1000

The OPT configs carry the published sizes of OPT-1.3B and OPT-6.7B (Zhang et
al., 2022, table 1: layers, heads, width; feed-forward 4x width; vocabulary
50272; 2048 positions). The tokenizer of every folder is SmolLM2's (the
offline default's, whose ids all fit OPT's vocabulary): OPT's own GPT-2 BPE
tokenizer would cut the same sentences into slightly different lengths.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

OPT = {"opt-1.3b": (2048, 24, 32), "opt-6.7b": (4096, 32, 32)}  # width, layers, heads


SMOLLM2_ARCH = "smollm2-135m-arch"


def write(out: Path, names: tuple[str, ...] = (*OPT, SMOLLM2_ARCH)) -> list[Path]:
    """Write one folder per architecture in ``names`` under ``out``; refuse to touch a non-empty one."""
    from transformers import AutoConfig, OPTConfig

    from paczero.models import SMOLLM2, _smollm2_cached, cache_dir, load_tokenizer

    taken = [out / n for n in names if (out / n).exists() and any((out / n).iterdir())]
    if taken:  # never overwrite what a user wrote
        raise SystemExit(f"error: {taken[0]} exists and is not empty; pick another output folder")
    tokenizer = load_tokenizer("tiny-llama")  # SmolLM2's tokenizer: from its cached copy alone, no weights needed
    made = []
    for name, (width, layers, heads) in OPT.items():
        if name not in names:
            continue
        folder = out / name
        OPTConfig(vocab_size=50272, hidden_size=width, word_embed_proj_dim=width, num_hidden_layers=layers,
                  ffn_dim=4 * width, num_attention_heads=heads, max_position_embeddings=2048,
                  do_layer_norm_before=True, enable_bias=True, activation_function="relu",
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id).save_pretrained(folder)
        made.append(folder)
    if SMOLLM2_ARCH in names:  # SmolLM2-135M's own config (converts the offline default once, if not cached)
        folder = out / SMOLLM2_ARCH
        cached = cache_dir() / SMOLLM2  # its config alone where the converted copy holds one; else convert
        AutoConfig.from_pretrained(cached if (cached / "config.json").exists() else _smollm2_cached("model")
                                   ).save_pretrained(folder)
        made.append(folder)
    for folder in made:
        tokenizer.save_pretrained(folder)
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="output folder (one sub-folder per architecture)")
    ns = p.parse_args(argv)
    for folder in write(ns.out):
        print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
