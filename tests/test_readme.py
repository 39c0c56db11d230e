"""The README's commands run offline as written: training on your own small file, and the Python API snippet."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _own_data_command() -> list[str]:
    block = next(b for b in _blocks("bash") if "--data reviews.csv" in b)
    joined = block.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if x.strip().startswith("paczero train"))
    return shlex.split(line.split("#")[0])[1:]


def test_the_own_data_command_trains_on_a_40_row_csv(tmp_path, monkeypatch, capsys):
    """The README's command on a 40-row CSV with `text` and `label` columns, the tiny test model and 2 steps in
    place of SmolLM2's 60 (flags given later win): with no sizes given, the file is used as given (8 test rows,
    6 dev, 26 in U) and one line says so. Red if the default sizes (1000 + 500) apply to a 40-row file, or a
    flag the command names does not exist."""
    from paczero.cli import main

    rows = [f"this was {'great' if i % 2 else 'awful'} number {i},{i % 2}" for i in range(40)]
    (tmp_path / "reviews.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    monkeypatch.chdir(tmp_path)
    args = _own_data_command()
    assert "--data" in args and args[args.index("--data") + 1] == "reviews.csv"
    assert main(args + ["--model", "tiny-llama", "--steps", "2", "--eval-every", "1", "--no-progress"]) == 0
    assert "U = 26 rows, dev = 6, test = 8" in capsys.readouterr().err
    summary = json.loads((tmp_path / "runs" / "reviews" / "summary.json").read_text())
    assert [summary["config"][k] for k in ("n_train", "n_dev", "n_test")] == [26, 6, 8]


@pytest.mark.slow  # loads SmolLM2-135M and trains 2 steps: about a minute on 2 cores
def test_the_api_snippet_runs_as_written(tmp_path, monkeypatch):
    """The README's Python block (with 2 steps and the run folder in a temporary directory): the offline
    model, the data sets as given (40 rows are U, 10 select the weights), a statement. Red if the snippet
    names a function that does not exist or the API refuses its data."""
    code = next(b for b in _blocks("python") if "PACZeroTrainer(" in b)
    code = code.replace("steps=20", "steps=2").replace('"runs/mine"', repr(str(tmp_path / "mine")))
    code = code.replace('open("paczero/data/', f'open("{REPO}/paczero/data/')
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    result = scope["result"]
    assert result.statement.startswith("What is protected")
    assert json.loads((tmp_path / "mine" / "run.json").read_text())["data_use"].startswith("U = 40 rows")
