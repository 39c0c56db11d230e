"""Data loading: the shipped demo set, local files, the paper's sampling protocol."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest

from paczero.tasks import load_splits
from paczero.tasks.data import DEMO_PATH, canonical_task


def as_keys(rows):
    return [json.dumps(r, sort_keys=True) for r in rows]


def test_demo_set_is_balanced_unique_and_short():
    rows = [json.loads(line) for line in DEMO_PATH.read_text().splitlines()]
    assert len(rows) == 400 and len({r["text"] for r in rows}) == 400
    counts = Counter((r["split"], r["label"]) for r in rows)
    assert counts == {("train", 0): 150, ("train", 1): 150, ("test", 0): 50, ("test", 1): 50}
    assert all(5 <= len(r["text"].split()) <= 30 for r in rows)


def test_demo_splits_disjoint_and_seeded():
    train, dev, test = load_splits("demo", n_train=200, n_dev=100, seed=3)
    assert (len(train), len(dev), len(test)) == (200, 100, 100)
    assert set(train[0]) == {"sentence", "label"}
    keys = [set(as_keys(s)) for s in (train, dev, test)]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    again = load_splits("sst2", source="demo", n_train=200, n_dev=100, seed=3)
    assert again == (train, dev, test)
    other = load_splits("demo", n_train=200, n_dev=100, seed=4)
    assert other[0] != train and other[2] == test  # test is the whole test split
    everything, small_dev, _ = load_splits("demo", n_train=None, n_dev=20)
    assert len(everything) == 280 and len(small_dev) == 20


def write_rows(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_local_file_without_split_is_carved(tmp_path, suffix):
    rows = [{"review": f"review number {i}", "stars": i % 2} for i in range(50)]
    path = write_rows(tmp_path / f"data{suffix}", rows)
    train, dev, test = load_splits("sst2", source=path, n_train=30, n_dev=10, columns={"sentence": "review", "label": "stars"})
    assert (len(train), len(dev), len(test)) == (30, 10, 10)  # test: 20% of 50
    assert all(isinstance(r["label"], int) for r in train + dev + test)
    assert len({r["sentence"] for r in train + dev + test}) == 50
    with pytest.raises(ValueError, match="fewer than n_train"):
        load_splits("sst2", source=path, n_train=35, n_dev=10, columns={"sentence": "review", "label": "stars"})


def test_local_file_with_split_column(tmp_path):
    rows = [{"sentence": f"s{i}", "label": i % 2, "split": "train"} for i in range(20)]
    rows += [{"sentence": f"v{i}", "label": i % 2, "split": "validation"} for i in range(6)]
    rows += [{"sentence": f"t{i}", "label": i % 2, "split": "test"} for i in range(4)]
    path = write_rows(tmp_path / "d.jsonl", rows)
    train, dev, test = load_splits("sst2", source=path, n_train=10, n_dev=None)
    assert len(train) == 10 and all(r["sentence"].startswith("s") for r in train)
    assert len(dev) == 6 and all(r["sentence"].startswith("v") for r in dev)
    assert [r["sentence"] for r in test] == [f"t{i}" for i in range(4)]


def test_local_squad_file(tmp_path):
    rows = [
        {"context": f"Paris is the capital of country {i}.", "question": "What is the capital?", "answers": ["Paris"]}
        for i in range(10)
    ]
    path = write_rows(tmp_path / "qa.jsonl", rows)
    train, dev, test = load_splits("squad", source=path, n_train=6, n_dev=2)
    assert (len(train), len(dev), len(test)) == (6, 2, 2)
    assert train[0]["answers"] == ["Paris"] and train[0]["title"] == ""


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        load_splits("imdb")
    with pytest.raises(ValueError, match="not found"):
        load_splits("sst2", source=tmp_path / "missing.jsonl")
    path = write_rows(tmp_path / "d.jsonl", [{"review": "fine", "label": 1}] * 5)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['sentence'\]"):
        load_splits("sst2", source=path)
    with pytest.raises(ValueError, match="fewer than"):
        load_splits("demo")  # the paper's 1000 + 500 do not fit 300 demo train rows
    bad = write_rows(tmp_path / "bad.jsonl", [{"sentence": "x", "label": "positive"}] * 5)
    with pytest.raises(ValueError, match="not an integer"):
        load_splits("sst2", source=bad)
    with pytest.raises(ValueError, match="unsupported"):
        load_splits("sst2", source=write_rows(tmp_path / "d.jsonl", [{"a": 1}]).rename(tmp_path / "d.txt"))


@pytest.mark.parametrize("name, content, needle", [
    ("list.jsonl", '{"sentence": "a", "label": 1}\n["b", 0]\n', "list.jsonl line 2: expected an object of named fields, got a list"),
    ("torn.jsonl", '{"sentence": "a", "label": 1}\n\n{"sentence": "b",\n', "torn.jsonl line 3: Expecting"),
    ("strings.json", '["a", "b"]', "strings.json record 1: expected an object of named fields, got a str"),
    ("none.jsonl", '{"sentence": "a", "label": 1}\n{"sentence": null, "label": 0}\n', "record 2: sentence is missing or empty"),
    ("gone.jsonl", '{"sentence": "a", "label": 1}\n{"label": 0}\n', "record 2: sentence is missing or empty"),
    ("blank.csv", "sentence,label\na,1\n,0\n", "record 2: sentence is missing or empty"),
    ("float.jsonl", '{"sentence": "a", "label": 1.7}\n', "record 1: label 1.7 is not an integer"),
    ("float.csv", "sentence,label\na,0.5\n", "record 1: label '0.5' is not an integer"),
    ("commas.csv", "sentence,label\na,1\nb, with a comma,0\n", "commas.csv line 3: more fields than the header's 2"),
])
def test_a_malformed_file_is_one_error_naming_its_line_or_record(tmp_path, name, content, needle):
    """Each is one error line naming the line or record (not a traceback, a silent 'None' sentence or a
    truncated label); none echoes more of the user's text than a short label."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError) as info:
        load_splits("sst2", source=path, n_train=1, n_dev=0, n_test=0)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_spreadsheet_exports_and_integral_float_labels_load(tmp_path):
    """A CSV saved with a UTF-8 byte-order mark (Excel's "CSV UTF-8") and labels written 1.0."""
    path = tmp_path / "excel.csv"
    path.write_text("sentence,label\n" + "".join(f"s{i},{i % 2}.0\n" for i in range(10)), encoding="utf-8-sig")
    train, _, _ = load_splits("sst2", source=path, n_train=6, n_dev=2, n_test=2)
    assert {r["label"] for r in train} <= {0, 1} and all(r["sentence"].startswith("s") for r in train)


