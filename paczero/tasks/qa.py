"""Extractive question answering (SQuAD v1.1) as generation.

Prompt ``"Title: {title}\\nContext: {context}\\nQuestion: {question}\\nAnswer:"``,
target ``" {first answer}\\n"``. Two training objectives:

- ``"nll"`` (default): the teacher-forced mean negative log-likelihood of the
  target tokens; one forward of ``prompt + target[:-1]`` per example, with only
  the last ``max target length`` positions projected through the LM head.
- ``"f1"``: minus the token F1 of a greedy generation (the paper's
  non-differentiable objective); costs a ``generate`` call per batch.

Generation (the f1 objective and evaluation) is greedy, at most
``max_new_tokens`` tokens, and ends where ``answer_stop`` says:

- ``"newline-token"`` (default; the paper's scripts): at the tokenizer's
  newline token (the last id of ``"\n"`` encoded alone) or EOS; the answer is
  the decoded text up to and including that token, stripped. A token that merely
  contains a newline (``"\n\n"``) does not end it.
- ``"any-newline"``: at any token whose text contains a newline, or EOS; the
  answer is the first line, stripped.

Prompts lose tokens from the left (the question stays) so that a prompt plus
``max_new_tokens`` generated tokens, and a prompt plus its target, fit
``max_length`` (2048, as the scripts). Evaluation reports SQuAD-normalised F1
and exact match as fractions in [0, 1], the maximum over the gold answers, plus
the answer NLL as ``loss``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Mapping, Sequence

import numpy as np
import torch

from paczero.tasks.batching import (
    Batch,
    Encoded,
    collect,
    left_pad,
    OWN,
    model_device,
    own_padding,
    pad_token_id,
    plan_batches,
    prompt_prefix,
    target_logprobs,
    teacher_forced_batches,
    is_cut,
    tokenize,
    truncate_left,
)
from paczero.tasks.classification import template_fields

SQUAD_TEMPLATE = "Title: {title}\nContext: {context}\nQuestion: {question}\nAnswer:"
OBJECTIVES = ("nll", "f1")
ANSWER_STOPS = ("newline-token", "any-newline")

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, squeeze spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_score(prediction: str, gold: str) -> float:
    """Token-overlap F1 of two answers after normalisation."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def best_f1(prediction: str, golds: Sequence[str]) -> float:
    return max(f1_score(prediction, g) for g in golds)


def best_em(prediction: str, golds: Sequence[str]) -> float:
    return max(exact_match(prediction, g) for g in golds)


class _StopAtNewline:
    """Marks a row finished once its last token contains a newline.

    ``generate`` keeps finished rows finished (padding them), so stopping is
    per row and generation ends when every row has produced a newline or EOS.
    """

    def __init__(self, stop_mask: torch.Tensor):
        self.stop_mask = stop_mask

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        mask = self.stop_mask.to(input_ids.device)
        last = input_ids[:, -1].clamp(0, len(mask) - 1)
        return mask[last]


