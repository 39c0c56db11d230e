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
    ("dpzero-aggzo1", {"epsilon": 2.0, "sample_rate": 0.5}),
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
    if mechanism in ("dpzero", "dp-aggzo", "dpzero-aggzo1"):  # the private Poisson batch is not logged, nor the time it took
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
    assert summary["environment"]["torch"] == torch.__version__ and summary["environment"]["device"] == "cpu"


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
        losses = [r["train_loss"] for r in _records(tmp_path / objective)]
        if objective == "f1":  # minus the F1 of a greedy generation: in [-1, 0] (an answer NLL is > 0)
            assert all(-1.0 <= x <= 0.0 for x in losses)
            assert (s["config"]["answer_stop"], s["config"]["max_length"]) == ("newline-token", 2048)
        else:
            assert all(x > 0 for x in losses)


def test_the_squad_recipes_f1_objective_runs_end_to_end_on_a_local_file(tmp_path):
    """A shipped SQuAD recipe (objective f1 and the scripts' generation settings) trains and evaluates on a small
    local SQuAD-format file with a tiny model: every train loss is minus a generation F1 (an NLL mutant is > 0)."""
    from paczero.flags import config_from_args
    import argparse

    rows = []
    for i in range(12):
        ctx = f"The river {i} flows to town{i}."
        rows.append({"id": str(i), "title": f"River {i}", "context": ctx, "question": f"Where does river {i} flow?",
                     "answers": {"text": [f"town{i}"], "answer_start": [ctx.index("town")]}})
    path = tmp_path / "squad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ns = argparse.Namespace(recipe="headline/squad-opt1.3b-lora-zpl", config=None, model="tiny-opt", dtype="fp32",
                            data=str(path), n_train=6, n_dev=3, n_test=3, steps=2, eval_every=1, num_subsets=4,
                            max_new_tokens=4, private_seed=1, progress=False, eval_zero_shot=False,
                            out_dir=str(tmp_path / "run"))
    cfg = config_from_args(ns)
    assert (cfg.objective, cfg.answer_stop, cfg.max_length) == ("f1", "newline-token", 2048)
    s = train(cfg, log=_quiet)
    assert all(-1.0 <= r["train_loss"] <= 0.0 for r in _records(tmp_path / "run"))
    assert 0.0 <= s["test"]["f1"] <= 1.0 and set(s["test"]) >= {"f1", "em", "loss"}


def test_a_ladder_is_one_run_with_its_weights_saved_and_evaluated_at_each_rung(tmp_path):
    """rungs [2, 4, 6]: one trajectory of 6 steps (the polynomial schedule spans all 6, not a 2-step run per rung),
    each rung's weights saved and evaluated; the recorded test metric is that of the saved weights (evaluated
    again here), the rung-4 weights are the step-4 checkpoint's, and the dev-best of each prefix is the loop's
    choice at that step."""
    from safetensors.torch import load_file

    from paczero.run.build import build, evaluate, load_trainable
    from paczero.models import trainable_parameters

    cfg = TrainConfig(**{**TINY, "steps": 6, "eval_every": 4}, mechanism="pac-zpl", lr=0.05, lr_schedule="polynomial",
                      rungs=[2, 4, 6], out_dir=str(tmp_path / "run"))
    s = train(cfg, log=_quiet)
    run = tmp_path / "run"
    assert [r["step"] for r in s["rungs"]] == [2, 4, 6]
    assert [r["lr"] for r in _records(run)] == [lr_at(cfg, t) for t in range(6)]  # one schedule over T = 6
    assert _records(run)[1]["lr"] != lr_at(cfg.replace(steps=2), 1)
    evals = {r["step"]: r for r in map(json.loads, (run / "evals.jsonl").read_text().splitlines())}
    assert set(evals) == {2, 4, 6}  # rung 2 is evaluated on dev although eval_every is 4
    setup = build(cfg)
    params = trainable_parameters(setup.model, cfg.track)
    for r in s["rungs"]:
        weights = load_file(str(run / r["weights"]))
        load_trainable(params, weights)
        assert evaluate(setup, setup.test_enc) == r["test"] and r["dev"] == evals[r["step"]]["dev"]
        assert r["dev_best"]["step"] == evals[r["step"]]["best_step"] <= r["step"]
        assert r["mi_spent_realised"] == 0.0
    rung4 = load_file(str(run / "rungs" / "step-4" / "weights.safetensors"))
    ckpt4 = load_file(str(run / "checkpoints" / "step-000004" / "weights.safetensors"))
    assert rung4.keys() == ckpt4.keys() and all(torch.equal(rung4[k], ckpt4[k]) for k in rung4)
    assert "post-processing" in s["privacy"]["rungs"] and "Rungs 2, 4, 6" in s["privacy_text"]
    assert json.loads((run / "summary.json").read_text())["rungs"] == s["rungs"]


