"""Exact transcript audit of PAC-ZPL (Theorem 2: I(S*; Y_{1:T}) = 0).

For small M and T we enumerate every path of the mechanism's private
randomness (each fair coin is replaced by a scripted one, each script having
probability 2^-T) and compute, for every possible secret j, the exact
distribution of the public transcript (released bit and branch per step). The
signs of each step may depend adaptively on the transcript so far, as they do
in training (theta_t is a function of the released bits). PAC-ZPL must give the
same distribution for every j; a deliberately leaky variant must fail.
"""
from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest

from paczero.mechanisms import PacZPL
from paczero.mechanisms.base import Release


class NeedCoin(Exception):
    """The mechanism asked for one coin more than the script holds."""


class ScriptedCoins:
    """Stands in for the private generator: ``random()`` returns scripted coin values."""

    def __init__(self, coins):
        self._coins = list(coins)

    def random(self):
        if not self._coins:
            raise NeedCoin
        return 0.25 if self._coins.pop(0) else 0.75  # -> bit +1 / bit -1


class LeakyZPL(PacZPL):
    """Negative control: on disagreement, the coin is biased towards s_{j*} (3/4 vs 1/4)."""

    name = "leaky-zpl"

    def _release_one(self, signs, beta):
        rel = super()._release_one(signs, beta)
        if rel.branch != "coin":
            return rel
        s = int(signs[self._secret])
        bit = s if self._rng.random() < 0.5 or rel.bit == s else rel.bit
        return Release(bit=bit, branch="coin", coef=float(bit), q_plus=rel.q_plus,
                       agreement=rel.agreement)


class BlatantZPL(PacZPL):
    """Negative control: releases s_{j*} on disagreement too (no coin)."""

    name = "blatant-zpl"

    def _release_one(self, signs, beta):
        rel = super()._release_one(signs, beta)
        s = int(signs[self._secret])
        return Release(bit=s, branch=rel.branch, coef=float(s), q_plus=rel.q_plus,
                       agreement=rel.agreement)


def adaptive_schedule(m: int, seed: int):
    """Signs of step t as a deterministic function of (t, released bits so far)."""

    def signs(t, prefix):
        h = hash((seed, t, prefix)) & 0xFFFFFFFF
        rng = np.random.default_rng(h)
        if rng.random() < 0.35:  # a unanimity step
            return np.full(m, rng.choice([-1, 1]))
        s = np.where(rng.random(m) < 0.5, 1, -1)
        if np.all(s == s[0]):
            s[0] = -s[0]
        return s

    return signs


def fixed_schedule(rows):
    return lambda t, prefix: np.asarray(rows[t])


def transcript_distributions(cls, m: int, t_total: int, schedule):
    """For each secret j: exact {transcript: probability} over every path of the coins.

    Depth-first over coin scripts: a run that asks for a coin beyond its script
    is re-run with the script extended by each outcome; a completed run with
    c coins has probability 2^-c.
    """

    def run(j, script):
        mech = cls(m, secret=j, seed=0)
        mech._rng = ScriptedCoins(script)  # white-box: enumerate the private randomness
        transcript = ()
        for t in range(t_total):
            rel = mech.release(schedule(t, tuple(b for b, _ in transcript)))
            transcript += ((rel.bit, rel.branch),)
        return transcript

    dists = []
    for j in range(m):
        dist: dict = defaultdict(Fraction)
        stack = [()]
        while stack:
            script = stack.pop()
            try:
                transcript = run(j, script)
            except NeedCoin:
                stack.extend((script + (0,), script + (1,)))
                continue
            dist[transcript] += Fraction(1, 2 ** len(script))
        assert sum(dist.values()) == 1
        dists.append(dict(dist))
    return dists


def exact_mi(dists) -> float:
    """I(j*; transcript) in nats for j* uniform."""
    m = len(dists)
    keys = set().union(*dists)
    mix = {k: sum(d.get(k, 0) for d in dists) / m for k in keys}
    return sum(float(p) * math.log(p / mix[k]) for d in dists for k, p in d.items() if p) / m


def assert_zero_leakage(dists):
    for j, d in enumerate(dists[1:], start=1):
        assert d == dists[0], f"transcript distribution differs between secret 0 and {j}"
    assert exact_mi(dists) == 0.0


SCHEDULES = [
    ("all-disagree", 4, 4, fixed_schedule([[1, -1, 1, -1]] * 4)),
    ("mixed", 4, 5, fixed_schedule([[1, 1, 1, 1], [1, -1, -1, -1], [-1, -1, -1, -1],
                                    [1, 1, -1, 1], [-1, 1, 1, -1]])),
    ("adaptive-a", 4, 4, adaptive_schedule(4, 1)),
    ("adaptive-b", 2, 8, adaptive_schedule(2, 2)),
]


@pytest.mark.parametrize("label, m, t_total, schedule", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_pac_zpl_transcript_is_independent_of_the_secret(label, m, t_total, schedule):
    dists = transcript_distributions(PacZPL, m, t_total, schedule)
    assert_zero_leakage(dists)


@pytest.mark.parametrize("leaky", [LeakyZPL, BlatantZPL])
@pytest.mark.parametrize("label, m, t_total, schedule", SCHEDULES[:3], ids=[s[0] for s in SCHEDULES[:3]])
def test_audit_catches_a_leaky_mechanism(leaky, label, m, t_total, schedule):
    dists = transcript_distributions(leaky, m, t_total, schedule)
    assert exact_mi(dists) > 1e-3
    with pytest.raises(AssertionError):
        assert_zero_leakage(dists)


def test_audit_of_unanimous_steps_reveals_only_the_common_sign():
    dists = transcript_distributions(PacZPL, 4, 3, fixed_schedule([[1] * 4, [-1] * 4, [1] * 4]))
    assert dists[0] == {((1, "unanimous"), (-1, "unanimous"), (1, "unanimous")): 1}
    assert_zero_leakage(dists)
