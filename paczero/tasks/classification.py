"""Prompted classification with verbalizers (SST-2 and friends).

Each example becomes ``template.format(**example)``, every field stripped of
surrounding whitespace first (GLUE's SST-2 sentences end in a space, which the
paper's template strips: ``"<sentence> It was"``, no doubled space), and each
class an option string (the verbalizer). A class score is the mean log-probability of the
option's tokens after the prompt (log-softmax over the full vocabulary); the
per-sample loss is the cross-entropy of the label over the class scores and the
prediction is their argmax.

When every option is one token, one forward of the prompt alone gives all
scores: left padding puts the prediction position last, and only the option
tokens' logits at that position are computed (for a tied LM head, only their
rows of the head; :func:`paczero.tasks.batching.token_logits`). The scores are
then those logits: they differ from the option log-probabilities by the
full-vocabulary normaliser, one constant per row, which cancels in the
cross-entropy over classes and in the argmax, so the loss and the prediction
are the ones of the log-probabilities without ever touching the vocabulary.
Otherwise every option is still scored from one forward of the prompt: the options
follow the prompt in one row, each seeing the prompt and its own earlier tokens
only (:mod:`paczero.tasks.options`), so a step's cost barely grows with the
number of classes. ``scoring="per_candidate"`` (and a model whose attention
:func:`paczero.tasks.options.packs` does not know) gives each example one row per
option (``prompt + option[:-1]``), the last ``max option length`` positions
scoring the option tokens: the same scores, one forward per option.
"""

from __future__ import annotations

import string
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from paczero.tasks.batching import (
    Batch,
    Encoded,
    collect,
    forward_logits,
    left_pad,
    OWN,
    model_device,
    own_padding,
    pad_token_id,
    plan_batches,
    prompt_prefix,
    right_align,
    target_logprobs,
    token_logits,
    is_cut,
    tokenize,
    truncate_left,
)
from paczero.tasks.options import OptionLayout, mask_for, option_logprobs, packs
from paczero.tasks.options import positions as packed_positions

SST2_TEMPLATE = "{sentence} It was"
SST2_VERBALIZER = {0: " terrible", 1: " great"}


