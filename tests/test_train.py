"""The training loop end to end on tiny models: every mechanism, both tracks, both tasks, resume."""
import json

import pytest
import torch

from paczero.cli import main
from paczero.config import ConfigError, TrainConfig
from paczero.train import lr_at, train

TINY = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=4, eval_every=2,
            checkpoint_every=2, num_subsets=4, private_seed=3, progress=False, eval_zero_shot=False)


def _quiet(*a, **k):
    pass


def _records(run_dir):
    out = []
    for line in (run_dir / "log.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds")
        out.append(r)
    return out


@pytest.mark.parametrize("mechanism,extra", [
    ("pac-zpl", {}),
    ("pac-mi", {"mi_budget": 0.05}),
    ("hybrid", {"mi_budget": 0.05, "switch_step": 2}),
    ("mezo", {"batch_size": 8}),
    ("dpzero", {"epsilon": 2.0, "sample_rate": 0.5}),
    ("dp-aggzo", {"epsilon": 2.0, "sample_rate": 0.5, "num_directions": 2}),
    ("raw_half", {}),
    ("quant_full", {}),
    ("random_sign", {}),
])
def test_every_mechanism_runs_end_to_end(tmp_path, mechanism, extra):
    cfg = TrainConfig(**TINY, mechanism=mechanism, out_dir=str(tmp_path / "run"), **extra)
    summary = train(cfg, log=_quiet)
    assert summary["test"]["accuracy"] >= 0.0
    recs = _records(tmp_path / "run")
    assert [r["step"] for r in recs] == list(range(4))
    stmt = summary["privacy"]
    if mechanism == "pac-mi":
        assert 0 < stmt["mi_spent"] <= 0.05
        assert abs(recs[-1]["cum_mi"] - stmt["mi_spent"]) < 1e-15
    if mechanism in ("pac-mi", "hybrid"):  # summary.json states the guarantee of the budget, not the spend
        from paczero.privacy import mia_bound

        on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())["privacy"]
        assert on_disk["mi_bound"] == 0.05 and on_disk["mia_bound"] == mia_bound(0.05)
        assert f"at most {mia_bound(0.05):.4f}" in summary["privacy_text"] and "not a bound" in summary["privacy_text"]
        card = (tmp_path / "run" / "model" / "README.md").read_text()
        assert f"membership-inference success at most {mia_bound(0.05):.4f}" in card
    if mechanism in ("dpzero", "dp-aggzo"):  # the private Poisson batch is not logged, nor the time it took
        assert all(r["rows"] is None and r["train_loss"] is None for r in recs)
        raw = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
        assert all(r["seconds"] is None for r in raw)
        assert summary["train_seconds"] is None and summary["seconds_per_step"] is None  # total time: sum of batches
        run_json = json.loads((tmp_path / "run" / "run.json").read_text())  # add-or-remove: N is private
        assert "universe_size" not in run_json and "data_fingerprint" not in run_json
        assert stmt["adjacency"] == "add-or-remove-one"
        publics = list((tmp_path / "run" / "checkpoints").glob("*/public.json"))
        assert publics and all(json.loads(p.read_text())["seconds"] is None for p in publics)
    if stmt.get("private") is False:
        assert stmt["secret_source"] == "none (a non-private reference)" and "WARNING" not in summary["privacy_text"]
    if mechanism == "pac-zpl":
        assert stmt["mi_spent"] == 0.0 and stmt["mia_bound"] == 0.5
        assert all(r["branch"] in ("unanimous", "coin") for r in recs)
    assert (tmp_path / "run" / "summary.json").exists()
    assert (tmp_path / "run" / "selected.safetensors").exists()


@pytest.mark.parametrize("track", ["ft", "lora"])
def test_tracks_move_only_trainable_weights(tmp_path, track):
    from paczero.models import load_model, trainable_parameters

    cfg = TrainConfig(**{**TINY, "model": "tiny-opt"}, track=track, mechanism="raw_full", lr=0.05,
                      out_dir=str(tmp_path / "r"))
    train(cfg, log=_quiet)
    from safetensors.torch import load_file

    trained = load_file(str(tmp_path / "r" / "selected.safetensors"))
    base = load_model("tiny-opt", track=track, init_seed=0).model
    params = dict(trainable_parameters(base, track))
    assert set(trained) == set(params)
    assert any(not torch.equal(trained[n], params[n]) for n in params)


