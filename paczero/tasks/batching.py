"""Length-aware batching and the scoring helpers shared by the tasks.

Every task pre-tokenises its examples once (:class:`Encoded`), then packs them
into left-padded micro-batches (:class:`Batch`) that the training loop reuses at
every step. Batches are planned by a token budget: the examples are sorted by
length once (longest first) and grouped greedily so that ``rows * max_len`` of
each micro-batch stays within the budget, which keeps padding near zero.

Left padding puts the last real token of every row at the last position, so the
next-token logits a task needs are always the last ``k`` positions and the model
is asked for only those (``logits_to_keep=k``). Position ids are
``cumsum(mask) - 1`` clamped at 0, so a padded row sees the same positions as
the unpadded sequence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class Encoded:
    """One pre-tokenised example.

    ``prompt_ids`` is the model input before any target; ``target_ids`` the
    teacher-forced continuation (QA answers); ``label`` the class position
    (classification); ``answers`` the gold strings (QA).
    """

    prompt_ids: np.ndarray
    label: int | None = None
    target_ids: np.ndarray | None = None
    answers: tuple[str, ...] = ()


@dataclass
class Batch:
    """A left-padded micro-batch.

    ``index`` holds the positions of the batch's examples in the encoded list,
    in row order. Classification scored one row per option (``per_candidate``) has several
    rows per example (``input_ids.shape[0] == len(index) * n_options``).
    """

    index: np.ndarray
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor | None = None  # [B] class positions
    targets: torch.Tensor | None = None  # [R, T] right-aligned target tokens
    target_mask: torch.Tensor | None = None  # [R, T] 1 where targets is a real token
    answers: tuple[tuple[str, ...], ...] | None = None  # gold strings per example

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_tokens(self) -> int:
        """Padded size ``rows * max_len`` of the model input."""
        return int(self.input_ids.numel())

    def to(self, device) -> "Batch":
        """A copy with every tensor moved to ``device``."""
        moved = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device)
            moved[f.name] = value
        return Batch(**moved)


def prompt_prefix(tokenizer) -> list[int]:
    """The BOS token the tokenizer adds by default, or nothing.

    Prompts are tokenised without special tokens and prefixed with this, so
    training and evaluation see the same ids and no tokenizer appends an EOS.
    """
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    with_specials = tokenizer("x")["input_ids"]
    return [bos] if with_specials and with_specials[0] == bos else []


def tokenize(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of ``texts`` without special tokens (one batched call)."""
    if not texts:
        return []
    return list(tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def truncate_left(ids: list[int], max_len: int, prefix: list[int]) -> list[int]:
    """``prefix + ids``, dropping tokens from the left of ``ids`` to fit ``max_len``."""
    room = max(max_len - len(prefix), 1)
    return prefix + list(ids[-room:])


def is_cut(ids: Sequence[int], max_len: int, prefix: list[int]) -> bool:
    """Whether :func:`truncate_left` drops tokens of ``ids``."""
    return len(ids) > max(max_len - len(prefix), 1)


def pad_token_id(tokenizer) -> int:
    """The id used for padding (pad, else EOS, else 0). Masked out either way."""
    for tok_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tok_id is not None:
            return int(tok_id)
    return 0


def left_pad(rows: Sequence[Sequence[int]], pad_id: int):
    """Left-pad ``rows`` into ``(input_ids, attention_mask, position_ids)``."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row):] = row
            mask[i, width - len(row):] = 1
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(positions)


def right_align(rows: Sequence[Sequence[int]]):
    """Right-align ``rows`` into ``(tokens, mask)`` of width ``max(len)``; pads are 0."""
    width = max(len(r) for r in rows)
    tokens = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, row in enumerate(rows):
        if len(row):
            tokens[i, width - len(row):] = row
            mask[i, width - len(row):] = True
    return torch.from_numpy(tokens), torch.from_numpy(mask)


#: the padding cap of a micro-batch where padded tokens cost compute (a CPU): an example joins a group only if it
#: is at most ``max(2, 10 %)`` of the group's longest shorter; on a GPU, where a forward's cost is mostly its
#: launches, a task built with ``fill_batches=True`` fills every micro-batch to the token budget instead
TIGHT_PADDING = 0.1
#: ``make_batches``' default: the padding rule the task was built with
OWN = "own"


def own_padding(task, max_padding):
    """``max_padding`` as given, or (``OWN``) the task's own: None (fill) where it was built with
    ``fill_batches=True``, else ``TIGHT_PADDING``."""
    if max_padding != OWN:
        return max_padding
    return None if getattr(task, "fill_batches", False) else TIGHT_PADDING


def plan_batches(
    lengths: Sequence[int],
    token_budget: int,
    rows_per_example: int = 1,
    indices: Sequence[int] | None = None,
    max_padding: float | None = 0.1,
) -> list[np.ndarray]:
    """Group example positions into micro-batches by a token budget.

    Examples are sorted by length (longest first, ties by position) and added to
    the current group while ``rows * longest <= token_budget`` and the example
    is at most ``max(2, max_padding * longest)`` tokens shorter than the group's
    longest, so that padding stays near zero (``max_padding=None``: fill up to the
    budget whatever the padding); every group has at least one example. Returns
    the groups as int64 position arrays.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if indices is None:
        indices = np.arange(len(lengths), dtype=np.int64)
    else:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(lengths)):
            raise ValueError(f"indices must lie in [0, {len(lengths)}), got {indices.min()}..{indices.max()}")
    order = indices[np.lexsort((indices, -lengths[indices]))]
    groups: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        per_group = max(token_budget // (longest * rows_per_example), 1)
        shortest_ok = 0 if max_padding is None else longest - max(2, int(max_padding * longest))
        end = start + 1
        while end < len(order) and end - start < per_group and lengths[order[end]] >= shortest_ok:
            end += 1
        groups.append(order[start:end])
        start = end
    return groups


def _contiguous_input(module, args):
    return (args[0].contiguous(), *args[1:]) if args and isinstance(args[0], torch.Tensor) else None


def _fast_head(model) -> None:
    """Make the LM head's input contiguous (once per model).

    ``logits_to_keep`` slices the hidden states to a strided ``[B, keep, d]``
    view, which ``linear`` computes as B tiny batched products: ~10x slower
    on CPU than one ``[B*keep, d] x [d, V]`` product of the contiguous copy.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and not getattr(head, "_paczero_contiguous", False):
        head.register_forward_pre_hook(_contiguous_input)
        head._paczero_contiguous = True


def forward_logits(model, batch: Batch, keep: int, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits of the last ``keep`` positions through the model's ordinary forward (``attention_mask``:
    one in place of the batch's, as a 4D mask of packed options)."""
    _fast_head(model)
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask if attention_mask is None else attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=keep,
        use_cache=False,
    )
    return out.logits[:, -keep:].float()


