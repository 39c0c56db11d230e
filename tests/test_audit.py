"""The membership-inference audit: it must catch a leaky variant and pass PAC-ZPL.

Negative control (docs/audit.md): ``raw_half`` trains on the mean scalar of
the secret subset itself, so the released model remembers its members; on a
tiny problem (a random tiny-llama with LoRA, 8 records of one label, 40 steps
at lr 0.05, five runs with fresh secrets pooled) the loss-reduction attack is
clearly above 1/2. PAC-ZPL on the same problem stays within its interval of 1/2.
One label for the whole universe takes the label out of the score: otherwise
the model mostly learns the label mix of S*, which the median threshold cannot
tell from membership.
"""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from paczero.audit.membership import PRIVATE_WARNING, audit, auc, collect_run, format_report, hoeffding, wilson
from paczero.cli import main
from paczero.config import TrainConfig
from paczero.train import train

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu apple river stone cloud paper glass "
         "metal forest ocean desert winter summer candle silver copper marble velvet").split()
CONTROL = dict(model="tiny-llama", task="demo", track="lora", n_train=8, n_dev=4, n_test=4, steps=40,
               num_subsets=8, lr=0.05, eval_every=40, checkpoint_every=40, dev_best=False,
               eval_zero_shot=False, progress=False)


def write_universe(path, rows: int = 80, seed: int = 0) -> str:
    """Sentences of 8 random words (the negative control's data), label 1 but for every tenth (a file of one class
    is refused as training data)."""
    r = random.Random(seed)
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"sentence": " ".join(r.choice(WORDS) for _ in range(8)),
                                "label": 0 if i % 10 == 0 else 1}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _runs(root, mechanism: str, seeds, data: str, **extra) -> list[str]:
    out = []
    for s in seeds:
        d = root / f"{mechanism}-{s}"
        train(TrainConfig(mechanism=mechanism, private_seed=s, out_dir=str(d), data=data, **{**CONTROL, **extra}),
              log=lambda *a: None)
        out.append(str(d))
    return out


def test_statistics():
    assert auc(np.array([1, 2, 3, 4.0]), np.array([0, 0, 1, 1])) == 1.0
    assert auc(np.array([1, 1, 1, 1.0]), np.array([0, 1, 0, 1])) == 0.5
    lo, hi = wilson(50, 100)
    assert lo < 0.5 < hi and abs(hi - 0.5 - (0.5 - lo)) < 1e-12
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)
    lo, hi = hoeffding([1.0] * 4)
    assert hi == 1.0 and lo == pytest.approx(1 - math.sqrt(math.log(40) / 8))


@pytest.mark.slow
def test_negative_control_leaky_caught_zpl_passes(tmp_path, one_thread):
    data = write_universe(tmp_path / "universe.jsonl")
    leaky = audit(_runs(tmp_path, "raw_half", (1, 2, 3, 4, 5), data), bootstrap=300, reveal_secret=True)
    loss = leaky["attacks"]["loss"]
    assert leaky["mia_bound"] is None
    assert loss["accuracy_ci95"][0] > 0.5 and loss["auc_ci95"][0] > 0.5, loss
    assert leaky["attacks"]["subset"]["accuracy"] > 0.75
    assert leaky["attacks"]["transcript"] is None  # defined for the PAC mechanisms only

    zpl = audit(_runs(tmp_path, "pac-zpl", (1, 2), data), bootstrap=300, reveal_secret=True)
    assert zpl["mia_bound"] == 0.5 and zpl["mi_bound"] == [0.0, 0.0] and zpl["mi_spent"] == [0.0, 0.0]
    assert zpl["transcript"]["expected_accuracy_mean"] == 0.5  # public: needs no secret
    for name in ("loss", "subset", "transcript"):
        att = zpl["attacks"][name]
        assert att["accuracy_ci95"][0] <= 0.5 <= att["accuracy_ci95"][1], (name, att)
        assert att["verdict"] == "consistent with the bound"
    # no noised release: the transcript posterior stays uniform, the AUC is exactly 1/2
    assert zpl["attacks"]["transcript"]["auc"] == 0.5
    assert zpl["attacks"]["transcript"]["posterior_expected_accuracy"] == 0.5