def test_squad_both_objectives(tmp_path):
    rows = []
    for i in range(20):
        ctx = f"The capital of land {i} is city{i}. It has {i} rivers."
        rows.append({"id": str(i), "title": f"Land {i}", "context": ctx, "question": f"What is the capital of land {i}?",
                     "answers": {"text": [f"city{i}"], "answer_start": [ctx.index("city")]}})
    path = tmp_path / "squad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for objective in ("nll", "f1"):
        cfg = TrainConfig(**{**TINY, "task": "squad", "steps": 2, "eval_every": 2, "n_train": 8, "n_dev": 4, "n_test": 4},
                          data=str(path), objective=objective, max_new_tokens=4, out_dir=str(tmp_path / objective))
        s = train(cfg, log=_quiet)
        assert set(s["test"]) >= {"f1", "em", "loss"}


def test_resume_gives_the_uninterrupted_transcript(tmp_path):
    base = dict(TINY, mechanism="pac-mi", mi_budget=0.2, steps=6, checkpoint_every=2, private_seed=None)
    # the full run draws its secret from OS entropy; so does the interrupted one, so compare via the
    # checkpoint: run 4 steps, then resume to 6 and check against a straight run that reuses the same state
    first = TrainConfig(**{**base, "steps": 6}, out_dir=str(tmp_path / "a"))
    train(first, log=_quiet)
    full = _records(tmp_path / "a")
    # interrupt: keep the checkpoint of step 4, drop the later one and the summary, then resume
    import shutil

    shutil.rmtree(tmp_path / "a" / "checkpoints" / "step-000006")
    (tmp_path / "a" / "summary.json").unlink()
    train(first.replace(resume=True), log=_quiet)
    assert _records(tmp_path / "a") == full


def test_resume_refuses_other_privacy_parameters(tmp_path):
    cfg = TrainConfig(**TINY, mechanism="pac-mi", mi_budget=0.1, out_dir=str(tmp_path / "r"))
    train(cfg, log=_quiet)
    with pytest.raises(ConfigError, match="mi_budget"):
        train(cfg.replace(resume=True, mi_budget=0.2), log=_quiet)
    with pytest.raises(ConfigError, match="num_subsets"):
        train(cfg.replace(resume=True, num_subsets=8), log=_quiet)


def test_k_equals_one_matches_single_direction_and_k_runs(tmp_path):
    a = train(TrainConfig(**TINY, mechanism="pac-mi", mi_budget=0.1, out_dir=str(tmp_path / "k1")), log=_quiet)
    b = train(TrainConfig(**TINY, mechanism="pac-mi", mi_budget=0.1, num_directions=3,
                          out_dir=str(tmp_path / "k3")), log=_quiet)
    rec = _records(tmp_path / "k3")
    assert all(isinstance(r["branch"], list) and len(r["branch"]) == 3 for r in rec)
    assert b["privacy"]["mi_spent"] <= 0.1 + 1e-12 and a["privacy"]["mi_spent"] <= 0.1 + 1e-12


def test_lr_schedules():
    cfg = TrainConfig(steps=10, lr=1e-3)
    assert lr_at(cfg, 5) == 1e-3
    assert lr_at(cfg.replace(lr_schedule="linear"), 5) == pytest.approx(5e-4)
    poly = cfg.replace(lr_schedule="polynomial")
    assert lr_at(poly, 0) == pytest.approx(1e-3) and lr_at(poly, 10) == pytest.approx(1e-7)


def test_never_overwrites_without_flag(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="not empty"):
        train(TrainConfig(**TINY, out_dir=str(out)), log=_quiet)
    with pytest.raises(ValueError, match="not a paczero run"):
        train(TrainConfig(**TINY, out_dir=str(out), overwrite=True), log=_quiet)
    assert (out / "notes.txt").read_text() == "precious"


def test_overwrite_deletes_the_earlier_run_only_once_every_input_is_checked(tmp_path, capsys):
    """Bad input with --overwrite used to delete the earlier run first and fail after; now the run is
    kept, whole, until the new one has read its data and model. A data file inside the folder that
    --overwrite would delete is refused. The good overwrite replaces the run."""
    out = tmp_path / "run"
    train(TrainConfig(**{**TINY, "steps": 1}, out_dir=str(out)), log=_quiet)
    (out / "MODEL_CARD.md").write_text("mine")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"sentence": f"s{i}", "label": "positive"}) + "\n" for i in range(40)))
    inside = out / "data.jsonl"
    inside.write_text("".join(json.dumps({"sentence": f"s{i}", "label": i % 2}) + "\n" for i in range(40)))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".paczero.lock"}
    flags = ["train", "--model", "tiny-llama", "--task", "sst2", "--n-train", "16", "--n-dev", "8", "--n-test", "8",
             "--steps", "1", "--no-progress", "--out-dir", str(out), "--overwrite"]
    for data, needle in ((bad, "not an integer"), (tmp_path / "missing.tsv", "does not exist"),
                         (inside, "holds this run's data file")):
        assert main(flags + ["--data", str(data)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and needle in err, err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".paczero.lock"} == before
    good = tmp_path / "good.jsonl"
    good.write_bytes(inside.read_bytes())
    assert main(flags + ["--data", str(good)]) == 0
    assert not (out / "MODEL_CARD.md").exists() and not inside.exists()
    assert json.loads((out / "run.json").read_text())["config"]["data"] == str(good.resolve())


def test_a_run_that_fails_before_writing_leaves_no_folder_behind(tmp_path):
    out = tmp_path / "never"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"sentence": f"s{i}", "label": "x"}) + "\n" for i in range(40)))
    with pytest.raises(ValueError, match="not an integer"):
        train(TrainConfig(**{**TINY, "task": "sst2"}, data=str(bad), out_dir=str(out)), log=_quiet)
    assert not out.exists()