class SquadTask:
    """SQuAD v1.1 with a teacher-forced NLL or a generation-F1 training loss."""

    metric = "f1"

    def __init__(
        self,
        tokenizer,
        objective: str = "nll",
        max_new_tokens: int = 50,
        max_length: int = 2048,
        template: str = SQUAD_TEMPLATE,
        answer_stop: str = "newline-token",
        fill_batches: bool = False,
    ):
        if objective not in OBJECTIVES:
            raise ValueError(f"SQuAD objective must be one of {OBJECTIVES}, got {objective!r}")
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if int(max_length) <= int(max_new_tokens):
            raise ValueError(f"max_length ({max_length}) must exceed max_new_tokens ({max_new_tokens})")
        if answer_stop not in ANSWER_STOPS:
            raise ValueError(f"answer_stop must be one of {ANSWER_STOPS}, got {answer_stop!r}")
        self.name = "squad"
        self.fill_batches = bool(fill_batches)
        self.tokenizer = tokenizer
        self.objective = objective
        self.max_new_tokens = int(max_new_tokens)
        self.max_length = int(max_length)
        self.template = template
        self.answer_stop = answer_stop
        self.pad_id = pad_token_id(tokenizer)
        self.prefix = prompt_prefix(tokenizer)
        self._stop_mask = None

    def __repr__(self) -> str:
        return (f"SquadTask(objective={self.objective!r}, max_new_tokens={self.max_new_tokens}, "
                f"max_length={self.max_length}, answer_stop={self.answer_stop!r})")

    # -- encoding and batching ----------------------------------------------
    def encode(self, examples: Sequence[Mapping]) -> list[Encoded]:
        """Tokenise prompts and first-answer targets once; keep every gold answer."""
        fields = template_fields(self.template)
        prompts, targets, golds = [], [], []
        for i, ex in enumerate(examples):
            missing = [f for f in fields + ["answers"] if f not in ex]
            if missing:
                raise ValueError(f"example {i} lacks {missing} (has {sorted(ex)})")
            answers = ex["answers"]
            if isinstance(answers, Mapping):
                answers = answers.get("text")
            answers = [answers] if isinstance(answers, str) else [str(a) for a in (answers or [])]
            if not answers:
                raise ValueError(f"example {i} has no answers")
            prompts.append(self.template.format_map({f: ex[f] for f in fields}))
            targets.append(f" {answers[0]}\n")
            golds.append(tuple(answers))
        encoded = []
        self.truncated = 0  # of this call's examples
        for ids, target, answers in zip(tokenize(self.tokenizer, prompts), tokenize(self.tokenizer, targets), golds):
            # the prompt fits max_length with its target (teacher forcing) and with a generated answer
            room = max(self.max_length - max(len(target) - 1, self.max_new_tokens), 1)
            self.truncated += is_cut(ids, room, self.prefix)
            encoded.append(Encoded(
                prompt_ids=np.asarray(truncate_left(ids, room, self.prefix), dtype=np.int64),
                target_ids=np.asarray(target, dtype=np.int64),
                answers=answers,
            ))
        return encoded

    def make_batches(self, enc: Sequence[Encoded], token_budget: int = 4096, indices=None,
                     max_padding: float | str | None = OWN) -> list[Batch]:
        """Micro-batches for the training objective (teacher-forced rows or generation prompts)."""
        max_padding = own_padding(self, max_padding)
        if self.objective == "nll":
            return self._nll_batches(enc, token_budget, indices, max_padding)
        return self._generation_batches(enc, token_budget, indices, max_padding)

    def _nll_batches(self, enc, token_budget, indices=None, max_padding=OWN) -> list[Batch]:
        return teacher_forced_batches(enc, self.pad_id, token_budget, indices, own_padding(self, max_padding))

    def _generation_batches(self, enc, token_budget, indices=None, max_padding=OWN) -> list[Batch]:
        lengths = [len(e.prompt_ids) + self.max_new_tokens for e in enc]
        batches = []
        for group in plan_batches(lengths, token_budget, 1, indices, own_padding(self, max_padding)):
            ids, mask, pos = left_pad([enc[i].prompt_ids for i in group], self.pad_id)
            batches.append(Batch(
                index=group, input_ids=ids, attention_mask=mask, position_ids=pos,
                answers=tuple(enc[i].answers for i in group),
            ))
        return batches

    # -- losses, generation, evaluation ---------------------------------------
    def losses(self, model, batch: Batch) -> torch.Tensor:
        """Per-sample training loss ``[B]`` (fp32): answer NLL, or minus generation F1."""
        if batch.targets is not None:
            return -target_logprobs(model, batch)
        predictions = self.generate(model, batch)
        negative_f1 = [0.0 - best_f1(p, golds) for p, golds in zip(predictions, batch.answers)]
        return torch.tensor(negative_f1, dtype=torch.float32, device=batch.input_ids.device)

    def generate(self, model, batch: Batch) -> list[str]:
        """Greedy answers for a batch of prompts, ended as ``answer_stop`` says (module docstring)."""
        from transformers import GenerationConfig, StoppingCriteriaList

        eos = self.tokenizer.eos_token_id
        stops = [i for i in (self.newline_id() if self.answer_stop == "newline-token" else None, eos) if i is not None]
        config = GenerationConfig(
            max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1,
            pad_token_id=self.pad_id, eos_token_id=stops or None,
        )
        criteria = [] if self.answer_stop == "newline-token" else [_StopAtNewline(self.stop_mask())]
        with torch.inference_mode():
            out = model.generate(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                generation_config=config,
                stopping_criteria=StoppingCriteriaList(criteria),
            )
        new_tokens = out[:, batch.input_ids.shape[1]:].tolist()
        if self.answer_stop == "any-newline":
            texts = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            return [text.split("\n", 1)[0].strip() for text in texts]
        # a finished row is padded to the batch's length: read each up to its first stop token
        rows = [row[:next((k + 1 for k, t in enumerate(row) if t in stops), len(row))] for row in new_tokens]
        return [text.strip() for text in self.tokenizer.batch_decode(rows, skip_special_tokens=True)]

    def newline_id(self) -> int:
        """The newline token: the last id of ``"\\n"`` encoded alone (as the paper's scripts find it)."""
        return self.tokenizer("\n", add_special_tokens=False)["input_ids"][-1]

    def stop_mask(self) -> torch.Tensor:
        """Boolean mask over the vocabulary of tokens whose text contains a newline (``"any-newline"``)."""
        if self._stop_mask is None:
            vocab = len(self.tokenizer)
            texts = self.tokenizer.batch_decode([[i] for i in range(vocab)])
            self._stop_mask = torch.tensor(["\n" in t for t in texts], dtype=torch.bool)
        return self._stop_mask

    def evaluate(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> dict[str, float]:
        """Answer NLL (``loss``) and greedy-generation ``f1``/``em`` (fractions), batched."""
        if not enc:
            raise ValueError("evaluate needs at least one example")
        device = model_device(model)
        nll_batches = self._nll_batches(enc, token_budget)
        gen_batches = self._generation_batches(enc, token_budget)
        nll, f1, em = [], [], []
        with torch.inference_mode():
            for batch in nll_batches:
                nll.append(-target_logprobs(model, batch.to(device)))
            for batch in gen_batches:
                predictions = self.generate(model, batch.to(device))
                f1.append(torch.tensor([best_f1(p, g) for p, g in zip(predictions, batch.answers)]))
                em.append(torch.tensor([best_em(p, g) for p, g in zip(predictions, batch.answers)]))
        return {
            "loss": float(collect(nll, nll_batches, len(enc)).mean()),
            "f1": float(collect(f1, gen_batches, len(enc)).mean()),
            "em": float(collect(em, gen_batches, len(enc)).mean()),
        }

    def predict(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> list[str]:
        """Greedy answers for ``enc``, in order."""
        device = model_device(model)
        answers: list[str] = [""] * len(enc)
        for batch in self._generation_batches(enc, token_budget):
            for i, text in zip(batch.index, self.generate(model, batch.to(device))):
                answers[i] = text
        return answers
