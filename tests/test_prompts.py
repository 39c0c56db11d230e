"""The prompt of a classification run: the answer words are the verbalizer's (never implied by --labels), every
run states them, template auto chooses among candidates on dev alone, and every release evaluates as trained."""
from __future__ import annotations

import json

import pytest

from paczero.cli import main
from paczero.config import TrainConfig
from paczero.tasks.prompts import candidates, choose

FLAGS = ["--model", "tiny-llama", "--task", "demo", "--n-train", "12", "--n-dev", "8", "--n-test", "8", "--steps", "2",
         "--num-subsets", "4", "--eval-every", "2", "--checkpoint-every", "2", "--dtype", "fp32", "--no-progress",
         "--private-seed", "1"]


def test_choose_keeps_the_candidate_of_lowest_dev_loss():
    """With dev losses known in advance, the chosen candidate is the one of lowest loss (not the first, not the
    one of highest accuracy), a tie goes to the earlier, and every candidate's score is kept. Red if choose
    takes the maximum, the first candidate, or the accuracy."""
    found = candidates(2)
    losses = {i: 0.9 - 0.1 * (i == 2) - 0.2 * (i == 3) for i in range(len(found))}
    accuracy = {i: 1.0 if i == 0 else 0.5 for i in range(len(found))}
    best, scored = choose(found, lambda c: {"loss": losses[found.index(c)], "accuracy": accuracy[found.index(c)]})
    assert best == 3 and [s["dev"]["loss"] for s in scored] == [losses[i] for i in range(len(found))]
    best, _ = choose(found, lambda c: {"loss": 0.5 if found.index(c) in (1, 2) else 0.7})
    assert best == 1


def test_candidates_fill_in_the_label_names_and_a_given_verbalizer():
    """The paper's and the strong prompt are candidates; label names become candidates' answer words (never
    replacing the others); three named labels keep only the name candidates; a verbalizer given replaces every
    candidate's words. Red if the YAML loses the paper's prompt or the label names are not filled in."""
    plain = candidates(2)
    assert {"template": "{sentence} It was", "verbalizer": {0: " terrible", 1: " great"}} in plain
    assert {"template": "Review: {sentence}\nSentiment:", "verbalizer": {0: " negative", 1: " positive"}} in plain
    named = candidates(2, ["neg", "pos"])
    assert all(c in named for c in plain) and {"template": "Text: {sentence}\nLabel:",
                                               "verbalizer": {0: " neg", 1: " pos"}} in named
    three = candidates(3, ["bad", "meh", "good"])
    assert three and all(c["verbalizer"] == {0: " bad", 1: " meh", 2: " good"} for c in three)
    with pytest.raises(ValueError, match="give --labels"):
        candidates(3)
    fixed = candidates(2, ["neg", "pos"], {0: " no", 1: " yes"})
    assert {tuple(c["verbalizer"].values()) for c in fixed} == {(" no", " yes")} and len(fixed) > 1


def _build(tmp_path, test_labels_flipped: bool):
    """build() with template auto on the demo set's rows, the test rows' labels flipped or not."""
    from paczero.run.build import build
    from paczero.tasks import load_splits

    train, dev, test = load_splits("demo", n_train=12, n_dev=8, n_test=8)
    if test_labels_flipped:
        test = [{**row, "label": 1 - row["label"]} for row in test]
    cfg = TrainConfig(model="tiny-llama", task="demo", n_train=12, n_dev=8, n_test=8, template="auto", dtype="fp32",
                      labels=["negative", "positive"], out_dir=str(tmp_path)).validate()
    return build(cfg, examples=(train, dev, test)), dev


def test_template_auto_chooses_on_dev_alone(tmp_path, monkeypatch):
    """template auto scores every candidate on the dev rows only (a spy on the task's evaluation sees dev's rows
    and nothing else), keeps the one of lowest dev loss, records it, and the choice and its scores are the same
    whatever the test rows say (their labels flipped). Red if the choice reads the test split, or keeps another
    candidate than the dev winner."""
    from paczero.tasks.classification import ClassificationTask

    seen = []
    evaluate = ClassificationTask.evaluate

    def spy(self, model, enc, token_budget=4096):
        seen.append(len(enc))
        return evaluate(self, model, enc, token_budget)

    monkeypatch.setattr(ClassificationTask, "evaluate", spy)
    setup, dev = _build(tmp_path, test_labels_flipped=False)
    prompt = setup.prompt
    assert prompt["source"] == "auto" and seen == [len(dev)] * len(prompt["candidates"])
    losses = [c["dev"]["loss"] for c in prompt["candidates"]]
    winner = prompt["candidates"][losses.index(min(losses))]
    assert (winner["template"], winner["verbalizer"]) == (prompt["template"], prompt["verbalizer"])
    assert setup.cfg.template == prompt["template"] and setup.task.template == prompt["template"]
    flipped, _ = _build(tmp_path, test_labels_flipped=True)
    assert flipped.prompt == prompt