@pytest.mark.slow
def test_a_ladder_resumed_between_a_step_and_its_rung_records_the_rung_once(tmp_path):
    """A crash after step 6 was journaled but before its rung was recorded: the resume replays steps 5-6 from
    the step-4 checkpoint and records rung 6 with the uninterrupted run's weights and metrics."""
    import shutil

    from safetensors.torch import load_file

    cfg = TrainConfig(**{**TINY, "steps": 6}, mechanism="pac-zpl", lr=0.05, rungs=[2, 6], out_dir=str(tmp_path / "r"))
    full = train(cfg, log=_quiet)
    run = tmp_path / "r"
    before = load_file(str(run / "rungs" / "step-6" / "weights.safetensors"))
    shutil.rmtree(run / "checkpoints" / "step-000006")
    shutil.rmtree(run / "rungs" / "step-6")
    (run / "summary.json").unlink()
    for name in ("rungs.jsonl", "evals.jsonl"):  # their records of step 6 were not written yet
        lines = (run / name).read_text().splitlines()
        (run / name).write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] != 6))
    resumed = train(cfg.replace(resume=True), log=_quiet)
    assert resumed["rungs"] == full["rungs"]
    after = load_file(str(run / "rungs" / "step-6" / "weights.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [json.loads(line)["step"] for line in (run / "rungs.jsonl").read_text().splitlines()] == [2, 6]


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
    """Bad input with --overwrite keeps the earlier run, whole, until the new one has read its data and
    model. A data file among the files --overwrite would delete (under model/) is refused. The good
    overwrite replaces the run's own files and keeps the user's (a note, a data file beside the run), with
    a warning that names them. Red if --overwrite deletes every entry of the folder."""
    out = tmp_path / "run"
    train(TrainConfig(**{**TINY, "steps": 1}, out_dir=str(out)), log=_quiet)
    capsys.readouterr()  # the good run's own lines (the dtype auto chose)
    (out / "MODEL_CARD.md").write_text("mine")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"sentence": f"s{i}", "label": "positive"}) + "\n" for i in range(40)))
    rows = "".join(json.dumps({"sentence": f"s{i}", "label": i % 2}) + "\n" for i in range(40))
    inside = out / "model" / "data.jsonl"
    inside.write_text(rows)
    beside = out / "data.jsonl"
    beside.write_text(rows)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".paczero.lock"}
    flags = ["train", "--model", "tiny-llama", "--task", "sst2", "--n-train", "16", "--n-dev", "8", "--n-test", "8",
             "--steps", "1", "--no-progress", "--out-dir", str(out), "--overwrite"]
    for data, needle in ((bad, "not an integer"), (tmp_path / "missing.tsv", "does not exist"),
                         (inside, "holds this run's data file")):
        assert main(flags + ["--data", str(data)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and needle in err, err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".paczero.lock"} == before
    old_log = (out / "log.jsonl").read_text()
    assert main(flags + ["--data", str(beside)]) == 0
    assert (out / "MODEL_CARD.md").read_text() == "mine" and beside.read_text() == rows  # the user's: kept
    assert not inside.exists() and (out / "log.jsonl").read_text() != old_log  # the run's own: replaced
    assert json.loads((out / "run.json").read_text())["config"]["data"] == str(beside.resolve())
    err = capsys.readouterr().err
    assert "paczero: warning: --overwrite replaced the run in" in err and "kept what paczero did not write " \
        "there: MODEL_CARD.md, data.jsonl" in err


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
    (["train", "--rungs", "400", "200"], "rungs must be increasing"),
    (["train", "--steps", "500", "--rungs", "250", "1000"], "rung 1000 lies beyond steps (500)"),
    (["train", "--task", "squad", "--answer-stop", "eos"], "answer_stop must be one of"),
    (["train", "--task", "squad", "--max-length", "40"], "max_length (40) must exceed max_new_tokens (50)"),
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
    from paczero.run.build import build
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
    frozen the adapters would give + and - losses equal (g = 0) and miss the update
    (:func:`_check_compiled_lora_step`). The check runs in a Python process of its own: a native failure in the
    kernels Inductor compiled on this machine (an abort ends its whole process) then fails this test with that
    process's own error output and traceback, where in the test process it would end the suite unreported."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c",
                           "import test_train; test_train._check_compiled_lora_step()"],
                          cwd=Path(__file__).parent, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"the compiled check's process ended with {done.returncode}:\n{done.stderr[-8000:]}"


