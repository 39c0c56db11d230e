"""Every class of an example from one forward: options of several tokens packed after the prompt
(paczero/tasks/options.py) score as one row per option does, in losses, gradients, evaluation and prediction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paczero.tasks import build_task
from test_tasks import EXAMPLES, all_losses, reference_classification_losses, tiny_model

TEMPLATE = "Review: {sentence}\nSentiment:"
#: six classes, every answer word two tokens or more on SmolLM2's tokenizer
SIX = {0: " not good at all", 1: " quite good", 2: " so so", 3: " awful really", 4: " very nice", 5: " meh okay"}
#: single- and multi-token answer words side by side
MIXED = {0: " bad", 1: " quite good", 2: " fine", 3: " awful really"}


@pytest.fixture(scope="module")
def tokenizer():
    from paczero.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


def examples(classes: int) -> list[dict]:
    return [dict(e, label=i % classes) for i, e in enumerate(EXAMPLES)]


def pair(tokenizer, verbalizer):
    packed = build_task("classification", tokenizer, template=TEMPLATE, verbalizer=verbalizer)
    rows = build_task("classification", tokenizer, template=TEMPLATE, verbalizer=verbalizer, scoring="per_candidate")
    return packed, rows


@pytest.mark.parametrize("kind", ["llama", "opt", "gpt2"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("words", ["six", "mixed"])
def test_packed_options_score_as_one_row_per_option(tokenizer, kind, attention, words):
    """The per-example losses of the packed path equal the per-candidate path's and the definition's (one
    unpadded forward per option, full log-softmax) to 1e-5, fp32, each example on one model row. Red when one
    option's last token is dropped from the scored tokens (``OptionLayout``: ``mask[c, len(option) - 1] =
    False``), when the options see each other (the 2D padding mask passed instead of the 4D one), or when the
    option tokens' position ids run on after the prompt instead of restarting at its end."""
    verbalizer = SIX if words == "six" else MIXED
    model = tiny_model(kind, len(tokenizer))
    model.set_attn_implementation(attention)
    packed, rows = pair(tokenizer, verbalizer)
    assert packed.layout is not None and any(len(o) > 1 for o in packed.option_ids)
    assert words == "six" or any(len(o) == 1 for o in packed.option_ids)
    data = examples(len(verbalizer))
    batches = packed.make_batches(packed.encode(data), token_budget=100)
    assert sum(b.input_ids.shape[0] for b in batches) == len(data)  # one row an example
    got = all_losses(packed, model, data, token_budget=100)
    torch.testing.assert_close(got, all_losses(rows, model, data, token_budget=100), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, reference_classification_losses(rows, model, data), atol=1e-5, rtol=1e-5)


def test_first_order_gradients_match(tokenizer):
    """The gradient of the summed per-example losses (a first-order step's) is the per-candidate path's. Red
    when the packed options see each other (the loss, and so its gradient, changes)."""
    model = tiny_model("llama", len(tokenizer))
    packed, rows = pair(tokenizer, SIX)
    data = examples(6)
    grads = []
    for task in (packed, rows):
        model.zero_grad()
        for batch in task.make_batches(task.encode(data), max_padding=None):
            task.losses(model, batch).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_evaluation_report_probabilities_and_prediction_match(tokenizer):
    """evaluate, report, probabilities and predict (training's dev, paczero eval, paczero predict and the Python
    API all call these) give the per-candidate path's figures."""
    model = tiny_model("llama", len(tokenizer))
    packed, rows = pair(tokenizer, SIX)
    data = examples(6)
    a, b = packed.encode(data), rows.encode(data)
    assert packed.evaluate(model, a) == pytest.approx(rows.evaluate(model, b), abs=1e-5)
    np.testing.assert_allclose(packed.probabilities(model, a), rows.probabilities(model, b), atol=1e-5)
    np.testing.assert_array_equal(packed.predict(model, a, token_budget=40), rows.predict(model, b))
    assert packed.report(model, a)["confusion"] == rows.report(model, b)["confusion"]


def test_a_model_that_does_not_read_packed_rows_is_scored_one_row_per_option(tokenizer, monkeypatch):
    """A model type the packed layout is not known to suit gets the same losses, read one row per option (its
    input embedding reads examples x options rows). Red when the packed row goes to it anyway (``packs``
    ignoring ``PACKED_TYPES``: the embedding reads one row an example)."""
    import paczero.tasks.options as options

    model = tiny_model("opt", len(tokenizer))
    packed, rows = pair(tokenizer, MIXED)
    data = examples(4)
    want = all_losses(rows, model, data)
    monkeypatch.setattr(options, "PACKED_TYPES", frozenset())
    seen = []
    model.model.decoder.embed_tokens.register_forward_hook(lambda m, a, out: seen.append(out.shape[0]))
    torch.testing.assert_close(all_losses(packed, model, data), want, atol=1e-5, rtol=1e-5)
    assert sum(seen) == len(data) * len(MIXED)


def test_single_token_words_keep_the_prompt_only_forward(tokenizer):
    """Answer words of one token each keep their one forward of the prompt alone (no packed suffix, no
    targets): the packed path is for words of several tokens only."""
    task = build_task("classification", tokenizer, template=TEMPLATE, verbalizer={0: " bad", 1: " good", 2: " fine"})
    assert task.single_token and task.layout is None
    enc = task.encode(examples(3))
    (batch,) = task.make_batches(enc, max_padding=None)
    assert batch.targets is None and batch.input_ids.shape == (len(enc), max(len(e.prompt_ids) for e in enc))


def test_layout_of_two_options():
    """The layout of options a = [1, 2, 3] and b = [4]: the suffix holds a's first two tokens; a's tokens are
    predicted from kept positions 0 (the prompt's last), 1 and 2, b's from 0; a's second packed token sees the
    first; positions restart after the prompt."""
    from paczero.tasks.options import OptionLayout, attention_mask, positions

    layout = OptionLayout([[1, 2, 3], [4], [5, 6]])
    assert layout.suffix == [1, 2, 5] and layout.keep == 4
    assert layout.where.tolist() == [[0, 1, 2], [0, 0, 0], [0, 3, 0]]
    assert layout.mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert layout.sees.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])  # a prompt of two tokens, left-padded by one
    assert positions(mask, layout).tolist() == [[0, 0, 1, 2, 3, 2]]
    seen = attention_mask(mask, layout, None)[0, 0].int().tolist()
    assert seen == [[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0],
                    [0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 1]]
