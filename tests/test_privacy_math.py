"""paczero.privacy: binary-channel MI, its calibration, MIA / DP conversions."""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from paczero.privacy import (
    binary_entropy,
    binary_kl,
    binary_mi,
    dp_epsilon_matching_mi,
    dp_mia_bound,
    mi_for_mia,
    mi_matching_dp,
    mia_bound,
    sigma_for_mi,
)

ROOT = Path(__file__).resolve().parents[1]


def mi_mpmath(q: float, sigma: float, dps: int = 30) -> float:
    """Eq. (binary-mi) by mpmath tanh-sinh quadrature, split at the transitions."""
    with mp.workdps(dps):
        q, s = mp.mpf(q), mp.mpf(sigma)
        norm = 1 / mp.sqrt(2 * mp.pi)

        def integrand(y):
            # sum_s P(s) phi(y - s) log(phi(y - s) / mixture), both branches
            lp = -((y - 1) ** 2) / (2 * s * s)
            lm = -((y + 1) ** 2) / (2 * s * s)
            mix = mp.log(q * mp.exp(lp) + (1 - q) * mp.exp(lm))
            return norm / s * (q * mp.exp(lp) * (lp - mix) + (1 - q) * mp.exp(lm) * (lm - mix))

        logit = mp.log((1 - q) / q)
        pts = sorted({-1 - 12 * s, -1, s * s * logit / 2, 1, 1 + 12 * s})
        return float(mp.quad(integrand, [-mp.inf, *pts, mp.inf]))


def mi_scipy(q: float, sigma: float) -> float:
    """Eq. (binary-mi) with scipy.integrate.quad on y (moderate sigma only)."""

    def integrand(y):
        lp = -((y - 1) ** 2) / (2 * sigma**2)
        lm = -((y + 1) ** 2) / (2 * sigma**2)
        mix = np.logaddexp(math.log(q) + lp, math.log1p(-q) + lm)
        c = 1 / (sigma * math.sqrt(2 * math.pi))
        return c * (q * math.exp(lp) * (lp - mix) + (1 - q) * math.exp(lm) * (lm - mix))

    pts = [-1.0, 0.0, 1.0, sigma**2 * math.log((1 - q) / q) / 2]
    lo, hi = -1 - 40 * sigma, 1 + 40 * sigma
    val, _ = integrate.quad(integrand, lo, hi, points=sorted(pts), epsabs=0, epsrel=1e-12, limit=400)
    return val


# ---------------------------------------------------------------- binary_mi accuracy
@pytest.mark.parametrize("q", [1e-6, 1e-3, 0.3, 0.5, 1 - 1e-6])
@pytest.mark.parametrize("sigma", [0.05, 0.25, 0.6, 2.0, 50.0, 1e4])
def test_binary_mi_matches_mpmath(q, sigma):
    ref = mi_mpmath(q, sigma)
    assert binary_mi(q, sigma) == pytest.approx(ref, rel=1e-11, abs=0)  # below the calibration slack


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_binary_mi_matches_scipy_quad_on_a_grid():
    worst = 0.0
    for q in np.geomspace(1e-5, 0.5, 7):
        for sigma in np.geomspace(0.08, 30.0, 9):
            ref = mi_scipy(q, sigma)
            worst = max(worst, abs(binary_mi(q, sigma) - ref) / ref)
    assert worst < 1e-8


def test_binary_mi_large_sigma_series():
    # low-SNR expansion at q = 1/2: I = s/2 - s^2/4 + s^3/6 - ..., s = 1/sigma^2
    for sigma in (3e3, 1e5, 1e8):
        s = sigma**-2
        assert binary_mi(0.5, sigma) == pytest.approx(s / 2 - s * s / 4 + s**3 / 6, rel=1e-12)


def test_binary_mi_limits_and_vectorisation():
    assert binary_mi(0.0, 1.0) == 0.0
    assert binary_mi(1.0, 0.3) == 0.0
    assert binary_mi(0.3, 0.0) == binary_entropy(0.3)
    assert binary_mi(0.3, math.inf) == 0.0
    out = binary_mi(np.array([[0.1], [0.5]]), np.array([0.0, 1.0, np.inf]))
    assert out.shape == (2, 3)
    assert out[1, 0] == pytest.approx(math.log(2))
    assert out[0, 2] == 0.0
    assert binary_mi(0.2, 0.7) == pytest.approx(binary_mi(0.8, 0.7), rel=1e-14)


@settings(max_examples=60, deadline=None)
@given(q=st.floats(1e-9, 1 - 1e-9), s1=st.floats(0.01, 1e5), s2=st.floats(0.01, 1e5))
def test_binary_mi_properties(q, s1, s2):
    lo, hi = sorted((s1, s2))
    i_lo, i_hi = binary_mi(q, lo), binary_mi(q, hi)
    assert 0.0 <= i_hi <= i_lo * (1 + 1e-12) + 1e-300  # data processing: decreasing in sigma
    assert i_lo <= binary_entropy(q) * (1 + 1e-12)
    assert i_lo <= 2 * q * (1 - q) / lo**2 * (1 + 1e-12)  # I-MMSE bound


def test_binary_entropy():
    assert binary_entropy(1e-12) == pytest.approx(2.863e-11, rel=1e-3)  # Appendix B
    assert binary_entropy(0.5) == pytest.approx(math.log(2))
    assert binary_entropy(0.0) == 0.0 and binary_entropy(1.0) == 0.0
    np.testing.assert_allclose(binary_entropy(np.array([0.25, 0.75])), 0.5623351446188083)


