"""No PAC-MI release above its beta, no run above its budget, checked independently.

Every MI here is computed without paczero's evaluator: :func:`mi_exact` is 40-digit
mpmath quadrature of the definition, and the run audits use the adversary's exact
posterior (50-digit mpmath, recomputed from the public transcript) with the
float evaluator of ``benchmarks/privacy_simulation.py`` (validated below against
:func:`mi_exact` to 1e-12). Each check is a reusable function that returns its
violations, and each test also runs it on a deliberate mutation of paczero (a
negative control) to show that the check can fail; the docstrings name it.
"""
from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import mpmath as mp
import numpy as np
import pytest

import paczero.privacy.binary_channel as bc
from paczero.mechanisms import Hybrid, PacMI, PacZPL
from paczero.mechanisms import pac
from paczero.privacy.binary_channel import binary_mi, sigma_for_mi

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("privacy_simulation",
                                               ROOT / "benchmarks" / "privacy_simulation.py")
SIM = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(SIM)


# ----------------------------------------------------------------- the independent reference
def mi_exact(q, sigma, dps: int = 40) -> mp.mpf:
    """``I(xi; xi + N(0, sigma^2))``, ``P(xi = +1) = q``, from the definition.

    ``I = sum_x P(x) int f(y|x) log(f(y|x) / f(y)) dy`` with ``f(y|x) = N(y; x, sigma^2)``
    and ``f(y) = q f(y|+1) + (1-q) f(y|-1)``. With ``y = x + sigma z`` the log-ratio
    is ``-log(P(x) + P(-x) exp(-2 x y / sigma^2))``; tanh-sinh quadrature split at 0,
    +-8 and at the point where the two terms of the mixture are equal.
    """
    with mp.workdps(dps):
        q = mp.mpf(q)
        s = mp.mpf(sigma)
        total = mp.mpf(0)
        for x, px in ((1, q), (-1, 1 - q)):
            po = 1 - px

            def integrand(z, x=x, px=px, po=po):
                y = x + s * z
                return mp.npdf(z) * -mp.log(px + po * mp.exp(-2 * x * y / (s * s)))

            zstar = (-mp.log(px / po) * s * s / (2 * x) - x) / s
            pts = sorted({mp.mpf(0), mp.mpf(-8), mp.mpf(8)} | ({zstar} if abs(zstar) < 40 else set()))
            total += px * mp.quad(integrand, [-mp.inf, *pts, mp.inf])
        return total


@functools.lru_cache(maxsize=None)
def reference(q: float, sigma: float) -> float:
    return float(mi_exact(q, sigma))


def h_exact(m) -> mp.mpf:
    with mp.workdps(50):
        m = mp.mpf(m)
        return mp.mpf(0) if m == 0 else -m * mp.log(m) - (1 - m) * mp.log1p(-m)


# ----------------------------------------------------------------- binary_mi accuracy
GRID = [(q, s) for q in (1e-15, 1e-12, 1e-8, 1e-4, 0.05, 0.5)
        for s in (0.01, 0.12, 0.2, 0.3, 0.7, 2.0, 6.0, 100.0, 2500.0, 1e7)]
CANCELLATION_GRID = [(1e-15, 0.15), (1e-15, 0.25), (1e-13, 0.3), (1e-10, 1999.0), (0.3, 1999.0),
                     (1e-12, 1e5)]


def mi_accuracy_violations(evaluate, points, rtol: float) -> list[tuple[float, float, float]]:
    """(q, sigma, relative error) of every point where ``evaluate`` misses mi_exact by > rtol."""
    out = []
    for q, s in points:
        ref = reference(q, s)
        rel = abs(float(evaluate(q, s)) - ref) / ref
        if rel > rtol:
            out.append((q, s, rel))
    return out


def _underestimating(monkeypatch, rel: float = 1e-9) -> None:
    """Mutation: paczero's MI evaluator returns ``rel`` relative too little."""
    real = bc._mi_scalar
    monkeypatch.setattr(bc, "_mi_scalar", lambda q, s: real(q, s) * (1.0 - rel))


