"""``paczero bench --account``: one floor pass's time, accounted for by module category with forward hooks
(paczero/bench/account.py), on the tiny models built from their configs."""
import json
from types import SimpleNamespace

import pytest

from paczero.bench import BenchConfig, Harness
from paczero.bench import account as acc_mod
from paczero.bench import harness as harness_mod
from paczero.bench.account import BASE_LINEAR, CATEGORIES, LORA, NORMS, OUTSIDE, floor_account


@pytest.fixture(scope="module")
def harnesses():
    """One harness per tiny model and track (8 demo rows, one thread), built once for the module."""
    made = {}

    def get(model, track):
        if (model, track) not in made:
            made[model, track] = Harness(BenchConfig(model=model, track=track, n=8, threads=1))
        return made[model, track]

    return get


@pytest.mark.parametrize("model,track", [("tiny-llama", "lora"), ("tiny-opt", "ft")])
def test_the_categories_partition_the_pass(harnesses, model, track):
    """Every category is >= 0 and together they are the hooked pass's wall time, ``total_s``; the top-level
    module calls plus the time outside them make the same total, and every module call is counted with its two
    hooks. Red if a module's exclusive time does not subtract its nested calls (the sum exceeds the total), if
    "outside the model" is dropped or computed from another time, or if a category goes negative."""
    a = floor_account(harnesses(model, track))
    assert list(a["categories"]) == list(CATEGORIES)
    assert all(v >= 0 for v in a["categories"].values()), a["categories"]
    assert sum(a["categories"].values()) == pytest.approx(a["total_s"], rel=1e-9, abs=1e-12)
    assert a["modules_s"] + a["categories"][OUTSIDE] == pytest.approx(a["total_s"], rel=1e-12)
    assert sum(a["shares"].values()) == pytest.approx(1.0)
    assert sum(a["by_type"].values()) == pytest.approx(a["modules_s"], rel=1e-9)
    assert a["unhooked_s"] > 0 and a["hook_calls"] == 2 * a["module_calls"] > 0
    assert json.loads(json.dumps(a)) == a


def _linear_flops_per_token(config) -> int:
    """The base model's linear FLOPs per (padded) token, from its config alone: Llama's q, k, v, o and gated MLP,
    OPT's q, k, v, out and fc1, fc2, every layer; 2 FLOPs per multiply-add."""
    h, layers = config.hidden_size, config.num_hidden_layers
    if config.model_type == "llama":
        heads, kv = config.num_attention_heads, config.num_key_value_heads
        hd = getattr(config, "head_dim", None) or h // heads
        per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * config.intermediate_size
    else:
        assert config.model_type == "opt" and config.word_embed_proj_dim == h  # no project_in / project_out
        per_layer = 4 * h * h + 2 * h * config.ffn_dim
    return 2 * layers * per_layer


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-opt"])
def test_base_linear_flops_and_the_lora_category(harnesses, model):
    """The base linears' FLOPs equal a count from the config (hidden, intermediate, heads, kv heads, layers)
    times the padded tokens of the floor micro-batches, on LoRA and full fine-tuning alike: LoRA's adapters
    are not in it, and their time is in their own category on a LoRA model, none on FT. Red if the adapters'
    linears (lora_A / lora_B) count as base linears, if the real tokens are counted in place of the padded
    ones, if the LM head or an embedding is counted, or if the LoRA wrappers' time lands elsewhere."""
    from paczero.models import hf_model

    for track in ("lora", "ft"):
        h = harnesses(model, track)
        tokens = sum(b.input_ids.numel() for b in h.floor_batches)
        assert any(b.attention_mask.sum() < b.attention_mask.numel() for b in h.floor_batches)  # padding counts
        a = floor_account(h)
        assert a["matmul_flops"] == _linear_flops_per_token(hf_model(h.model).config) * tokens, track
        assert a["matmul_tflops"] == pytest.approx(a["matmul_flops"] / a["categories"][BASE_LINEAR] / 1e12)
        if track == "lora":
            assert a["categories"][LORA] > 0
        else:
            assert not a["categories"].get(LORA)