def _check_compiled_lora_step():
    """The compiled step's check, run by :func:`test_compiled_lora_step_sees_the_perturbation_and_the_update`."""
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

    from paczero.flags import field_help

    helps = field_help()
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
    assert err.count("\n") == 0 and not (tmp_path / "o").exists()
    assert "three.jsonl record 3: label 2 is not one of the labels the verbalizer scores (0, 1)" in err


def test_the_final_weights_are_evaluated_on_dev_once(tmp_path, monkeypatch):
    """finish() takes the last step's dev metrics from evals.jsonl instead of a second pass over dev
    (costly on SQuAD, which decodes); an evaluation per eval_every, and one on test."""
    import paczero.run.finish as fin
    import paczero.train as tr

    calls = []
    real = tr.evaluate
    monkeypatch.setattr(tr, "evaluate", lambda setup, enc: calls.append(len(enc)) or real(setup, enc))
    monkeypatch.setattr(fin, "evaluate", lambda setup, enc: calls.append(len(enc)) or real(setup, enc))
    per_class = fin.evaluate_per_class  # the test pass (loss, accuracy and each class's recall from one pass)
    monkeypatch.setattr(fin, "evaluate_per_class", lambda setup, enc: calls.append(len(enc)) or per_class(setup, enc))
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
    from paczero.run.release import model_card

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
    for name in ("private/journal.jsonl", "log.jsonl", "evals.jsonl", "summary.json"):
        (out / name).unlink()
    import shutil
    shutil.rmtree(out / "checkpoints")
    summary = train(cfg.replace(resume=True), log=_quiet)
    assert summary["privacy"]["steps"] == TINY["steps"] and len(_records(out)) == TINY["steps"]


@pytest.mark.parametrize("select", ["loss", "accuracy", None])
def test_dev_best_keeps_the_step_the_select_metric_picks(tmp_path, select):
    """select_metric loss keeps the evaluation with the lowest dev loss, ties to the earliest; accuracy the highest
    accuracy (ties: lower loss, then earliest); without select_metric a classification run selects by the dev
    loss. Recomputed here from evals.jsonl, independent of the loop's bookkeeping; summary.json names the metric.
    Red if selection ignores select_metric (the task's accuracy would pick another step in at least one of the
    scripted sequences below), if the default goes back to the task's accuracy (step 6, not 4), or if a loss tie
    moves to the later."""
    import paczero.train as tr

    # (loss, accuracy) per evaluation at steps 2, 4, 6, 8: lowest loss at step 4 (tied at 8), best accuracy at 6
    scripted = iter([{"loss": 0.7, "accuracy": 0.5}, {"loss": 0.4, "accuracy": 0.5}, {"loss": 0.6, "accuracy": 0.9},
                     {"loss": 0.4, "accuracy": 0.6}, {"loss": 0.5, "accuracy": 0.5}])
    real = tr.evaluate
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(tr, "evaluate", lambda setup, enc: next(scripted) if enc is setup.dev_enc else real(setup, enc))
    try:
        out = tmp_path / "run"
        summary = train(TrainConfig(**{**TINY, "steps": 8}, select_metric=select, out_dir=str(out)), log=_quiet)
    finally:
        monkeypatch.undo()
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    chosen = select or "loss"
    if chosen == "loss":
        expected = min(evals, key=lambda r: (r["dev"]["loss"], r["step"]))["step"]
    else:
        expected = min(evals, key=lambda r: (-r["dev"]["accuracy"], r["dev"]["loss"], r["step"]))["step"]
    assert expected == {"loss": 4, "accuracy": 6}[chosen]
    assert summary["selected_step"] == expected and summary["select_metric"] == chosen
    assert json.loads((out / "summary.json").read_text())["select_metric"] == chosen