def test_aliases():
    assert canonical_task("SST-2") == "sst2" and canonical_task("rajpurkar/squad") == "squad"


def test_hub_protocol_with_a_stand_in_for_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name):
        calls.append(name)
        if name == "stanfordnlp/sst2":
            make = lambda n, tag: [{"idx": i, "sentence": f"{tag}{i}", "label": i % 2} for i in range(n)]  # noqa: E731
            return {"train": make(2000, "tr"), "validation": make(872, "va")}
        make = lambda n, tag: [  # noqa: E731
            {"id": f"{tag}{i}", "title": "T", "context": "C", "question": "Q",
             "answers": {"text": ["A", "a"], "answer_start": [0, 0]}}
            for i in range(n)
        ]
        return {"train": make(1600, "tr"), "validation": make(1200, "va")}

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    train, dev, test = load_splits("sst2")
    assert (len(train), len(dev), len(test)) == (1000, 500, 872)
    assert not ({r["sentence"] for r in train} & {r["sentence"] for r in dev})
    train, dev, test = load_splits("squad", seed=1)
    assert (len(train), len(dev), len(test)) == (1000, 500, 1000)
    assert test[0]["answers"] == ["A", "a"] and test[0]["id"].startswith("va")
    assert calls == ["stanfordnlp/sst2", "rajpurkar/squad"]