@pytest.mark.parametrize("extra", [
    ["--labels", "neg,pos", "--verbalizer", "0= bad,1= good", "--template", "Review: {sentence}\\nSentiment:"],
    ["--labels", "neg,pos"],
    ["--labels", "neg,pos", "--template", "auto"],
    ["--verbalizer", "0= no,1= yes"],
])
def test_every_release_evaluates_as_trained(tmp_path, capsys, extra):
    """A run trained through the command line on a CSV labelled neg/pos (0/1 without --labels) with each combination of --labels,
    --verbalizer and --template: the run prints its prompt and answer words once, and `paczero eval` of its
    released folder and of the run folder reproduce the run's test metrics. Red if task.json or run.json keeps
    the verbalizer's keys as strings (eval then refuses them), if eval scores the default words, or if --labels
    turns the label names into the answer words."""
    from paczero.tasks.data import DEMO_PATH

    rows = [json.loads(line) for line in DEMO_PATH.read_text().splitlines()][:40]
    data = tmp_path / "reviews.csv"
    names = ["neg", "pos"] if "--labels" in extra else [0, 1]
    data.write_text("review,sentiment\n" + "".join(f"\"{r['text']}\",{names[r['label']]}\n" for r in rows))
    args = ["train", *FLAGS, "--data", str(data), "--columns", "sentence=review,label=sentiment", "--out-dir",
            str(tmp_path / "run"), *extra]
    args[args.index("--task") + 1] = "sst2"
    assert main(args) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    words = summary["prompt"]["verbalizer"]
    lines = [line for line in out.splitlines() if line.startswith("paczero: prompt ")]
    assert len(lines) == 1 and all(json.dumps(w) in lines[0] for w in words.values()), out
    if "--verbalizer" not in extra and "auto" not in extra:
        assert words == {"0": " terrible", "1": " great"}  # the task's words, not " neg"/" pos"
    for target in (tmp_path / "run" / "model", tmp_path / "run"):
        assert main(["eval", str(target), "--split", "test"]) == 0
        assert json.loads(capsys.readouterr().out)["test"] == summary["test"]