def test_select_metric_must_fit_the_task():
    with pytest.raises(ConfigError, match="select_metric f1 does not apply to task demo"):
        TrainConfig(**TINY, select_metric="f1").validate()
    with pytest.raises(ConfigError, match="select_metric must be one of loss, accuracy, f1"):
        TrainConfig(**TINY, select_metric="eval_loss").validate()
    assert TrainConfig(**{**TINY, "task": "squad"}, select_metric="f1").validate().select_metric == "f1"


def test_max_length_is_a_flag_and_a_run_says_how_many_examples_it_cut(tmp_path, capsys, caplog):
    """A 10 MB example was cut to a max_length that no flag set, without a word. Now --max-length sets it and
    the run warns with the number cut in each split (here 4 of 16 training and 1 of 8 dev examples are long
    by construction, the rest a few tokens). Under DP whether a training row was cut is private and not said."""
    import logging

    from paczero.run.build import build

    long_text = " ".join(["word"] * 300)
    rows = ([{"sentence": long_text if i < 4 else f"short {i}", "label": i % 2, "split": "train"} for i in range(16)]
            + [{"sentence": long_text if i < 1 else f"dev {i}", "label": i % 2, "split": "dev"} for i in range(8)]
            + [{"sentence": f"test {i}", "label": i % 2, "split": "test"} for i in range(8)])
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = ["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(path), "--n-train", "16", "--n-dev", "8",
             "--n-test", "8", "--steps", "1", "--num-subsets", "4", "--no-progress", "--no-eval-zero-shot",
             "--max-length", "64", "--out-dir", str(tmp_path / "run")]
    assert main(flags) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("paczero: warning:")]
    assert warned == ["paczero: warning: 4 of 16 training, 1 of 8 dev examples are longer than max_length (64 "
                      "tokens) and lose tokens from the left (the start of their text); raise --max-length to keep "
                      "them whole"]
    cfg = TrainConfig(**{**TINY, "task": "sst2"}, data=str(path), max_length=64)
    setup = build(cfg, with_model=False)
    assert max(len(e.prompt_ids) for e in setup.universe) <= 64
    assert sorted(len(e.prompt_ids) for e in setup.universe)[-5] < 20  # the short ones whole
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paczero"):
        build(cfg.replace(max_length=4096), with_model=False)  # nothing cut: no warning
        assert not caplog.records
        build(cfg.replace(mechanism="dpzero", epsilon=2.0), with_model=False)
    (message,) = [r.getMessage() for r in caplog.records]  # DP: the dev rows (its stable split's), not training's
    assert "training" not in message and " dev examples are longer than max_length" in message


def test_build_fills_micro_batches_on_a_gpu_and_in_native_bf16(tmp_path, monkeypatch):
    """The task a run builds fills its micro-batches to the token budget where the device is a GPU, or a CPU in
    bf16 whose flags hold native bf16, and keeps them near zero padding on a CPU in fp32 or in emulated bf16.
    Mutation that turns it red: _task not passing fill_batches, or passing the device alone (the dtype ignored),
    or fills_batches ignoring the CPU's flags."""
    import paczero.run.build as build_module
    from paczero.machine.hardware import CPU_FLAGS_ENV
    from paczero.run.build import build

    cfg = TrainConfig(**TINY, device="cpu")
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx512f avx512_bf16")
    assert build(cfg.replace(dtype="fp32"), with_model=False).task.fill_batches is False
    assert build(cfg.replace(dtype="bf16", mu=1e-2), with_model=False).task.fill_batches is True
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2")  # bf16 emulated: padded tokens cost compute
    assert build(cfg.replace(dtype="bf16", mu=1e-2), with_model=False).task.fill_batches is False
    monkeypatch.setattr(build_module, "resolve_device", lambda device: "cuda:0")
    assert build(cfg.replace(device="cuda"), with_model=False).task.fill_batches is True


def test_a_resume_with_other_settings_is_refused_naming_them(tmp_path):
    """--token-budget (and every key outside RESUME_FREE) was accepted silently on a resume; now one line
    names each differing key with both values. Keys of where and how fast it runs may change. Red if
    check_resumed_config skips a key that changes the computation."""
    from paczero.run.journal import RESUME_FREE

    cfg = TrainConfig(**TINY, out_dir=str(tmp_path / "r"))
    train(cfg, log=_quiet)
    (tmp_path / "r" / "summary.json").unlink()
    with pytest.raises(ConfigError, match=r"^cannot resume: eval_every, token_budget differ from the original run "
                                          r"\(eval_every 2 there, 3 now; token_budget 4096 there, 2048 now\)"):
        train(cfg.replace(resume=True, token_budget=2048, eval_every=3), log=_quiet)
    assert RESUME_FREE < set(TrainConfig.field_names()) and not {"token_budget", "eval_every"} & RESUME_FREE
    summary = train(cfg.replace(resume=True, checkpoint_every=3, progress=True, compile=False), log=_quiet)
    assert summary["privacy"]["steps"] == TINY["steps"]