def test_binary_mi_matches_the_definition_to_1e_11(monkeypatch):
    """binary_mi within 1e-11 of 40-digit mpmath over q in [1e-15, 1/2], sigma in [0.01, 1e7].

    Red when: ``_mi_scalar`` underestimates by 1e-9 (negative control below), or the
    quadrature window/step is the |z| <= 10.5, step 0.1 one (misses 1e-15 masses by 2e-11).
    """
    worst = max(rel for *_, rel in mi_accuracy_violations(binary_mi, GRID + CANCELLATION_GRID, 0.0))
    assert worst < 1e-12, worst
    assert not mi_accuracy_violations(binary_mi, GRID + CANCELLATION_GRID, 1e-11)
    assert binary_mi(0.75, 0.7) == binary_mi(0.25, 0.7)  # symmetric (1 - q exact here)
    _underestimating(monkeypatch)
    assert len(mi_accuracy_violations(binary_mi, GRID, 1e-11)) == len(GRID)


def test_simulation_evaluator_matches_the_definition_to_1e_12():
    """The benchmark's independent float evaluator (used by the run audits) within 1e-12.

    Red when: ``privacy_simulation.true_mi`` drops the low-SNR subtraction or its window
    (it would then miss at sigma >= 1e4 or q = 1e-15)."""
    evaluate = lambda q, s: SIM.true_mi(q, s)[0]  # noqa: E731
    assert not mi_accuracy_violations(evaluate, GRID + CANCELLATION_GRID, 1e-12)
    bad = lambda q, s: SIM.true_mi(q, s)[0] * (1 - 1e-9)  # noqa: E731
    assert mi_accuracy_violations(bad, GRID[:5], 1e-12)


# ----------------------------------------------------------------- calibration
CALIBRATION = [(q, f * float(bc.binary_entropy(q)))
               for q in (1e-15, 1e-12, 1e-7, 1e-3, 0.2, 0.5)
               for f in (1e-9, 1e-3, 0.3, 0.999)]


def calibration_violations(pairs, sigma_fn=sigma_for_mi) -> list[tuple[float, float, float]]:
    """(q, beta, true MI / beta) wherever the true MI at ``sigma_fn(q, beta)`` is above beta
    or below beta (1 - 1e-8) (a wasteful calibration)."""
    out = []
    for q, beta in pairs:
        ratio = reference(q, sigma_fn(q, beta)) / beta
        if not 1 - 1e-8 <= ratio <= 1.0:
            out.append((q, beta, ratio))
    return out


def test_calibration_is_conservative_and_tight_against_the_definition(monkeypatch):
    """mi_exact(q, sigma_for_mi(q, beta)) in [beta (1 - 1e-8), beta] on q 1e-15..1/2, beta up
    to 0.999 h(q); sigma from ~0.1 to ~1e5.

    Red when: ``_mi_scalar`` underestimates by 1e-9 (negative control), ``_TARGET_SLACK``
    or the nudge is removed, or the calibration is loosened beyond 1e-8."""
    assert not calibration_violations(CALIBRATION)
    _underestimating(monkeypatch)
    assert len(calibration_violations(CALIBRATION[::4])) == len(CALIBRATION[::4])


# ----------------------------------------------------------------- run audits
class ExactPosterior:
    """The adversary's posterior from the public transcript, in 50-digit mpmath."""

    def __init__(self, prior) -> None:
        with mp.workdps(50):
            self.log_w = [mp.log(mp.mpf(float(p))) if p > 0 else mp.mpf(0) for p in prior]
        self.alive = [bool(p > 0) for p in prior]

    def noised(self, signs, y: float, sigma: float) -> None:
        with mp.workdps(50):
            c = mp.mpf(y) / mp.mpf(sigma) ** 2
            self.log_w = [lw + c * int(s) for lw, s in zip(self.log_w, signs)]

    def unanimous(self, signs, bit: int) -> None:
        self.alive = [a and int(s) == bit for a, s in zip(self.alive, signs)]

    def sides(self, signs) -> tuple[mp.mpf, mp.mpf]:
        """(mass of the +1 side, mass of the -1 side)."""
        with mp.workdps(50):
            top = max(lw for lw, a in zip(self.log_w, self.alive) if a)
            w = [mp.exp(lw - top) if a else mp.mpf(0) for lw, a in zip(self.log_w, self.alive)]
            total = mp.fsum(w)
            plus = mp.fsum(wi for wi, s in zip(w, signs) if s == 1)
            minus = mp.fsum(wi for wi, s in zip(w, signs) if s != 1)
            return plus / total, minus / total


