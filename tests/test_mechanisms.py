"""paczero.mechanisms: PAC-MI, PAC-ZPL, hybrid, references, registry."""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from paczero.privacy.exact_noise import SIGMA_BITS
from paczero.mechanisms import MECHANISMS, Hybrid, PacMI, PacZPL, build_mechanism
from paczero.mechanisms.base import Release
from paczero.mechanisms.pac import ENTROPY_CAP, UNANIMITY_TOL
from paczero.privacy.binary_channel import CHARGE_MARGIN
from paczero.privacy import binary_entropy, binary_mi, dp_epsilon_matching_mi, mia_bound
from paczero.privacy.subsets import balanced_design, subset_signs


def random_signs(rng, k, m, p_unanimous=0.3):
    out = np.where(rng.random((k, m)) < rng.uniform(0.1, 0.9), 1, -1)
    for row in out:
        if rng.random() < p_unanimous:
            row[:] = rng.choice([-1, 1])
    return out


# ----------------------------------------------------------------- PAC-MI invariants
def test_pac_mi_invariants_over_many_random_runs():
    """mi_spent <= total; each noised release tight and conservative; Bayes posterior exact."""
    rng = np.random.default_rng(12345)
    n_noised = 0
    for run in range(1000):
        m = int(rng.choice([2, 4, 6, 8, 16]))
        t_total = int(rng.integers(1, 9))
        k = int(rng.choice([1, 1, 2, 3]))
        total = float(10 ** rng.uniform(-6, 0))
        schedule = "adaptive" if run % 3 else "uniform"
        mech = PacMI(m, total, t_total, schedule=schedule, seed=run)
        log_post = np.full(m, -math.log(m))  # independent Bayes computation
        for t in range(1, t_total + 1):
            spent_before = mech.mi_spent
            remaining = max(0.0, total - spent_before) * (1 - 1e-12)
            beta_t = remaining / (t_total - t + 1) if schedule == "adaptive" else min(
                total / t_total, remaining)
            signs_k = random_signs(rng, k, m)
            rels = mech.release_many(signs_k)
            for signs, rel in zip(signs_k, rels):
                post = np.exp(log_post - logsumexp(log_post))
                q_plus = post[signs == 1].sum()
                assert rel.q_plus == pytest.approx(q_plus, abs=1e-12)
                assert rel.agreement == pytest.approx(np.mean(signs == 1))
                if np.all(signs == signs[0]):  # exact unanimity (tests/test_privacy_exactness.py
                    assert rel.branch == "unanimous" and rel.mi == 0.0  # covers the tolerance)
                    continue
                assert rel.branch == "noised"
                cap = min(beta_t / k, ENTROPY_CAP * binary_entropy(float(q_plus)))
                assert rel.beta == pytest.approx(cap, rel=1e-9)
                charged = binary_mi(rel.q_plus, rel.sigma) * (1 + CHARGE_MARGIN)
                assert rel.mi == pytest.approx(charged, rel=1e-12) and rel.mi <= rel.beta
                # tight: sigma is the calibrated one rounded up to SIGMA_BITS bits, which leaves at most
                # 2 * 2^(1 - SIGMA_BITS) of the step's budget unspent (MI falls as 1/sigma^2 at most)
                assert (rel.beta - rel.mi) / rel.beta <= 2.0 ** (2 - SIGMA_BITS)
                assert rel.bit == (1 if rel.y_tilde >= 0 else -1) == rel.coef
                # p[m] <- p[m] N(y; s_m, sigma^2)
                log_post = log_post - (rel.y_tilde - signs) ** 2 / (2 * rel.sigma**2)
                n_noised += 1
            np.testing.assert_allclose(mech.posterior, np.exp(log_post - logsumexp(log_post)),
                                       rtol=1e-9, atol=1e-15)
            assert mech.mi_spent <= total
            assert sum(r.mi for r in rels) <= beta_t * (1 + 1e-12)
        assert mech.steps == t_total
    assert n_noised > 1000