def test_template_auto_is_refused_where_it_does_not_apply(tmp_path, capsys):
    """template auto on SQuAD or completion is one error line, exit 2, before any model loads; three labels
    without answer words are one line naming both ways to give them. Red if either trains or raises."""
    base = ["train", "--model", "tiny-llama", "--out-dir", str(tmp_path / "x"), "--steps", "1"]
    for task in ("squad", "completion"):
        assert main(base + ["--task", task, "--template", "auto"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "template auto" in err[0] and task in err[0], err
    assert main(base + ["--task", "demo", "--labels", "bad,meh,good"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--verbalizer (e.g. 0= bad,1= meh,2= good) or --template auto" in err[0], err


def test_a_resumed_auto_run_keeps_its_choice(tmp_path, monkeypatch, capsys):
    """A run begun with --template auto and continued with --resume (the same flags, template auto included,
    and more steps) goes on with the prompt it recorded: nothing is chosen again. Red if the resume scores the
    candidates anew (the spy below fails it) or refuses the recorded prompt as a changed setting."""
    import paczero.run.build

    args = ["train", *FLAGS, "--template", "auto", "--out-dir", str(tmp_path / "run")]
    assert main(args) == 0
    chosen = json.loads((tmp_path / "run" / "run.json").read_text())["prompt"]

    def no_second_choice(*a, **k):
        raise AssertionError("the prompt was chosen again")

    monkeypatch.setattr(paczero.run.build, "_choose_prompt", no_second_choice)
    capsys.readouterr()
    assert main(args[:args.index("--steps") + 1] + ["4"] + args[args.index("--steps") + 2:] + ["--resume"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["prompt"] == chosen and summary["config"]["template"] == chosen["template"]


def test_a_run_with_its_own_candidates_resumes_from_its_folder_alone(tmp_path, capsys):
    """A run begun with --template auto and --template-candidates, continued with `--out-dir RUN --resume --steps
    4` and no other flag: the resume takes the run's own recorded settings (its candidates among them) and goes on
    with the prompt it chose, to step 4. Red if the resume reads the recorded template (the chosen prompt) as a
    template given beside --template-candidates and refuses it ("give --template auto with them")."""
    run = tmp_path / "run"
    mine = "Ticket: {sentence}\\nMood:"
    assert main(["train", *FLAGS, "--template", "auto", "--template-candidates", mine, "--out-dir", str(run)]) == 0
    chosen = json.loads((run / "run.json").read_text())["prompt"]
    assert "Ticket: {sentence}\nMood:" in [c["template"] for c in chosen["candidates"]]
    capsys.readouterr()
    assert main(["train", "--out-dir", str(run), "--resume", "--steps", "4", "--no-progress"]) == 0, \
        capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["steps"] == 4 and len((run / "log.jsonl").read_text().splitlines()) == 4
    assert summary["prompt"]["template"] == chosen["template"] and summary["config"]["template"] == chosen["template"]


def test_the_api_asks_for_answer_words_in_its_own_words(tmp_path):
    """PACZeroTrainer(labels=[three names]) without a verbalizer: one ConfigError line naming verbalizer={...}
    as a Python dict and template='auto', no command-line flag. Red if the API message names --verbalizer."""
    from paczero import PACZeroTrainer
    from paczero.config import ConfigError

    rows = [{"sentence": f"row {i}", "label": ["bad", "meh", "good"][i % 3]} for i in range(30)]
    with pytest.raises(ConfigError) as info:
        PACZeroTrainer(train_dataset=rows, task="sst2", labels=["bad", "meh", "good"], config={"model": "tiny-llama"},
                       out_dir=str(tmp_path / "x")).train()
    text = str(info.value)
    assert "verbalizer={0: ' bad', 1: ' meh', 2: ' good'}" in text and "template='auto'" in text, text
    assert "--" not in text and "\n" not in text


def test_a_zero_shot_dev_accuracy_near_chance_is_said():
    """Two classes, 40 dev rows: 0.55 is within reach of chance (0.5 + max(0.1, 1/sqrt(40))) and gets a line
    naming --template auto; 0.80 does not; a task without a prompt (not classification) never does. Red if
    the line is missing or said of every run."""
    from types import SimpleNamespace

    from paczero.run.build import near_chance

    setup = SimpleNamespace(prompt={"template": "t"}, task=SimpleNamespace(num_classes=2), dev_enc=[0] * 40)
    assert "near chance (0.50)" in near_chance(setup, {"accuracy": 0.55}) and "--template auto" in near_chance(
        setup, {"accuracy": 0.55})
    assert near_chance(setup, {"accuracy": 0.80}) is None
    assert near_chance(SimpleNamespace(prompt=None, task=None, dev_enc=[0] * 40), {"loss": 1.0}) is None


def test_candidates_take_the_user_s_templates_and_the_label_names_in_words():
    """Three named labels: the user's own templates come first (with the names as answer words), the
    task-neutral candidates name the labels in words ("billing, technical or account"), and no candidate keeps
    a {labels} placeholder; without names a {labels} template does not apply. Red if own templates are
    dropped or placed after the built-in ones, or if {labels} is left unfilled."""
    names = ["billing", "technical", "account"]
    own = ["Support ticket: {sentence}\nThis ticket is about"]
    found = candidates(3, names, own=own)
    assert found[0] == {"template": own[0], "verbalizer": {0: " billing", 1: " technical", 2: " account"}}
    assert any("billing, technical or account" in c["template"] for c in found)
    assert not any("{labels}" in c["template"] for c in found) and len(found) >= 5
    assert not any("{labels}" in c["template"] or "billing" in c["template"] for c in candidates(2))
    assert candidates(2, own=own)[0]["template"] == own[0]  # with each fitting set of fixed words


def test_template_auto_says_when_its_best_candidate_is_near_chance():
    """The chosen candidate's dev accuracy 0.35 on 40 rows of 3 classes is near chance (1/3 + 0.158): one line
    naming the candidate and how to give one's own; 0.8 says nothing. Red if auto chooses silently."""
    from paczero.tasks.prompts import near_chance_line

    record = {"template": "T {sentence}", "verbalizer": {"0": " a"},
              "candidates": [{"template": "T {sentence}", "verbalizer": {"0": " a"}, "dev": {"loss": 1.0, "accuracy": 0.35}},
                             {"template": "U {sentence}", "verbalizer": {"0": " a"}, "dev": {"loss": 1.1, "accuracy": 0.9}}]}
    line = near_chance_line(record, 40, 3)
    assert "best of its 2 candidates" in line and "near chance (0.33)" in line and "--template-candidates" in line
    record["candidates"][0]["dev"]["accuracy"] = 0.8
    assert near_chance_line(record, 40, 3) is None


def test_task_classification_trains_on_a_file_of_named_classes_and_needs_data(tmp_path, capsys):
    """`--task classification` with three string labels trains from the command line (run.json and the card
    name the task); without --data it is refused in one line, exit 2. Red if the name is not a task, or if it
    falls back to the hub's SST-2."""
    from paczero.cli import main

    data = tmp_path / "tickets.csv"
    data.write_text("message,topic\n" + "".join(f"\"my {w}, again {i}\",{t}\n" for i in range(10) for w, t in
                                                (("invoice", "billing"), ("crash", "technical"), ("login", "account"))))
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny-llama", "--task", "classification", "--data", str(data), "--columns",
                 "sentence=message,label=topic", "--labels", "billing,technical,account", "--template", "auto",
                 "--steps", "1", "--num-subsets", "4", "--no-progress", "--no-eval-zero-shot",
                 "--out-dir", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["config"]["task"] == "classification"
    assert "Task: classification" in (out / "model" / "README.md").read_text()
    capsys.readouterr()
    assert main(["train", "--model", "tiny-llama", "--task", "classification", "--out-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --data FILE" in err