class _Clock:
    """A test clock: every reading advances it by 1 µs, and ``sleep`` advances it by the time asked, so the
    machine's load (the suite may run beside other work) cannot move time between categories."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_slow_norm_lands_in_norms_alone(harnesses, monkeypatch):
    """One RMSNorm module of tiny-llama (LoRA) planted to sleep 0.05 s (on the test's clock, which only
    that sleep and 1 µs a reading advance) moves >= 0.05 s into "norms" and no other category grows by as
    much: the planted call's time is its own exclusive time, not its decoder layer's (glue) or the model's.
    Red if a parent does not subtract its children's inclusive time, if norms are classified as another
    category, or if a call's time is booked to the wrong frame of the stack."""
    import time

    h = harnesses("tiny-llama", "lora")
    clock = _Clock()
    fake = SimpleNamespace(perf_counter=clock.perf_counter, process_time=time.process_time)
    monkeypatch.setattr(acc_mod, "time", fake)
    monkeypatch.setattr(harness_mod, "time", fake)
    before = floor_account(h)
    norm = next(m for n, m in h.model.named_modules() if type(m).__name__ == "LlamaRMSNorm")
    inner = norm.forward

    def slow(*args, **kwargs):
        clock.sleep(0.05)
        return inner(*args, **kwargs)

    monkeypatch.setattr(norm, "forward", slow)
    after = floor_account(h)
    calls = len(h.floor_batches)  # the planted norm runs once per micro-batch
    assert after["categories"][NORMS] - before["categories"][NORMS] == pytest.approx(0.05 * calls, abs=1e-3)
    assert after["categories"][NORMS] >= 0.05
    for cat in CATEGORIES:
        if cat != NORMS:
            assert after["categories"][cat] - before["categories"][cat] < 0.01, cat
    assert sum(after["categories"].values()) == pytest.approx(after["total_s"], rel=1e-9)


def test_bench_account_rows_and_table(tmp_path, capsys, monkeypatch):
    """``paczero bench --account --json-out``: every row holds ``account``, and the printed table after the main
    one gives each category with its seconds and share, and the base linears' TFLOP/s as a share of the row's
    measured matmul rates (here stubbed to 1e-6 TFLOP/s, about a tiny model's rate). Red if the option is not
    threaded to the rows, the table is not printed, or the rate is divided by another figure."""
    from paczero.bench import main, mfu

    monkeypatch.setattr(mfu, "matmul_tflops", lambda *a, **k: 1e-6)
    out = tmp_path / "bench.json"
    assert main(["--model", "tiny-llama", "--track", "lora", "ft", "--n", "8", "--steps", "1", "--no-scaling",
                 "--no-memory", "--no-plain", "--threads", "1", "--account", "--json-out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert len(rows) == 2 and all(set(r["account"]["categories"]) == set(CATEGORIES) for r in rows)
    assert printed.count("account of the floor pass: tiny-llama") == 2
    for r in rows:
        rate = r["account"]["matmul_tflops"]
        assert r["matmul_tflops_shape"] == r["matmul_tflops_2048"] == 1e-6
        assert f"| {rate:.4g} " in printed and f"| {rate / 1e-6:.1%} " in printed
        for cat in CATEGORIES:
            assert f"| {cat}" in printed


@pytest.mark.parametrize("argv", [["--account", "--compile"], ["--account", "--mechanism", "dp-sgd"]])
def test_account_refuses_what_it_cannot_time(argv, capsys):
    """``--account`` times the eager zeroth-order floor: with ``--compile`` or ``--mechanism dp-sgd`` it is one
    error line, exit 2. Red if the combination runs (a compiled body's hooks would time graph breaks)."""
    from paczero.cli import main

    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--account" in err[0]
