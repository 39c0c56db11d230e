"""``coin_step: skip``: a coin release leaves theta where it is, and PAC-ZPL's output is then a function of public inputs.

The exact check runs the whole loop of Algorithm 1 on a model small enough to enumerate: N = 6 examples
with quadratic losses f_i(theta) = |theta - a_i|^2 / 2 in R^3, the real balanced design and
``subset_signs``, public directions z_t from a fixed seed, the two-point scalars, the mechanism's release
and the update theta <- theta - lr coef z. For every j* of the M candidates it records the transcript
(bit, branch, coefficient per step) and the final theta bit for bit. The signs of step t depend on theta_t,
so on every earlier release, as in training.
"""
from __future__ import annotations

import numpy as np
import pytest

from paczero.config import ConfigError, TrainConfig
from paczero.mechanisms import Hybrid, PacMI, PacZPL
from paczero.mechanisms.base import Release
from paczero.privacy.subsets import balanced_design

N, D, M, T, MU, LR = 6, 3, 4, 40, 1e-3, 0.05
TARGETS = np.array([[1.0, 0.0, 0.0], [0.9, 0.2, 0.0], [1.1, -0.1, 0.1],
                    [-1.0, 0.0, 0.0], [0.0, 1.0, -1.0], [0.2, -0.8, 0.5]])
DESIGN = balanced_design(N, M, 0)


class MovesAlongTheSecret(PacZPL):
    """Negative control: on disagreement, moves along s_{j*} instead of skipping (a leak of s_{j*})."""

    name = "pac-zpl"

    def _release_one(self, signs, beta):
        rel = super()._release_one(signs, beta)
        if rel.branch != "coin":
            return rel
        s = float(signs[self._secret])
        return Release(bit=0, branch="coin", coef=s, q_plus=rel.q_plus, agreement=rel.agreement)


def run(mechanism) -> tuple[tuple, bytes]:
    """The transcript and the final theta of one run of the toy loop."""
    theta = np.zeros(D)
    public = np.random.default_rng(2026)
    transcript = []
    for _ in range(T):
        z = public.standard_normal(D)
        loss = lambda th: 0.5 * ((th - TARGETS) ** 2).sum(axis=1)  # noqa: E731
        scalars = (loss(theta + MU * z) - loss(theta - MU * z)) / (2 * MU)
        (rel,) = mechanism.step(scalars[None, :])
        transcript.append((rel.bit, rel.branch, rel.coef))
        theta = theta - LR * rel.coef * z
    return tuple(transcript), theta.tobytes()


def outputs_for_every_secret(make) -> list[tuple[tuple, bytes]]:
    return [run(make(j)) for j in range(M)]


def test_skip_makes_pac_zpl_output_the_same_for_every_secret_and_every_private_stream():
    """Exact, for every j* in 0..M-1 and three private streams: one transcript and one theta, bit for bit.
    The run has both kinds of step (so the check is not vacuous), and no coin is drawn (the private
    generator's counter does not move). Red with the paper's rule only across streams (the coins differ),
    and red for every stream with the negative control below."""
    outs = [out for seed in (0, 1, 2)
            for out in outputs_for_every_secret(lambda j, s=seed: PacZPL(M, design=DESIGN, secret=j, seed=s,
                                                                           coin_step="skip"))]
    assert len(set(outs)) == 1
    branches = {b for _, b, _ in outs[0][0]}
    assert branches == {"unanimous", "coin"}
    assert all(c == 0.0 and bit == 0 for bit, b, c in outs[0][0] if b == "coin")
    mech = PacZPL(M, design=DESIGN, secret=1, seed=0, coin_step="skip")
    before = mech.state_dict()["rng_state"]["counter"]
    run(mech)
    assert mech.state_dict()["rng_state"]["counter"] == before


def test_the_papers_rule_depends_on_the_coins_but_not_on_the_secret():
    """With ``move`` and one private stream, every j* gives the same output (the coins do not depend on
    j*); two streams give two outputs (the comparison above would see a coin that moves theta)."""
    one = outputs_for_every_secret(lambda j: PacZPL(M, design=DESIGN, secret=j, seed=0))
    assert len(set(one)) == 1
    other = run(PacZPL(M, design=DESIGN, secret=0, seed=1))
    assert other != one[0]


