"""The privacy statement states the guarantee, not one run's realised spend.

Theorem 1 bounds I(S*; transcript) by the MI budget; its proof gives I = E[sum of beta_used], an
average over runs. So the statement's ``mi_bound``/``mia_bound``/``matched_dp_epsilon``, its text and
the model card carry the budget's bound (0 and 1/2 for PAC-ZPL), and ``mi_spent`` is reported apart,
labelled as one run's realised value. Mutation that turns these red: computing ``mia_bound`` (or the
text's "at most" figure) from ``mi_spent`` instead of the budget in ``_PacBase.privacy_statement``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from paczero.config import TrainConfig
from paczero.mechanisms import Hybrid, PacMI, PacZPL
from paczero.mechanisms.dp import DPZero
from paczero.privacy import mia_bound
from paczero.run.release import model_card
from paczero.privacy.statement import guarantee_summary, privacy_statement_text

BUDGET = 0.68


def kl_half_inverse(mi: float) -> float:
    """An independent MIA bound: the p >= 1/2 with KL(p || 1/2) = mi (1 beyond log 2)."""
    if mi >= math.log(2):
        return 1.0
    return brentq(lambda p: p * math.log(2 * p) + (1 - p) * math.log(2 * (1 - p)) - mi, 0.5, 1 - 1e-15,
                  xtol=1e-14)


def adaptive_run(mech, steps: int, seed: int):
    """Disagreeing signs whose order depends on the earlier released bits (as theta_t does in training)."""
    rng = np.random.default_rng(seed)
    m, prev = mech.num_subsets, 1
    for _ in range(steps):
        s = np.where(rng.random(m) < 0.5, 1, -1)
        s[0], s[1] = prev, -prev  # always a disagreement
        prev = mech.release(s).bit
    return mech


def test_independent_bound_agrees_with_mia_bound():
    for b in (0.0, 1e-3, 0.05, 0.25, BUDGET, 1.0):
        assert mia_bound(b) == pytest.approx(kl_half_inverse(b) if b else 0.5, abs=1e-9)


def test_pac_mi_states_the_budget_whatever_it_spent():
    """M=2, T=200, budget 0.68, 120 steps (long enough for the posterior to settle in some runs and
    end their noised releases): runs spend different amounts; every statement says mia_bound(0.68)."""
    spends = []
    for secret in (0, 1):
        for seed in range(3):
            mech = adaptive_run(PacMI(2, BUDGET, 200, secret=secret, seed=seed), 120, seed)
            st = mech.privacy_statement()
            spends.append(st["mi_spent"])
            assert st["mi_spent"] == mech.mi_spent < BUDGET
            assert st["mi_bound"] == BUDGET and st["mi_total_budget"] == BUDGET
            assert st["mia_bound"] == mia_bound(BUDGET)
            assert st["mia_bound"] == pytest.approx(kl_half_inverse(BUDGET), abs=1e-9)
            assert st["mia_bound"] > mia_bound(st["mi_spent"])  # the realised spend is not the bound
            assert "mia_bound_of_budget" not in st
    assert len({round(s, 12) for s in spends}) > 1  # the realised spend varies between runs


def test_pac_zpl_states_zero_and_one_half():
    mech = adaptive_run(PacZPL(4, secret=2, seed=0), 30, 0)
    st = mech.privacy_statement()
    assert st["mi_bound"] == 0.0 and st["mia_bound"] == 0.5 and st["matched_dp_epsilon"] == 0.0
    assert st["mi_spent"] == 0.0


@pytest.mark.parametrize("steps", [0, 3, 20])  # before, during and after the MI phase (switch at 5)
def test_hybrid_states_the_budget(steps):
    mech = adaptive_run(Hybrid(4, 0.2, 20, 5, secret=1, seed=0), steps, 1)
    st = mech.privacy_statement()
    assert st["mi_bound"] == 0.2 and st["mia_bound"] == mia_bound(0.2)
    assert st["mia_bound"] == pytest.approx(kl_half_inverse(0.2), abs=1e-9)
    assert st["mi_spent"] == mech.mi_spent <= 0.2


def _cfg(**kw) -> TrainConfig:
    base = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=200, num_subsets=2)
    return TrainConfig(**{**base, **kw})


def test_text_names_the_bound_and_labels_the_realised_spend():
    mech = adaptive_run(PacMI(2, BUDGET, 200, secret=0, seed=0), 60, 0)
    st = mech.privacy_statement()
    text = privacy_statement_text(st, _cfg(mechanism="pac-mi", mi_budget=BUDGET))
    assert f"guaranteed I(S*; transcript) <= {BUDGET:.6g} nats" in text
    assert f"at most {kl_half_inverse(BUDGET):.4f}" in text
    assert f"at most {mia_bound(st['mi_spent']):.4f}" not in text
    assert f"Realised MI spend of this run: {st['mi_spent']:.6g} nats" in text and "not a bound" in text

    zpl = privacy_statement_text(PacZPL(4, seed=0).privacy_statement(), _cfg(num_subsets=4))
    assert "guaranteed I(S*; transcript) <= 0 nats" in zpl and "at most 0.5000" in zpl
    assert "For reference only" not in zpl


def test_model_card_names_the_bound_and_labels_the_realised_spend():
    mech = adaptive_run(PacMI(2, BUDGET, 200, secret=1, seed=0), 60, 0)
    st = mech.privacy_statement()
    cfg = _cfg(mechanism="pac-mi", mi_budget=BUDGET)
    card = model_card({"config": cfg.to_dict(), "metric": "accuracy", "selected_step": 200,
                       "dev": {"accuracy": 0.5}, "test": {"accuracy": 0.5}, "privacy": st,
                       "privacy_text": privacy_statement_text(st, cfg)})
    assert (f"- Privacy guarantee: membership-inference success at most {kl_half_inverse(BUDGET):.4f} (prior 0.5) "
            "for the membership of a record of U in S*, given U") in card
    assert f"from I(S*; transcript) <= {BUDGET:.6g} nats" in card
    assert f"Realised MI spend of this run: {st['mi_spent']:.6g} nats" in card and "not a bound" in card


def test_dp_and_reference_summaries():
    dp = DPZero(100, 2.0, 1e-5, 10, 0.1, 1.0, seed=0).privacy_statement()
    assert guarantee_summary(dp).startswith("(2, 1e-05)-DP") and f"{dp['mia_bound']:.4f}" in guarantee_summary(dp)
    assert guarantee_summary({"private": False}) == "none (a non-private reference)."


def test_the_statement_and_the_card_open_with_the_guarantee_in_plain_words():
    """The first line of every private run's statement is the plain one: for PAC what is hidden (which records
    were in S*), the attack's best odds, and that the records and their use are not hidden; for DP the epsilon
    achieved, the factor e^epsilon it bounds and that it covers whether a record was used; a non-private
    reference has none. The card carries the same sentence above its details. Red if the plain line moves below
    the details, claims PAC hides the records, or gives DP a wrong factor."""
    from paczero.privacy.statement import plain_guarantee

    cfg = _cfg(num_subsets=4)
    zpl = PacZPL(4, seed=0).privacy_statement()
    first = privacy_statement_text(zpl, cfg).splitlines()[0]
    assert first.startswith("In plain words: this run hides which of the 16 training records were in the secret half")
    assert "at best 50.0 %" in first and "does not hide the records themselves, nor that they were used" in first
    dp = DPZero(100, 2.0, 1e-5, 10, 0.1, 1.0, seed=0).privacy_statement()
    first = privacy_statement_text(dp, _cfg(mechanism="dpzero", epsilon=2.0)).splitlines()[0]
    eps = dp["epsilon_rdp"]
    assert first.startswith(f"In plain words: this run is ({eps:.3g}, 1e-05)-differentially private")
    assert f"e^epsilon = {math.exp(eps):.3g}" in first and "whether it was used" in first
    assert plain_guarantee({"private": False}, 16) is None
    card = model_card({"config": cfg.to_dict(), "metric": "accuracy", "selected_step": 200, "dev": {"accuracy": 0.5},
                       "test": {"accuracy": 0.5}, "privacy": zpl, "privacy_text": privacy_statement_text(zpl, cfg)})
    body = card.split("---\n", 2)[2]
    assert body.index("**Privacy:** In plain words: this run hides") < body.index("- Privacy guarantee:")