@pytest.fixture(scope="module")
def mi_run(tmp_path_factory, one_thread):
    """A tiny finished PAC-MI run (budget 0.5 nats) with noised releases."""
    run = tmp_path_factory.mktemp("audit") / "mi"
    train(TrainConfig(model="tiny-llama", task="demo", n_train=16, n_dev=4, n_test=4, steps=6, num_subsets=8,
                      mechanism="pac-mi", mi_budget=0.5, eval_every=6, checkpoint_every=6, private_seed=3,
                      eval_zero_shot=False, progress=False, out_dir=str(run)), log=lambda *a: None)
    return run


def test_transcript_replay_recovers_the_mechanism_posterior(mi_run):
    """PAC-MI: the adversary's replay from public data reproduces the mechanism's own posterior, and the
    audit checks the attacks against the guarantee of the budget (not against the realised spend)."""
    from paczero.checkpoint import load_latest_checkpoint
    from paczero.privacy import mia_bound

    ev = collect_run(mi_run)
    assert ev.replay_check["noised_releases"] > 0 and ev.replay_check["max_q_plus_error"] < 1e-9
    state = load_latest_checkpoint(mi_run)[3]["mechanism"]
    lp = np.asarray(state["log_posterior"])
    np.testing.assert_allclose(ev.transcript_post, np.exp(lp) / np.exp(lp).sum(), rtol=1e-9, atol=1e-12)
    summary = json.loads((mi_run / "summary.json").read_text())
    rep = audit([], evidence=[ev], bootstrap=50, reveal_secret=True)
    assert rep["mi_spent"] == [summary["privacy"]["mi_spent"]] and rep["mi_bound"] == [0.5]
    assert rep["mia_bound"] == summary["privacy"]["mia_bound"] == mia_bound(0.5)
    tr = rep["attacks"]["transcript"]
    assert 0.5 <= tr["posterior_expected_accuracy"] <= 1.0


