"""The learning rate chosen on dev (``paczero train ... --lr a,b,c`` or ``--lr auto``; paczero/run/lr_choice.py):
the choice, the record of every candidate, the released folder, the privacy of the whole choice, bad input.

The references are computed here, apart from the code under test: the choice from the candidates' own
summary.json files, the MI total by adding the candidates' statements, the DP total by dp-accounting's RDP
accountant composing each candidate's Poisson-subsampled Gaussian steps from its recorded noise multiplier.
"""
from __future__ import annotations

import json
import math

import pytest

from paczero.cli import main

TINY = ["train", "--model", "tiny-llama", "--task", "demo", "--data", "demo", "--n-train", "12", "--n-dev", "8",
        "--n-test", "8", "--dtype", "fp32", "--no-progress", "--steps", "3", "--eval-every", "1",
        "--num-subsets", "4", "--private-seed", "0"]


def _summaries(out, lrs):
    """Each candidate's summary.json, read from disk: the released one in ``out``, the others in their folders."""
    found = {}
    for lr in lrs:
        folder = out / "lr-candidates" / f"lr-{lr:g}"
        found[lr] = json.loads(((folder if folder.exists() else out) / "summary.json").read_text())
    return found


def test_the_lowest_dev_loss_is_chosen_recorded_and_released_as_a_plain_run(tmp_path, capsys):
    """PAC-ZPL with three learning rates: the chosen one is the candidate whose summary.json has the lowest dev
    loss (read here from each candidate's own file, ties by the higher accuracy); lr_choice.json lists all three
    with their dev figures and seconds; the chosen run's files are in OUT_DIR, the others stay in
    OUT_DIR/lr-candidates/; `paczero eval OUT_DIR` reproduces the released run's test figures; the printed table,
    the cost and the MI = 0 statement are printed and the model card names the choice; the same command again
    without --overwrite is refused in one line. Red if the choice takes the highest loss, the first or the last
    value, if a candidate is left out of lr_choice.json, if the chosen run is not moved into OUT_DIR (eval finds
    no run), or if the statement or the card line is dropped."""
    out = tmp_path / "run"
    lrs = [1e-3, 0.2, 0.02]  # on this tiny model the middle one moves dev furthest: "take the first/last" is red
    args = TINY + ["--mechanism", "pac-zpl", "--lr", ",".join(map(str, lrs)), "--out-dir", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    summaries = _summaries(out, lrs)
    want = min(lrs, key=lambda lr: (summaries[lr]["dev"]["loss"], -summaries[lr]["dev"]["accuracy"]))
    assert want == 0.2
    record = json.loads((out / "lr_choice.json").read_text())
    assert record["chosen"]["lr"] == want
    assert [row["lr"] for row in record["candidates"]] == lrs
    for row in record["candidates"]:
        assert row["dev"] == summaries[row["lr"]]["dev"]
        assert row["seconds"] > 0
        assert row["folder"] == ("." if row["lr"] == want else f"lr-candidates/lr-{row['lr']:g}")
    released = json.loads((out / "summary.json").read_text())
    assert released["config"]["lr"] == want and released["config"]["out_dir"] == str(out)
    assert sorted(p.name for p in (out / "lr-candidates").iterdir()) == ["lr-0.001", "lr-0.02"]
    assert record["privacy"]["mi_bound"] == 0.0
    assert "3 runs: about 3 times one run's time" in printed
    assert "the released model's guarantee stays MI = 0" in printed
    starred = [line.split() for line in printed.splitlines() if line.startswith("* ")]
    assert len(starred) == 1 and starred[0][1] == "0.2"  # the table marks the chosen row
    card = (out / "model" / "README.md").read_text()
    assert "- Learning rate: 0.2, chosen on dev among 0.001, 0.2, 0.02" in card and "stays MI = 0" in card

    assert main(["eval", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["weights"] == "selected weights"
    assert result["test"]["loss"] == pytest.approx(released["test"]["loss"], rel=1e-5)
    assert result["test"]["accuracy"] == released["test"]["accuracy"]

    assert main(args) == 2  # the folder holds a run: not replaced without --overwrite
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0]


def test_pac_mi_splits_its_budget_so_the_whole_choice_stays_within_it(tmp_path, capsys):
    """PAC-MI at B = 0.3 nats with two learning rates: each candidate states at most B/2, the candidates'
    statements add (here, independently, by math.fsum) to at most B, and lr_choice.json and the printed statement
    state that total against B. Red if each candidate runs at the whole budget (the sum is 2B), or if the stated
    total is not the sum of the candidates' bounds."""
    out = tmp_path / "run"
    lrs = [5e-3, 2e-2]
    assert main(TINY + ["--mechanism", "pac-mi", "--mi-budget", "0.3", "--lr", "5e-3,2e-2", "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    bounds = [s["privacy"]["mi_bound"] for s in _summaries(out, lrs).values()]
    assert all(b <= 0.15 for b in bounds) and math.fsum(bounds) <= 0.3
    record = json.loads((out / "lr_choice.json").read_text())
    assert record["privacy"]["mi_bound"] == math.fsum(bounds) <= 0.3
    assert "the MI budget 0.3 nats is split over the 2 candidates" in printed and "<= 0.3 nats" in printed
    assert "split over the 2 candidates" in (out / "model" / "README.md").read_text()


def test_dp_candidates_compose_within_the_target_epsilon(tmp_path, capsys):
    """DPZero at (2, 1e-5) with two learning rates: each candidate runs at (1, 5e-6); composing the two
    candidates' recorded steps (their noise multipliers, sample rate and step count) in dp-accounting's RDP
    accountant, independently of paczero's accounting, gives at most epsilon 2 at delta 1e-5, and the total
    lr_choice.json states (basic composition) is at most 2 too. A DP run's time is private: no candidate's
    seconds are recorded. Red if the candidates run at the whole epsilon (the composition exceeds 2), if the
    deltas are not split, or if a candidate's seconds are written."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    out = tmp_path / "run"
    lrs = [1e-3, 0.5]
    args = [a for a in TINY if a not in ("--num-subsets", "4")]
    args[args.index("--n-train") + 1] = "32"
    assert main(args + ["--mechanism", "dpzero", "--epsilon", "2", "--sample-rate", "0.25", "--lr", "1e-3,0.5",
                        "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    stated = [s["privacy"] for s in _summaries(out, lrs).values()]
    assert all(p["epsilon_rdp"] <= 1.0 and p["delta"] <= 5e-6 for p in stated)
    accountant = RdpAccountant()
    for p in stated:
        accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            p["sample_rate"], dp_accounting.GaussianDpEvent(p["noise_multiplier"])), p["steps"]))
    independent = accountant.get_epsilon(1e-5)
    record = json.loads((out / "lr_choice.json").read_text())
    assert independent <= record["privacy"]["epsilon"] <= 2.0
    assert math.fsum(p["delta"] for p in stated) <= record["privacy"]["delta"] <= 1e-5
    assert all(row["seconds"] is None for row in record["candidates"])
    assert "by basic composition the 2 together" in printed and "within the target (2, 1e-05)" in printed


@pytest.mark.parametrize("lr, extra, words", [
    ("1e-3,,2e-2", [], "a comma list of numbers (5e-3,1e-2,2e-2) or auto, got '1e-3,,2e-2'"),
    ("1e-3,1e-3", [], "names one learning rate"),
    ("1e-3,-2e-2", [], "must be > 0"),
    ("0,1e-3", [], "must be > 0"),
    ("1e-3,x", [], "a comma list of numbers (5e-3,1e-2,2e-2) or auto, got '1e-3,x'"),
    ("1e-3,5e-3", ["--resume"], "cannot be resumed"),
    ("auto", ["--resume"], "cannot be resumed"),
])
def test_bad_candidates_are_one_line_exit_2_before_any_model_loads(lr, extra, words, tmp_path, capsys,
                                                                      monkeypatch):
    """A malformed list, a list naming one value, an lr <= 0, and --resume with candidates: exit 2 and one line
    naming the problem; the loop is never entered and no folder is made. Red if any of them starts a run (the
    patched loop fails the test) or prints more than one line."""
    import paczero.train

    def no_run(*a, **k):
        raise AssertionError("a run started")

    monkeypatch.setattr(paczero.train, "train", no_run)
    out = tmp_path / "run"
    code = main(TINY + ["--mechanism", "pac-zpl", "--lr", lr, "--out-dir", str(out)] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("paczero: error:") and words in err[0], err
    assert not out.exists()


def test_auto_grids_and_the_budget_split_round_down():
    """`--lr auto` gives every mechanism two or more different positive values; a budget split over k candidates
    adds up to at most the budget in floating point (0.3 / 3 does not: 3 x 0.1 is 0.30000000000000004). Red if a
    mechanism has no grid, or if the split is plain division."""
    from paczero.config import MECHANISMS, TrainConfig
    from paczero.run.lr_choice import candidate_config, candidates

    for m in MECHANISMS:
        grid = candidates(TrainConfig(mechanism=m), "auto")
        assert len(set(grid)) >= 2 and all(v > 0 for v in grid), m
    cfg = TrainConfig(mechanism="pac-mi", mi_budget=0.3)
    assert math.fsum([candidate_config(cfg, 1e-3, 3).mi_budget] * 3) <= 0.3
    cfg = TrainConfig(mechanism="dp-sgd", epsilon=0.3, delta=3e-5, dp_clip=1.0)
    one = candidate_config(cfg, 1e-3, 3)
    assert math.fsum([one.epsilon] * 3) <= 0.3 and math.fsum([one.delta] * 3) <= 3e-5
    assert one.out_dir.endswith("lr-candidates/lr-0.001") and one.push_to_hub is None


def test_the_rule_lowest_loss_then_higher_accuracy_then_earlier():
    """The rule on written summaries: the lowest dev loss; equal losses by the higher accuracy; then the earlier
    value; a non-finite loss (a diverged run) is the worst. Red if the rule takes the highest loss, ignores the
    accuracy on a tie, or lets a NaN loss win."""
    from paczero.run.lr_choice import best

    def s(loss, acc):
        return {"dev": {"loss": loss, "accuracy": acc}}

    assert best([s(0.7, 0.5), s(0.6, 0.4), s(0.65, 0.9)]) == 1
    assert best([s(0.6, 0.5), s(0.6, 0.7), s(0.6, 0.7)]) == 1
    assert best([s(float("nan"), 1.0), s(0.9, 0.1)]) == 1


@pytest.mark.parametrize("yaml_lr, flag, want", [
    ("[0.001, 0.02]", None, (0.001, 0.02)),
    ("auto", None, "auto"),
    ("[0.001, 0.02]", "0.005", 0.005),  # the flag wins: one value, a plain run
    ("0.003", None, 0.003),
])
def test_a_config_file_names_the_candidates_as_the_flag_does(yaml_lr, flag, want, tmp_path, capsys, monkeypatch):
    """``lr: [a, b]`` or ``lr: auto`` in a ``--config`` YAML starts the same choice on dev as ``--lr a,b`` /
    ``--lr auto``; a ``--lr`` flag overrides the file; one number stays a plain run. The loop is replaced here by
    recorders, so only the routing is tested (the choice itself: the tests above). Red if the file's list is
    dropped (a plain run at the default lr) or wins over the flag."""
    import paczero.run.lr_choice as lr_choice
    import paczero.train

    seen = {}
    monkeypatch.setattr(lr_choice, "choose_lr", lambda cfg, lrs, fn: seen.update(lrs=lrs) or {})
    monkeypatch.setattr(paczero.train, "train", lambda cfg, **k: seen.update(lr=cfg.lr) or {})
    config = tmp_path / "c.yaml"
    config.write_text(f"mechanism: pac-zpl\nlr: {yaml_lr}\n")
    assert main(TINY + ["--config", str(config), "--out-dir", str(tmp_path / "run")]
                + (["--lr", flag] if flag else [])) == 0
    if isinstance(want, float):
        assert seen == {"lr": want}
    else:
        assert seen == {"lrs": lr_choice.AUTO_GRIDS["pac"] if want == "auto" else want}


def test_a_bad_list_in_a_config_file_is_one_line_exit_2(tmp_path, capsys):
    """A file's lr list is checked by the flag's rules: one line, exit 2. Red if it reaches TrainConfig's
    generic type error or starts a run."""
    config = tmp_path / "c.yaml"
    config.write_text("mechanism: pac-zpl\nlr: [0.001, -0.02]\n")
    assert main(TINY + ["--config", str(config), "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lr in a file" in err[0] and "must be > 0" in err[0], err
