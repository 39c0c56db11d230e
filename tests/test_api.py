"""The Python API (paczero.api): a model object built here, a tokenizer object and a datasets.Dataset train
through the loop of `paczero train`, with its run folder, checkpoints, resume and privacy statement."""
import json
import signal

import pytest
import torch

from paczero import ConfigError, PACZeroTrainer
from paczero.run.build import Given, build, data_fingerprint
from paczero.config import TrainConfig
from paczero.models import load_tokenizer, trainable_parameters

ROWS = [{"sentence": f"this film is {'good' if i % 2 else 'bad'}, take {i}", "label": i % 2, "note": "x"}
        for i in range(40)]
SMALL = dict(task="sst2", n_train=16, n_dev=8, n_test=8, steps=4, eval_every=2, checkpoint_every=2, num_subsets=4,
             private_seed=3, progress=False, eval_zero_shot=False)


def _quiet(*a, **k):
    pass


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-opt")


def _model(tokenizer, seed=0):
    """A 2-layer OPT built from its config, with seeded weights: no file, no name."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    return OPTForCausalLM(OPTConfig(vocab_size=len(tokenizer), hidden_size=16, word_embed_proj_dim=16,
                                    num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
                                    max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _dataset():
    import datasets

    return datasets.Dataset.from_list(ROWS)


def _weights(model, track):
    return {n: p.detach().clone() for n, p in trainable_parameters(model, track)}


def _records(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (run_dir / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mechanism,track,extra", [("pac-zpl", "lora", {}), ("pac-mi", "ft", {"mi_budget": 0.1})])
def test_a_model_object_trains_on_a_dataset_and_comes_back_with_the_released_weights(
        tmp_path, tokenizer, mechanism, track, extra):
    from safetensors.torch import load_file

    model = _model(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    padding = tokenizer.padding_side
    result = PACZeroTrainer(model=model, tokenizer=tokenizer, train_dataset=_dataset(), mechanism=mechanism,
                            track=track, out_dir=str(tmp_path / "run"), **SMALL, **extra).train(log=_quiet)
    # the model trained is the object given (on track lora: the peft wrapper around it)
    assert (result.model is model) if track == "ft" else (result.model.get_base_model() is model)
    released = load_file(str(result.run_dir / "selected.safetensors"))
    trained = _weights(result.model, track)
    assert trained.keys() == released.keys() and all(torch.equal(trained[k], released[k]) for k in released)
    if track == "ft":
        assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    else:  # the base weights stay as they were; the adapters moved away from their zero-init B
        base = {n.replace(".base_layer", ""): p for n, p in model.named_parameters() if "lora_" not in n}
        assert base.keys() == before.keys() and all(torch.equal(before[n], p) for n, p in base.items())
        assert any(p.abs().sum() > 0 for n, p in trained.items() if "lora_B" in n)
    # the summary and the folder are those of `paczero train`
    assert result.privacy["mi_bound"] == (0.0 if mechanism == "pac-zpl" else 0.1)
    assert result.statement and result.statement == result.summary["privacy_text"]
    for name in ("run.json", "log.jsonl", "private/journal.jsonl", "evals.jsonl", "summary.json", "checkpoints/step-000004",
                 "model/README.md"):
        assert (result.run_dir / name).exists(), name
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["in_memory"] == ["model", "tokenizer", "data"] and run["config"]["model"] == "OPTForCausalLM"
    card = (result.run_dir / "model" / "README.md").read_text()
    assert result.statement in card and "examples given in memory" in card and "SST-2" not in card
    assert len(_records(result.run_dir)) == SMALL["steps"]
    assert tokenizer.padding_side == padding  # the caller's tokenizer is left as it was


def test_eval_and_audit_refuse_a_run_on_objects_in_memory_in_one_line(tmp_path, tokenizer, capsys):
    """Their run.json names the objects but cannot rebuild them: without the refusal, `paczero eval` would
    score the model on SST-2 from the hub, not on the examples it was trained and selected on."""
    from paczero.cli import main

    run = PACZeroTrainer(model=_model(tokenizer), tokenizer=tokenizer, train_dataset=_dataset(), track="ft",
                         out_dir=str(tmp_path / "run"), **{**SMALL, "steps": 1}).train(log=_quiet).run_dir
    for argv in (["eval", str(run)], ["audit", str(run)]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "trained on objects given in memory (model, tokenizer, data)" in err and "\n" not in err


def test_eval_of_a_released_adapter_knows_a_base_loaded_from_the_offline_smollm2(tmp_path, tokenizer):
    """A model object loaded from paczero's offline SmolLM2 folder (its name_or_path, as
    load_model('smollm2-135m-instruct') gives it; here a tiny model that says so) trains LoRA adapters;
    `paczero eval RUN/model --data FILE` then finds the base by name (task.json) and asks for no
    --base-model, while an object with any other name_or_path still needs it. Red if every model given in
    memory counts as unpublished."""
    from paczero.models import SMOLLM2, cache_dir
    from paczero.run.release import released_config

    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    for name_or_path, known in ((str(cache_dir() / SMOLLM2), True), ("my/own-model", False)):
        model = _model(tokenizer)
        model.config._name_or_path = name_or_path
        run = PACZeroTrainer(model=model, tokenizer=tokenizer, train_dataset=_dataset(), track="lora",
                             out_dir=str(tmp_path / name_or_path.replace("/", "_")),
                             **{**SMALL, "steps": 1}).train(log=_quiet).run_dir
        task = json.loads((run / "model" / "task.json").read_text())
        if known:
            assert task["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
            assert released_config(run / "model", {"data": str(data)}).model == SMOLLM2
        else:
            assert task["base_model"] is None
            with pytest.raises(ConfigError, match="give --base-model"):
                released_config(run / "model", {"data": str(data)})


def test_a_stopped_run_resumes_from_its_checkpoint_to_the_uninterrupted_weights(tmp_path, tokenizer, monkeypatch):
    """Stop at step 3 (a SIGTERM after step 3's checkpoint decision: the newest checkpoint is step 2's and
    the journal's record of step 3 is replayed), resume through the same trainer (its model is now the peft
    model the first call returned), and compare with a straight run of the same objects bit for bit:
    weights and transcript. Red if the API's resume starts the run over (or writes a second one) instead
    of continuing from the checkpoint and the journal, if a replayed or resumed step differs from the
    straight run's, if the next call does not train the peft model the stopped call returned, or if the
    stopped result names the command line's --resume or holds None where the README reads a value."""
    from safetensors.torch import load_file

    from killpoints import signal_after_steps

    cfg = dict(SMALL, mechanism="pac-mi", mi_budget=0.2, steps=6, checkpoint_every=2)
    straight = PACZeroTrainer(model=_model(tokenizer), tokenizer=tokenizer, train_dataset=_dataset(),
                              out_dir=str(tmp_path / "straight"), **cfg).train(log=_quiet)

    trainer = PACZeroTrainer(model=_model(tokenizer), tokenizer=tokenizer, train_dataset=_dataset(),
                             out_dir=str(tmp_path / "stopped"), **cfg)
    lines = []
    with monkeypatch.context() as patch:  # a SIGTERM as step 3's progress is counted: the loop stops there
        signal_after_steps(3, signal.SIGTERM, patch=patch.setattr)
        first = trainer.train(log=lines.append)
    assert first.stopped and first.summary["stopped_at"] == 3
    # the stopped result says how to go on in this API's words, and the README's reads find values
    assert "stopped at step 3" in first.statement and "trainer.train(resume=True)" in first.statement
    assert "--" not in first.statement and "--" not in "".join(lines)
    assert any("trainer.train(resume=True)" in line for line in lines)
    assert first.privacy["mi_bound"] == 0.2 and 0.5 < first.privacy["mia_bound"] < 1
    assert trainer.model is first.model  # the peft wrapper the first call built
    resumed = trainer.train(resume=True, log=_quiet)
    assert not resumed.stopped and resumed.model is first.model
    assert _records(resumed.run_dir) == _records(straight.run_dir)
    a, b = load_file(str(straight.run_dir / "selected.safetensors")), _weights(resumed.model, "lora")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.privacy["mi_bound"] == straight.privacy["mi_bound"] == 0.2


