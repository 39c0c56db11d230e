"""The released model folder (RUN/model) is usable as trained: by plain transformers/peft with its task.json
(examples/use_released_model.py), by `paczero eval MODEL_DIR`, and on the hub through `paczero push`."""
from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import stat
from pathlib import Path

import pytest

from paczero.config import TrainConfig
from paczero.run.release import TASK_FILE, model_card
from paczero.train import train

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "use_released_model.py"
LABELS = ["negative", "positive"]  # not the default verbalizer: a release without them scores other words
RUN = dict(model="tiny-opt", task="demo", n_train=32, n_dev=16, n_test=40, steps=6, eval_every=3, checkpoint_every=3,
           num_subsets=4, private_seed=3, progress=False, labels=LABELS, verbalizer={0: " negative", 1: " positive"},
           dev_best=False)
LR = {"lora": 0.2, "ft": 0.01}  # large enough that the fine-tuned test accuracy differs from the zero-shot one
SMALL = {**RUN, "n_train": 8, "n_dev": 4, "n_test": 4, "steps": 2, "eval_every": 2, "checkpoint_every": 2}


def _quiet(*a, **k):
    pass


def _script():
    spec = importlib.util.spec_from_file_location("use_released_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=["lora", "ft"])
def released(request, tmp_path_factory):
    track = request.param
    out = tmp_path_factory.mktemp(f"release-{track}") / "run"
    summary = train(TrainConfig(**RUN, track=track, lr=LR[track], out_dir=str(out)), log=_quiet)
    assert summary["test"]["accuracy"] != summary["zero_shot"]["test"]["accuracy"]  # so a base-only score shows
    return track, out, summary


@pytest.fixture(scope="module", params=["lora", "ft"])
def small(request, tmp_path_factory):
    """A two-step run of each track, for what does not need a model that learned something."""
    out = tmp_path_factory.mktemp(f"small-{request.param}") / "run"
    return request.param, out, train(TrainConfig(**SMALL, track=request.param, out_dir=str(out)), log=_quiet)


def _test_examples(summary) -> list[dict]:
    """The run's test examples, as paczero drew them (the file a user would score)."""
    from paczero.tasks import load_splits

    cfg = summary["config"]
    return load_splits(cfg["task"], source=cfg["data"], n_train=cfg["n_train"], n_dev=cfg["n_dev"],
                       n_test=cfg["n_test"], seed=cfg["data_seed"], labels=cfg["labels"])[2]


def test_the_example_script_uses_no_paczero():
    imported = set()
    for node in ast.walk(ast.parse(SCRIPT.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "argparse", "csv", "json", "os", "pathlib", "torch", "transformers", "peft"}, imported


@pytest.mark.slow
def test_the_example_script_reproduces_the_runs_test_accuracy(released, tmp_path):
    """Plain transformers/peft on the released folder and its task.json score the run's test examples to the
    run's recorded test accuracy exactly. Red if task.json loses the template, the verbalizer or the label
    names, if the adapter is not loaded (the zero-shot accuracy differs), or if the released weights are not
    the selected ones."""
    from paczero.models import load_model

    track, out, summary = released
    script = _script()
    base = None
    if track == "lora":  # the tiny base is not on the hub: its note says how paczero builds it
        task = json.loads((out / "model" / TASK_FILE).read_text())
        assert task["base_model"] == "tiny-opt" and "init_seed=0" in task["base_model_note"]
        base = tmp_path / "base"
        load_model("tiny-opt", track="ft", init_seed=summary["config"]["seed"]).model.save_pretrained(base)
    model, tokenizer, task = script.load_released(out / "model", None if base is None else str(base))
    examples = _test_examples(summary)
    data = tmp_path / "test.jsonl"  # labels by name, as a user's file may hold them
    data.write_text("".join(json.dumps({**ex, "label": LABELS[ex["label"]]}) + "\n" for ex in examples))
    accuracy = script.accuracy(model, tokenizer, task, script.read_examples(data))
    assert accuracy == pytest.approx(summary["test"]["accuracy"], abs=1e-6)  # fp32 mean of 40 0/1 values
    assert round(accuracy * len(examples)) == round(summary["test"]["accuracy"] * len(examples))
    # the command line, on a file whose sentences are in a column of another name (--columns sentence=text)
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text("".join(json.dumps({"text": ex["sentence"], "label": ex["label"]}) + "\n" for ex in examples))
    import contextlib
    import io
    import sys

    argv = [str(SCRIPT), str(out / "model"), str(renamed), "--columns", "sentence=text"]
    argv += ["--base-model", str(base)] if base is not None else []
    printed = io.StringIO()
    old_argv, sys.argv = sys.argv, argv
    try:
        with contextlib.redirect_stdout(printed):
            script.main()
    finally:
        sys.argv = old_argv
    assert json.loads(printed.getvalue())["accuracy"] == accuracy


@pytest.mark.slow
def test_paczero_eval_of_the_released_folder_reports_the_runs_test_metrics(released, tmp_path, capsys):
    """`paczero eval MODEL_DIR` reads task.json (task, verbalizer, label names, test split): the same test
    metrics as the run, labelled as the fine-tuned model, also for a copy of the folder elsewhere (no run.json
    beside it). Red if eval scores with the default verbalizer, loads no adapter, or calls it zero-shot."""
    from paczero.cli import main

    track, out, summary = released
    copy = tmp_path / "elsewhere" / "released"
    shutil.copytree(out / "model", copy)
    for folder in (out / "model", copy):
        capsys.readouterr()
        assert main(["eval", str(folder), "--split", "test", "--device", "cpu"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["test"] == summary["test"]
        assert "fine-tuned" in result["weights"] and "zero-shot" not in result["weights"]
        assert ("LoRA adapter" in result["weights"]) == (track == "lora")


def test_the_released_folder_is_public_and_portable(small):
    """Every file of the released folder is 0644 (the weights too); the private files of the run stay 0600;
    the adapter names its base portably (no local path); the card carries the metadata a hub needs and the
    task definition. Red if a weight file keeps the 0600 of safetensors or a local path reaches the card."""
    from huggingface_hub import ModelCard

    track, out, summary = small
    folder = out / "model"
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name
    assert stat.S_IMODE((out / "private" / "journal.jsonl").stat().st_mode) == 0o600
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in out.glob("checkpoints/*/private.json"))
    names = {p.name for p in folder.iterdir()}
    assert {"README.md", TASK_FILE, "tokenizer.json"} <= names
    assert ("adapter_model.safetensors" in names) == (track == "lora") and ("config.json" in names) == (track == "ft")
    if track == "lora":
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-opt"
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == "apache-2.0" and card.data.pipeline_tag == "text-generation"
    assert card.data.metrics == ["accuracy"]
    assert card.data.library_name == ("peft" if track == "lora" else "transformers")
    assert summary["privacy_text"] in card.text and '1 → `" positive"`' in card.text and str(out) not in str(card)


def test_a_card_names_the_hub_base_and_dataset_and_keeps_local_paths_out(small, tmp_path):
    """The built-in SmolLM2 is named by its hub id, a hub model by its id, a local folder not at all; SST-2
    from the hub gives datasets and eval results."""
    from huggingface_hub import ModelCard

    _, _, summary = small
    cfg = summary["config"]
    for model, base in (("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
                        ("facebook/opt-1.3b", "facebook/opt-1.3b"), (str(tmp_path / "patients" / "model"), None)):
        text = model_card({**summary, "config": {**cfg, "model": model, "task": "sst2", "data": None}})
        card = ModelCard(text)
        assert card.data.base_model == base and "patients" not in text
        assert card.data.datasets == ["stanfordnlp/sst2"]
        assert card.data.eval_results[0].metric_value == summary["test"]["accuracy"]
        assert card.data.license == ("apache-2.0" if model.startswith("smollm2") else "other")


class _Hub:
    """A stand-in for huggingface_hub.HfApi that records what it is asked to do (the hub is out of reach)."""

    calls: list = []
    fail: str | None = None

    def __init__(self, *a, **k):
        pass

    def create_repo(self, repo_id, **kw):
        if _Hub.fail:
            raise OSError(_Hub.fail)
        _Hub.calls.append(("create_repo", repo_id, kw))
        return f"https://hub.example/{repo_id}"

    def upload_folder(self, *, repo_id, folder_path, **kw):
        files = sorted(p.name for p in Path(folder_path).iterdir())
        _Hub.calls.append(("upload_folder", repo_id, {**kw, "files": files, "folder": folder_path}))
        return type("CommitInfo", (), {"commit_url": f"https://hub.example/{repo_id}/commit/1"})()


def test_push_uploads_the_released_folder_through_huggingface_hub(small, monkeypatch, capsys):
    """`paczero push RUN --repo-id ...` creates the repository and uploads RUN/model (weights, task.json,
    card), never the run's private files; a bad repo id or an unfinished run is refused (exit 2) before the
    hub is called; a failing hub is one line (exit 1). Red if push uploads the run folder itself."""
    import huggingface_hub

    from paczero.cli import main

    _, out, _ = small
    monkeypatch.setattr(huggingface_hub, "HfApi", _Hub)
    _Hub.calls, _Hub.fail = [], None
    assert main(["push", str(out), "--repo-id", "me/tiny-zpl", "--private"]) == 0
    assert "https://hub.example/me/tiny-zpl/commit/1" in capsys.readouterr().out
    (create, repo, kw), (upload, repo2, up) = _Hub.calls
    assert (create, repo, kw["private"], kw["exist_ok"]) == ("create_repo", "me/tiny-zpl", True, True)
    assert upload == "upload_folder" and repo2 == "me/tiny-zpl" and Path(up["folder"]) == out / "model"
    assert {"README.md", TASK_FILE} <= set(up["files"]) and not {"journal.jsonl", "run.json"} & set(up["files"])

    _Hub.calls = []
    unfinished = out.parent / "unfinished"
    unfinished.mkdir(exist_ok=True)
    (unfinished / "run.json").write_text("{}")
    for argv in (["push", str(out), "--repo-id", "me/bad name!"], ["push", str(unfinished), "--repo-id", "me/x"],
                 ["push", str(out / "checkpoints"), "--repo-id", "me/x"]):
        capsys.readouterr()
        assert main(argv) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert _Hub.calls == []
    _Hub.fail = "no token: run hf auth login"
    assert main(["push", str(out), "--repo-id", "me/x"]) == 1
    assert capsys.readouterr().err.strip() == "paczero: error: push to 'me/x' failed: no token: run hf auth login"


@pytest.mark.slow  # three tiny runs through the command line
def test_train_push_to_hub_uploads_the_released_model_when_the_run_is_complete(tmp_path, monkeypatch, capsys):
    """`paczero train --push-to-hub ID` uploads the run's released folder after the run, as `paczero push`
    does. A bad repo id, or no token at hand, is one line (exit 2) before any folder is made; a failing hub
    after the run is one line (exit 1) naming the retry, and the run stays complete. Red if the push runs
    before the run has released its model, or if a missing token is found only after the run."""
    import huggingface_hub

    from paczero.cli import main

    monkeypatch.setattr(huggingface_hub, "HfApi", _Hub)
    _Hub.calls, _Hub.fail = [], None
    flags = ["--model", "tiny-opt", "--task", "demo", "--n-train", "8", "--n-dev", "4", "--n-test", "4",
             "--steps", "2", "--eval-every", "2", "--num-subsets", "4", "--no-progress", "--labels", ",".join(LABELS)]
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    for repo, says in (("me/bad name!", "push_to_hub 'me/bad name!'"), ("me/tiny", "needs a Hugging Face token")):
        capsys.readouterr()
        assert main(["train", *flags, "--out-dir", str(tmp_path / "never"), "--push-to-hub", repo]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0]
    assert not (tmp_path / "never").exists() and _Hub.calls == []

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_token")
    out = tmp_path / "run"
    assert main(["train", *flags, "--out-dir", str(out), "--push-to-hub", "me/tiny", "--hub-private"]) == 0
    assert "pushed to https://hub.example/me/tiny/commit/1" in capsys.readouterr().out
    (_, repo, kw), (_, _, up) = _Hub.calls
    assert repo == "me/tiny" and kw["private"] is True and Path(up["folder"]) == out / "model"
    assert {"README.md", TASK_FILE} <= set(up["files"])

    _Hub.calls, _Hub.fail = [], "503 Service Unavailable"
    assert main(["train", *flags, "--out-dir", str(tmp_path / "run2"), "--push-to-hub", "me/tiny"]) == 1
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not line.startswith("paczero: dtype auto:")]  # the run's own line on which dtype it chose
    assert len(err) == 1 and f"retry with paczero push {tmp_path / 'run2'} --repo-id me/tiny" in err[0]
    assert (tmp_path / "run2" / "summary.json").exists()


def test_eval_of_a_released_adapter_without_its_base_asks_for_one(small, tmp_path, capsys):
    from paczero.cli import main

    track, out, _ = small
    if track != "lora":
        assert main(["eval", str(out / "model"), "--base-model", "tiny-opt"]) == 2
        assert "holds a full model" in capsys.readouterr().err
        return
    copy = tmp_path / "copy"
    shutil.copytree(out / "model", copy)
    task = json.loads((copy / TASK_FILE).read_text())
    task["paczero"]["model"] = None  # a local base, whose path is not published
    (copy / TASK_FILE).write_text(json.dumps(task))
    assert main(["eval", str(copy)]) == 2
    assert "give --base-model" in capsys.readouterr().err


@pytest.mark.slow
def test_a_smollm2_adapter_names_the_hub_base_and_paczero_eval_finds_the_local_copy(tmp_path, capsys):
    """The offline SmolLM2 loads from a local cache folder: the adapter names the hub id instead (portable),
    and `paczero eval MODEL_DIR` still scores it on paczero's own copy, to the run's test metrics. Red if the
    cache path reaches adapter_config.json or the card."""
    from paczero.cli import main
    from paczero.models import cache_dir

    out = tmp_path / "run"
    summary = train(TrainConfig(**{**SMALL, "model": "smollm2-135m-instruct", "steps": 1, "n_train": 4,
                                   "n_dev": 2, "eval_zero_shot": False}, track="lora", out_dir=str(out)), log=_quiet)
    folder = out / "model"
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert str(cache_dir()) not in "".join(p.read_text() for p in folder.glob("*.json")) + \
        (folder / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in (folder / "README.md").read_text()
    capsys.readouterr()
    assert main(["eval", str(folder), "--split", "test", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["test"] == summary["test"]


def test_a_release_of_a_local_file_names_neither_its_path_nor_its_columns(tmp_path, capsys):
    """A run on a local data file: task.json and the card hold neither the file's path nor its column names;
    `paczero eval` finds the file through the run.json beside the folder, and a copy elsewhere asks for
    --data. Red if the path or a column name reaches the release."""
    from paczero.cli import main

    data = tmp_path / "zqx-ward-7.jsonl"
    data.write_text("".join(json.dumps({"zqx_note": f"note {i} {'fine' if i % 2 else 'poor'}", "label": i % 2})
                            + "\n" for i in range(40)))
    out = tmp_path / "run"
    summary = train(TrainConfig(**{**SMALL, "task": "sst2", "labels": None}, data=str(data),
                                columns={"sentence": "zqx_note"}, out_dir=str(out)), log=_quiet)
    public = "".join(p.read_text() for p in (out / "model").glob("*.json")) + (out / "model" / "README.md").read_text()
    assert "zqx" not in public
    assert json.loads((out / "model" / TASK_FILE).read_text())["data"] == "a local data file"
    capsys.readouterr()
    assert main(["eval", str(out / "model"), "--split", "test", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["test"] == summary["test"]
    copy = tmp_path / "copy"
    shutil.copytree(out / "model", copy)
    assert main(["eval", str(copy)]) == 2
    assert "give --data FILE" in capsys.readouterr().err


def test_the_example_script_and_paczero_eval_agree_on_a_csv(small, tmp_path, capsys):
    """The same CSV (columns review and sentiment, labels by name, a split column whose test rows are scored)
    through `paczero eval MODEL --data FILE --columns ...` and through examples/use_released_model.py with the
    same --columns: the same number of rows, the same accuracy and the same loss. Red if the script cannot read
    CSV, scores the train rows too, reads the labels or the columns otherwise than paczero, or prints no loss
    (or another one than eval's cross-entropy over the options)."""
    import contextlib
    import io
    import sys

    from paczero.cli import main
    from paczero.models import load_model
    from paczero.tasks.data import DEMO_PATH

    track, out, summary = small
    rows = [json.loads(line) for line in DEMO_PATH.read_text().splitlines()][:60]
    data = tmp_path / "heldout.csv"
    data.write_text("review,sentiment,split\n" + "".join(
        f"\"{r['text']}\",{LABELS[r['label']]},{'test' if i % 3 else 'train'}\n" for i, r in enumerate(rows)))
    columns = "sentence=review,label=sentiment"
    capsys.readouterr()
    assert main(["eval", str(out / "model"), "--data", str(data), "--columns", columns]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    argv = [str(SCRIPT), str(out / "model"), str(data), "--columns", columns]
    if track == "lora":  # the tiny base is not on the hub: built as its note says
        base = tmp_path / "base"
        load_model("tiny-opt", track="ft", init_seed=summary["config"]["seed"]).model.save_pretrained(base)
        argv += ["--base-model", str(base)]
    printed = io.StringIO()
    old_argv, sys.argv = sys.argv, argv
    try:
        with contextlib.redirect_stdout(printed):
            _script().main()
    finally:
        sys.argv = old_argv
    scored = json.loads(printed.getvalue())
    assert scored["examples"] == evaluated["examples"] == 40
    assert round(scored["accuracy"] * 40) == round(evaluated["metrics"]["accuracy"] * 40)  # eval: an fp32 mean
    assert scored["loss"] == pytest.approx(evaluated["metrics"]["loss"], rel=1e-4)  # the same cross-entropy


@pytest.mark.parametrize("words", [None, {"0": " not good at all", "1": " very good indeed"}])
def test_the_example_script_batches_as_paczero_eval_and_agrees_with_it(small, tmp_path, capsys, words):
    """The example script on 60 rows of varied length, its answer words one token each (the run's) or several
    (task.json's verbalizer replaced, for eval and script alike): its accuracy and loss are `paczero eval
    --data`'s; every forward runs under inference mode; one row a prompt where each answer word is one token
    (one a prompt and answer word otherwise); prompts of about one length share a batch, padded on the left,
    so the padding is under a fifth of the tokens, and a forward holds several prompts. Red if the script goes
    back to one row per option in file order (twice the rows, padding to the longest of each batch) or to
    scoring outside inference mode, or if its batches change its results."""
    from paczero.cli import main
    from paczero.models import load_model
    from paczero.tasks.data import DEMO_PATH

    track, out, summary = small
    folder = out / "model"
    if words is not None:
        folder = tmp_path / "model"
        shutil.copytree(out / "model", folder)
        task = json.loads((folder / TASK_FILE).read_text())
        task["verbalizer"] = words
        task["paczero"]["verbalizer"] = words
        (folder / TASK_FILE).write_text(json.dumps(task))
        shutil.copy(out / "run.json", tmp_path / "run.json")  # the run beside it: its data for eval's config
    rows = [json.loads(line) for line in DEMO_PATH.read_text().splitlines()][:60]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"sentence": r["text"] * (1 + i % 3), "label": LABELS[r["label"]]}) + "\n"
                            for i, r in enumerate(rows)))
    capsys.readouterr()
    assert main(["eval", str(folder), "--data", str(data)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    base = None
    if track == "lora":
        base = tmp_path / "base"
        load_model("tiny-opt", track="ft", init_seed=summary["config"]["seed"]).model.save_pretrained(base)
    script = _script()
    model, tokenizer, task = script.load_released(folder, None if base is None else str(base))
    seen = []

    def spy(module, args, kwargs):
        mask = kwargs["attention_mask"]
        seen.append((torch.is_inference_mode_enabled(), mask.shape[0], mask.numel(), int(mask.sum())))

    import torch

    model.register_forward_pre_hook(spy, with_kwargs=True)
    found = script.evaluate(model, tokenizer, task, script.read_examples(data), token_budget=1024)
    assert round(found["accuracy"] * 60) == round(evaluated["metrics"]["accuracy"] * 60)
    assert found["loss"] == pytest.approx(evaluated["metrics"]["loss"], rel=1e-4)
    options = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in task["verbalizer"].values()]
    single = all(len(o) == 1 for o in options)
    assert single == (words is None)
    assert all(inference for inference, *_ in seen)
    assert sum(rows for _, rows, _, _ in seen) == 60 * (1 if single else len(options))
    padded, real = sum(n for *_, n, _ in seen), sum(r for *_, r in seen)
    assert padded - real < 0.2 * padded and len(seen) < 60, seen
