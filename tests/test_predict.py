"""`paczero predict` (each row's label and class probabilities) and the per-class metrics of `paczero eval`,
from the command line, on a three-class file with string labels."""
import csv
import json

import pytest

from paczero.cli import main

LABELS = ["billing", "technical", "account"]
WORDS = {"billing": "invoice", "technical": "crash", "account": "password"}


def _tickets(path, n=45, labelled=True):
    lines = ["message,topic" if labelled else "message"]
    for i in range(n):
        label = LABELS[i % 3]
        text = f"\"my {WORDS[label]}, again ({i})\""
        lines.append(f"{text},{label}" if labelled else text)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-step run of tiny-llama on 45 tickets labelled by name, its prompt chosen by template auto."""
    folder = tmp_path_factory.mktemp("predict")
    data = _tickets(folder / "tickets.csv")
    out = folder / "run"
    assert main(["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(data), "--columns",
                 "sentence=message,label=topic", "--labels", ",".join(LABELS), "--template", "auto", "--steps", "2",
                 "--eval-every", "2", "--num-subsets", "4", "--no-progress", "--out-dir", str(out)]) == 0
    return folder, out


def test_class_report_counts_by_hand():
    """Truth [0 0 1 2], predicted [0 1 1 1]: class 0 precision 1 recall 0.5, class 1 precision 1/3 recall 1,
    class 2 never predicted (precision, recall, F1 0); the matrix's rows are the true classes, and the matrix says
    so (``rows``: the true label, ``columns``: the predicted one). Red if rows and columns swap, if precision and
    recall do, or if the matrix does not name its axes."""
    from paczero.tasks.classification import class_report

    found = class_report([0, 0, 1, 2], [0, 1, 1, 1], ["a", "b", "c"])
    assert found["confusion"] == {"rows": "true label", "columns": "predicted label", "labels": ["a", "b", "c"],
                                  "matrix": [[1, 1, 0], [0, 1, 0], [0, 1, 0]]}
    assert found["per_class"]["a"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}
    assert found["per_class"]["b"] == {"precision": pytest.approx(1 / 3), "recall": 1.0, "f1": 0.5, "support": 1}
    assert found["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def test_predict_writes_each_rows_label_and_probabilities_in_file_order(run, tmp_path, capsys):
    """`paczero predict RUN/model --data new.csv --out preds.csv` on unlabelled rows: one CSV row per file row in
    the file's order, the predicted label one of the class names and the most probable, the probabilities
    summing to 1. Red if rows come back in batch order, if the label names are lost, or if the probabilities
    are not normalised."""
    _, out = run
    new = _tickets(tmp_path / "new.csv", n=7, labelled=False)
    preds = tmp_path / "preds.csv"
    assert main(["predict", str(out / "model"), "--data", str(new), "--out", str(preds)]) == 0
    assert "predicted 7 rows" in capsys.readouterr().err
    rows = list(csv.DictReader(preds.open()))
    assert [r["row"] for r in rows] == [str(i) for i in range(1, 8)]
    assert [r["text"] for r in rows] == [f"my {WORDS[LABELS[i % 3]]}, again ({i})" for i in range(7)]
    assert "label" not in rows[0]
    for r in rows:
        p = {name: float(r[f"p_{name}"]) for name in LABELS}
        assert sum(p.values()) == pytest.approx(1, abs=1e-5)
        assert r["predicted"] == max(p, key=p.get)


def test_predict_on_labelled_rows_agrees_with_eval_and_never_overwrites(run, tmp_path, capsys):
    """On a labelled file, predict keeps each row's label beside its prediction, and its accuracy and loss are
    `paczero eval --data`'s on the same file; eval's confusion matrix has the file's classes as rows (their
    sums the supports) and its trace is the accuracy. A second predict to the same --out is refused in one
    line, exit 2, the file unchanged. Red if eval and predict score differently, if eval drops the per-class
    report, or if predict replaces a file."""
    from paczero.evaluate import predict_target

    folder, out = run
    data = folder / "tickets.csv"
    preds = tmp_path / "preds.csv"
    found = predict_target(str(out / "model"), str(data), out=str(preds), say=lambda line: None)
    assert main(["eval", str(out / "model"), "--data", str(data)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert found["rows"] == evaluated["examples"] == 45
    assert found["accuracy"] == pytest.approx(evaluated["metrics"]["accuracy"], abs=1e-6)
    assert found["loss"] == pytest.approx(evaluated["metrics"]["loss"], rel=1e-4)
    rows = list(csv.DictReader(preds.open()))
    assert [r["label"] for r in rows] == [LABELS[i % 3] for i in range(45)]
    assert sum(r["label"] == r["predicted"] for r in rows) == round(found["accuracy"] * 45)
    classes = evaluated["classes"]
    matrix = classes["confusion"]["matrix"]
    assert classes["confusion"]["labels"] == LABELS and [sum(row) for row in matrix] == [15, 15, 15]
    assert sum(matrix[i][i] for i in range(3)) == round(evaluated["metrics"]["accuracy"] * 45)
    assert {name: c["support"] for name, c in classes["per_class"].items()} == dict.fromkeys(LABELS, 15)
    before = preds.read_text()
    assert main(["predict", str(out / "model"), "--data", str(data), "--out", str(preds)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paczero: error: --out") and err.count("\n") == 1 and preds.read_text() == before


def test_eval_of_a_run_reports_each_split_by_class(run, capsys):
    """`paczero eval RUN` gives dev and test metrics as training recorded them (loss, accuracy: unchanged keys)
    and beside them each split's per-class report. Red if the per-class keys leak into the split's metrics
    (summary.json's figures would then differ from eval's)."""
    _, out = run
    assert main(["eval", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    summary = json.loads((out / "summary.json").read_text())
    assert set(result["test"]) == {"loss", "accuracy"} and result["test"] == summary["test"]
    for split in ("dev", "test"):
        assert set(result[f"{split}_classes"]["per_class"]) == set(LABELS)


@pytest.mark.parametrize("target", ["model", "run"])
@pytest.mark.parametrize("header", ["question", "question,topic", "text"])
def test_predict_refuses_a_file_without_the_text_column_it_was_trained_on(run, tmp_path, capsys, target, header):
    """The run read its sentences from the column `message`: predict on a file without it (one other column, the
    recorded label column beside another, or a `text` column) is one line, exit 2, before any model loads, naming
    the column it needs, the file's real columns (no `label` it lacks) and --columns; no --out file is written.
    With --columns sentence=question the same file is labelled. Red if predict scores another column (the
    file's one text column) and exits 0, or if its error lists a column the file does not have."""
    _, out = run
    data = tmp_path / "new.csv"
    columns = header.split(",")
    data.write_text(header + "\n" + "".join(",".join([f"\"my {WORDS[LABELS[i % 3]]} ({i})\"", LABELS[i % 3]]
                                                     [:len(columns)]) + "\n" for i in range(6)))
    preds = tmp_path / "preds.csv"
    where = out / "model" if target == "model" else out
    capsys.readouterr()
    assert main(["predict", str(where), "--data", str(data), "--out", str(preds)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paczero: error: ") and err.count("\n") == 1, err
    assert "'message'" in err and str(sorted(columns)) in err and "--columns sentence=" in err, err
    assert "'label'" not in err and "'sentence'" not in err.split("--columns")[0], err
    assert not preds.exists()
    if header != "text":
        assert main(["predict", str(where), "--data", str(data), "--out", str(preds), "--columns",
                     "sentence=question"]) == 0
        assert len(list(csv.DictReader(preds.open()))) == 6


def test_predict_with_a_missing_mapped_column_lists_the_file_s_own_columns(run, tmp_path, capsys):
    """--columns naming a column the file lacks: one line, exit 2, listing the file's columns as they are (no
    placeholder `label`). Red if the list holds a column the file does not have."""
    _, out = run
    data = tmp_path / "new.csv"
    data.write_text("message\n\"my invoice\"\n\"a crash\"\n")
    assert main(["predict", str(out / "model"), "--data", str(data), "--columns", "sentence=body"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'body'" in err and "['message']" in err and "'label'" not in err, err
