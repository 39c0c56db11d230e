"""The exact samplers and the accounting of the channel that runs (paczero.privacy.exact_noise, discrete_binary_mi).

Each sampler is compared with its probability mass function computed here from the definition; the
lattice channel's MI with 40-digit mpmath sums over the lattice, written here independently.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

from paczero.privacy.exact_noise import (GRID_BITS, MAX_SIGMA, SIGMA_BITS, bernoulli_exp, bernoulli_mask, discrete_gaussian,
                                 discrete_laplace, noise_grid, on_grid, public_sigma)
from paczero.mechanisms.pac import PacMI, _noised_value
from paczero.privacy.binary_channel import binary_mi, discrete_binary_mi
from paczero.privacy.secure_random import SecureGenerator


def _chi2_pvalue(samples, pmf, support):
    counts = np.array([np.count_nonzero(samples == k) for k in support], dtype=float)
    expected = np.array([pmf(k) for k in support]) * len(samples)
    rest = len(samples) - counts.sum()
    counts, expected = np.append(counts, rest), np.append(expected, len(samples) - expected.sum())
    keep = expected > 5
    return stats.chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue


def test_bernoulli_exp_has_probability_exp_minus_gamma():
    """Frequencies of Bernoulli(exp(-gamma)) for gamma in {0.3, 1, 2.7} within 4.5 standard errors.
    Red when the parity rule of CKS Algorithm 1 is inverted or the integer part is skipped."""
    rng = SecureGenerator.from_seed(11)
    for gamma in (Fraction(3, 10), Fraction(1), Fraction(27, 10)):
        n = 20_000
        hits = sum(bernoulli_exp(rng, gamma) for _ in range(n))
        p = math.exp(-float(gamma))
        assert abs(hits / n - p) <= 4.5 * math.sqrt(p * (1 - p) / n), gamma


@pytest.mark.parametrize("sigma2", [Fraction(5, 2), Fraction(49)])
def test_discrete_gaussian_matches_its_pmf(sigma2):
    """Chi-square of 20,000 draws against exp(-x^2 / (2 sigma^2)) normalised by direct summation: p > 1e-4.
    Red when the rejection step of CKS Algorithm 3 is dropped (a discrete Laplace) or t = floor(sigma)."""
    rng = SecureGenerator.from_seed(3)
    draws = np.array([discrete_gaussian(rng, sigma2) for _ in range(20_000)])
    s2 = float(sigma2)
    width = int(12 * math.sqrt(s2)) + 2
    z = sum(math.exp(-k * k / (2 * s2)) for k in range(-width, width + 1))
    support = range(-width, width + 1)
    assert _chi2_pvalue(draws, lambda k: math.exp(-k * k / (2 * s2)) / z, support) > 1e-4


def test_discrete_laplace_matches_its_pmf():
    """Chi-square of 20,000 draws of scale 7/3 against exp(-|x| / b) normalised by summation: p > 1e-4.
    Red when the floor(X / s) of CKS Algorithm 2 is left out (the scale becomes t instead of t / s)."""
    rng = SecureGenerator.from_seed(4)
    draws = np.array([discrete_laplace(rng, Fraction(7, 3)) for _ in range(20_000)])
    b = 7 / 3
    z = sum(math.exp(-abs(k) / b) for k in range(-200, 201))
    assert _chi2_pvalue(draws, lambda k: math.exp(-abs(k) / b) / z, range(-40, 41)) > 1e-4


def test_the_grid_sampler_draws_at_the_scale_of_sigma():
    """At the release scale (sigma / grid in [2^40, 2^41)) 3,000 draws have mean 0 and sd 1 in sigma units
    within sampling error. Red when the scale passed to the sampler is sigma instead of sigma / grid."""
    rng = SecureGenerator.from_seed(5)
    sigma = 1.7
    grid = noise_grid(sigma)
    ys = np.array([_noised_value(rng, 1, sigma, grid) for _ in range(3000)])
    z = (ys - 1.0) / sigma
    assert abs(z.mean()) < 4 / math.sqrt(3000) and abs(z.std() - 1) < 0.05


def test_noise_grid_puts_both_signs_on_the_lattice():
    """For sigma from 1e-6 to 2^40: grid is a power of two, 1/grid an integer, sigma/grid in [2^40, 2^41)
    where the grid is not at its finest, and s + grid * X is exact. Red when the grid is not dyadic."""
    for sigma in (1e-6, 3e-4, 0.01, 0.5, 1.0, 1.999, 7.3, 1e3, 1e7, MAX_SIGMA):
        grid = noise_grid(sigma)
        assert math.frexp(grid)[0] == 0.5
        assert (1 / grid) == int(1 / grid)
        if grid > 2.0 ** -51:
            assert 2.0 ** GRID_BITS <= sigma / grid < 2.0 ** (GRID_BITS + 1)
        for s in (1, -1):
            assert on_grid(float(s), grid) is not None
    with pytest.raises(ValueError):
        noise_grid(MAX_SIGMA * 2)


def _mp_lattice_mi(q, sigma, grid):
    """I(xi; xi + grid X), X discrete Gaussian of scale sigma/grid: the definition, summed in mpmath."""
    q, s = mp.mpf(q), mp.mpf(sigma) / mp.mpf(grid)
    shift = int(round(1 / grid))
    n = int(mp.ceil(16 * s)) + 2
    z = mp.fsum(mp.exp(-mp.mpf(k) ** 2 / (2 * s * s)) for k in range(-n, n + 1))
    total = mp.mpf(0)
    for k in range(-n - shift, n + shift + 1):
        pp = mp.exp(-(k - shift) ** 2 / (2 * s * s)) / z
        pm = mp.exp(-(k + shift) ** 2 / (2 * s * s)) / z
        py = q * pp + (1 - q) * pm
        total += q * pp * mp.log(pp / py) + (1 - q) * pm * mp.log(pm / py)
    return total


@pytest.mark.parametrize("q, sigma, grid", [
    (0.3, 1.0, 0.5), (0.1, 0.5, 0.25), (1e-6, 0.8, 0.125), (0.5, 0.2, 1 / 32),   # direct lattice sums
    (0.5, 3.0, 1 / 64), (0.2, 10.0, 0.125), (1e-9, 4.0, 1 / 64),                  # Poisson-summation branch
])
def test_discrete_binary_mi_matches_mpmath(q, sigma, grid):
    """Relative error below 1e-12 against 40-digit lattice sums, on both evaluation branches. On the
    coarse grids the lattice MI differs visibly from the continuous one, so a function that ignored
    the grid would be red there; on the fine ones the aliasing bound says they agree."""
    mp.mp.dps = 40
    ref = _mp_lattice_mi(q, sigma, grid)
    got = discrete_binary_mi(q, sigma, grid)
    assert abs(got - ref) <= 1e-12 * ref
    if (q, sigma, grid) in ((0.3, 1.0, 0.5), (0.1, 0.5, 0.25)):
        assert abs(binary_mi(q, sigma) - float(ref)) > 1e-11 * float(ref)  # the grid matters here


def test_discrete_binary_mi_refuses_a_grid_the_inputs_are_not_on():
    """1/grid not an integer: the two inputs lie on different cosets and the channel is not this one. The check is
    exact: grid = 0.1 (a double just above 1/10, whose inverse rounds to 10.0 in floats) is refused too; red
    with the check done in floats."""
    with pytest.raises(ValueError, match="integer"):
        discrete_binary_mi(0.3, 1.0, 3 * 2.0 ** -42)
    with pytest.raises(ValueError, match="integer"):
        discrete_binary_mi(0.5, 0.5, 0.1)
    assert 1.0 / 0.1 == 10.0  # what a float check sees
    assert discrete_binary_mi(0.5, 0.5, 0.125) > 0.0  # 1/grid = 8 exactly


def _mp_gaussian_binary_mi(q, sigma):
    """I(xi; xi + sigma Z), Z standard normal: the definition as a 40-digit mpmath quadrature."""
    q, s = mp.mpf(q), mp.mpf(sigma)

    def f(z):
        y = 2 * (1 + s * z) / (s * s)  # the log-likelihood ratio at the output 1 + sigma z, and its mirror
        w = 2 * (-1 + s * z) / (s * s)
        return mp.npdf(z) * (-q * mp.log(q + (1 - q) * mp.exp(-y)) - (1 - q) * mp.log(1 - q + q * mp.exp(w)))
    return mp.quad(f, [-mp.inf, -10, 0, 10, mp.inf])


@pytest.mark.parametrize("q, sigma", [(0.01, 1850.0), (0.5, 1949.91), (1.6e-11, 1925.0), (1e-6, 1671.2),
                                      (0.3, 700.0), (0.1, 60.0)])
def test_discrete_binary_mi_error_is_within_its_stated_bound(q, sigma):
    """The relative error the docstring states (below 4e-13 for sigma up to 2000, of either sign) holds at the
    worst points of a scan against 40-digit quadrature (sigma in [0.05, 2000]); the charge's margin (5e-11) covers
    it. Red when the evaluator loses accuracy near its switch to the low-SNR expansion at sigma = 2000."""
    mp.mp.dps = 40
    grid = noise_grid(sigma)
    ref = _mp_gaussian_binary_mi(q, sigma)
    assert abs(discrete_binary_mi(q, sigma, grid) - ref) <= 4e-13 * ref


def test_bernoulli_mask_keeps_exactly_the_rational_q():
    """The mask keeps u < numerator for u uniform below the exact denominator of q (the float q as a rational):
    at q = 0.064 (denominator 2^54) the draw just below the numerator is kept and the one at it is not. Red for
    a float test random() < q, or a threshold rounded to another grid."""
    p = Fraction(0.064)
    calls = []

    class Edge:
        def integers(self, low, high, size):
            calls.append((low, high, size))
            return np.array([p.numerator - 1, p.numerator], dtype=np.int64)

    assert p.denominator == 2 ** 54
    assert bernoulli_mask(Edge(), 0.064, 2).tolist() == [True, False]
    assert calls == [(0, 2 ** 54, 2)]
    assert bernoulli_mask(SecureGenerator.from_seed(0), Fraction(1), 3).all()
    assert not bernoulli_mask(SecureGenerator.from_seed(0), 0.0, 3).any()
    rng = SecureGenerator.from_seed(3)
    draws = bernoulli_mask(rng, 0.064, 400_000)
    assert abs(draws.mean() - 0.064) < 4 * math.sqrt(0.064 * 0.936 / 400_000)
    tiny = Fraction(1, 3 * 2 ** 70)  # a denominator beyond 2^63: one exact draw at a time
    assert not bernoulli_mask(rng, tiny, 50).any()
    with pytest.raises(ValueError):
        bernoulli_mask(rng, 1.5, 2)


def test_dp_zo_poisson_mask_is_drawn_exactly_at_q():
    """DPZero's batch_indices draws its Poisson mask through bernoulli_mask on the private generator: with a
    generator answering one draw below and one at the numerator of Fraction(q), exactly the first example joins.
    Red for the float mask ``random() < q``."""
    from paczero.mechanisms.dp import DPZero

    q = 0.064
    mech = DPZero(2, 2.0, 1e-5, 10, q, 1.0, seed=0)

    class Edge:
        def integers(self, low, high, size):
            assert (low, high) == (0, Fraction(q).denominator)
            return np.array([Fraction(q).numerator - 1, Fraction(q).numerator], dtype=np.int64)

    mech._rng = Edge()
    assert mech.batch_indices(2).tolist() == [0]


def test_pac_mi_publishes_lattice_values_and_charges_the_lattice_channel():
    """Every noised release of a PAC-MI run: y~ = s + grid * integer for both s, the grid logged, and the
    charge equals discrete_binary_mi at the logged sigma and grid (times the margin). Red when y~ is drawn
    as a float (not on the grid) or the charge comes from another channel."""
    rng = np.random.default_rng(2)
    seen = 0
    mech = PacMI(8, 2.0, 40, secret=3, seed=1)
    for _ in range(40):
        signs = np.where(rng.random(8) < 0.5, 1, -1)
        signs[0] = -signs[1]
        before = mech.state_dict()["log_posterior"]
        r = mech.release(signs)
        if r.branch != "noised":
            continue
        seen += 1
        assert r.grid == noise_grid(r.sigma)
        assert r.sigma == public_sigma(r.sigma)  # the machine-independent scale (test below)
        assert on_grid(r.y_tilde - 1.0, r.grid) is not None and on_grid(r.y_tilde + 1.0, r.grid) is not None
        plus = signs == 1
        post = np.exp(before - before.max())
        post /= post.sum()
        m = min(post[plus].sum(), post[~plus].sum())
        assert r.mi == pytest.approx(discrete_binary_mi(m, r.sigma, r.grid) * (1 + 5e-11), rel=1e-9)
    assert seen >= 10


def test_public_sigma_rounds_up_to_its_significant_bits_and_absorbs_a_machines_last_bits():
    """``public_sigma`` is the least number of ``SIGMA_BITS`` significant bits at or above sigma (checked in
    exact rationals), and sigma moved by a few ulps, as another CPU's numpy/BLAS kernels move a calibrated
    sigma, gives the same public sigma except within those ulps of a rounding point. Red if sigma is
    rounded down (less noise than calibrated), to the nearest, or not at all (every ulp then changes the
    exact sampler's draw, and a transcript differs from one CPU kind to another)."""
    rng = np.random.default_rng(0)
    moved = 0
    for sigma in np.exp(rng.uniform(math.log(1e-3), math.log(1e6), 2000)):
        sigma = float(sigma)
        got = Fraction(public_sigma(sigma))
        e = math.floor(math.log2(sigma))
        step = Fraction(2) ** (e + 1 - SIGMA_BITS)
        want = -((-Fraction(sigma)) // step) * step  # ceil(sigma / step) * step
        assert got == want and got >= Fraction(sigma) and got - Fraction(sigma) < step
        near = [float(np.nextafter(sigma, d)) for d in (-np.inf, np.inf)]
        moved += any(public_sigma(x) != float(got) for x in near)
    assert moved <= 2  # only a sigma within an ulp of a rounding point (2^-32 of the draws)
    assert public_sigma(3.0) == 3.0 and public_sigma(1.0 + 2.0 ** -30) == 1.0 + 2.0 ** (1 - SIGMA_BITS)
    with pytest.raises(ValueError):
        public_sigma(0.0)
