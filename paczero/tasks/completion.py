"""Prompt -> completion fine-tuning: the loss is the NLL of the completion tokens only.

An example is a ``prompt`` and its ``completion`` (plain text), or a ``messages`` conversation (a list of
``{"role", "content"}``) ending in an assistant message, rendered with the tokenizer's chat template:

- plain: the model input is the prompt's tokens (after the BOS the tokenizer adds by default, if any),
  the target is the completion's tokens followed by the EOS token. The completion is appended to the
  prompt as written: no separator is added (write it into one of them, e.g. ``"...\\nAgent:"`` and
  ``" Hello"``).
- chat: the prompt is ``apply_chat_template(messages[:-1], add_generation_prompt=True)``, the target is
  what the template adds for the last (assistant) message, its end-of-turn token included; the
  template writes every special token, so no BOS is added.

The per-sample loss is the **mean** negative log-likelihood per completion token of the example (a
sum would weight long completions more): one forward of ``prompt + completion[:-1]``, with only the
last ``max completion length`` positions projected through the LM head. The prompt tokens are context,
never scored. Examples longer than ``max_length`` lose prompt tokens from the left (the completion
stays whole; a completion longer than ``max_length - 1`` tokens is itself cut at its end).

Evaluation reports the mean of those per-example NLLs (``loss``, what training lowers and dev-best
selection reads), the NLL per completion token over all tokens (``nll_per_token``) and its
``perplexity``; when the examples carry reference answers, also greedy-generation ``em`` and ``f1``
(SQuAD normalisation, fractions), generation ending at the EOS token or after ``max_new_tokens``.
"""

from __future__ import annotations

import math
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
    tokenize,
    truncate_left,
)
from paczero.tasks.qa import best_em, best_f1


