"""The last-bits attack (Mironov, CCS 2012) against every noisy value paczero publishes.

For 10,000 releases of each mechanism (PAC-MI, the hybrid, DPZero, DP-AggZO) the attack of
paczero.audit.lsb_attack asks which hypothesis (PAC: s_{j*} = +1 or -1; DP: the target record in the
batch or not, the adversary knowing every other record and the batch) the published value could
come from exactly. With the exact grid samplers none is decided and every value is reachable; the
negative controls, the same releases made with the float samplers the mechanisms would otherwise
use, are decided at least 40 % of the time, so the attack is one that works.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from paczero.privacy.exact_noise import GRID_BITS
from paczero.audit.lsb_attack import decided, float_consistent, grid_sum_consistent, pac_release_consistency
from paczero.mechanisms.dp import DPAggZO, DPZero, clip_rows, clip_scalars, grid_rows
from paczero.mechanisms.hybrid import Hybrid
from paczero.mechanisms.pac import PacMI
from paczero.privacy.secure_random import SecureGenerator

RELEASES = 10_000


def _pac_releases(make, n=RELEASES, m=8, steps=50):
    """n noised releases of fresh mechanisms on disagreeing signs: (y~, sigma, grid, s_{j*})."""
    rng = np.random.default_rng(0)
    out = []
    while len(out) < n:
        secret = int(rng.integers(m))
        mech = make(m, secret, int(rng.integers(1 << 30)), steps)
        for _ in range(steps):
            signs = np.where(rng.random(m) < 0.5, 1, -1)
            signs[0] = -signs[1]
            r = mech.release(signs)
            if r.branch == "noised":
                out.append((r.y_tilde, r.sigma, r.grid, int(signs[secret])))
    return out[:n]


def _attack_pac(releases):
    decided_n = lost = 0
    for y, sigma, grid, s in releases:
        plus, minus = pac_release_consistency(y, sigma, grid)
        decided_n += decided(plus, minus)
        lost += not (plus if s == 1 else minus)  # the true sign must always stand
    return decided_n, lost


@pytest.mark.parametrize("make", [
    lambda m, secret, seed, steps: PacMI(m, 1.0, steps, secret=secret, seed=seed),
    lambda m, secret, seed, steps: Hybrid(m, 1.0, steps, steps, secret=secret, seed=seed),
], ids=["pac-mi", "hybrid"])
def test_no_pac_release_is_decided_and_the_float_sampler_is(make):
    """0 of 10,000 grid releases decided, none unreachable from its true sign. Negative control: the
    same sigmas with y~ = s + sigma * standard_normal() (the float sampler) are decided >= 40 % of the
    time and the true sign is never excluded (the attack is sound). Red when _noised_value draws a float
    (y~ off the grid: the true sign is excluded) or when noise_grid returns a grid 1/grid is not an
    integer of (the two signs on different cosets: every release decided)."""
    releases = _pac_releases(make)
    decided_n, lost = _attack_pac(releases)
    assert (decided_n, lost) == (0, 0)

    rng = SecureGenerator.from_seed(7)
    float_releases = [(s + sigma * float(rng.standard_normal()), sigma, 0.0, s) for _, sigma, _, s in releases]
    decided_float, lost_float = _attack_pac(float_releases)
    assert lost_float == 0
    assert decided_float >= 0.4 * len(float_releases)


def _dp_world(seed, n=24):
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 20.0, size=(4, n))  # per-example scalars, the target is example 0


def test_no_dpzero_release_is_decided_and_the_float_sampler_is():
    """DPZero, the target record 0 in a universe of 24, batch known to the adversary: on the grid, for
    0 of 10,000 releases does only one of 'target in' / 'target out' reach the published coefficient
    through an integer noisy sum (and every coefficient is reached). Negative control: coef = (sum +
    noise_std * z) / (q N) with the float sampler is decided >= 40 %. Red when the coefficient is made
    from a float Gaussian (no integer reaches it: both hypotheses excluded)."""
    scalars = _dp_world(1)[0]
    n, q, clip = scalars.size, 0.5, 25.0
    mech = DPZero(n, 2.0, 1e-5, RELEASES, q, clip, seed=3)
    den = q * n
    unit = clip * 2.0 ** -GRID_BITS
    float_rng = SecureGenerator.from_seed(8)
    decided_grid = unreachable = decided_float = lost_float = 0
    for _ in range(RELEASES):
        batch = mech.batch_indices(n)
        with_target = np.union1d(batch, [0])
        coef = mech.step(scalars[batch][None, :])[0].coef
        estimate = coef * den / unit
        consistent = [grid_sum_consistent(coef, estimate, lambda k: math.ldexp(float(k), -GRID_BITS) * clip / den)
                      for _ in (0, 1)]  # any integer noisy sum is reachable from either integer sum
        decided_grid += decided(*consistent)
        unreachable += not any(consistent)
        # the float control, target in the batch
        sums = [float(clip_scalars(scalars[idx], clip).sum()) for idx in (with_target, np.setdiff1d(batch, [0]))]
        std = mech.noise_multiplier * clip
        noisy = (sums[0] + float(float_rng.normal(0.0, std))) / den
        c = [float_consistent(noisy, (noisy * den - t) / std, lambda z, t=t: (t + std * z) / den) for t in sums]
        decided_float += decided(*c)
        lost_float += not c[0]
    assert (decided_grid, unreachable) == (0, 0)
    assert lost_float == 0 and decided_float >= 0.4 * RELEASES


def test_no_dp_aggzo_release_is_decided_and_the_float_sampler_is():
    """DP-AggZO, K = 4, 2,500 steps (10,000 released coefficients): as the DPZero test, per coordinate.
    Red when a coordinate's noise is a float Gaussian."""
    k = 4
    scalars = _dp_world(2)
    n, q, clip = scalars.shape[1], 0.5, 25.0
    mech = DPAggZO(n, 2.0, 1e-5, RELEASES // k, q, clip, k, seed=4)
    den = mech._denominator()
    unit = clip * 2.0 ** -GRID_BITS
    float_rng = SecureGenerator.from_seed(9)
    decided_grid = unreachable = decided_float = lost_float = 0
    for _ in range(RELEASES // k):
        batch = mech.batch_indices(n)
        coefs = [r.coef for r in mech.step(scalars[:, batch])]
        for c in coefs:
            consistent = [grid_sum_consistent(c, c * den / (k * unit),
                                              lambda j: k * (math.ldexp(float(j), -GRID_BITS) * clip) / den)
                          for _ in (0, 1)]
            decided_grid += decided(*consistent)
            unreachable += not any(consistent)
        with_target, without = np.union1d(batch, [0]), np.setdiff1d(batch, [0])
        sums = [clip_rows(scalars[:, idx].T / k, clip).sum(axis=0) for idx in (with_target, without)]
        std = mech.noise_multiplier * clip
        noisy = sums[0] + np.array([float(float_rng.normal(0.0, std)) for _ in range(k)])
        published = k * (noisy / den)
        for i in range(k):
            c = [float_consistent(published[i], (published[i] * den / k - t[i]) / std,
                                  lambda z, t=t[i]: k * ((t + std * z) / den)) for t in sums]
            decided_float += decided(*c)
            lost_float += not c[0]
    assert (decided_grid, unreachable) == (0, 0)
    assert lost_float == 0 and decided_float >= 0.4 * RELEASES


def test_grid_rows_keep_each_contribution_within_the_sensitivity():
    """Rows at and beyond the clip norm, rounded to the grid: every integer row has squared L2 norm at
    most 2^(2 GRID_BITS), checked in integers. Red when the integer re-clip is removed (rounding can
    push a row on the clip sphere over it by up to sqrt(K)/2 units)."""
    rng = np.random.default_rng(5)
    for k in (1, 3, 16, 64):
        rows = rng.normal(size=(200, k))
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)  # on the sphere of radius 1: clipped at C = 1
        for row in grid_rows(clip_rows(rows * 25.0, 25.0), 25.0):
            assert sum(v * v for v in row) <= 2 ** (2 * GRID_BITS)