def test_an_output_path_that_is_no_folder_is_refused_in_one_line(tmp_path, capsys):
    """A file as --out-dir, or under a file, or a folder that cannot be created: exit 2 and one line
    (it was a NotADirectoryError traceback); the file is left as it was."""
    (tmp_path / "notes.txt").write_text("precious")
    flags = ["train", "--model", "tiny-llama", "--task", "demo", "--n-train", "16", "--steps", "1"]
    for out, needle in ((tmp_path / "notes.txt", "is a file"), (tmp_path / "notes.txt" / "run", "Not a directory")):
        assert main(flags + ["--out-dir", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("paczero: error: ") and needle in err
    assert (tmp_path / "notes.txt").read_text() == "precious"


def test_a_folder_left_with_only_its_lock_takes_a_fresh_run(tmp_path):
    """A run that died before writing run.json leaves its lock file alone: the folder counts as empty."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".paczero.lock").write_text("pid 1 on elsewhere")
    summary = train(TrainConfig(**{**TINY, "steps": 1}, out_dir=str(out)), log=_quiet)
    assert summary["privacy"]["steps"] == 1 and (out / "run.json").exists()


@pytest.mark.parametrize("argv,needle", [
    (["train", "--num-subsets", "7"], "even"),
    (["train", "--mechanism", "pac-mi"], "mi_budget"),
    (["train", "--mechanism", "pac-mi", "--mi-budget", "0"], "mi_budget"),
    (["train", "--steps", "0"], "steps"),
    (["train", "--lr", "0"], "lr"),
    (["train", "--n-train", "1"], "n_train"),
    (["train", "--task", "imagenet"], "unknown task"),
    (["train", "--model", "./missing-model"], "does not exist"),
    (["train", "--data", "./missing.jsonl"], "does not exist"),
    (["train", "--mechanism", "dpzero"], "epsilon"),
    (["train", "--recipe", "no/such"], "unknown recipe"),
    (["train", "--mi-budget", "nan", "--mechanism", "pac-mi"], "mi_budget"),
    (["train", "--track", "ft", "--compile"], "--track lora only"),
    (["train", "--task", "squad", "--compile"], "classification tasks only"),
    (["train", "--template", "{sentence} Stars: {stars}. It was"], "may use {sentence} only, not {stars}"),
    (["train", "--template", "{sentence} {} It was"], "not {}"),
    (["train", "--template", "{sentence} { It was"], "not a format string"),
    (["train", "--task", "squad", "--template", "{sentence}"], "{title} {context} {question} only"),
    (["train", "--data", "./missing.tsv"], "does not exist"),
    (["train", "--data", "imdb"], "does not exist"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_cli_missing_columns(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"txt": f"s{i}", "y": i % 2}) + "\n" for i in range(40)))
    rc = main(["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(path), "--out-dir", str(tmp_path / "o")])
    assert rc == 2
    assert "sentence" in capsys.readouterr().err


def test_cli_train_and_eval(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["train", "--model", "tiny-gpt2", "--n-train", "16", "--n-dev", "8", "--n-test", "8", "--steps", "2",
            "--eval-every", "2", "--num-subsets", "4", "--no-progress", "--no-eval-zero-shot", "--out-dir", str(out)]
    assert main(args) == 0
    assert main(["eval", str(out), "--split", "test"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed[printed.index("{\n"):])
    assert result["weights"] == "selected weights" and "accuracy" in result["test"]
    assert main(["privacy", "--mi", "0.25", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert abs(p["mia_bound"] - 0.84) < 0.01
    # the run's weights on a file of its own: every example of it, with its own column names
    from paczero.build import build
    from paczero.config import TrainConfig as Config

    test_rows = build(Config.from_dict({**json.loads((out / "run.json").read_text())["config"]}),
                      with_model=False).test
    held = tmp_path / "held.csv"
    held.write_text("text,stars\n" + "".join(f"{json.dumps(r['sentence'])},{r['label']}\n" for r in test_rows))
    assert main(["eval", str(out), "--data", str(held), "--columns", "sentence=text,label=stars"]) == 0
    printed = capsys.readouterr().out
    on_file = json.loads(printed[printed.index("{\n"):])
    assert on_file["examples"] == 8 and on_file["metrics"]["accuracy"] == result["test"]["accuracy"]
    assert on_file["metrics"]["loss"] == pytest.approx(result["test"]["loss"], rel=1e-5)


def test_resume_refuses_changed_data_at_the_same_path(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"sentence": f"sentence number {i} was {'fine' if i % 2 else 'poor'}", "label": i % 2} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainConfig(**{**TINY, "task": "sst2"}, data=str(path), out_dir=str(tmp_path / "r"))
    train(cfg, log=_quiet)
    rows[0]["sentence"] = "an edited sentence"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="data"):
        train(cfg.replace(resume=True), log=_quiet)


@pytest.mark.slow
def test_unloadable_hub_model_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["eval", "no-such-org/no-such-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-org/no-such-model" in err[0]


def test_offloaded_trained_weights_are_refused(monkeypatch):
    """A device map that offloads trained weights (to CPU or disk beside the accelerators) leaves them on the
    meta device, loaded by accelerate's hooks for each forward: they cannot be perturbed or updated. The
    perturber refuses them with one clear error (shown on CPU with accelerate's own offloading)."""
    accelerate = pytest.importorskip("accelerate")
    import numpy as np

    from paczero import zo
    from paczero.models import load_model, trainable_parameters
    from paczero.tasks import build_task, load_splits

    lm = load_model("tiny-opt", track="ft")
    task = build_task("demo", lm.tokenizer)
    batches = task.make_batches(task.encode(load_splits("demo", n_train=6, n_dev=1, n_test=1)[0]), token_budget=64)

    def scalars():
        pert = zo.Perturber(lm.model, trainable_parameters(lm.model, "ft"), public_seed=1, cache_limit=0)
        return zo.two_point_scalars(pert, 0, 1, 1e-2, batches, lambda b: task.losses(lm.model, b), 6, "cpu")[0]

    assert np.all(scalars() != 0)  # resident: accepted
    accelerate.cpu_offload(lm.model, execution_device="cpu")
    with pytest.raises(ValueError, match="offloaded .* trained tensors"):
        scalars()
    monkeypatch.setattr(zo.perturb, "refuse_offloaded", lambda params: None)  # control: without it, a deep traceback
    with pytest.raises(RuntimeError):
        scalars()


@pytest.mark.slow
def test_compiled_lora_step_sees_the_perturbation_and_the_update():
    """``compile``: the compiled body reads the adapters' swapped-in (theta +/- mu z) and updated tensors.

    Scalars and losses match the eager model's to float tolerance and are far from zero: a graph that had
    frozen the adapters would give + and - losses equal (g = 0) and miss the update."""
    import numpy as np

    from paczero.models import compile_body, load_model, trainable_parameters
    from paczero.tasks import build_task, load_splits
    from paczero.zo import Perturber, two_point_scalars

    lm = load_model("tiny-llama", track="lora")
    task = build_task("demo", lm.tokenizer)
    train_ex, _, _ = load_splits("demo", n_train=24, n_dev=1, n_test=1)
    batches = task.make_batches(task.encode(train_ex), token_budget=128)
    perturber = Perturber(lm.model, trainable_parameters(lm.model, "lora"), 0)
    assert perturber.cache

    def scalars_and_loss():
        with torch.no_grad():
            g, _ = two_point_scalars(perturber, 0, 1, 1e-2, batches, lambda b: task.losses(lm.model, b), 24, "cpu")
        with torch.no_grad():  # the step's grad mode: one compiled graph serves both
            loss = torch.cat([task.losses(lm.model, b) for b in batches])
        return g, loss

    def update():
        perturber.apply_update(0, [1.0], 5.0)

    g_eager, loss_eager = scalars_and_loss()
    update()
    _, moved_eager = scalars_and_loss()
    perturber.apply_update(0, [-1.0], 5.0)  # back (fp32 rounding aside) before compiling
    start = [p.detach().clone() for _, p in trainable_parameters(lm.model, "lora")]
    compile_body(lm.model)
    g_comp, loss_comp = scalars_and_loss()
    update()
    _, moved_comp = scalars_and_loss()
    assert np.abs(g_eager).min() > 1e-3
    np.testing.assert_allclose(g_comp, g_eager, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(loss_comp, loss_eager, rtol=1e-4, atol=1e-5)
    assert (moved_eager - loss_eager).abs().max() > 1e-3  # the update moves the losses
    torch.testing.assert_close(moved_comp, moved_eager, rtol=1e-4, atol=1e-5)
    assert any(not torch.equal(a, p) for a, (_, p) in zip(start, trainable_parameters(lm.model, "lora")))


def test_every_train_flag_says_what_it_means(capsys, monkeypatch):
    """`paczero train --help` gives every config key's meaning (its comment in TrainConfig) and default."""
    import dataclasses

    from paczero.cli import _field_help

    helps = _field_help()
    missing = [f.name for f in dataclasses.fields(TrainConfig) if not helps.get(f.name)]
    assert not missing, f"TrainConfig fields without a comment: {missing}"
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside a hyphenated name
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "one of pac-zpl, pac-mi, hybrid, mezo, dpzero, dp-aggzo," in out and "(default: 1000)" in out


def test_labels_outside_the_verbalizer_stop_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import paczero.models

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the prompts were checked")

    monkeypatch.setattr(paczero.models, "load_model", no_model)
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"sentence": f"s{i}", "label": i % 3}) + "\n" for i in range(40)))
    assert main(["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(path), "--n-train", "16",
                 "--n-dev", "8", "--n-test", "8", "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not in the verbalizer labels [0, 1]" in err and not (tmp_path / "o").exists()


def test_the_final_weights_are_evaluated_on_dev_once(tmp_path, monkeypatch):
    """finish() takes the last step's dev metrics from evals.jsonl instead of a second pass over dev
    (costly on SQuAD, which decodes); an evaluation per eval_every, and one on test."""
    import paczero.train as tr

    calls = []
    real = tr.evaluate
    monkeypatch.setattr(tr, "evaluate", lambda setup, enc: calls.append(len(enc)) or real(setup, enc))
    out = tmp_path / "run"
    summary = train(TrainConfig(**TINY, out_dir=str(out)), log=_quiet)  # 4 steps, dev every 2
    assert calls == [8, 8, 8]  # dev at steps 2 and 4, then test
    last = json.loads((out / "evals.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 4 and summary["final_dev"] == last["dev"]


def test_the_released_model_carries_a_model_card_with_the_privacy_statement(tmp_path):
    """model/README.md: peft's empty template replaced by what was trained, the metrics and the
    privacy statement in words; a local data file is not named (its path may be private)."""
    data = tmp_path / "patients-2026.jsonl"
    data.write_text("".join(json.dumps({"sentence": f"s{i}", "label": i % 2}) + "\n" for i in range(40)))
    out = tmp_path / "run"
    summary = train(TrainConfig(**{**TINY, "task": "sst2"}, data=str(data), out_dir=str(out)), log=_quiet)
    card = (out / "model" / "README.md").read_text()
    assert summary["privacy_text"] in card and "Model Card for Model ID" not in card
    assert "patients" not in card and "a local data file" in card
    assert "the universe itself" in summary["privacy_text"] and "8 dev examples" in summary["privacy_text"]


def test_a_model_card_names_a_hub_model_but_not_a_local_path(tmp_path):
    from paczero.statement import model_card

    summary = train(TrainConfig(**{**TINY, "steps": 1}, out_dir=str(tmp_path / "run")), log=_quiet)
    for model, named in (("facebook/opt-1.3b", True), (str(tmp_path / "private" / "model"), False)):
        card = model_card({**summary, "config": {**summary["config"], "model": model}})
        assert (model in card) == named and ("base_model: facebook/opt-1.3b" in card) == named
        assert named or "a local model" in card


def test_a_run_stopped_before_its_first_release_resumes_from_scratch(tmp_path):
    """A crash after run.json was written but before the journal's first line (nothing released, no
    checkpoint): --resume starts the run at step 0 instead of failing. Red if the resume reads a
    checkpoint's mechanism state that does not exist."""
    out = tmp_path / "run"
    cfg = TrainConfig(**TINY, out_dir=str(out))
    train(cfg, log=_quiet)
    for name in ("journal.jsonl", "log.jsonl", "evals.jsonl", "summary.json"):
        (out / name).unlink()
    import shutil
    shutil.rmtree(out / "checkpoints")
    summary = train(cfg.replace(resume=True), log=_quiet)
    assert summary["privacy"]["steps"] == TINY["steps"] and len(_records(out)) == TINY["steps"]