def render_chat(tokenizer, messages: Sequence[Mapping]) -> tuple[str, str]:
    """``(prompt, completion)`` text of a conversation through the tokenizer's chat template: the
    conversation before its last (assistant) message with the generation prompt, and what the template
    adds for that last message."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: give prompt and completion columns instead "
                         "of messages")
    messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt) or len(full) == len(prompt):
        raise ValueError("the chat template does not render the conversation as its prompt followed by the "
                         "last message; give prompt and completion columns instead of messages")
    return prompt, full[len(prompt):]


class CompletionTask:
    """Prompt -> completion (or chat) with the completion NLL as the per-sample loss."""

    metric = "loss"  # the completion NLL: lower is better (dev-best selection keeps the lowest)

    def __init__(self, tokenizer, max_length: int = 2048, max_new_tokens: int = 50, name: str = "completion",
                 fill_batches: bool = False):
        if int(max_length) < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.name = name
        self.tokenizer = tokenizer
        self.fill_batches = bool(fill_batches)
        self.max_length = int(max_length)
        self.max_new_tokens = int(max_new_tokens)
        self.pad_id = pad_token_id(tokenizer)
        self.prefix = prompt_prefix(tokenizer)
        self.eos = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []

    def __repr__(self) -> str:
        return f"CompletionTask(max_length={self.max_length}, max_new_tokens={self.max_new_tokens})"

    # -- encoding and batching ----------------------------------------------
    def encode(self, examples: Sequence[Mapping]) -> list[Encoded]:
        """Tokenise prompts and completions once (``prompt``/``completion`` or ``messages``; optional
        ``answers``, the reference answers of an exact-match / F1 evaluation)."""
        prompts, completions, chat, golds = [], [], [], []
        for i, ex in enumerate(examples):
            if ex.get("messages") is not None:
                prompt, completion = render_chat(self.tokenizer, ex["messages"])
                chat.append(True)
            elif ex.get("prompt") is not None and ex.get("completion") is not None:
                prompt, completion = str(ex["prompt"]), str(ex["completion"])
                chat.append(False)
            else:
                raise ValueError(f"example {i} needs prompt and completion, or messages (has {sorted(ex)})")
            if not completion.strip():
                raise ValueError(f"example {i}: the completion is empty")
            answers = ex.get("answers") or ()
            prompts.append(prompt)
            completions.append(completion)
            golds.append((answers,) if isinstance(answers, str) else tuple(str(a) for a in answers))
        encoded = []
        self.truncated = 0  # of this call's examples
        for ids, target, is_chat, answers in zip(tokenize(self.tokenizer, prompts),
                                                 tokenize(self.tokenizer, completions), chat, golds):
            prefix = [] if is_chat else self.prefix
            target = list(target) + ([] if is_chat else self.eos)
            keep = max(self.max_length - len(prefix) - 1, 1)  # at least one prompt token predicts the first
            cut = len(target) > keep
            target = target[:keep]
            room = self.max_length - len(target)
            cut = cut or len(ids) > max(room - len(prefix), 1)
            self.truncated += cut
            encoded.append(Encoded(
                prompt_ids=np.asarray(truncate_left(ids, room, prefix), dtype=np.int64),
                target_ids=np.asarray(target, dtype=np.int64),
                answers=answers,
            ))
        return encoded

    def make_batches(self, enc: Sequence[Encoded], token_budget: int = 4096, indices=None,
                     max_padding: float | str | None = OWN) -> list[Batch]:
        """Left-padded rows ``prompt + completion[:-1]`` with right-aligned completion targets."""
        return teacher_forced_batches(enc, self.pad_id, token_budget, indices, own_padding(self, max_padding))

    # -- losses, generation, evaluation ---------------------------------------
    def losses(self, model, batch: Batch) -> torch.Tensor:
        """Per-sample training loss ``[B]`` (fp32): the mean NLL per completion token."""
        return -target_logprobs(model, batch)

    def generate(self, model, batch: Batch) -> list[str]:
        """Greedy completions of a batch of prompts (``batch.input_ids`` are the prompts), ending at the
        EOS token or after ``max_new_tokens``; decoded without special tokens, stripped."""
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1,
                                  pad_token_id=self.pad_id, eos_token_id=self.eos or None)
        with torch.inference_mode():
            out = model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 generation_config=config)
        texts = self.tokenizer.batch_decode(out[:, batch.input_ids.shape[1]:].tolist(), skip_special_tokens=True)
        return [text.strip() for text in texts]

    def _prompt_batches(self, enc, token_budget) -> list[Batch]:
        lengths = [len(e.prompt_ids) + self.max_new_tokens for e in enc]
        batches = []
        for group in plan_batches(lengths, token_budget, 1):
            ids, mask, pos = left_pad([enc[i].prompt_ids for i in group], self.pad_id)
            batches.append(Batch(index=group, input_ids=ids, attention_mask=mask, position_ids=pos,
                                 answers=tuple(enc[i].answers for i in group)))
        return batches

    def evaluate(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> dict[str, float]:
        """``loss`` (mean per-example completion NLL), ``nll_per_token``, ``perplexity``; ``em`` and ``f1``
        over the examples with reference answers, when there are any."""
        if not enc:
            raise ValueError("evaluate needs at least one example")
        device = model_device(model)
        batches = self.make_batches(enc, token_budget)
        nll = []
        with torch.inference_mode():
            for batch in batches:
                nll.append(-target_logprobs(model, batch.to(device)))
        per_example = collect(nll, batches, len(enc)).double()
        counts = torch.tensor([len(e.target_ids) for e in enc], dtype=torch.float64)
        per_token = float((per_example * counts).sum() / counts.sum())
        out = {"loss": float(per_example.mean()), "nll_per_token": per_token,
               "perplexity": math.exp(min(per_token, 700.0))}
        with_answers = [e for e in enc if e.answers]
        if with_answers:
            f1, em = [], []
            for batch in self._prompt_batches(with_answers, token_budget):
                for prediction, golds in zip(self.generate(model, batch.to(device)), batch.answers):
                    f1.append(best_f1(prediction, golds))
                    em.append(best_em(prediction, golds))
            out.update(em=float(np.mean(em)), f1=float(np.mean(f1)))
        return out

    def predict(self, model, enc: Sequence[Encoded], token_budget: int = 4096) -> list[str]:
        """Greedy completions for ``enc``, in order."""
        device = model_device(model)
        texts: list[str] = [""] * len(enc)
        for batch in self._prompt_batches(enc, token_budget):
            for i, text in zip(batch.index, self.generate(model, batch.to(device))):
                texts[i] = text
        return texts