def template_fields(template: str) -> list[str]:
    """The ``{placeholder}`` names of a format template."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


class ClassificationTask:
    """Prompted classification scored through verbalizer tokens.

    ``scoring`` is ``"auto"`` (one forward per example: of the prompt alone when every option is a
    single token, else of the prompt with every option packed after it) or ``"per_candidate"`` (one row
    per option; same losses, one forward per option; kept for tests and checks).
    ``label_names`` names the classes (label i is the i-th name): an example's
    label may then be its name. The answer words are the verbalizer's, whatever the names (default: SST-2's
    ``" terrible"``/``" great"`` for two classes; more classes need a verbalizer).
    """

    metric = "accuracy"

    def __init__(
        self,
        tokenizer,
        template: str = SST2_TEMPLATE,
        verbalizer: Mapping[int, str] | None = None,
        max_length: int = 512,
        scoring: str = "auto",
        name: str = "sst2",
        label_names: Sequence[str] | None = None,
        fill_batches: bool = False,
    ):
        if label_names is not None:
            label_names = [str(n).strip() for n in label_names]
            if len(label_names) < 2 or len(set(label_names)) < len(label_names) or not all(label_names):
                raise ValueError(f"labels must be at least two distinct non-empty names, got {label_names}")
            if verbalizer is None and len(label_names) != len(SST2_VERBALIZER):
                raise ValueError(f"{len(label_names)} labels need their answer words: give a verbalizer (e.g. "
                                 + ",".join(f"{i}= {n}" for i, n in enumerate(label_names)) + ")")
            if verbalizer is not None and {int(k) for k in verbalizer} != set(range(len(label_names))):
                raise ValueError(f"the verbalizer's labels {sorted(verbalizer)} are not the positions 0.."
                                 f"{len(label_names) - 1} of the {len(label_names)} label names")
        self.label_names = label_names
        verbalizer = dict(SST2_VERBALIZER if verbalizer is None else verbalizer)
        if len(verbalizer) < 2:
            raise ValueError(f"verbalizer needs at least 2 classes, got {verbalizer}")
        try:
            verbalizer = {int(k): str(v) for k, v in verbalizer.items()}
        except (TypeError, ValueError):
            raise ValueError(f"verbalizer keys must be integer labels, got {list(verbalizer)}") from None
        if scoring not in ("auto", "per_candidate"):
            raise ValueError(f"scoring must be 'auto' or 'per_candidate', got {scoring!r}")
        if not template_fields(template):
            raise ValueError(f"template has no {{placeholder}}: {template!r}")
        self.name = name
        self.tokenizer = tokenizer
        self.template = template
        self.fill_batches = bool(fill_batches)
        self.verbalizer = verbalizer
        self.labels = sorted(verbalizer)
        self.max_length = int(max_length)
        self.pad_id = pad_token_id(tokenizer)
        self.prefix = prompt_prefix(tokenizer)
        self.option_ids = tokenize(tokenizer, [verbalizer[k] for k in self.labels])
        empty = [verbalizer[k] for k, ids in zip(self.labels, self.option_ids) if not ids]
        if empty:
            raise ValueError(f"verbalizer options tokenise to nothing: {empty}")
        self.single_token = scoring == "auto" and all(len(ids) == 1 for ids in self.option_ids)
        self.max_option_len = max(len(ids) for ids in self.option_ids)
        self._option_tensor = torch.tensor([ids[0] for ids in self.option_ids]) if self.single_token else None
        #: multi-token options in one row after the prompt (None: one token each, or one row per option)
        self.layout = OptionLayout(self.option_ids) if scoring == "auto" and not self.single_token else None

    def __repr__(self) -> str:
        return f"ClassificationTask({self.name!r}, template={self.template!r}, verbalizer={self.verbalizer!r})"

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    # -- encoding and batching ----------------------------------------------
    def encode(self, examples: Sequence[Mapping]) -> list[Encoded]:
        """Tokenise ``examples`` (dicts with the template's fields and ``label``) once."""
        fields = template_fields(self.template)
        position = {label: i for i, label in enumerate(self.labels)}
        prompts, labels = [], []
        for i, ex in enumerate(examples):
            missing = [f for f in fields + ["label"] if f not in ex]
            if missing:
                raise ValueError(f"example {i} lacks {missing} (has {sorted(ex)})")
            label = ex["label"]
            if self.label_names and isinstance(label, str) and label.strip() in self.label_names:
                label = self.label_names.index(label.strip())
            try:
                label = int(label)
            except (TypeError, ValueError):
                raise ValueError(f"example {i}: label {ex['label']!r} is not an integer") from None
            if label not in position:
                raise ValueError(f"example {i}: label {label} not in the verbalizer labels {self.labels}")
            prompts.append(self.template.format_map({f: str(ex[f]).strip() for f in fields}))
            labels.append(position[label])
        room = self.max_length - (self.max_option_len - 1)
        prompt_ids = tokenize(self.tokenizer, prompts)
        self.truncated = sum(is_cut(ids, room, self.prefix) for ids in prompt_ids)  # of this call's examples
        return [
            Encoded(prompt_ids=np.asarray(truncate_left(ids, room, self.prefix), dtype=np.int64), label=label)
            for ids, label in zip(prompt_ids, labels)
        ]

    def make_batches(self, enc: Sequence[Encoded], token_budget: int = 4096, indices=None,
                     max_padding: float | str | None = OWN) -> list[Batch]:
        """Left-padded micro-batches of at most ``token_budget`` padded tokens (>= 1 example); ``max_padding``
        (default: the task's own, batching.own_padding) as plan_batches takes it."""
        max_padding = own_padding(self, max_padding)
        if self.single_token:
            lengths = [len(e.prompt_ids) for e in enc]
            groups = plan_batches(lengths, token_budget, 1, indices, max_padding)
            return [self._single_batch(enc, g) for g in groups]
        if self.layout is not None:
            lengths = [len(e.prompt_ids) + len(self.layout.suffix) for e in enc]
            groups = plan_batches(lengths, token_budget, 1, indices, max_padding)
            return [self._packed_batch(enc, g) for g in groups]
        lengths = [len(e.prompt_ids) + self.max_option_len - 1 for e in enc]
        groups = plan_batches(lengths, token_budget, self.num_classes, indices, max_padding)
        return [self._candidate_batch(enc, g) for g in groups]

    def _packed_batch(self, enc, group) -> Batch:
        """One row per example, ``prompt + every option[:-1]`` (:mod:`paczero.tasks.options`); the 2D mask marks
        the real tokens (the 4D one is formed for the model at scoring)."""
        ids, mask, _ = left_pad([list(enc[i].prompt_ids) + self.layout.suffix for i in group], self.pad_id)
        labels = torch.tensor([enc[i].label for i in group], dtype=torch.int64)
        return Batch(index=group, input_ids=ids, attention_mask=mask,
                     position_ids=packed_positions(mask, self.layout), labels=labels)

    def _single_batch(self, enc, group) -> Batch:
        ids, mask, pos = left_pad([enc[i].prompt_ids for i in group], self.pad_id)
        labels = torch.tensor([enc[i].label for i in group], dtype=torch.int64)
        return Batch(index=group, input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels)

    def _candidate_batch(self, enc, group, prompts=None) -> Batch:
        rows, targets = [], []
        for n, i in enumerate(group):
            prompt = list(enc[i].prompt_ids) if prompts is None else prompts[n]
            for option in self.option_ids:
                rows.append(prompt + option[:-1])
                targets.append(option)
        ids, mask, pos = left_pad(rows, self.pad_id)
        tgt, tgt_mask = right_align(targets)
        labels = None if enc is None else torch.tensor([enc[i].label for i in group], dtype=torch.int64)
        return Batch(
            index=group, input_ids=ids, attention_mask=mask, position_ids=pos,
            labels=labels, targets=tgt, target_mask=tgt_mask,
        )

    # -- scoring --------------------------------------------------------------
    def scores(self, model, batch: Batch) -> torch.Tensor:
        """Class scores ``[B, C]``, fp32: the mean option log-prob, or for single-token options their
        logits (the log-probs up to one constant per row: same cross-entropy over classes, same argmax)."""
        if batch.targets is not None:
            return target_logprobs(model, batch).view(len(batch.index), self.num_classes)
        if self.layout is None:
            return token_logits(model, batch, self._option_tensor)
        if not packs(model):  # the same scores, one row per option
            return self.scores(model, self._unpacked(batch))
        logits = forward_logits(model, batch, self.layout.keep,
                                attention_mask=mask_for(model, batch.attention_mask, self.layout))
        return option_logprobs(logits, self.layout)

    def _unpacked(self, batch: Batch) -> Batch:
        """A packed batch as one row per option (for a model that does not read packed rows)."""
        cut = len(self.layout.suffix)
        prompts = [row[m.bool()].tolist()[:-cut] for row, m in zip(batch.input_ids.cpu(), batch.attention_mask.cpu())]
        out = self._candidate_batch(None, batch.index, prompts)
        out.labels = batch.labels
        return out.to(batch.input_ids.device)

    def losses(self, model, batch: Batch) -> torch.Tensor:
        """Per-sample training loss ``[B]``: cross-entropy of the label over the class scores."""
        return F.cross_entropy(self.scores(model, batch), batch.labels, reduction="none")

    def evaluate(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> dict[str, float]:
        """Mean loss and accuracy (fraction in [0, 1]) over ``enc``, batched."""
        loss, correct, _ = self._scored(model, enc, token_budget)
        return {"loss": float(loss.mean()), "accuracy": float(correct.mean())}

    def report(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> dict:
        """:meth:`evaluate`'s loss and accuracy (the same numbers) and, from the same pass, each class's
        precision, recall, F1 and support and the confusion matrix (:func:`class_report`)."""
        loss, correct, probs = self._scored(model, enc, token_budget)
        truth = [e.label for e in enc]
        return {"loss": float(loss.mean()), "accuracy": float(correct.mean()),
                **class_report(truth, probs.argmax(dim=-1).tolist(), self.class_names())}

    def probabilities(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> np.ndarray:
        """``[len(enc), classes]`` class probabilities (the softmax of the class scores, whose cross-entropy is
        the loss), in ``enc``'s order; column i is class ``self.labels[i]``."""
        return self._scored(model, enc, token_budget)[2].numpy()

    def class_names(self) -> list[str]:
        """Each class's name, in class order: the label names where given, else the integer labels."""
        return list(self.label_names) if self.label_names else [str(k) for k in self.labels]

    def _scored(self, model, enc: Sequence[Encoded], token_budget: int):
        """Per-example loss and 0/1 correctness ``[N]`` and class probabilities ``[N, C]`` (CPU fp32), in order."""
        if not enc:
            raise ValueError("evaluate needs at least one example")
        device = model_device(model)
        batches = self.make_batches(enc, token_budget)
        losses, correct = [], []
        probs = torch.full((len(enc), self.num_classes), float("nan"), dtype=torch.float32)
        with torch.inference_mode():
            for batch in batches:
                batch = batch.to(device)
                scores = self.scores(model, batch)
                losses.append(F.cross_entropy(scores, batch.labels, reduction="none"))
                correct.append((scores.argmax(dim=-1) == batch.labels).float())
                probs[torch.from_numpy(batch.index)] = torch.softmax(scores.float(), dim=-1).cpu()
        return collect(losses, batches, len(enc)), collect(correct, batches, len(enc)), probs

    def predict(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> np.ndarray:
        """Predicted labels (verbalizer keys) for ``enc``, in order."""
        device = model_device(model)
        batches = self.make_batches(enc, token_budget)
        preds = []
        with torch.inference_mode():
            for batch in batches:
                preds.append(self.scores(model, batch.to(device)).argmax(dim=-1).float())
        positions = collect(preds, batches, len(enc)).long().numpy()
        return np.asarray(self.labels)[positions]


def class_report(truth: Sequence[int], predicted: Sequence[int], names: Sequence[str]) -> dict:
    """Per-class ``precision``, ``recall``, ``f1`` and ``support`` (rows of that class), keyed by class name, and
    the ``confusion`` matrix (its ``rows`` the true label, its ``columns`` the predicted one, both in ``names``'
    order, and the matrix names its axes so) of class positions ``truth`` against ``predicted``. A class never predicted has precision 0 (and F1 0)."""
    k = len(names)
    matrix = [[0] * k for _ in range(k)]
    for t, p in zip(truth, predicted):
        matrix[int(t)][int(p)] += 1
    per_class = {}
    for i, name in enumerate(names):
        hit, said, support = matrix[i][i], sum(row[i] for row in matrix), sum(matrix[i])
        precision = hit / said if said else 0.0
        recall = hit / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[str(name)] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    return {"per_class": per_class, "confusion": {"rows": "true label", "columns": "predicted label",
                                                  "labels": [str(n) for n in names], "matrix": matrix}}