def test_third_party_noise_is_filtered_and_nothing_else(recwarn):
    """peft's FutureWarning about transformers' is_gradient_checkpointing (on every LoRA run) and its
    fan_in_fan_out note (GPT-2) do not reach the user; another warning of the same category does, and
    transformers' progress bars are as they were afterwards."""
    import warnings

    from transformers.utils import logging as hf_logging

    from paczero.models import load_model, quiet_transformers

    warnings.simplefilter("always")
    bars = hf_logging.is_progress_bar_enabled()
    load_model("tiny-gpt2", track="lora")
    load_model("tiny-llama", track="lora")
    assert not [w for w in recwarn if "is_gradient_checkpointing" in str(w.message) or "fan_in_fan_out" in str(w.message)]
    with quiet_transformers():
        warnings.warn("another deprecation", FutureWarning)
    assert [str(w.message) for w in recwarn] == ["another deprecation"]
    assert hf_logging.is_progress_bar_enabled() == bars


def test_completion_task_trains_end_to_end_from_the_command_line(tmp_path, capsys):
    """`paczero train --task completion` on a prompt/completion file: dev-best selection keeps the lowest
    dev completion NLL, the summary reports NLL and perplexity; bad files stop in one line (exit 2)."""
    rows = [{"prompt": f"Customer: where is order {i}?\nAgent:", "completion": f" Order {i} ships today.",
             "answer": f"Order {i} ships today."} for i in range(40)]
    data = tmp_path / "support.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    flags = ["train", "--model", "tiny-opt", "--task", "completion", "--n-train", "16", "--n-dev", "8",
             "--n-test", "4", "--steps", "4", "--eval-every", "2", "--num-subsets", "4", "--max-new-tokens", "4",
             "--no-progress", "--no-eval-zero-shot", "--out-dir", str(out)]
    assert main(flags + ["--data", str(data)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "loss" and summary["select_metric"] == "loss"
    assert {"loss", "nll_per_token", "perplexity", "em", "f1"} <= set(summary["test"])
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    best = min(evals, key=lambda r: (r["dev"]["loss"], r["step"]))
    assert summary["selected_step"] == best["step"]
    capsys.readouterr()
    for bad, needle in (([{"prompt": "p", "reply": "c"}] * 40, "lacks column(s) ['completion']"),
                        ([{"prompt": "p", "completion": ""}] * 40, "record 1: completion is missing or empty")):
        data.write_text("".join(json.dumps(r) + "\n" for r in bad))
        assert main(flags + ["--data", str(data), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_label_names_on_the_command_line(tmp_path, capsys):
    """--labels negative,positive reads a file labelled by name; a name outside the list is one line."""
    data = tmp_path / "named.jsonl"
    data.write_text("".join(json.dumps({"sentence": f"s{i}", "label": ["negative", "positive"][i % 2]}) + "\n"
                            for i in range(40)))
    flags = ["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(data), "--n-train", "16",
             "--n-dev", "8", "--n-test", "8", "--steps", "1", "--num-subsets", "4", "--no-progress",
             "--no-eval-zero-shot", "--out-dir", str(tmp_path / "run")]
    assert main(flags + ["--labels", "negative,positive"]) == 0
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert config["labels"] == ["negative", "positive"]
    capsys.readouterr()  # the good run's own lines
    assert main(flags + ["--labels", "neg,pos", "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "label 'negative' is not one of the labels neg, pos" in err[0], err
    assert main(flags[:-2] + ["--task", "completion", "--labels", "a,b", "--out-dir", str(tmp_path / "x")]) == 2
    assert "labels apply to the classification tasks" in capsys.readouterr().err


def test_the_expected_duration_line_from_the_median_of_the_first_steps():
    """Steps of 10, 50 and 12 s (a slow first one is the median's to drop): after the third, one line, at the
    median 12 s a step, 100 steps: "about 20 min"; nothing before the third step nor after the line; nothing
    for a DP run however slow; nothing for a run projected under a minute, nor for one with no step left after
    the timed ones. Red if the mean is used (24 s, 40 min), if the line repeats, or if a DP run says a time."""
    from paczero.run.duration import Estimate

    said = []
    eta = Estimate(100, 0, False, said.append)
    for seconds in (50.0, 10.0):
        assert eta.add(seconds) == seconds and said == []
    eta.add(12.0)
    assert said == ["paczero: about 20 min for 100 steps at 12 s a step (from the first 3 steps)"]
    eta.add(12.0)
    assert len(said) == 1
    resumed = []
    Estimate(1000, 400, False, resumed.append).add(9.0)
    for n, (start, steps, private) in enumerate([(0, 100, True), (0, 10, False), (0, 3, False), (97, 100, False)]):
        quiet = []
        eta = Estimate(steps, start, private, quiet.append)
        for _ in range(5):
            eta.add(5.0 if n != 0 else 600.0)
        assert quiet == [], (n, quiet)
    assert resumed == []
    eta = Estimate(1000, 400, False, resumed.append)
    for _ in range(3):
        eta.add(9.0)
    assert resumed == ["paczero: about 90 min for 600 steps at 9 s a step (from the first 3 steps)"]


@pytest.mark.parametrize("mechanism,extra", [("pac-zpl", {}), ("dpzero", {"epsilon": 2.0, "sample_rate": 0.5})])
def test_a_run_says_its_expected_duration_after_its_first_steps_but_a_dp_run(tmp_path, monkeypatch, mechanism,
                                                                               extra):
    """A run of 4 steps with the threshold at 0 s: a PAC-ZPL run says one duration line after its third step,
    through the run's own lines (not into log.jsonl or any other file of the run); a DPZero run (its step time
    is private) says none. Red if the DP run says a time, or if the line reaches a file of the run folder."""
    import paczero.run.duration as duration

    monkeypatch.setattr(duration, "SAY_FROM", 0.0)
    lines = []
    cfg = TrainConfig(**TINY, mechanism=mechanism, out_dir=str(tmp_path / "run"), **extra)
    train(cfg, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    said = [line for line in lines if "s a step (from the first 3 steps)" in line]
    assert len(said) == (0 if mechanism == "dpzero" else 1), lines
    files = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file()
                    and p.suffix in (".json", ".jsonl", ".md", ".txt", ".csv"))
    assert "a step (from the first" not in files


def test_a_classification_run_records_each_classs_test_recall(tmp_path):
    """summary.json holds each class's recall on test for the released weights (``test_recall``) and for the base
    model (``zero_shot.test_recall``), from the pass whose accuracy it records: recomputed here from the test rows'
    labels and the released model's predictions (task.predict on the same rows, an independent path), and their
    support-weighted mean is the recorded accuracy. Mutation that turns it red: recall computed over the predicted
    rows (precision) instead of the true ones, or the zero-shot recall taken from the released weights."""
    import numpy as np

    from paczero.models import trainable_parameters
    from paczero.run.build import build, load_trainable

    out = tmp_path / "r"
    cfg = TrainConfig(**{**TINY, "eval_zero_shot": True, "steps": 4, "lr": 0.5}, out_dir=str(out))
    summary = train(cfg, log=_quiet)
    recall, zero = summary["test_recall"], summary["zero_shot"]["test_recall"]
    assert recall != zero  # the training moved the predictions: the two recalls are told apart
    setup = build(cfg)
    names = setup.task.class_names()
    assert list(recall) == names and list(zero) == names
    truth = np.asarray([e.label for e in setup.test_enc])
    support = {n: int((truth == i).sum()) for i, n in enumerate(names)}

    def recalls(pred):
        return {n: None if not support[n] else float((pred[truth == i] == setup.task.labels[i]).mean())
                for i, n in enumerate(names)}

    assert zero == pytest.approx(recalls(setup.task.predict(setup.model, setup.test_enc)))
    from safetensors.torch import load_file

    load_trainable(trainable_parameters(setup.model, cfg.track), load_file(str(out / "selected.safetensors")))
    assert recall == pytest.approx(recalls(setup.task.predict(setup.model, setup.test_enc)))
    for rec, acc in ((recall, summary["test"]["accuracy"]), (zero, summary["zero_shot"]["test"]["accuracy"])):
        assert sum(rec[n] * support[n] for n in names if support[n]) / len(truth) == pytest.approx(acc)