def test_pac_mi_monte_carlo_mi_matches_charge():
    """I(j*; y~) of one real release, estimated by Monte Carlo, matches the charged MI."""
    m, total = 4, 0.2
    signs = np.array([1, 1, -1, 1])  # q+ = 3/4
    ys, charged = [], None
    for i in range(3000):
        mech = PacMI(m, total, 1, secret=i % m, seed=i)
        rel = mech.release(signs)
        ys.append(rel.y_tilde)
        charged, sigma = rel.mi, rel.sigma
    y = np.array(ys)
    s_true = signs[np.arange(len(y)) % m]
    # pointwise log p(y | j*) / p(y): an unbiased estimate of I(j*; y~)
    ll = -((y[:, None] - signs[None, :]) ** 2) / (2 * sigma**2)
    own = -((y - s_true) ** 2) / (2 * sigma**2)
    terms = own - (logsumexp(ll, axis=1) - math.log(m))
    est, se = terms.mean(), terms.std(ddof=1) / math.sqrt(len(terms))
    assert total * (1 - 2.0 ** (2 - SIGMA_BITS)) <= charged <= total  # sigma rounded up: at most that unspent
    assert abs(est - charged) < 4 * se, (est, se, charged)


def test_unanimity_releases_secret_sign_without_cost():
    for cls in (PacMI, PacZPL):
        args = (8, 0.5, 10) if cls is PacMI else (8,)
        mech = cls(*args, secret=3, seed=0)
        for s in (1, -1):
            rel = mech.release(np.full(8, s))
            assert (rel.bit, rel.branch, rel.mi, rel.sigma) == (s, "unanimous", 0.0, 0.0)
        np.testing.assert_array_equal(mech.posterior, np.full(8, 1 / 8))
        assert mech.free_steps == mech.steps == 2
        assert mech.unanimity_rate == 1.0


def test_pac_mi_small_noise_mostly_releases_secret_sign():
    signs = np.array([1, -1, 1, -1])
    hits = sum(PacMI(4, 0.69, 1, secret=1, seed=i).release(signs).bit == -1 for i in range(200))
    assert hits > 180


def test_pac_mi_zero_budget_is_zpl():
    mech = PacMI(4, 0.0, 5, seed=0)
    rel = mech.release(np.array([1, -1, 1, 1]))
    assert rel.branch == "coin" and rel.mi == 0.0
    after = PacMI(4, 0.1, 1, seed=0)
    after.release(np.array([1, -1, 1, 1]))
    assert after.release(np.array([1, -1, 1, 1])).branch == "coin"  # t > T


def _zpl_transcript(cls, secret: int, signs: np.ndarray) -> list[int]:
    mech = cls(6, secret=secret, seed=100)  # the same private stream for every secret value
    return [mech.release(row).bit for row in signs]


def test_zpl_coin_is_fair_and_independent_of_secret():
    """With the same private stream, every secret value gives the very same PAC-ZPL transcript (exact
    independence of S*, not only equal means), the coins are fair and the posterior stays uniform.
    Negative control: a mechanism that leaks s_{j*} on disagreement gives transcripts that differ
    between secrets, and this check catches it."""
    rng = np.random.default_rng(3)
    signs = np.where(rng.random((2000, 6)) < 0.5, 1, -1).astype(np.int8)
    signs[::7] = 1  # some unanimous steps
    transcripts = [_zpl_transcript(PacZPL, secret, signs) for secret in range(6)]
    assert all(t == transcripts[0] for t in transcripts)
    disagree = np.abs(signs.sum(axis=1)) < 6
    assert abs(np.mean(np.asarray(transcripts[0])[disagree])) < 0.1
    mech = PacZPL(6, secret=2, seed=100)
    for row in signs:
        mech.release(row)
    assert mech.mi_spent == 0.0 and mech.free_steps == 2000
    np.testing.assert_array_equal(mech.posterior, np.full(6, 1 / 6))

    class Leaky(PacZPL):  # the mutation: s_{j*} instead of the coin
        def _release_one(self, row, beta):
            rel = super()._release_one(row, beta)
            return rel if rel.branch == "unanimous" else Release(bit=int(row[self._secret]), branch="coin",
                                                                 coef=float(row[self._secret]))

    leaky = [_zpl_transcript(Leaky, secret, signs) for secret in range(6)]
    assert not all(t == leaky[0] for t in leaky)


