"""DP at the level of the user's file: one row removed from the file changes one row of U, and nothing else.

A DP run's statement is (epsilon, delta)-DP under add-or-remove-one adjacency of U. A user thinks in rows of
their file: the guarantee holds for a row of the file only if removing that row changes U in that row alone
(else a row is protected only by group privacy over every row it moves).

* **The split** (``test_removing_a_row_moves_that_row_alone``): for every row of a file, with and without a
  ``split`` column, the file without that row is split again; every other row keeps its split (U, dev, test or
  unused), compared by content. The same checker run on the exact split of non-DP runs
  (:func:`paczero.tasks.split.split_records`, seeded permutations of all rows) must find rows that move: the
  negative control that shows the checker can fail.
* **Adjacent files end to end** (``test_adjacent_files_publish_nothing_the_noise_does_not_explain``): two
  ``paczero train`` runs of each DP mechanism, same settings and ``--private-seed``, on two files that differ in
  one training row, with and without a split column. Everything a run publishes (stdout and stderr, run.json,
  summary.json, the model card, task.json, evals.jsonl, log.jsonl, the checkpoints' public files, a tracker's
  config) is compared; the only differences allowed are those the mechanism's noisy outcome decides (fine-tuned
  metrics, released coefficients, the dev-best step, weight hashes; DP-AggZO's logged sigma, which divides by
  its Laplace-noised U size). The zero-shot metrics involve no noise and are compared unmasked, as are the sizes,
  the noise scales and every message.
* **A dev or test row removed** (``test_removing_a_test_row_leaves_the_training_bit_for_bit``): U is the same,
  so the released weights are the same bit for bit; only the test metrics move.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from paczero.cli import main
from paczero.tasks.split import split_records, stable_split

WORDS = ["great", "awful", "fine", "bad", "superb", "dull", "lovely", "boring"]
SIZES = {"n_train": 36, "n_dev": 12, "n_test": 12}


def _rows(layout: str) -> list[dict]:
    """60 rows (and one training row twice: a copy removed leaves its twin where it was). ``split``: 36 train,
    12 validation and 12 test rows named by a split column; ``plain``: no split column."""
    rows = [{"sentence": f"a {WORDS[i % 8]} film, take {i}", "label": int(i % 3 == 0)} for i in range(60)]
    rows.append(dict(rows[5]))
    if layout == "split":
        for i, row in enumerate(rows):
            row["split"] = "train" if i < 36 or i == 60 else "validation" if i < 48 else "test"
    return rows


def _where(splits: tuple[list, list, list]) -> dict[str, list[str]]:
    """Each row's split by content: sentence -> the splits holding it (a duplicated row: twice)."""
    found: dict[str, list[str]] = {}
    for name, rows in zip(("U", "dev", "test"), splits):
        for row in rows:
            found.setdefault(row["sentence"], []).append(name)
    return {k: sorted(v) for k, v in found.items()}


def _moved(split, rows: list[dict], sizes: tuple[int, int, int]) -> dict[int, list[str]]:
    """For each row i of ``rows``: the other rows whose split changes when row i is removed (empty: none)."""
    def run(records):
        return _where(split("sst2", records, "file", *sizes, 3, {}))

    full = run(rows)
    moved = {}
    for i, row in enumerate(rows):
        less = run(rows[:i] + rows[i + 1:])
        expected = dict(full)
        gone = expected.pop(row["sentence"], [])
        if len(gone) > 1:  # the duplicated row: its twin stays where it was
            expected[row["sentence"]] = gone[1:]
        moved[i] = sorted(k for k in full.keys() | less.keys() if expected.get(k) != less.get(k))
    return moved


@pytest.mark.parametrize("layout", ["plain", "split"])
def test_removing_a_row_moves_that_row_alone(layout):
    """Removing any row of the file (a training, dev, test or unused row, the duplicated one too) changes only
    that row's own split under :func:`stable_split`, with and without a split column; the exact split moves
    other rows (the checker's negative control). Red when the stable split ranks U by position (e.g. U as the
    first n_train rows of the train pool in file order), sets its thresholds from the file's row count, or caps
    dev or test at their sizes by rank (a dev row removed then brings in another)."""
    rows = _rows(layout)
    moved = _moved(stable_split, rows, (36, 12, 12))
    assert {i: m for i, m in moved.items() if m} == {}
    exact = _moved(split_records, rows, (30, 10, 10))  # sizes every smaller file still holds
    assert sum(bool(m) for m in exact.values()) > len(rows) // 2  # the permutation split moves rows
    assert max(len(m) for m in exact.values()) >= 5
    universe, dev, test = stable_split("sst2", rows, "file", 36, 12, 12, 3, {})
    assert len(universe) + len(dev) + len(test) == len(rows)  # data_fraction 1: every row is used
    if layout == "split":
        named = {name: [r["sentence"] for r in rows if r["split"] == name] for name in ("train", "validation", "test")}
        assert [r["sentence"] for r in universe] == named["train"]  # the whole train split, in the file's order
        assert [r["sentence"] for r in dev] == named["validation"] and [r["sentence"] for r in test] == named["test"]