# ---------------------------------------------------------------- calibration
@pytest.mark.parametrize("q", [1e-6, 1e-3, 0.1, 0.5, 0.97, 1 - 1e-6])
def test_sigma_for_mi_round_trip_is_tight_and_conservative(q):
    h = binary_entropy(q)
    for beta in [*np.geomspace(1e-14, 0.5 * h, 12), 0.9 * h, 0.999 * h]:
        sigma = sigma_for_mi(q, beta)
        mi = binary_mi(q, sigma)
        assert mi <= beta, (q, beta, sigma, mi)
        assert (beta - mi) / beta <= 1e-9, (q, beta, sigma, mi)


@settings(max_examples=60, deadline=None)
@given(q=st.floats(1e-9, 1 - 1e-9), frac=st.floats(1e-12, 0.999))
def test_sigma_for_mi_property(q, frac):
    beta = frac * binary_entropy(q)
    if beta <= 0.0:
        return
    mi = binary_mi(q, sigma_for_mi(q, beta))
    assert beta * (1 - 1e-9) <= mi <= beta


@pytest.mark.parametrize(
    "args, word",
    [
        ((0.0, 0.1), "q_plus"),
        ((1.0, 0.1), "q_plus"),
        ((1.5, 0.1), "q_plus"),
        ((math.nan, 0.1), "q_plus"),
        ((0.5, 0.0), "beta"),
        ((0.5, -1e-3), "beta"),
        ((0.5, math.log(2)), "beta"),
        ((0.5, 1.0), "beta"),
        ((0.5, math.inf), "beta"),
        ((0.5, math.nan), "beta"),
        ((0.5, "x"), "beta"),
    ],
)
def test_sigma_for_mi_rejects_bad_input(args, word):
    with pytest.raises(ValueError, match=word):
        sigma_for_mi(*args)


def test_binary_mi_and_entropy_reject_bad_input():
    for bad in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError, match="q"):
            binary_mi(bad, 1.0)
        with pytest.raises(ValueError, match="q"):
            binary_entropy(bad)
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="sigma"):
            binary_mi(0.5, bad)


# ---------------------------------------------------------------- MIA and DP conversions
def test_paper_numbers():
    assert mia_bound(0.25) == pytest.approx(0.84, abs=0.005)  # Section 2
    assert mia_bound(1 / 128) == pytest.approx(0.56, abs=0.005)
    assert dp_mia_bound(1.0, 1e-5) == pytest.approx(0.7311, abs=1e-4)
    assert dp_mia_bound(0.1, 1e-5) == pytest.approx(0.5250, abs=1e-4)
    assert mi_matching_dp(2.0) == pytest.approx(0.33, abs=0.005)  # matched-MIA annotations
    assert mi_matching_dp(6.0) == pytest.approx(0.68, abs=0.005)


def test_mia_bound_limits():
    assert mia_bound(0.0) == 0.5
    assert mia_bound(math.log(2)) == 1.0
    assert mia_bound(5.0) == 1.0
    assert mia_bound(0.0, prior=0.9) == 0.9
    assert dp_epsilon_matching_mi(0.0) == 0.0
    assert dp_mia_bound(0.0, 0.0) == 0.5


@settings(max_examples=60, deadline=None)
@given(mi=st.floats(1e-12, 0.69), prior=st.floats(0.05, 0.95))
def test_mia_bound_inverse_and_conservative(mi, prior):
    p = mia_bound(mi, prior)
    assert prior <= p <= 1.0
    if p < 1.0:
        assert binary_kl(p, prior) >= mi  # rounded up: never understates the attack
        assert mi_for_mia(p, prior) == pytest.approx(mi, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.01, 8.0))
def test_dp_matching_round_trip(eps):
    mi = mi_matching_dp(eps)
    assert dp_epsilon_matching_mi(mi) == pytest.approx(eps, rel=1e-6)
    assert mia_bound(mi) == pytest.approx(dp_mia_bound(eps, 1e-5), abs=1e-12)


def test_binary_kl_series_matches_closed_form():
    for prior in (0.5, 0.2):
        for d in (1e-3, -1e-3, 3e-5):
            p = prior + d
            closed = p * math.log(p / prior) + (1 - p) * math.log((1 - p) / (1 - prior))
            assert binary_kl(p, prior) == pytest.approx(closed, rel=1e-8)


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: mia_bound(-0.1), "mi"),
        (lambda: mia_bound(math.nan), "mi"),
        (lambda: mia_bound(0.1, prior=1.0), "prior"),
        (lambda: mi_for_mia(0.4), "p"),
        (lambda: mi_for_mia(1.1), "p"),
        (lambda: dp_mia_bound(-1.0, 1e-5), "epsilon"),
        (lambda: dp_mia_bound(1.0, 1.5), "delta"),
        (lambda: mi_matching_dp(math.nan), "epsilon"),
        (lambda: dp_epsilon_matching_mi(-1.0), "mi"),
        (lambda: binary_kl(2.0, 0.5), "p"),
    ],
)
def test_conversions_reject_bad_input(call, word):
    with pytest.raises(ValueError, match=word):
        call()


# ---------------------------------------------------------------- hygiene
def test_privacy_core_does_not_import_torch():
    code = (
        "import sys; import paczero.privacy, paczero.privacy.subsets, paczero.mechanisms.pac, "
        "paczero.mechanisms.reference; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_docs_privacy_examples_run():
    text = (ROOT / "docs" / "privacy.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/privacy.md", "exec"), namespace)  # noqa: S102