def test_k1_release_many_is_bit_identical_to_release():
    rng = np.random.default_rng(0)
    for cls, args in ((PacMI, (8, 0.3, 20)), (PacZPL, (8,)), (Hybrid, (8, 0.3, 20, 10))):
        a, b = cls(*args, secret=5, seed=7), cls(*args, secret=5, seed=7)
        for _ in range(20):
            signs = random_signs(rng, 1, 8)
            assert a.release(signs[0]) == b.release_many(signs)[0]
        assert a.state_dict()["mi_spent"] == b.state_dict()["mi_spent"]
        np.testing.assert_array_equal(a.posterior, b.posterior)


def test_k_split_and_sequential_updates():
    mech = PacMI(4, 0.4, 2, seed=3)
    rels = mech.release_many(np.array([[1, -1, 1, -1]] * 4))
    assert all(r.branch == "noised" for r in rels)
    assert rels[0].beta == pytest.approx(0.4 * (1 - 1e-12) / 2 / 4)
    assert len({r.q_plus for r in rels}) > 1  # later releases see the updated posterior
    assert mech.steps == 1 and mech.mi_spent <= 0.2


def test_hybrid_switches_to_frozen_zero_mi_tail():
    m = 2
    signs = np.array([1, -1])
    mech = Hybrid(m, 5.0, 40, switch_step=30, secret=0, seed=1)
    for _ in range(30):
        mech.release(signs)
    assert mech.in_tail and mech.mi_spent <= 5.0
    post = mech.posterior.copy()
    spent = mech.mi_spent
    rel = mech.release(signs)
    np.testing.assert_array_equal(mech.posterior, post)
    assert mech.mi_spent == spent and rel.mi == 0.0
    # with a concentrated inherited posterior the tail still sees unanimity
    q_plus = post[0]
    expected = "unanimous" if q_plus >= 1 - UNANIMITY_TOL or q_plus <= UNANIMITY_TOL else "coin"
    assert rel.branch == expected
    assert mech.privacy_statement()["in_tail"] is True


def test_hybrid_tail_unanimity_judged_on_posterior_weight():
    mech = Hybrid(4, 0.1, 10, switch_step=0, secret=2, seed=0)
    state = mech.state_dict()
    state["log_posterior"] = np.array([-1e3, -1e3, 0.0, 0.0])  # support {2, 3}
    mech.load_state_dict(state)
    rel = mech.release(np.array([-1, 1, 1, 1]))  # subsets 2 and 3 agree
    # tolerance unanimity (minority mass e^-1000 / 2 > 0): charged its residual h(m) from the
    # budget left over, and subset 0 is ruled out
    assert (rel.branch, rel.bit) == ("unanimous", 1) and 0.0 < rel.mi <= 1e-300
    assert mech.mi_spent >= rel.mi and mech.posterior[0] == 0.0
    assert mech.release(np.array([1, 1, -1, 1])).branch == "coin"
    rel = mech.release(np.array([-1, 1, 1, 1]))  # subset 0 has zero mass: exact unanimity, free
    assert (rel.branch, rel.mi) == ("unanimous", 0.0)
    # with no budget left, tolerance unanimity is a coin (MI 0), not a release of s_{j*}
    broke = Hybrid(4, 0.0, 10, switch_step=0, secret=2, seed=0)
    broke.load_state_dict({**broke.state_dict(), "log_posterior": np.array([-1e3, -1e3, 0.0, 0.0])})
    rel = broke.release(np.array([-1, 1, 1, 1]))
    assert (rel.branch, rel.mi, broke.mi_spent) == ("coin", 0.0, 0.0)