def test_the_stable_split_follows_its_public_rates():
    """The stable split's rates are its public sizes: on 6,000 rows without a split column, test, dev and U
    hold about n_test / S, n_dev / S and n_train / S of them (S = n_train + n_dev + n_test; within 5 binomial
    standard deviations), ``data_fraction`` keeps about that share of the rows (U then a subset of the whole
    file's U), a split column's dev and test rows are all used whatever the fraction, and the draws depend on
    the data seed. Red when a threshold is mis-set (e.g. dev's and test's rates swapped) or a split is capped at
    its size by rank."""
    rows = [{"sentence": f"row {i}", "label": i % 2} for i in range(6000)]
    universe, dev, test = stable_split("sst2", rows, "file", 600, 300, 100, 0, {})

    def near(count, p, n=6000):
        return abs(count - p * n) < 5 * (n * p * (1 - p)) ** 0.5

    assert near(len(universe), 0.6) and near(len(dev), 0.3) and near(len(test), 0.1)
    part = stable_split("sst2", rows, "file", 600, 300, 100, 0, {}, data_fraction=0.25)
    assert near(len(part[0]), 0.15) and near(len(part[1]), 0.075) and near(len(part[2]), 0.025)
    assert {r["sentence"] for r in part[0]} <= {r["sentence"] for r in universe}
    named = [{**r, "split": "test" if i < 500 else "train"} for i, r in enumerate(rows)]
    universe, dev, test = stable_split("sst2", named, "file", 128, 100, None, 0, {}, data_fraction=0.1)
    assert len(test) == 500 and near(len(dev), 0.1 * 100 / 228, 5500) and near(len(universe), 0.1 * 128 / 228, 5500)
    other = stable_split("sst2", rows, "file", 600, 300, 100, 1, {})[0]
    assert {r["sentence"] for r in other} != {r["sentence"] for r in stable_split("sst2", rows, "file", 600, 300,
                                                                                    100, 0, {})[0]}


# ----------------------------------------------------------------------------- adjacent files, end to end
MECHANISM_FLAGS = {
    "dp-sgd": ["--dp-clip", "0.05"],
    "dpzero": [],
    "dp-aggzo": ["--num-directions", "2"],
    "dpzero-aggzo1": [],
}
#: what a DP run's noisy outcome decides (outside zero_shot): metrics, released coefficients, the dev-best step
OUTCOME_KEYS = {"loss", "accuracy", "f1", "exact_match", "coef", "selected_step", "best_step"}


def _argv(mechanism: str, data: Path, out: Path) -> list[str]:
    return (["train", "--model", "tiny-gpt2", "--task", "sst2", "--data", str(data), "--mechanism", mechanism,
             "--epsilon", "2", "--sample-rate", "0.5", "--steps", "2", "--eval-every", "2", "--lr", "1e-3",
             "--private-seed", "0", "--dtype", "fp32", "--no-progress", "--out-dir", str(out), "--data-seed", "3",
             "--no-dev-best",  # the last weights: whether a step beats step 0 on dev is the noisy outcome's
             "--n-train", str(SIZES["n_train"]), "--n-dev", str(SIZES["n_dev"]), "--n-test", str(SIZES["n_test"])]
            + MECHANISM_FLAGS[mechanism])