def test_moving_along_the_secret_sign_on_disagreement_is_caught():
    """Negative control: a rule that moves along s_{j*} on disagreement gives different theta for
    different j* (and the same transcript: the leak is in the model, not the log)."""
    outs = outputs_for_every_secret(lambda j: MovesAlongTheSecret(M, design=DESIGN, secret=j, seed=0,
                                                                  coin_step="skip"))
    assert len({theta for _, theta in outs}) > 1
    assert len({t for t, _ in outs}) > 1 or len({theta for _, theta in outs}) > 1


@pytest.mark.parametrize("make", [
    lambda j, rule: PacMI(M, 1e-3, 8, design=DESIGN, secret=j, seed=0, coin_step=rule),
    lambda j, rule: Hybrid(M, 1e-3, T, 4, design=DESIGN, secret=j, seed=0, coin_step=rule),
], ids=["pac-mi", "hybrid"])
def test_after_the_budget_coin_steps_do_not_move_theta(make):
    """PAC-MI past its horizon and the hybrid's tail: every coin has coefficient 0 and no coin is drawn;
    the noised releases and the MI charged are those of the paper's rule, step for step (the rule changes
    only what a coin does)."""
    skip_mech, move_mech = make(2, "skip"), make(2, "move")
    skip, move = run(skip_mech), run(move_mech)
    coins = [(bit, c) for bit, b, c in skip[0] if b == "coin"]
    assert coins and all(c == 0.0 and bit == 0 for bit, c in coins)
    assert skip_mech.mi_spent <= 1e-3 and skip_mech.privacy_statement()["coin_step"] == "skip"
    first_coin = next(i for i, (_, b, _) in enumerate(move[0]) if b == "coin")
    assert skip[0][:first_coin] == move[0][:first_coin]  # identical until the first coin


def test_a_tolerance_step_that_cannot_be_paid_does_not_move():
    """Minority mass in (0, tau] and no budget left to pay h(m): the release is a coin, and with ``skip`` its
    coefficient is 0. Red if such a step moved along s_{j*} (a leak of up to h(m), uncharged)."""
    mech = PacMI(4, 1e-30, 5, secret=2, seed=0, coin_step="skip")
    state = mech.state_dict()
    state["log_posterior"] = np.array([-40.0, -45.0, 0.0, 0.0])
    mech.load_state_dict(state)
    rel = mech.release(np.array([-1, 1, 1, 1]))
    assert (rel.branch, rel.coef, rel.bit, rel.mi) == ("coin", 0.0, 0, 0.0)


def test_a_state_saved_with_another_rule_is_refused_and_old_states_load():
    mech = PacZPL(4, secret=1, seed=0, coin_step="skip")
    with pytest.raises(ValueError, match="coin_step"):
        PacZPL(4, seed=0).load_state_dict(mech.state_dict())
    old = PacZPL(4, secret=1, seed=0).state_dict()
    del old["coin_step"]  # written before the rule existed: the paper's rule
    PacZPL(4, seed=0).load_state_dict(old)
    with pytest.raises(ValueError, match="coin_step"):
        PacZPL(4, seed=0, coin_step="walk")


def test_coin_step_is_validated_in_the_config():
    with pytest.raises(ConfigError, match="coin_step must be"):
        TrainConfig(model="tiny-llama", task="demo", coin_step="walk").validate()
    with pytest.raises(ConfigError, match="coin_step applies to pac-zpl, pac-mi and hybrid only"):
        TrainConfig(model="tiny-llama", task="demo", mechanism="mezo", coin_step="skip").validate()
    assert TrainConfig().coin_step == "move"


def test_a_skip_run_end_to_end_from_the_command_line(tmp_path, capsys):
    """``paczero train --coin-step skip``: the log's coin steps have coefficient 0 and bit 0, the statement
    says coin steps did not move the weights, that the model is then a function of all of U and that the
    attack of U's records against records outside U is not bounded; the card's headline names what is bounded
    (membership of a record of U in S*, given U). Red if the words of either were dropped."""
    import json

    from paczero.cli import main

    def train_run(name: str, private: int) -> bytes:
        out = tmp_path / name
        args = ["train", "--model", "tiny-llama", "--task", "demo", "--n-train", "16", "--n-dev", "4", "--n-test",
                "4", "--steps", "8", "--num-subsets", "8", "--coin-step", "skip", "--private-seed", str(private),
                "--out-dir", str(out)]
        assert main(args) == 0
        return out

    out = train_run("a", 4)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert any(r["branch"] == "coin" for r in records)
    assert all((r["coef"], r["bit"]) == (0.0, 0) for r in records if r["branch"] == "coin")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["privacy"]["coin_step"] == "skip" and summary["config"]["coin_step"] == "skip"
    assert "did not move the weights" in summary["privacy_text"]
    # what is bounded, in words: membership in S* given U; not U against records outside it
    assert "the model is a function of all of U" in summary["privacy_text"]
    assert "records from records outside U" in summary["privacy_text"] and "U itself is not protected" in summary[
        "privacy_text"]
    card = (out / "model" / "README.md").read_text()
    assert "- Privacy guarantee: membership-inference success at most 0.5000 (prior 0.5) for the membership of a " \
           "record of U in S*, given U" in card
    capsys.readouterr()


