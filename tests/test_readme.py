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


def _own_data_command(mechanism: str = "pac-zpl") -> list[str]:
    block = next(b for b in _blocks("bash") if "--data tickets.csv" in b)
    joined = block.replace("\\\n", " ")
    lines = [x for x in joined.splitlines() if x.strip().startswith("paczero train")]
    line = next(x for x in lines if ("dp-sgd" in x) == (mechanism == "dp-sgd"))
    return shlex.split(line.split("#")[0])[1:]


def _tickets(tmp_path) -> None:
    names = ["billing", "technical", "account"]
    rows = [f"\"my {names[i % 3]} question, number {i}\",{names[i % 3]}" for i in range(60)]
    (tmp_path / "tickets.csv").write_text("text,label\n" + "\n".join(rows) + "\n")


def test_the_own_data_command_trains_on_a_60_row_csv_of_three_named_classes(tmp_path, monkeypatch, capsys):
    """The README's PAC-ZPL command on a 60-row CSV with `text` and `label` columns, three classes by name, and
    the tiny test model in place of SmolLM2 (flags given later win), its 20 steps as written: with no sizes
    given, the file is used as given (12 test rows, 10 dev, 38 in U) and one line says so; dev is evaluated
    every 5 steps (so dev selects the released weights); one line says that 10 dev and 12 test rows resolve
    little. Red if the default sizes (1000 + 500) apply, if the command evaluates on dev only at its last step,
    if the small-split line is missing, or if a flag the command names does not exist."""
    from paczero.cli import main

    _tickets(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = _own_data_command()
    assert "--data" in args and args[args.index("--data") + 1] == "tickets.csv"
    assert main(args + ["--model", "tiny-llama", "--dtype", "fp32", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "U = 38 rows, dev = 10, test = 12" in err
    notes = [line for line in out.splitlines() if "resolve little" in line]
    assert notes == ["paczero: data: dev 10 rows and test 12 rows: their scores resolve little (a 95 % interval "
                     "spans about ±31% on dev, ±28% on test); at least 50 rows each (a file with more rows, or "
                     "--n-dev and --n-test) resolve more"], out
    run = tmp_path / "runs" / "tickets"
    summary = json.loads((run / "summary.json").read_text())
    assert [summary["config"][k] for k in ("n_train", "n_dev", "n_test")] == [38, 10, 12]
    evals = [json.loads(line)["step"] for line in (run / "evals.jsonl").read_text().splitlines()]
    assert evals == [5, 10, 15, 20]


def test_the_own_data_commands_have_the_settings_the_results_chose(tmp_path, monkeypatch, capsys):
    """The README's PAC-ZPL command has the lr, steps, coin rule and clip of the cell docs/results.md chose for
    PAC-ZPL with coin steps skipped (cpu-practitioner/lora-zpl-skip-lr2e-2), and the prose names that lr; the
    DP-SGD command, naming none of them, gets DP-SGD's own clip 1.0 (not the zeroth-order 25). Red if the
    README's lr and the results page's disagree, or if dp-sgd falls back to the zeroth-order clip."""
    from paczero.cli import main
    from paczero.config import load_yaml
    from paczero.recipes import resolve_recipe

    _tickets(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(_own_data_command() + ["--print-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    chosen = load_yaml(resolve_recipe("cpu-practitioner/lora-zpl-skip-lr2e-2"))
    assert {k: config[k] for k in ("lr", "steps", "coin_step", "clip", "mechanism")} == {
        k: chosen[k] for k in ("lr", "steps", "coin_step", "clip", "mechanism")}
    results = (REPO / "docs" / "results.md").read_text()
    assert "skipped (lr 2e-2" in results and "lr 2e-2 over 20 steps" in README
    assert config["template"] == "auto" and config["task"] == "classification"
    assert main(_own_data_command("dp-sgd") + ["--print-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert (config["mechanism"], config["dp_clip"], config["epsilon"]) == ("dp-sgd", 1.0, 2.0)


def test_the_dp_command_s_sizes_pass_the_tool_s_own_warning():
    """The README's DP-SGD command names dev and test sizes of at least RESOLVING_ROWS each (the size below which
    a run warns that its scores resolve little), and sizes that sum to a file of a few hundred rows. Red if the
    command's --n-dev or --n-test falls below RESOLVING_ROWS (e.g. --n-dev 40)."""
    from paczero.run.build import RESOLVING_ROWS

    args = _own_data_command("dp-sgd")
    sizes = {flag: int(args[args.index(flag) + 1]) for flag in ("--n-train", "--n-dev", "--n-test")}
    assert sizes["--n-dev"] >= RESOLVING_ROWS and sizes["--n-test"] >= RESOLVING_ROWS, sizes
    assert 300 <= sum(sizes.values()) <= 400 and sizes["--n-train"] > sizes["--n-dev"], sizes


@pytest.mark.slow  # loads SmolLM2-135M and trains 2 steps: about a minute on 2 cores
def test_the_api_snippet_runs_as_written(tmp_path, monkeypatch):
    """The README's Python block (with 2 steps and the run folder in a temporary directory): the offline
    model, the data sets as given (40 rows are U, 10 select the weights), a statement. Red if the snippet
    names a function that does not exist or the API refuses its data."""
    code = next(b for b in _blocks("python") if "PACZeroTrainer(" in b)
    code = code.replace("steps=20", "steps=2").replace('"runs/mine"', repr(str(tmp_path / "mine")))
    monkeypatch.chdir(tmp_path)  # the snippet runs from any folder (the demo set through importlib.resources)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    result = scope["result"]
    assert result.statement.startswith("In plain words: this run hides which of the 40 training records")
    assert json.loads((tmp_path / "mine" / "run.json").read_text())["data_use"].startswith("U = 40 rows")