def audit_run(mech, steps: int, k: int, family: str, seed: int) -> list[dict]:
    """Play the adversary of ``privacy_simulation`` (signs from the public posterior and the
    last noised release) and score every release with its true MI."""
    rng = np.random.default_rng(seed)
    exact = ExactPosterior(mech.posterior)  # the public starting point (uniform when fresh)
    records, last_y = [], None
    for _ in range(steps):
        rows = SIM.choose_signs(rng, mech.posterior, family, k, last_y)
        for signs, rel in zip(rows, mech.release_many(rows)):
            plus, minus = exact.sides(signs)
            m = min(plus, minus)
            rec = {"branch": rel.branch, "m": m, "beta": rel.beta, "charge": rel.mi, "true": 0.0}
            if rel.branch == "noised":
                rec["true"] = float(SIM.true_mi(float(m), rel.sigma)[0])
                rec["sigma"] = rel.sigma
                exact.noised(signs, rel.y_tilde, rel.sigma)
                last_y = rel.y_tilde
            elif rel.branch == "unanimous":
                rec["true"] = float(h_exact(m))
                exact.unanimous(signs, rel.bit)
            records.append(rec)
    return records


def run_violations(records: list[dict], budget: float, mi_spent: float) -> list[str]:
    """Every way a run can overspend, judged on the true MIs of ``audit_run``."""
    out = []
    for i, r in enumerate(records):
        if r["branch"] == "noised" and r["true"] > r["beta"]:
            out.append(f"release {i}: true MI {r['true']!r} > beta {r['beta']!r}")
        if r["true"] > r["charge"]:
            out.append(f"release {i} ({r['branch']}): true MI {r['true']!r} > charge {r['charge']!r}")
    true_total = math.fsum(r["true"] for r in records)
    charged = math.fsum(r["charge"] for r in records)
    if true_total > budget:
        out.append(f"run: true total {true_total!r} > budget {budget!r}")
    if not charged <= mi_spent <= budget:
        out.append(f"run: charges {charged!r}, mi_spent {mi_spent!r}, budget {budget!r}")
    return out


def _cancelling_sides(log_post, plus):
    """Mutation: the -1 side's mass formed as 1 - (the +1 side's mass, a sum near 1)."""
    w = np.exp(log_post - log_post.max())
    q = float((w / w.sum()) @ plus)
    return (math.log(q) if q > 0 else -math.inf), (math.log1p(-q) if q < 1 else -math.inf)


def _runs():
    """(mechanism factory, steps, K, sign family): PAC-MI adaptive and uniform, hybrids whose
    tail starts with the budget spent, and a tiny budget."""
    out = []
    for i in range(6):
        sched = ("adaptive", "uniform")[i % 2]
        out.append((lambda i=i, sched=sched: PacMI(32, 3.0, 40, sched, secret=i, seed=i), 40, 2,
                    ("small", "mixed", "target")[i % 3]))
    for i in range(3):
        out.append((lambda i=i: _concentrated(Hybrid(16, 1e-11, 40, 0, secret=i, seed=10 + i), i),
                    40, 1, "single"))
    for i in range(2):
        out.append((lambda i=i: Hybrid(16, 2.0, 60, 20, secret=i, seed=20 + i), 60, 1, "mixed"))
    out.append((lambda: PacMI(12, 1e-10, 30, secret=0, seed=4), 30, 2, "mixed"))
    return out


def _concentrated(mech, i: int):
    """Start ``mech`` from a posterior concentrated on its secret (as a long MI phase leaves
    it): the others at log-masses -28 .. -45, so tolerance unanimity costs 1e-13..3e-11."""
    log_post = np.random.default_rng(i).uniform(-45.0, -28.0, mech.num_subsets)
    log_post[mech.state_dict()["secret"]] = 0.0
    mech.load_state_dict({**mech.state_dict(), "log_posterior": log_post})
    return mech


RUNS = _runs()
HYBRID = 6  # index of the first hybrid run (three hybrids start in the tail, budget 1e-11)