def test_a_skip_run_through_the_training_loop_releases_the_same_weights_for_every_secret(tmp_path, monkeypatch):
    """The whole training loop (``paczero.train``, tiny model, M = 4 candidates, ``coin_step: skip``), run once
    for every j* in 0..3 with the same private stream: the released weights, the final checkpoint's weights
    and the log are the same for every j*, bit for bit, and the run has coin steps. The checks above hold the
    mechanism's coefficients to account; this one holds the loop that applies them. Red if the loop moved
    theta along s_{j*} on a coin step while the log kept the coin's coefficient 0 (the released model then
    depends on j*, and every check of the log stays green)."""
    import json

    import paczero.privacy.subsets as subsets
    from forced_secret import forced
    from paczero.train import train

    def released(secret: int) -> tuple[bytes, bytes, list]:
        monkeypatch.setattr(subsets, "secret_generator", forced(secret))
        out = tmp_path / f"j{secret}"
        train(TrainConfig(model="tiny-llama", task="demo", n_train=16, n_dev=4, n_test=4, steps=6, num_subsets=M,
                          coin_step="skip", eval_every=6, checkpoint_every=6, private_seed=3, progress=False,
                          eval_zero_shot=False, out_dir=str(out)), log=lambda *a: None)
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        for record in log:
            record.pop("seconds")
        return ((out / "selected.safetensors").read_bytes(),
                (out / "checkpoints" / "step-000006" / "weights.safetensors").read_bytes(), log)

    runs = [released(j) for j in range(M)]
    assert {r["branch"] for r in runs[0][2]} == {"unanimous", "coin"}
    assert all(run == runs[0] for run in runs[1:])


def test_posterior_mean_coefficient_is_the_public_posterior_mean_of_the_secret_sign():
    """``noised_coef: posterior-mean``: each noised release moves theta by E[s_{j*} | transcript], computed here
    independently in 50-digit arithmetic from what the log publishes (y~, sigma) and the posterior before the
    release (the adversary's, public); bits, y~, charges and posterior are those of the paper's rule, release
    for release. Red if the coefficient used the secret's own sign (e.g. s_{j*} * |E|), or the prior instead of
    the updated posterior."""
    import mpmath as mp

    rng = np.random.default_rng(4)
    bit_rule = PacMI(M, 0.5, 12, design=DESIGN, secret=1, seed=7)
    mean_rule = PacMI(M, 0.5, 12, design=DESIGN, secret=1, seed=7, noised_coef="posterior-mean")
    seen = 0
    for _ in range(12):
        signs = np.where(rng.random(M) < 0.5, 1, -1)
        prior = mean_rule.posterior
        a, b = bit_rule.release(signs), mean_rule.release(signs)
        assert (a.bit, a.branch, a.y_tilde, a.sigma, a.mi) == (b.bit, b.branch, b.y_tilde, b.sigma, b.mi)
        np.testing.assert_array_equal(bit_rule.posterior, mean_rule.posterior)
        if b.branch != "noised":
            assert b.coef == a.coef
            continue
        seen += 1
        with mp.workdps(50):
            w = [mp.mpf(float(p)) * mp.e ** (-(mp.mpf(b.y_tilde) - int(s)) ** 2 / (2 * mp.mpf(b.sigma) ** 2))
                 for p, s in zip(prior, signs)]
            want = sum(wi * int(s) for wi, s in zip(w, signs)) / sum(w)
        assert abs(b.coef - float(want)) < 1e-9 and abs(b.coef) <= 1.0 and a.coef in (1.0, -1.0)
    assert seen >= 3
    assert mean_rule.privacy_statement()["noised_coef"] == "posterior-mean"
    with pytest.raises(ConfigError, match="noised_coef applies to pac-mi and hybrid only"):
        TrainConfig(model="tiny-llama", task="demo", noised_coef="posterior-mean").validate()