# ----------------------------------------------------------------- engine entry
def test_step_uses_design_and_subset_signs():
    design = balanced_design(50, 8, rng=0)
    g = np.random.default_rng(1).normal(0.2, 1.0, size=(3, 50))
    a = PacMI(8, 0.2, 10, design=design, secret=1, seed=4)
    b = PacMI(8, 0.2, 10, secret=1, seed=4)
    assert a.step(g) == b.release_many(subset_signs(g, design))
    with pytest.raises(ValueError, match="design"):
        b.step(g)


# ----------------------------------------------------------------- state
def _run(mech, rng, n, design=None):
    out = []
    for _ in range(n):
        if design is None:
            out.extend(mech.release_many(random_signs(rng, 2, mech.num_subsets)))
        else:
            idx = mech.batch_indices(design.shape[1])
            width = design.shape[1] if idx is None else len(idx)
            out.extend(mech.step(rng.normal(size=(2, width))))
    return out


# DP: test_dp_baselines.py, test_dpsgd.py; adamw (a gradient step, no scalars): test_adamw.py
@pytest.mark.parametrize("name", sorted(set(MECHANISMS) - {"dpzero", "dp-aggzo", "dpzero-aggzo1", "dp-sgd", "adamw"}))
def test_state_dict_round_trip_gives_identical_continuation(name):
    design = balanced_design(40, 8, rng=0)
    kwargs = {
        "pac-mi": dict(num_subsets=8, total_mi=0.5, total_steps=12),
        "pac-zpl": dict(num_subsets=8),
        "hybrid": dict(num_subsets=8, total_mi=0.5, total_steps=12, switch_step=6),
        "mezo": dict(batch_size=16),
    }.get(name, {})
    mech = build_mechanism(name, design=design, seed=11, **kwargs)
    _run(mech, np.random.default_rng(0), 5, design)
    state = copy.deepcopy(mech.state_dict())
    tail = _run(mech, np.random.default_rng(1), 6, design)
    fresh = build_mechanism(name, design=design, seed=99, **kwargs)
    fresh.load_state_dict(state)
    assert _run(fresh, np.random.default_rng(1), 6, design) == tail
    assert fresh.steps == mech.steps and fresh.mi_spent == mech.mi_spent


@pytest.mark.parametrize(
    "other, field",
    [
        (PacZPL(8, seed=0), "mechanism"),
        (PacMI(6, 0.5, 12, seed=0), "num_subsets"),
        (PacMI(8, 0.4, 12, seed=0), "total_mi"),
        (PacMI(8, 0.5, 13, seed=0), "total_steps"),
        (PacMI(8, 0.5, 12, schedule="uniform", seed=0), "schedule"),
    ],
)
def test_load_state_dict_rejects_mismatch(other, field):
    state = PacMI(8, 0.5, 12, seed=0).state_dict()
    with pytest.raises(ValueError, match=field):
        other.load_state_dict(state)


def test_load_state_dict_rejects_other_design():
    a = PacZPL(4, design=balanced_design(10, 4, rng=0), seed=0)
    b = PacZPL(4, design=balanced_design(10, 4, rng=1), seed=0)
    with pytest.raises(ValueError, match="design"):
        b.load_state_dict(a.state_dict())


# ----------------------------------------------------------------- statements
REQUIRED = {"mechanism", "mi_total_budget", "mi_bound", "mi_spent", "mia_bound", "matched_dp_epsilon",
            "steps", "free_steps", "unanimity_rate"}


def test_privacy_statement_is_public_and_consistent():
    mech = PacMI(8, 0.3, 10, secret=6, seed=0)
    _run(mech, np.random.default_rng(0), 10)
    st = mech.privacy_statement()
    assert REQUIRED <= st.keys()
    json.dumps(st)
    assert st["mi_spent"] == mech.mi_spent <= st["mi_total_budget"] == 0.3
    # the guarantee is the budget's (Theorem 1), not this run's realised spend
    assert st["mi_bound"] == 0.3 and st["mia_bound"] == mia_bound(0.3)
    assert st["matched_dp_epsilon"] == dp_epsilon_matching_mi(0.3)
    assert not {"secret", "posterior", "log_posterior", "signs", "rng_state"} & st.keys()
    zpl = PacZPL(8, seed=0).privacy_statement()
    assert zpl["mi_spent"] == zpl["mi_bound"] == 0.0 and zpl["mia_bound"] == 0.5 and zpl["matched_dp_epsilon"] == 0.0
    json.dumps(zpl)