def test_audit_prints_nothing_computed_from_the_secret_unless_asked(mi_run, capsys):
    """Without --reveal-secret the report and its text are the same whatever the secret is (scored
    against another candidate's membership they do not change) and carry no attack score; with it they
    change, and say they are private. Mutation that turns it red: returning ``attacks`` (or printing
    "j* found", an accuracy, a verdict) when ``reveal_secret`` is false, e.g. deleting the
    ``if not reveal_secret: return report`` line of ``audit``."""
    import dataclasses

    ev = collect_run(mi_run)
    other = next(j for j in range(ev.num_subsets) if not np.array_equal(ev.design[j], ev.member))
    ev_other = dataclasses.replace(ev, secret=other, member=ev.design[other].copy())
    public = [audit([], evidence=[e], bootstrap=50) for e in (ev, ev_other)]
    assert json.dumps(public[0]) == json.dumps(public[1]) and format_report(public[0]) == format_report(public[1])
    assert public[0]["private"] is False and "attacks" not in public[0]
    private = [audit([], evidence=[e], bootstrap=50, reveal_secret=True) for e in (ev, ev_other)]
    assert json.dumps(private[0]) != json.dumps(private[1]) and private[0]["private"] is True

    assert main(["audit", str(mi_run), "--json", "--bootstrap", "20"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {**public[0], "runs": printed["runs"], "last_bits": printed["last_bits"]}
    assert printed["last_bits"][str(mi_run)]["decided"] == 0
    assert printed["transcript"]["per_run"][0]["noised_releases"] > 0
    assert main(["audit", str(mi_run), "--bootstrap", "20"]) == 0
    text = capsys.readouterr().out
    for secret_derived in ("j* found", "acc ", "AUC", "VIOLATION", "consistent with", "PRIVATE"):
        assert secret_derived not in text, secret_derived
    assert "Guarantee: I(S*; transcript) <= 0.5 nats" in text and "not a bound" in text and "--reveal-secret" in text

    assert main(["audit", str(mi_run), "--bootstrap", "20", "--reveal-secret"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(PRIVATE_WARNING) and "j* found" in text and "Bayes posterior from the transcript" in text
    assert main(["audit", str(mi_run), "--json", "--bootstrap", "20", "--reveal-secret"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["private"] is True and printed["warning"] == PRIVATE_WARNING
    assert set(printed["attacks"]) == {"loss", "subset", "transcript"}


def test_audit_refuses_what_it_cannot_audit(tmp_path, capsys):
    assert main(["audit", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("paczero: error:") and "not a paczero run folder" in err and "\n" not in err


def test_last_bits_audit_finds_nothing_on_a_run_and_the_leak_on_float_values(mi_run, tmp_path, capsys):
    """`paczero audit RUN --last-bits` on a fresh PAC-MI run: every noised release on its grid, 0 decided.
    The same log with each y~ replaced by s_{j*} + sigma * z from the float sampler (what the mechanism
    published when it drew float noise): the audit decides at least a fifth of them. Red when
    a release is published off its grid, or when the audit ignores the logged grid."""
    from paczero.audit.lsb_attack import audit_transcript
    from paczero.privacy.secure_random import SecureGenerator

    assert main(["audit", str(mi_run), "--last-bits", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)[str(mi_run)]
    assert found["releases"] >= 3 and found["sampler"] == "grid"
    assert (found["decided"], found["excluded_both"]) == (0, 0)

    rng = SecureGenerator.from_seed(1)
    floats = tmp_path / "float-run"
    floats.mkdir()
    records, n = [], 0
    for line in (mi_run / "log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for _ in range(40 if rec.get("y_tilde") is not None else 1):  # enough noised values to decide some
            if rec.get("y_tilde") is not None:
                rec = {**rec, "y_tilde": 1 + rec["sigma"] * float(rng.standard_normal()), "grid": 0.0}
                n += 1
            records.append(json.dumps(rec))
    (floats / "log.jsonl").write_text("\n".join(records) + "\n")
    leak = audit_transcript(floats)
    assert leak["releases"] == n and leak["sampler"] == "float"
    assert leak["decided"] >= 0.2 * n and leak["excluded_both"] == 0


@pytest.mark.parametrize("mechanism, extra", [("dpzero-aggzo1", {}), ("dp-aggzo", {"num_directions": 3}),
                                              ("dpzero", {})])
def test_last_bits_audit_of_dp_runs_checks_every_coefficient(tmp_path, capsys, one_thread, mechanism, extra):
    """`paczero audit RUN --last-bits` on a fresh DP run: every released coefficient is the image of an integer
    noisy sum under the run's public arithmetic (so no record's presence can be tested on its last bits). One
    coefficient moved by one ulp, or every coefficient replaced by a float-noise value with the same sigma
    (what the mechanisms published with float samplers), is found off the grid. Red when a DP coefficient is
    published off its integer grid, or when the check accepts any float (the ulp and float controls)."""
    from paczero.audit.lsb_attack import audit_transcript
    from paczero.privacy.secure_random import SecureGenerator

    run = tmp_path / "dp"
    train(TrainConfig(model="tiny-llama", task="demo", n_train=16, n_dev=4, n_test=4, steps=6, mechanism=mechanism,
                      epsilon=2.0, sample_rate=0.5, eval_every=6, eval_zero_shot=False, progress=False,
                      out_dir=str(run), **extra), log=lambda *a: None)
    assert main(["audit", str(run), "--last-bits", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)[str(run)]
    assert found["releases"] == 6 * extra.get("num_directions", 1) and found["sampler"] == "grid"
    assert (found["decided"], found["off_grid"]) == (0, 0)

    lines = (run / "log.jsonl").read_text().splitlines()
    moved, floats = tmp_path / "moved", tmp_path / "floats"
    rng = SecureGenerator.from_seed(2)
    def first_moved(i, r):  # the first coefficient of step 2, one ulp up
        if i != 2:
            return r
        c = r["coef"]
        return {**r, "coef": [math.nextafter(c[0], math.inf), *c[1:]] if isinstance(c, list)
                else math.nextafter(c, math.inf)}

    def float_noise(i, r):
        noise = lambda s: s * float(rng.standard_normal())  # noqa: E731
        return {**r, "coef": [noise(s) for s in r["sigma"]] if isinstance(r["sigma"], list) else noise(r["sigma"])}

    for folder, change in ((moved, first_moved), (floats, float_noise)):
        folder.mkdir()
        (folder / "summary.json").write_bytes((run / "summary.json").read_bytes())
        (folder / "log.jsonl").write_text("".join(json.dumps(change(i, json.loads(x))) + "\n"
                                                  for i, x in enumerate(lines)))
    assert audit_transcript(moved)["off_grid"] == 1
    assert audit_transcript(floats)["off_grid"] == found["releases"]
    assert main(["audit", str(floats), "--last-bits"]) == 0
    assert "not the image of an integer noisy sum (float noise)" in capsys.readouterr().out