@functools.lru_cache(maxsize=None)
def _genuine_runs() -> list[tuple[list[dict], float, float]]:
    out = []
    for i, (make, steps, k, family) in enumerate(RUNS):
        mech = make()
        out.append((audit_run(mech, steps, k, family, seed=100 + i), mech.total_mi, mech.mi_spent))
    return out


def test_adversarial_runs_never_exceed_beta_charge_or_budget():
    """Adaptive adversaries (minority -1 side of posterior mass 1e-16..1/2, sides from the last
    release): every noised release's true MI <= its beta and its charge, every tolerance
    release's h(m) <= its charge, the true total <= the budget.

    Red when: the minority mass is formed by cancellation, the tolerance residual is not
    charged, the evaluator underestimates, or the charge margin is dropped (negative
    controls in the tests below)."""
    stats = {"noised": 0, "tolerance": 0, "small": 0, "coin": 0}
    for records, budget, spent in _genuine_runs():
        assert not run_violations(records, budget, spent)
        for r in records:
            stats["noised"] += r["branch"] == "noised"
            stats["small"] += r["branch"] == "noised" and r["m"] < 1e-6
            stats["tolerance"] += r["branch"] == "unanimous" and r["m"] > 0
            stats["coin"] += r["branch"] == "coin"
        worst = max((r["true"] / r["beta"] for r in records if r["branch"] == "noised"), default=0)
        assert worst <= 1.0
    # the runs exercise what they are meant to
    assert stats["noised"] > 300 and stats["small"] > 15 and stats["tolerance"] > 50 and stats["coin"] > 0, stats


def test_audit_spots_an_evaluator_that_underestimates(monkeypatch):
    """Negative control: ``_mi_scalar`` 1e-9 relative too small -> a noised release's true MI above its
    charge (above beta too where sigma's rounding to ``SIGMA_BITS`` bits leaves less than 1e-9 unspent)."""
    _underestimating(monkeypatch)
    make, steps, k, family = RUNS[0]
    mech = make()
    bad = run_violations(audit_run(mech, 10, k, family, seed=100), mech.total_mi, mech.mi_spent)
    assert any("(noised): true MI" in v and "> charge" in v or "> beta" in v for v in bad), bad


def test_audit_spots_a_minority_mass_formed_by_cancellation(monkeypatch):
    """Negative control: ``_log_side_masses`` forms the -1 side as 1 - q+ -> true MI above beta or above
    the charge on releases whose -1 minority has mass ~1e-12..1e-6 (which of the two, and on which
    releases, depends on the CPU's float sums: the test asks for either)."""
    monkeypatch.setattr(pac, "_log_side_masses", _cancelling_sides)
    bad = []
    for i, (make, steps, k, family) in enumerate(RUNS[:HYBRID]):
        mech = make()
        bad += run_violations(audit_run(mech, steps, k, family, seed=100 + i), mech.total_mi,
                              mech.mi_spent)
    assert any("> beta" in v or ("true MI" in v and "> charge" in v) for v in bad), bad


def test_audit_spots_an_uncharged_tolerance_residual(monkeypatch):
    """Negative control: tolerance unanimity charged 0 (``_tolerance_charge`` -> 0) -> h(m) >
    charge on those releases, and the hybrid's tail (budget exhausted) releases s_{j*}
    anyway, taking the true total above the budget."""
    monkeypatch.setattr(pac, "_tolerance_charge", lambda log_m: 0.0)
    bad = []
    for i in range(HYBRID, HYBRID + 3):
        make, steps, k, family = RUNS[i]
        mech = make()
        bad += run_violations(audit_run(mech, steps, k, family, seed=100 + i), mech.total_mi,
                              mech.mi_spent)
    assert any("unanimous" in v for v in bad)
    assert any(v.startswith("run: true total") for v in bad), bad