def test_a_dataframe_a_list_of_dicts_and_a_file_give_the_dataset_s_examples(tmp_path, tokenizer):
    """The rows in memory are read as a data file with the same rows: same examples, same fingerprint
    (the one a resume checks), whatever holds them. Red if in-memory rows skip the file's normalisation
    (types, columns) or its seeded split."""
    import pandas as pd

    from paczero.api import _examples

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    base = TrainConfig(**SMALL)

    def fingerprint(cfg, examples):
        return data_fingerprint(build(cfg, with_model=False, given=Given(tokenizer=tokenizer, examples=examples)))

    from_file = fingerprint(base.replace(data=str(path)), None)
    frame = pd.DataFrame(ROWS)
    frame["label"] = frame["label"].astype("int64")
    for table in (_dataset(), frame, list(ROWS)):
        assert fingerprint(base, _examples(base, {"train_dataset": table, "eval_dataset": None,
                                                   "test_dataset": None})) == from_file
    # an eval_dataset is the dev set; with no test_dataset it is evaluated last too
    test_rows = [{"sentence": f"held out {i}", "label": i % 2} for i in range(8)]
    train, dev, test = _examples(base, {"train_dataset": ROWS, "eval_dataset": test_rows, "test_dataset": None})
    assert sorted(t["sentence"] for t in test) == sorted(r["sentence"] for r in test_rows)
    assert len(train) == 16 and len(dev) == 8 and not {d["sentence"] for d in dev} & {t["sentence"] for t in train}