@pytest.mark.parametrize("name", ["mezo", "raw_full", "quant_full", "raw_half", "quant_half",
                                  "random_sign"])
def test_references(name):
    design = balanced_design(20, 4, rng=0)
    mech = build_mechanism(name, design=design, seed=0)
    g = np.random.default_rng(2).normal(size=(2, 20))
    rels = mech.step(g)
    secret = mech.state_dict()["secret"]
    expected = {
        "mezo": g.mean(axis=1),
        "raw_full": g.mean(axis=1),
        "quant_full": np.where(g.mean(axis=1) >= 0, 1.0, -1.0),
        "raw_half": None if secret is None else g[:, design[secret]].mean(axis=1),
        "quant_half": None if secret is None else np.where(
            g[:, design[secret]].mean(axis=1) >= 0, 1.0, -1.0),
    }.get(name)
    if name == "random_sign":
        assert all(r.coef in (-1.0, 1.0) for r in rels)
    else:
        np.testing.assert_allclose([r.coef for r in rels], expected)
    st = mech.privacy_statement()
    assert st["private"] is False and st["mechanism"] == name
    json.dumps(st)


def test_mezo_batches():
    mech = build_mechanism("mezo", batch_size=8, seed=3)
    idx = mech.batch_indices(100)
    assert len(set(idx.tolist())) == 8 and idx.max() < 100
    assert np.array_equal(idx, build_mechanism("mezo", batch_size=8, seed=3).batch_indices(100))
    assert build_mechanism("mezo").batch_indices(100) is None
    with pytest.raises(ValueError, match="batch_size"):
        mech.batch_indices(4)


# ----------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: PacMI(7, 0.1, 10), "num_subsets"),
        (lambda: PacMI(0, 0.1, 10), "num_subsets"),
        (lambda: PacMI(8, -0.1, 10), "total_mi"),
        (lambda: PacMI(8, math.nan, 10), "total_mi"),
        (lambda: PacMI(8, 0.1, 0), "total_steps"),
        (lambda: PacMI(8, 0.1, 10, schedule="cosine"), "schedule"),
        (lambda: PacZPL(8, secret=8), "secret"),
        (lambda: PacZPL(8, design=np.ones((6, 10), bool)), "design"),
        (lambda: Hybrid(8, 0.1, 10, switch_step=11), "switch_step"),
        (lambda: PacZPL(4, seed=0).release(np.array([1, 0, 1, -1])), "signs"),
        (lambda: PacZPL(4, seed=0).release(np.array([1, 1, -1])), "signs"),
        (lambda: PacZPL(4, seed=0).release_many(np.array([1, 1, -1, 1])), "signs"),
        (lambda: build_mechanism("sgd"), "unknown mechanism"),
        (lambda: build_mechanism("raw_half"), "design"),
        (lambda: build_mechanism("mezo", batch_size=0), "batch_size"),
    ],
)
def test_bad_inputs_raise_value_error(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_errors_never_reveal_the_secret():
    mech = PacZPL(64, secret=37, seed=0)
    for bad in (np.full(64, 2), np.ones(63), np.ones((2, 3))):
        with pytest.raises(ValueError) as err:
            mech.release(bad)
        assert "37" not in str(err.value)


def test_the_mechanism_registry_is_one_list():
    """config's names and families are the classes the mechanisms package builds. Red when a mechanism is
    added to one and not the other."""
    from paczero import config
    from paczero.mechanisms import MECHANISMS as CLASSES

    assert set(config.MECHANISMS) == set(CLASSES)
    assert set(config.PAC_PRIVATE) | set(config.DP_MECHANISMS) <= set(config.MECHANISMS)
    assert set(config.MI_BUDGETED) <= set(config.PAC_PRIVATE) <= set(config.PAC_MECHANISMS)