#: model types whose logits are ``lm_head(body(...).last_hidden_state)`` with no post-processing
#: (no softcapping, logit scale or scaled embedding), so a tied head's rows can be read from the embedding
_PLAIN_HEAD_TYPES = frozenset({"opt", "llama", "gpt2"})


def _rows_route(model):
    """``(body, embedding)`` when the logits of a few token ids can be formed from the input embedding's
    rows (a plain, bias-free LM head tied to the input embedding, known model type); else None."""
    from paczero.models import hf_model

    hf = hf_model(model)
    config = getattr(hf, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    head, emb = hf.get_output_embeddings(), hf.get_input_embeddings()
    body = getattr(hf, "base_model", None)
    if (body is None or body is hf or not isinstance(head, torch.nn.Linear) or head.bias is not None
            or not isinstance(emb, torch.nn.Embedding) or head.weight is not emb.weight):
        return None
    return body, emb


def token_logits(model, batch: Batch, token_ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``[B, len(token_ids)]`` of the given token ids at the last position.

    With a tied, plain LM head only those rows of the head are used: the body's
    last hidden state times the embedding's rows for ``token_ids``, looked up
    *through the embedding module*, so a perturbed evaluation (``paczero.zo``)
    sees the perturbed rows and never forms, draws or multiplies the full
    vocabulary (with gradients on, as in a DP-SGD step, the rows are looked up once per
    example, so per-example gradients are attributed to the example they belong to). Any
    other model projects the last position through its own forward and reads the columns.
    """
    route = _rows_route(model)
    if route is None:
        logits = forward_logits(model, batch, 1)[:, -1]
        return logits[:, token_ids.to(logits.device)]
    body, emb = route
    out = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
               position_ids=batch.position_ids, use_cache=False)
    hidden = out.last_hidden_state[:, -1]  # [B, d]
    ids = token_ids.to(hidden.device)
    if torch.is_grad_enabled():  # a gradient step (DP-SGD): each example looks up its own rows, batch first, so
        rows = emb(ids.expand(hidden.shape[0], -1))  # per-example gradient hooks (Opacus) see whose rows they are
        return torch.einsum("bd,bcd->bc", hidden, rows).float()
    rows = emb(ids).to(hidden.device)  # [C, d] (a sharded model's hooks may move it)
    return (hidden @ rows.t()).float()


def target_logprobs(model, batch: Batch) -> torch.Tensor:
    """Mean log-probability of each row's target tokens (teacher forcing), fp32 ``[R]``.

    Rows hold ``context + target[:-1]``; the logits at the last ``T`` positions
    predict the right-aligned targets, so only those positions are projected
    through the LM head.
    """
    width = batch.targets.shape[1]
    logits = forward_logits(model, batch, width)  # [R, T, V]
    picked = logits.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    logp = picked - torch.logsumexp(logits, dim=-1)
    logp = torch.where(batch.target_mask, logp, torch.zeros_like(logp))
    return logp.sum(dim=1) / batch.target_mask.sum(dim=1)


def collect(values: Sequence[torch.Tensor], batches: Sequence[Batch], size: int | None = None) -> torch.Tensor:
    """Scatter per-batch values back to example order: a CPU fp32 tensor ``[size]``.

    Positions not covered by any batch are NaN.
    """
    if size is None:
        size = 1 + max((int(b.index.max()) for b in batches if len(b.index)), default=-1)
    out = torch.full((size,), float("nan"), dtype=torch.float32)
    for value, batch in zip(values, batches):
        out[torch.from_numpy(batch.index)] = value.detach().float().cpu()
    return out


def model_device(model) -> torch.device:
    """The device of the model's first parameter (CPU if it has none)."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def teacher_forced_batches(enc, pad_id: int, token_budget: int = 4096, indices=None,
                           max_padding: float | None = 0.1) -> list[Batch]:
    """Left-padded rows ``prompt + target[:-1]`` with right-aligned targets (``Encoded.prompt_ids``,
    ``target_ids``, ``answers``): the micro-batches of a teacher-forced NLL (SQuAD, completion)."""
    lengths = [len(e.prompt_ids) + len(e.target_ids) - 1 for e in enc]
    batches = []
    for group in plan_batches(lengths, token_budget, 1, indices, max_padding):
        rows = [list(enc[i].prompt_ids) + list(enc[i].target_ids[:-1]) for i in group]
        ids, mask, pos = left_pad(rows, pad_id)
        tgt, tgt_mask = right_align([enc[i].target_ids for i in group])
        batches.append(Batch(
            index=group, input_ids=ids, attention_mask=mask, position_ids=pos,
            targets=tgt, target_mask=tgt_mask, answers=tuple(enc[i].answers for i in group),
        ))
    return batches