@pytest.mark.parametrize("kwargs,needle", [
    (dict(train_dataset=[{"review": "a", "label": 0}] * 40), "lacks column(s) ['sentence']"),
    (dict(train_dataset="rows.jsonl"), "a data file goes in the config's data setting"),
    (dict(model="facebook/opt-125m"), "a model name or path goes in the config's model setting"),
    (dict(model=torch.nn.Linear(2, 2)), "must be a causal language model object"),
    (dict(tokenizer=object()), "tokenizer must be a transformers tokenizer object"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(learning_rate=1e-3), "unknown setting(s) learning_rate"),
    (dict(eval_dataset=[{"sentence": "x", "label": 0}, {"sentence": "y", "label": 3}]),
     "eval_dataset record 2: label 3 is not one of the labels the verbalizer scores (0, 1); give a verbalizer={...}"),
])
def test_bad_input_is_one_config_error_line(tmp_path, tokenizer, kwargs, needle):
    kwargs = {"model": _model(tokenizer), "tokenizer": tokenizer, "train_dataset": _dataset(), **kwargs}
    with pytest.raises(ConfigError) as e:
        PACZeroTrainer(out_dir=str(tmp_path / "run"), **{**SMALL, **kwargs}).train(log=_quiet)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()  # refused before the run folder is claimed


def test_a_model_built_in_memory_needs_its_tokenizer_and_a_peft_model_trains_lora_only(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ConfigError, match="needs its tokenizer"):
        PACZeroTrainer(model=_model(tokenizer), train_dataset=_dataset(), **SMALL).train(log=_quiet)
    peft_model = get_peft_model(_model(tokenizer), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    with pytest.raises(ConfigError, match="track lora"):
        PACZeroTrainer(model=peft_model, tokenizer=tokenizer, track="ft", **SMALL)
    # a peft model's own adapter settings are what the run records
    from paczero.api import _describe

    cfg = _describe(TrainConfig(**SMALL), peft_model, tokenizer)
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_targets, cfg.dtype) == (4, 8, ["q_proj"], "fp32")