def _published(run: Path) -> dict[str, object]:
    """Every file of the run folder a reader gets (not the owner-only journal and mechanism state): JSON
    parsed, text as lines, other files by their size (weights: by their hash, marked as the noisy outcome)."""
    out = {}
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run).as_posix()
        if not path.is_file() or rel.startswith("private/") or path.name in ("private.json", ".paczero.lock"):
            continue
        if path.suffix == ".json":
            out[rel] = json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            out[rel] = [json.loads(line) for line in path.read_text().splitlines()]
        elif path.suffix in (".md", ".txt", ".jinja"):
            out[rel] = path.read_text().splitlines()
        elif path.suffix == ".safetensors":
            out[rel] = ("weights", path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            out[rel] = ("bytes", path.stat().st_size if path.suffix != ".png" else None)
    return out


def _one_run(mechanism: str, rows: list[dict], tmp: Path, capsys, monkeypatch) -> dict:
    """One `paczero train` in this process on ``rows`` written to ``tmp/d/data.jsonl``; what it published.
    Both runs of a pair use the same paths (run.json records them), one after the other."""
    from paczero import train as train_module
    from paczero.run.trackers import open_tracker, public_config

    where = tmp / "d"
    where.mkdir()
    data, out = where / "data.jsonl", where / "run"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tracked = []
    monkeypatch.setattr(train_module, "open_tracker",
                        lambda cfg, *a, **k: (tracked.append(public_config(cfg)), open_tracker(cfg, *a, **k))[1])
    capsys.readouterr()
    code = main(_argv(mechanism, data, out))
    captured = capsys.readouterr()
    public = {"exit": code, "stdout": captured.out.splitlines(), "tracker config": tracked,
              "stderr": [line for line in captured.err.splitlines() if not line.startswith("paczero: machine busy")]}
    if out.exists():
        public.update(_published(out))
    where.rename(tmp / f"done-{len(list(tmp.glob('done-*')))}")  # the other run writes to the same paths
    return public


def _outcome_line(a: str, b: str) -> bool:
    """Two lines of text that differ only in a fine-tuned metric's digits or the dev-best step (a zero-shot
    line, which involves no noise, never qualifies)."""
    if "zero-shot" in a or not re.search(r"loss|accuracy|\bf1\b|fine-tuned", a):
        return False
    mask = lambda s: re.sub(r"step \d+", "step #", re.sub(r"\d+\.\d+", "#", s))  # noqa: E731
    return mask(a) == mask(b)


def _differences(a, b, path: str = "", noisy_sigma: bool = False) -> list[str]:
    """Where ``a`` and ``b`` differ beyond the noisy outcome; under a ``zero_shot`` key nothing is masked."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())}"]
        found = []
        for key in a:
            exact = "zero_shot" in path
            if not exact and (key in OUTCOME_KEYS or (key == "sigma" and noisy_sigma)
                              or (key == "step" and path.endswith("/best"))):
                continue
            if "manifest.json/" in path + "/" and re.fullmatch(r"[0-9a-f]{64}", str(a[key])):
                continue  # a checksum of the weights: the noisy outcome
            found += _differences(a[key], b[key], f"{path}/{key}", noisy_sigma)
        return found
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        if a and a[0] == "weights":
            return [] if a[1] == b[1] else [f"{path}: weights of {a[1]} vs {b[1]} bytes"]
        found = []
        for i, (x, y) in enumerate(zip(a, b)):
            if isinstance(x, str) and isinstance(y, str) and x != y and _outcome_line(x, y):
                continue
            found += _differences(x, y, f"{path}[{i}]", noisy_sigma)
        return found
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _a_row_of(rows: list[dict], which: str) -> int:
    """The index of a row the stable split puts in U (``which`` "U") or in test ("test")."""
    universe, _, test = stable_split("sst2", rows, "file", SIZES["n_train"], SIZES["n_dev"], SIZES["n_test"], 3, {})
    chosen = {"U": universe, "test": test}[which][1]["sentence"]
    return next(i for i, r in enumerate(rows) if r["sentence"] == chosen)


@pytest.mark.parametrize("layout", ["plain", "split"])
@pytest.mark.parametrize("mechanism", list(MECHANISM_FLAGS))
def test_adjacent_files_publish_nothing_the_noise_does_not_explain(mechanism, layout, tmp_path, capsys,
                                                                    monkeypatch):
    """Two runs, same settings and private seed, on files that differ in one training row (a row of U
    removed): every public place compared; the zero-shot metrics, sizes, noise scales, settings and messages
    are equal, and the only differences are the noisy outcome's. Red with the exact split for DP runs
    (``stable=`` dropped in run/build.py: dev and test move, so the zero-shot metrics differ), red when a
    summary states U's true size (``split_sizes`` returning ``len(setup.universe)``), and red when the
    truncation warning or an error names U's count."""
    rows = _rows(layout)
    removed = _a_row_of(rows, "U")
    a = _one_run(mechanism, rows, tmp_path, capsys, monkeypatch)
    b = _one_run(mechanism, rows[:removed] + rows[removed + 1:], tmp_path, capsys, monkeypatch)
    assert a["exit"] in (0, None), a["stderr"]
    assert _differences(a, b, noisy_sigma=mechanism in ("dp-aggzo", "dpzero-aggzo1")) == []
    assert a["summary.json"]["zero_shot"] == b["summary.json"]["zero_shot"]  # unmasked, to the last bit
    assert a["run.json"]["config"]["n_train"] == SIZES["n_train"]
    assert a["summary.json"]["sizes"]["universe"] == SIZES["n_train"]  # the public expected size
    assert a["tracker config"][0]["n_train"] == SIZES["n_train"]
    privacy = a["summary.json"]["privacy"]
    sigmas = {s for r in a["log.jsonl"] for s in (r["sigma"] if isinstance(r["sigma"], list) else [r["sigma"]])}
    assert len(a["log.jsonl"]) == 2 and len(sigmas) == 1
    clip = 0.05 if mechanism == "dp-sgd" else 25.0
    if mechanism in ("dp-sgd", "dpzero"):  # normalised by the public q * n_train, whatever U holds
        assert sigmas.pop() == pytest.approx(privacy["noise_multiplier"] * clip / (0.5 * SIZES["n_train"]),
                                             rel=1e-12)
    text = "\n".join(a["summary.json"]["privacy_text"].splitlines())
    assert "dev and test rows" in text and "not covered" in text


def test_removing_a_test_row_leaves_the_training_bit_for_bit(tmp_path, capsys, monkeypatch):
    """A row of the test split removed (no split column): U and dev are the same, so with the same private
    seed the released weights are the same bit for bit and the dev metrics equal; only the test metrics may
    move. Red with the exact split (removing a row reshuffles U)."""
    rows = _rows("plain")
    removed = _a_row_of(rows, "test")
    a = _one_run("dp-sgd", rows, tmp_path, capsys, monkeypatch)
    b = _one_run("dp-sgd", rows[:removed] + rows[removed + 1:], tmp_path, capsys, monkeypatch)
    assert a["model/adapter_model.safetensors"] == b["model/adapter_model.safetensors"]
    assert a["summary.json"]["dev"] == b["summary.json"]["dev"]
    assert a["summary.json"]["zero_shot"]["dev"] == b["summary.json"]["zero_shot"]["dev"]
    assert a["summary.json"]["sizes"]["test"] == b["summary.json"]["sizes"]["test"] + 1


def test_a_dp_run_without_sizes_is_refused_alike_whatever_the_file(tmp_path, capsys, monkeypatch):
    """No --n-train/--n-dev/--n-test: the two adjacent files' runs are refused in the same one line naming
    --n-train (exit 2, before any model loads, no run folder), so they publish the same. Red when a DP run takes
    its sizes from the file (the old ``sizes_as_given`` for DP: stderr 'U = 61 rows' vs 60)."""
    rows = _rows("plain")
    runs = []
    for rs in (rows, rows[1:]):
        monkeypatch.setattr("test_file_adjacency._argv", lambda m, d, o: [
            "train", "--model", "tiny-gpt2", "--task", "sst2", "--data", str(d), "--mechanism", m, "--epsilon", "2",
            "--no-progress", "--out-dir", str(o)])
        runs.append(_one_run("dpzero", rs, tmp_path, capsys, monkeypatch))
    a, b = runs
    assert a == b and a["exit"] == 2 and a["stdout"] == [] and "run.json" not in a
    (line,) = a["stderr"]
    assert line.startswith("paczero: error: dpzero takes no sample size from its data") and "--n-train" in line


def test_the_python_api_refuses_sizes_taken_from_the_data(tmp_path):
    """PACZeroTrainer, a DP mechanism: a train_dataset without n_train, a train_dataset alone (dev and test drawn
    from it) without n_dev and n_test, and a data file without sizes are each refused in one line naming
    n_train, before a model loads; with the sizes set the check passes (a PAC run needs none). Red if the API
    used every row of train_dataset as U for DP (the run would publish their number)."""
    from paczero import PACZeroTrainer
    from paczero.config import ConfigError, TrainConfig

    rows = [{"sentence": r["sentence"], "label": r["label"]} for r in _rows("split") if r["split"] == "train"]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows("split")))
    common = dict(task="sst2", config={"model": "tiny-gpt2"}, mechanism="dpzero", epsilon=2.0, steps=2,
                  eval_every=2, progress=False, out_dir=str(tmp_path / "run"))
    for trainer in (PACZeroTrainer(train_dataset=rows, **common),
                    PACZeroTrainer(train_dataset=rows, n_train=16, **common),
                    PACZeroTrainer(train_dataset=rows, eval_dataset=rows[:8], n_dev=8, **common),
                    PACZeroTrainer(data=str(data), **common)):
        with pytest.raises(ConfigError) as error:
            trainer.train(log=lambda line: None)
        message = str(error.value)
        assert "\n" not in message and "n_train" in message and "--n-train" not in message, message
        assert message.startswith("dpzero takes no sample size from its data")
    assert not (tmp_path / "run").exists()
    from paczero.api import _check_dp_sizes

    datasets = {"train_dataset": rows, "eval_dataset": None, "test_dataset": None}
    cfg = TrainConfig(model="tiny-gpt2", task="sst2", mechanism="dpzero", epsilon=2.0).validate()
    _check_dp_sizes(cfg, datasets, {"n_train", "n_dev", "n_test"})
    _check_dp_sizes(cfg, {**datasets, "eval_dataset": rows[:8]}, {"n_train"})
    _check_dp_sizes(cfg.replace(mechanism="pac-zpl", epsilon=None), datasets, set())
