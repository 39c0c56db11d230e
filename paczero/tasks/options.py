"""Every answer option of a classification example scored from one forward of its prompt.

An example's row is its prompt followed by every option but its last token, the options one after the
other (``prompt + a[:-1] + b[:-1] + ...``). A four-dimensional attention mask lets each option token see the
prompt and its own option's earlier tokens only, and its position id is the one it would have right after
the prompt, so each option is read exactly as in a row of its own (``prompt + option[:-1]``). The logits a
class score needs are then the last ``1 + sum(len(option) - 1)`` positions of the left-padded row: the
prompt's last position (every option's first token) and each packed token (its option's next token).

The mask goes to the model as a ``[B, 1, W, W]`` mask in the form its attention takes (SDPA: boolean, True
where seen; eager: additive, 0 where seen and the dtype's minimum elsewhere), which transformers 5.x passes
through unchanged (``masking_utils``: a 4D mask is used as given). Models whose mask or positions follow other rules are
scored one row per option instead (:func:`packs`), with the same losses.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

#: model types tested to score packed options as rows of their own (tests/test_tasks.py), with these attentions
PACKED_TYPES = frozenset({"llama", "opt", "gpt2"})
PACKED_ATTENTION = frozenset({"eager", "sdpa"})


class OptionLayout:
    """Where the options sit after a prompt in one packed row, and which logits score which token.

    ``suffix``: the tokens appended to every prompt; ``offset``: each suffix token's position after the
    prompt's last one (its option's j-th token sits at the prompt's end plus j + 1); ``sees``: ``[S, S]``
    which suffix tokens each suffix token attends to (its own option's, up to itself); ``where``, ``tokens``
    and ``mask`` ``[C, L]``: for option c's k-th token, the position among the kept logits that predicts it
    (0: the prompt's last), the token, and whether option c has a k-th token.
    """

    def __init__(self, option_ids: Sequence[Sequence[int]]):
        width = max(len(o) for o in option_ids)
        self.suffix: list[int] = []
        offset, owner = [], []
        where = np.zeros((len(option_ids), width), dtype=np.int64)
        tokens = np.zeros((len(option_ids), width), dtype=np.int64)
        mask = np.zeros((len(option_ids), width), dtype=bool)
        for c, option in enumerate(option_ids):
            start = len(self.suffix)
            for k, token in enumerate(option):
                where[c, k] = 0 if k == 0 else 1 + start + k - 1
                tokens[c, k], mask[c, k] = token, True
            for j, token in enumerate(option[:-1]):
                self.suffix.append(int(token))
                offset.append(j + 1)
                owner.append(c)
        owner_arr, offset_arr = np.asarray(owner, dtype=np.int64), np.asarray(offset, dtype=np.int64)
        same = owner_arr[:, None] == owner_arr[None, :]
        upto = offset_arr[None, :] <= offset_arr[:, None]
        self.offset = torch.from_numpy(offset_arr)
        self.sees = torch.from_numpy(same & upto)
        self.where, self.tokens, self.mask = (torch.from_numpy(a) for a in (where, tokens, mask))
        self.keep = 1 + len(self.suffix)


def positions(mask: torch.Tensor, layout: OptionLayout) -> torch.Tensor:
    """Position ids of left-padded packed rows ``[B, W]`` (``mask``: 1 on real tokens): the prompt's count from
    0; each option token the position it has in a row of its own option."""
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    s = len(layout.suffix)
    if s:
        last = pos[:, -s - 1:-s]  # the prompt's last position
        pos[:, -s:] = last + layout.offset.to(pos.device)
    return pos


def attention_mask(mask: torch.Tensor, layout: OptionLayout, dtype: torch.dtype | None) -> torch.Tensor:
    """The ``[B, 1, W, W]`` mask of packed rows: causal over real tokens, each option token seeing the prompt
    and its own option's earlier tokens; a padding query sees itself alone (no empty row). Boolean (True:
    seen) where ``dtype`` is None, as transformers' SDPA masks are; else additive in ``dtype``, as its eager
    attention adds it to the scores."""
    b, w = mask.shape
    s = len(layout.suffix)
    seen = torch.ones((w, w), dtype=torch.bool, device=mask.device).tril()
    if s:
        seen[-s:, -s:] = layout.sees.to(mask.device)
    seen = seen.unsqueeze(0) & mask.bool().unsqueeze(1)  # keys that are padding are hidden
    seen |= torch.eye(w, dtype=torch.bool, device=mask.device)
    if dtype is None:
        return seen.unsqueeze(1)
    out = torch.zeros((b, 1, w, w), dtype=dtype, device=mask.device)
    return out.masked_fill_(~seen.unsqueeze(1), torch.finfo(dtype).min)


def packs(model) -> bool:
    """Whether ``model`` reads a packed row's 4D mask and position ids as :data:`PACKED_TYPES` do."""
    config = getattr(_hf(model), "config", None)
    return (getattr(config, "model_type", None) in PACKED_TYPES
            and getattr(config, "_attn_implementation", None) in PACKED_ATTENTION)


def mask_for(model, mask: torch.Tensor, layout: OptionLayout) -> torch.Tensor:
    """:func:`attention_mask` in the form ``model``'s attention takes (its input embedding's dtype for eager)."""
    hf = _hf(model)
    if hf.config._attn_implementation == "sdpa":
        return attention_mask(mask, layout, None)
    return attention_mask(mask, layout, hf.get_input_embeddings().weight.dtype)


def _hf(model):
    from paczero.models import hf_model

    return hf_model(model)


def option_logprobs(logits: torch.Tensor, layout: OptionLayout) -> torch.Tensor:
    """``[B, C]`` mean log-probability of each option's tokens from the kept logits ``[B, keep, V]`` (fp32)."""
    b, keep, v = logits.shape
    where, tokens, mask = (t.to(logits.device) for t in (layout.where, layout.tokens, layout.mask))
    picked = logits.reshape(b, keep * v)[:, (where * v + tokens).view(-1)].view(b, *where.shape)
    logp = picked - torch.logsumexp(logits, dim=-1)[:, where.view(-1)].view(b, *where.shape)
    logp = torch.where(mask, logp, torch.zeros_like(logp))
    return logp.sum(dim=-1) / mask.sum(dim=-1)