def test_the_datasets_handed_over_are_used_as_given(tmp_path, tokenizer):
    """40 training rows and 10 eval rows with no sizes set: U is the 40 rows, dev the 10 (they select the
    released weights), and with no test_dataset the final evaluation is on them too; a test_dataset is the
    test set. One log line and run.json say so. Red if the defaults n_train = 1000, n_dev = 500 applied
    (too few rows), or if eval_dataset became the test set with dev carved from the training rows."""
    from paczero.api import _examples

    train_rows = ROWS
    eval_rows = [{"sentence": f"held out {i}", "label": i % 2} for i in range(10)]
    test_rows = [{"sentence": f"tested {i}", "label": i % 2} for i in range(6)]
    cfg = TrainConfig(task="sst2")
    train, dev, test = _examples(cfg, {"train_dataset": train_rows, "eval_dataset": eval_rows, "test_dataset": None},
                                 set())
    assert len(train) == 40 and sorted(d["sentence"] for d in dev) == sorted(r["sentence"] for r in eval_rows)
    assert sorted(t["sentence"] for t in test) == sorted(r["sentence"] for r in eval_rows)
    _, dev, test = _examples(cfg, {"train_dataset": train_rows, "eval_dataset": eval_rows, "test_dataset": test_rows},
                             set())
    assert len(dev) == 10 and sorted(t["sentence"] for t in test) == sorted(r["sentence"] for r in test_rows)
    train, dev, test = _examples(cfg, {"train_dataset": train_rows, "eval_dataset": None, "test_dataset": None}, set())
    assert (len(train), len(dev), len(test)) == (26, 6, 8)  # a fifth for test, a fifth of the rest for dev

    lines = []
    settings = {k: v for k, v in SMALL.items() if k not in ("n_train", "n_dev", "n_test")}
    result = PACZeroTrainer(model=_model(tokenizer), tokenizer=tokenizer, train_dataset=_dataset(),
                            eval_dataset=eval_rows, out_dir=str(tmp_path / "run"), num_subsets=4,
                            **{k: v for k, v in settings.items() if k != "num_subsets"}).train(log=lines.append)
    use = json.loads((result.run_dir / "run.json").read_text())["data_use"]
    assert use.startswith("U = 40 rows of train_dataset; dev (selects the released weights) = 10 rows of eval_dataset")
    assert f"paczero: data: {use}" in lines
    assert result.summary["test"] and result.summary["dev"]


def test_the_statement_card_and_summary_state_the_sizes_the_run_used(tmp_path, tokenizer):
    """40 training rows and 10 eval rows (no test_dataset: the final evaluation reuses them), no sizes set:
    run.json, summary.json, the privacy statement and the model card all say 40 and 10, counted here from
    the rows handed over. Red if the config's defaults (n_train 1000, n_dev 500) reach any of them (the
    API did not record the sizes it used), or if the card leaves the test set's size out."""
    import re

    eval_rows = [{"sentence": f"held out {i}", "label": i % 2} for i in range(10)]
    settings = {k: v for k, v in SMALL.items() if k not in ("n_train", "n_dev", "n_test")}
    result = PACZeroTrainer(model=_model(tokenizer), tokenizer=tokenizer, train_dataset=ROWS, eval_dataset=eval_rows,
                            out_dir=str(tmp_path / "run"), **settings).train(log=_quiet)
    n_train, n_dev = len(ROWS), len(eval_rows)
    run = json.loads((result.run_dir / "run.json").read_text())
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert run["universe_size"] == n_train
    for config in (run["config"], summary["config"], result.config.to_dict()):
        assert (config["n_train"], config["n_dev"], config["n_test"]) == (n_train, n_dev, n_dev)
    assert summary["sizes"] == {"universe": n_train, "dev": n_dev, "test": n_dev}
    statement = summary["privacy_text"]
    assert f"{n_train}-example universe" in statement and f"{n_dev} dev examples" in statement, statement
    card = (result.run_dir / "model" / "README.md").read_text()
    assert (f"a training universe of {n_train} examples, {n_dev} dev examples (selection), {n_dev} test examples"
            in card), card
    assert statement in card
    for text in (statement, card):
        assert not re.search(r"\b(1000|500)\b", text)


def test_bad_input_speaks_of_the_api_s_arguments_not_the_command_line_s_flags(tmp_path, tokenizer):
    """A run folder that is not empty, rows whose sentence column has another name, rows with named labels:
    each refusal names the keyword argument (overwrite=True, columns={...}, labels=[...]) and no `--` flag.
    Red if PACZeroTrainer.train passes the command line's messages through (they name --overwrite, --columns,
    --labels)."""
    kwargs = {"model": _model(tokenizer), "tokenizer": tokenizer, **SMALL}
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    cases = [
        (dict(train_dataset=_dataset(), out_dir=str(out)), "overwrite=True"),
        (dict(train_dataset=[{"review": r["sentence"], "label": r["label"]} for r in ROWS],
              out_dir=str(tmp_path / "b")), "columns={'sentence': 'review'}"),
        (dict(train_dataset=[{"sentence": r["sentence"], "label": ["neg", "pos"][r["label"]]} for r in ROWS],
              out_dir=str(tmp_path / "c")), "labels=["),
    ]
    for given, words in cases:
        with pytest.raises(ValueError) as e:
            PACZeroTrainer(**{**kwargs, **given}).train(log=_quiet)
        assert words in str(e.value) and "--" not in str(e.value), str(e.value)
    assert (out / "notes.txt").read_text() == "mine"