def test_tolerance_unanimity_without_budget_is_a_coin():
    """A minority mass in (0, tau] with nothing left to pay h(m): a fair coin, MI 0; exact
    unanimity stays free. Red when the residual is released without being paid."""
    for mech in (PacMI(4, 1e-30, 5, secret=2, seed=0), Hybrid(4, 0.5, 5, 0, secret=2, seed=0)):
        state = mech.state_dict()
        state["log_posterior"] = np.array([-40.0, -45.0, 0.0, 0.0])  # m ~ 2e-18 .. 1e-18
        mech.load_state_dict(state)
        rel = mech.release(np.array([-1, 1, 1, 1]))
        m = math.exp(-40.0) / (2 + math.exp(-40) + math.exp(-45))
        if mech.total_mi < m:  # cannot pay
            assert (rel.branch, rel.mi, mech.mi_spent) == ("coin", 0.0, 0.0)
        else:
            assert rel.branch == "unanimous" and float(h_exact(m)) <= rel.mi <= 1e-15
            assert rel.mi <= mech.mi_spent <= mech.total_mi
        assert mech.release(np.array([1, 1, 1, 1])).mi == 0.0


def test_tiny_budgets_over_many_steps_stay_within_budget():
    """Budgets 1e-10 .. 1e-20 over 300 steps, K = 3: exact sum of charges <= mi_spent <= budget.
    Red when a charge is added to mi_spent without rounding upwards (the float sum falls
    below the exact sum) or without checking it against the budget. (A budget whose
    noise scale would exceed ``MAX_SIGMA`` releases coins: next test.)"""
    for total in (1e-10, 3e-10, 1e-20):
        mech = PacMI(4, total, 300, secret=1, seed=5)
        rng = np.random.default_rng(0)
        charges = []
        for _ in range(300):
            rows = np.where(rng.random((3, 4)) < 0.5, 1, -1)
            rows[:, 0] = -rows[:, 1]  # never unanimous
            charges += [r.mi for r in mech.release_many(rows)]
        assert math.fsum(charges) <= mech.mi_spent <= total
        assert mech.mi_spent >= 0.99 * total  # and the budget is used


def test_a_budget_too_small_for_the_grid_releases_coins():
    """A per-release budget whose sigma would exceed MAX_SIGMA = 2^40 (MI < 2^-80 nats) gives fair
    coins, charged nothing. Red when such a sigma reaches the grid sampler (noise_grid raises)."""
    mech = PacMI(4, 1e-300, 300, secret=1, seed=5)
    rels = mech.release_many(np.array([[1, -1, 1, -1]] * 3))
    assert [r.branch for r in rels] == ["coin"] * 3 and mech.mi_spent == 0.0


def test_pac_zpl_sees_only_exact_unanimity():
    """PAC-ZPL's posterior stays uniform: the minority mass is 0 or >= 1/M, so a release is
    exact unanimity (MI 0) or a coin, against the same adversary."""
    mech = PacZPL(16, secret=7, seed=0)
    records = audit_run(mech, 60, 2, "mixed", seed=9)
    for r in records:
        assert r["m"] == 0 or r["m"] >= mp.mpf(1) / 16
        assert r["branch"] == ("unanimous" if r["m"] == 0 else "coin") and r["charge"] == 0.0
    assert mech.mi_spent == 0.0
    np.testing.assert_array_equal(mech.posterior, np.full(16, 1 / 16))


# ----------------------------------------------------------------- the simulation, reduced
@pytest.mark.slow
def test_privacy_simulation_reduced():
    """100 simulated runs of benchmarks/privacy_simulation.py: no overspend anywhere, and its
    double-double posterior agrees with the 50-digit one."""
    results = [SIM.simulate(seed) for seed in range(100)]
    summary = SIM.summarise(results)
    assert summary["noised_true_mi_over_beta"] == 0 and summary["noised_true_mi_over_charge"] == 0
    assert summary["tolerance_true_mi_over_charge"] == 0 and summary["runs_true_total_over_budget"] == 0
    assert summary["max_true_over_beta"] <= 1.0
    rng = np.random.default_rng(3)
    dd, ref = SIM.ExactPosterior(8), ExactPosterior(np.full(8, 1 / 8))
    for _ in range(200):
        signs = np.where(rng.random(8) < 0.5, 1, -1)
        y, sigma = float(rng.normal(0, 2)), float(10 ** rng.uniform(-0.5, 1))
        dd.noised(signs.astype(float), y, sigma)
        ref.noised(signs, y, sigma)
        for got, want in zip(dd.side_masses(signs), ref.sides(signs)):
            assert abs(got - float(want)) <= 1e-14 * float(want) + 1e-300