def test_a_text_column_is_the_sentence_without_columns(tmp_path):
    """A file of ``text`` and ``label`` columns trains without ``--columns sentence=text``; a ``sentence``
    column, where there is one, is still the sentence, and a mapping given still wins. Red when the ``text``
    fallback is removed from ``canonical_rows`` (the first load raises 'lacks column(s)')."""
    rows = [{"text": f"t{i}", "sentence": f"s{i}", "other": f"o{i}", "label": i % 2} for i in range(10)]
    only_text = write_rows(tmp_path / "a.jsonl", [{"text": r["text"], "label": r["label"]} for r in rows])
    train, _, _ = load_splits("classification", source=only_text, n_train=6, n_dev=2, n_test=2)
    assert {r["sentence"] for r in train} <= {r["text"] for r in rows}
    both = write_rows(tmp_path / "b.jsonl", rows)
    train, _, _ = load_splits("classification", source=both, n_train=6, n_dev=2, n_test=2)
    assert all(r["sentence"].startswith("s") for r in train)
    train, _, _ = load_splits("classification", source=both, n_train=6, n_dev=2, n_test=2,
                              columns={"sentence": "other"})
    assert all(r["sentence"].startswith("o") for r in train)


def test_dev_and_test_files_of_their_own(tmp_path):
    """``dev_source``/``test_source`` (``--dev-data``/``--test-data``): every row of the data file trains, dev and
    test are the other files' rows (the dev file alone: it is the test set too), under the exact split and a DP
    run's stable split alike; a data file with a split column beside them is refused in one line, and so are
    dev/test files without a data file and a data_fraction for a run that is not DP. Red when the training file's
    rows are split as if no dev and test files were given (U would lose rows to dev and test)."""
    from paczero.config import ConfigError, TrainConfig

    train = write_rows(tmp_path / "t.jsonl", [{"text": f"t{i}", "label": i % 2} for i in range(20)])
    dev = write_rows(tmp_path / "d.jsonl", [{"text": f"d{i}", "label": i % 2} for i in range(6)])
    test = write_rows(tmp_path / "e.jsonl", [{"text": f"e{i}", "label": i % 2} for i in range(4)])
    for stable in (False, True):
        u, d, e = load_splits("classification", source=train, n_train=20, n_dev=6, n_test=4, dev_source=dev,
                              test_source=test, stable=stable)
        assert sorted(r["sentence"] for r in u) == sorted(f"t{i}" for i in range(20))
        assert sorted(r["sentence"] for r in d) == sorted(f"d{i}" for i in range(6))
        assert sorted(r["sentence"] for r in e) == sorted(f"e{i}" for i in range(4))
    u, d, e = load_splits("classification", source=train, n_train=20, n_dev=6, n_test=None, dev_source=dev)
    assert len(u) == 20 and sorted(map(str, d)) == sorted(map(str, e))
    named = write_rows(tmp_path / "s.jsonl", [{"text": f"s{i}", "label": i % 2, "split": "train"} for i in range(9)])
    with pytest.raises(ValueError, match="has a split column"):
        load_splits("classification", source=named, n_train=9, n_dev=6, dev_source=dev)
    with pytest.raises(ConfigError, match="dev_data and test_data go with a data file"):
        TrainConfig(task="sst2", dev_data=str(dev)).validate()
    with pytest.raises(ConfigError, match="dev_data file"):
        TrainConfig(task="classification", data=str(train), dev_data=str(tmp_path / "missing.jsonl")).validate()
    with pytest.raises(ConfigError, match="data_fraction applies to a DP run"):
        TrainConfig(task="classification", data=str(train), data_fraction=0.5).validate()
    TrainConfig(task="classification", data=str(train), data_fraction=0.5, mechanism="dp-sgd", epsilon=1.0).validate()
    from paczero.flags import sizes_as_given  # a DP run with a test file of its own needs no --n-test, and takes
    dp = TrainConfig(task="classification", data=str(train), test_data=str(test), mechanism="dp-sgd",  # no size
                     epsilon=1.0).validate()                                                         # from its data
    assert sizes_as_given(dp, say=lambda line: pytest.fail(line)) == dp
