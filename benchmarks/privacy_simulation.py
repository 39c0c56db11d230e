"""Simulated PAC-MI / hybrid runs against adversarial sign patterns, audited by an
independent evaluator of each release's true MI.

    python benchmarks/privacy_simulation.py [--runs 3000] [--workers 2] [--seed 0]

Each run draws M in {2, 4, ..., 128}, K in {1..4}, a budget log-uniform in
[1e-10, 30] nats, T in [20, 200], an adaptive or uniform schedule (some runs are
hybrids with a random switch step) and a sign-pattern family that the adversary
plays from the public transcript: a minority (-1) side of chosen posterior mass
(1e-16 .. 1/2, 1e-12 .. 1e-3, or close to the unanimity tolerance), one candidate
against the rest, sides chosen from the last noised release, random splits, and
exact unanimity.

The audit replays the public transcript (signs, y~, sigma, released bits) and
recomputes the adversary's exact posterior in double-double arithmetic (about 32
digits, independent of the mechanism's float posterior): a noised release
multiplies candidate m by N(y~; s_m, sigma^2), a unanimous release rules out the
candidates whose sign differs from the released bit, a coin changes nothing. From
the exact minority mass m of each release:

* noised: the release is checked to be a point of its lattice ``grid * Z`` (with ``1 / grid``
  an integer, so both signs lie on it) of scale ``sigma / grid`` with ``A = pi^2 sigma^2 /
  (4 grid) >= 800``, where the lattice channel's MI is the Gaussian one's to a relative
  ``e^-A`` (Poisson summation, paczero.privacy.binary_channel.discrete_binary_mi); its true
  MI ``I(m, sigma)`` is then computed by :func:`true_mi`, a trapezoidal rule of its
  own (finer step, wider window, first-order term removed analytically at low
  SNR; validated against 40-digit mpmath in tests/test_privacy_exactness.py);
* unanimous: true MI ``h(m)`` (0 when m = 0);
* coin: 0.

It prints a JSON summary: releases, noised releases whose true MI exceeds beta
or the charge, tolerance releases whose h(m) exceeds the charge, runs whose true
total exceeds the budget, and the largest ratios.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from fractions import Fraction
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from paczero.mechanisms import Hybrid, PacMI  # noqa: E402

# ----------------------------------------------------------------- the independent MI evaluator


def _nodes(step: float, z_max: float) -> tuple[np.ndarray, np.ndarray]:
    n = int(round(z_max / step))
    z = step * np.arange(-n, n + 1, dtype=np.float64)
    return z, step * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


_FINE = _nodes(0.02, 14.0)  # sigma < 3: aliasing exp(-pi^2 sigma / 0.02) where it matters
_COARSE = _nodes(0.1, 14.0)  # sigma >= 3


def _log1p_minus_x(x: np.ndarray) -> np.ndarray:
    """``log1p(x) - x`` without cancellation (series for |x| < 0.05)."""
    out = np.empty_like(x)
    small = np.abs(x) < 0.05
    xs = x[small]
    acc = np.zeros_like(xs)
    for k in range(16, 1, -1):  # -x^2/2 + x^3/3 - ...: error < 0.05^17 / 17 relative to x^2/2
        acc = xs * (acc + (-1.0) ** (k + 1) / k)
    out[small] = xs * acc
    xl = x[~small]
    out[~small] = np.log1p(xl) - xl
    return out


def true_mi(q: np.ndarray | float, sigma: np.ndarray | float) -> np.ndarray:
    """``I(xi; xi + N(0, sigma^2))`` for minority mass ``q`` in (0, 1/2], vectorised.

    ``I = sum_x P(x) E_z[-log(P(x) + P(-x) exp(-2 x (x + sigma z) / sigma^2))]``, the
    definition of the MI with ``y = x + sigma z``; both branches are written with
    ``u = -(2/sigma)(z + 1/sigma)`` (the -1 branch after z -> -z). For sigma >= 3 the
    zero-mean term ``P(-x) expm1(u)`` (``E[e^u] = 1``) is subtracted from each
    logarithm before summing, so the low-SNR result (of order q/sigma^2) is not the
    difference of terms of order q/sigma.
    """
    q = np.atleast_1d(np.asarray(q, dtype=np.float64))
    sigma = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    q, sigma = np.broadcast_arrays(q, sigma)
    out = np.empty(q.shape)
    for low_snr, (z, w) in ((False, _FINE), (True, _COARSE)):
        sel = (sigma >= 3.0) if low_snr else (sigma < 3.0)
        if not np.any(sel):
            continue
        qs, ss = q[sel][:, None], sigma[sel][:, None]
        ps = 1.0 - qs
        u = -(2.0 / ss) * (z[None, :] + 1.0 / ss)
        em1 = np.expm1(u)
        # +1 branch (weight q): log(q + p e^u); -1 branch (weight p): log(p + q e^u)
        direct = u < -1.0
        lp = np.where(direct, np.log(qs + ps * np.exp(np.minimum(u, 0.0))),
                      np.log1p(ps * np.where(direct, 0.0, em1)))
        lq = np.log1p(qs * em1)
        if low_snr:
            lp = np.where(direct, lp - ps * em1, _log1p_minus_x(ps * em1))
            lq = _log1p_minus_x(qs * em1)
        out[sel] = -(qs[:, 0] * (lp @ w) + ps[:, 0] * (lq @ w))
    return out


def entropy(m: float) -> float:
    return 0.0 if m <= 0.0 else -m * math.log(m) - (1.0 - m) * math.log1p(-m)


# ----------------------------------------------------------------- exact posterior (double-double)


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


class ExactPosterior:
    """The adversary's log-posterior ``L_m = sum_t y_t s_{t,m} / sigma_t^2`` in double-double.

    ``y / sigma^2`` of each noised release is formed in 40-digit mpmath from the
    public floats and split into hi + lo; candidates ruled out by a unanimous
    release are dropped (``alive``).
    """

    def __init__(self, m: int) -> None:
        self.hi = np.zeros(m)
        self.lo = np.zeros(m)
        self.alive = np.ones(m, dtype=bool)

    def noised(self, signs: np.ndarray, y: float, sigma: float) -> None:
        import mpmath as mp

        with mp.workdps(40):
            c = mp.mpf(y) / (mp.mpf(sigma) ** 2)
            c_hi = float(c)
            c_lo = float(c - c_hi)
        s, e = _two_sum(self.hi, c_hi * signs)  # c_hi * (+-1) is exact
        lo = self.lo + (e + c_lo * signs)
        self.hi, self.lo = _two_sum(s, lo)

    def unanimous(self, signs: np.ndarray, bit: int) -> None:
        self.alive &= signs == bit

    def side_masses(self, signs: np.ndarray) -> tuple[float, float]:
        """(mass of the +1 side, mass of the -1 side), each to ~1e-15 relative."""
        idx = np.flatnonzero(self.alive)
        top = int(idx[np.argmax(self.hi[idx])])
        d_hi, d_lo = _two_sum(self.hi[idx], -self.hi[top])
        w = np.exp(d_hi) * (1.0 + (d_lo + (self.lo[idx] - self.lo[top])))  # e^(hi + lo)
        total = w.sum()
        plus = signs[idx] == 1
        return float(w[plus].sum() / total), float(w[~plus].sum() / total)


# ----------------------------------------------------------------- the adversary


def choose_signs(rng: np.random.Generator, post: np.ndarray, family: str, k: int,
                 last_y: float | None) -> np.ndarray:
    """K rows of signs chosen from the public posterior and transcript."""
    m = len(post)
    rows = np.ones((k, m), dtype=np.int8)
    support = np.flatnonzero(post > 0.0)  # candidates not yet ruled out
    order = support[np.argsort(post[support], kind="stable")]
    csum = np.cumsum(post[order])
    for row in rows:
        pick = family
        if family == "mixed":
            pick = rng.choice(["target", "small", "tolerance", "single", "split", "last_y",
                               "unanimous"], p=[0.2, 0.15, 0.15, 0.1, 0.15, 0.15, 0.1])
        if pick in ("target", "small", "tolerance"):
            lo, hi = {"target": (-16.0, math.log10(0.5)), "small": (-12.0, -3.0),
                      "tolerance": (-16.0, -11.0)}[pick]
            target = 10.0 ** rng.uniform(lo, hi)
            n = max(1, int(np.searchsorted(csum, target, side="right")))
            n = min(n, max(1, len(order) - 1))
            row[order[:n]] = -1  # the minority is the -1 side, mass <= target (or the lightest)
        elif pick == "single":  # one candidate of the support, not the heaviest, against the rest
            row[order[rng.integers(max(1, len(order) - 1))]] = -1
        elif pick == "split":
            row[:] = np.where(rng.random(m) < 0.5, 1, -1)
            if np.all(row == row[0]):
                row[0] = -row[0]
        elif pick == "last_y":  # sides set by the last noised release: the likeliest half vs the rest
            s = 1 if (last_y is None or last_y >= 0) else -1
            row[:] = s
            row[order[: max(1, len(order) // 2)]] = -s
        else:
            row[:] = rng.choice([-1, 1])
    return rows


# ----------------------------------------------------------------- one run


def draw_config(rng: np.random.Generator) -> dict:
    hybrid = rng.random() < 0.2
    t_total = int(rng.integers(20, 201))
    return {
        "m": int(2 * rng.integers(1, 65)),
        "k": int(rng.integers(1, 5)),
        "budget": float(10.0 ** rng.uniform(-10.0, math.log10(30.0))),
        "t_total": t_total,
        "schedule": "adaptive" if rng.random() < 0.6 else "uniform",
        "switch": int(rng.integers(0, t_total + 1)) if hybrid else None,
        "family": str(rng.choice(["mixed", "mixed", "target", "small", "tolerance", "single",
                                  "last_y"])),
    }


def simulate(seed: int, cfg: dict | None = None) -> dict:
    """One run: the mechanism against the adversary, audited from the transcript."""
    rng = np.random.default_rng([seed, 7])
    cfg = cfg or draw_config(rng)
    m, k = cfg["m"], cfg["k"]
    secret = int(rng.integers(m))
    if cfg["switch"] is None:
        mech = PacMI(m, cfg["budget"], cfg["t_total"], cfg["schedule"], secret=secret, seed=seed)
    else:
        mech = Hybrid(m, cfg["budget"], cfg["t_total"], cfg["switch"], cfg["schedule"],
                      secret=secret, seed=seed)
    exact = ExactPosterior(m)
    noised_q, noised_sigma, noised_beta, noised_charge = [], [], [], []
    tol = {"n": 0, "over_charge": 0, "max_ratio": 0.0, "true": 0.0}
    lattice = {"off_grid": 0, "aliasing_not_negligible": 0}
    counts = {"releases": 0, "noised": 0, "unanimous": 0, "coin": 0}
    last_y = None
    charged = []
    for _ in range(cfg["t_total"]):
        rows = choose_signs(rng, mech.posterior, cfg["family"], k, last_y)
        for signs, rel in zip(rows, mech.release_many(rows)):
            plus, minus = exact.side_masses(signs)
            q = min(plus, minus)
            counts["releases"] += 1
            counts[rel.branch] += 1
            charged.append(rel.mi)
            if rel.branch == "noised":
                # the channel that runs: y~ on the public lattice grid * Z that both signs lie on, with a
                # scale sigma / grid large enough that its MI is the Gaussian channel's (aliasing <= e^-A)
                inv = Fraction(1) / Fraction(rel.grid) if rel.grid > 0 else Fraction(1, 3)
                lattice["off_grid"] += int(inv.denominator != 1 or
                                           (Fraction(rel.y_tilde) / Fraction(rel.grid)).denominator != 1)
                lattice["aliasing_not_negligible"] += int(
                    math.pi ** 2 * rel.sigma ** 2 / (4 * rel.grid) < 800 if rel.grid > 0 else 1)
                noised_q.append(q)
                noised_sigma.append(rel.sigma)
                noised_beta.append(rel.beta)
                noised_charge.append(rel.mi)
                exact.noised(signs.astype(np.float64), rel.y_tilde, rel.sigma)
                last_y = rel.y_tilde
            elif rel.branch == "unanimous":
                if q > 0.0:
                    h = entropy(q)
                    tol["n"] += 1
                    tol["true"] += h
                    tol["over_charge"] += int(h > rel.mi)
                    tol["max_ratio"] = max(tol["max_ratio"], h / rel.mi if rel.mi > 0 else math.inf)
                exact.unanimous(signs, rel.bit)
    true = true_mi(np.array(noised_q), np.array(noised_sigma)) if noised_q else np.zeros(0)
    beta = np.array(noised_beta)
    charge = np.array(noised_charge)
    true_total = math.fsum(true.tolist()) + tol["true"]
    return {
        "config": cfg,
        **counts,
        **lattice,
        "noised_over_beta": int(np.sum(true > beta)),
        "noised_over_charge": int(np.sum(true > charge)),
        "max_true_over_beta": float(np.max(true / beta)) if len(true) else 0.0,
        "max_true_over_charge": float(np.max(true / charge)) if len(true) else 0.0,
        "min_noised_q": float(min(noised_q)) if noised_q else None,
        "tolerance_releases": tol["n"],
        "tolerance_over_charge": tol["over_charge"],
        "tolerance_max_true_over_charge": tol["max_ratio"],
        "true_total": true_total,
        "charged_total": math.fsum(charged),
        "mi_spent": mech.mi_spent,
        "budget": cfg["budget"],
        "over_budget": bool(true_total > cfg["budget"] or mech.mi_spent > cfg["budget"]
                            or math.fsum(charged) > cfg["budget"]),
    }


def summarise(results: list[dict]) -> dict:
    noised_q = [r["min_noised_q"] for r in results if r["min_noised_q"] is not None]
    return {
        "runs": len(results),
        "hybrid_runs": sum(r["config"]["switch"] is not None for r in results),
        "releases": sum(r["releases"] for r in results),
        "noised_releases": sum(r["noised"] for r in results),
        "unanimous_releases": sum(r["unanimous"] for r in results),
        "coin_releases": sum(r["coin"] for r in results),
        "tolerance_unanimous_releases": sum(r["tolerance_releases"] for r in results),
        "noised_off_their_grid": sum(r["off_grid"] for r in results),
        "noised_lattice_mi_not_the_gaussian_one": sum(r["aliasing_not_negligible"] for r in results),
        "noised_true_mi_over_beta": sum(r["noised_over_beta"] for r in results),
        "noised_true_mi_over_charge": sum(r["noised_over_charge"] for r in results),
        "tolerance_true_mi_over_charge": sum(r["tolerance_over_charge"] for r in results),
        "runs_true_total_over_budget": sum(r["over_budget"] for r in results),
        "max_true_over_beta": max(r["max_true_over_beta"] for r in results),
        "max_true_over_charge": max(r["max_true_over_charge"] for r in results),
        "max_tolerance_true_over_charge": max(r["tolerance_max_true_over_charge"] for r in results),
        "max_true_total_over_budget": max(r["true_total"] / r["budget"] for r in results),
        "smallest_noised_minority_mass": min(noised_q) if noised_q else None,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    seeds = [args.seed * 1_000_003 + i for i in range(args.runs)]
    if args.workers > 1:
        with Pool(args.workers) as pool:
            results = pool.map(simulate, seeds, chunksize=16)
    else:
        results = [simulate(s) for s in seeds]
    summary = summarise(results)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
