"""Mutual information of the binary-input Gaussian channel and its inverse.

The release of PAC-MI on a disagreement step is ``Y~ = s_{j*} + N(0, sigma^2)`` in the
paper (paczero draws a discrete Gaussian on a fine lattice: :func:`discrete_binary_mi`)
where, to the strongest adversary, ``s_{j*}`` is a binary variable
``xi in {-1, +1}`` with ``P(xi = +1) = q_plus`` (the posterior-weighted agreement
probability of Algorithm 1). Its leakage is ``I(xi; xi + N(0, sigma^2))``,
eq. (binary-mi) of the paper; :func:`sigma_for_mi` is the calibration
``BinaryMI^{-1}(q_plus, beta)`` of Algorithm 1, line 11.

Numerics. Write ``z = N / sigma`` and ``u = -(2 / sigma) (z + 1 / sigma)``;
averaging the two branches of eq. (binary-mi) over ``xi`` gives

    I = E_z[ -q log(1 + (1-q) expm1(u)) - (1-q) log(1 + q expm1(u)) ],

a Gaussian expectation of a function whose only singularities sit at distance
``pi * sigma / 2`` from the real axis. The expectation is evaluated with the
trapezoidal rule (step 0.05 below sigma = 0.5, 0.1 below 1, 0.2 below 3 on
``|z| <= 13``; step 0.5 on ``|z| <= 10.5`` above), which converges geometrically
for such integrands; the wide window matters for a small minority mass q, where
the ``log(1 + q expm1(u))`` term is of order q but its integrand grows like
``|u|`` in the left tail. The logarithms are taken as ``log1p(a * expm1(u))`` (no
cancellation when the release is nearly pure noise) except where a direct
``log`` keeps a small ``q`` exact. For ``sigma >= 2000`` the low-SNR expansion
``I = 2 q(1-q) s - 4 (q(1-q))^2 s^2 + O(s^3)`` with ``s = sigma^-2`` is used.
Relative error against 40-digit mpmath quadrature of the definition, measured on minority
mass q in [1e-15, 1/2]: below 1e-13 for sigma < 1000, below 4e-13 for sigma in [1000, 2000)
(the largest found 3.75e-13 at q = 1/2, sigma = 1950, and -3.0e-13 at q = 0.01, sigma = 1850:
either sign), and below 3e-14 on the expansion beyond (tests/test_privacy_exactness.py,
tests/test_exact_noise.py).

Charging. :func:`calibrate` returns a sigma whose MI satisfies
``binary_mi(q, sigma) * (1 + CHARGE_MARGIN) <= beta``; a mechanism charges
:func:`mi_charge`, ``binary_mi * (1 + CHARGE_MARGIN)``, which exceeds the true MI
as long as the evaluator's relative error plus the relative error of the
caller's q stay below ``CHARGE_MARGIN`` (5e-11; the evaluator's is below 4e-13).
Callers pass the minority mass ``min(q, 1 - q)`` computed directly, never as
``1 -`` a sum near 1, whose absolute error would be a large relative error.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

__all__ = ["binary_entropy", "binary_mi", "discrete_binary_mi", "aliasing_exponent", "sigma_for_mi", "calibrate",
           "mi_charge", "CHARGE_MARGIN"]

_SERIES_SIGMA = 2000.0


def _trapezoid(step: float, z_max: float) -> tuple[np.ndarray, np.ndarray]:
    n = int(round(z_max / step))
    z = step * np.arange(-n, n + 1, dtype=np.float64)  # exact, symmetric nodes
    w = step * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return z, w


#: (sigma threshold, nodes, weights): the step shrinks with the distance pi*sigma/2 of the
#: integrand's complex singularities (aliasing error O(exp(-pi^2 sigma / step))); below
#: sigma = 3 the window is |z| <= 13, so that the left tail of the q-term (integrand ~ |u|,
#: weight phi(z)) is below 1e-13 of a result of order q for q down to 1e-15
_GRIDS = (
    (0.5, *_trapezoid(0.05, 13.0)),
    (1.0, *_trapezoid(0.1, 13.0)),
    (3.0, *_trapezoid(0.2, 13.0)),
    (math.inf, *_trapezoid(0.5, 10.5)),
)


def _check_q(q: np.ndarray, name: str = "q_plus") -> None:
    bad = ~np.isfinite(q) | (q < 0.0) | (q > 1.0)
    if np.any(bad):
        raise ValueError(f"{name} must lie in [0, 1]; got {q[bad].ravel()[0]!r}")


def binary_entropy(q: ArrayLike) -> np.ndarray | float:
    """Binary entropy ``h(q) = -q log q - (1-q) log(1-q)`` in nats (h(0) = h(1) = 0).

    The ceiling of the per-step MI of one bit (Appendix B, "Entropy-ceiling cap").
    Vectorised; returns a float for scalar input.
    """
    if isinstance(q, float) and 0.0 < q < 1.0:
        return -q * math.log(q) - (1.0 - q) * math.log1p(-q)
    qa = np.asarray(q, dtype=np.float64)
    _check_q(qa, "q")
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -qa * np.log(qa) - (1.0 - qa) * np.log1p(-qa)
    h = np.where((qa == 0.0) | (qa == 1.0), 0.0, h)
    return float(h) if h.ndim == 0 else h


def _mi_on_nodes(q: float, sigma: float, z: np.ndarray, w: np.ndarray) -> float:
    """Eq. (binary-mi) as the weighted sum ``sum_k w_k f(z_k)`` over sorted noise nodes ``z = N / sigma``.

    ``log(1 + q expm1(u))`` is accurate for every u; ``log((1-q) + q ... )``'s
    partner ``log(q + (1-q) e^u)`` is taken as ``log1p((1-q) expm1(u))`` where
    ``u >= -1`` (no cancellation when the release is nearly pure noise) and
    directly where ``u < -1`` (no loss of the small ``q``).
    """
    p = 1.0 - q
    u = z * (-2.0 / sigma) - 2.0 / (sigma * sigma)
    em1 = np.expm1(u)
    log_q_term = np.log1p(q * em1) @ w
    # u < -1  <=>  z > sigma/2 - 1/sigma, since u decreases along the sorted nodes
    k = int(np.searchsorted(z, 0.5 * sigma - 1.0 / sigma, side="right"))
    log_p_term = np.log1p(p * em1[:k]) @ w[:k]
    if k < len(z):
        log_p_term += np.log(q + p * np.exp(u[k:])) @ w[k:]
    return float(-(q * log_p_term + p * log_q_term))


def _mi_quadrature(q: float, sigma: float) -> float:
    """Trapezoidal evaluation of eq. (binary-mi) for 0 < q <= 1/2, 0 < sigma < inf
    (``u <= 85`` on the grids, so nothing overflows)."""
    for limit, z, w in _GRIDS:
        if sigma < limit:
            break
    return _mi_on_nodes(q, sigma, z, w)


def _mi_series(q: float, sigma: float) -> float:
    """Low-SNR expansion of eq. (binary-mi); relative truncation error O(sigma^-4)."""
    s = 1.0 / (sigma * sigma)
    qp = q * (1.0 - q)
    return qp * (2.0 * s - 4.0 * qp * s * s)


def _mi_scalar(q: float, sigma: float) -> float:
    q = min(q, 1.0 - q)  # I(q) = I(1 - q)
    if q == 0.0 or sigma == math.inf:
        return 0.0
    if sigma < 1e-3:
        # h(q) minus a correction of order exp(-1 / (2 sigma^2)) < exp(-500000): zero in
        # double precision (and sigma**2 would underflow below ~1e-154)
        return -q * math.log(q) - (1.0 - q) * math.log1p(-q)
    if sigma >= _SERIES_SIGMA:
        return _mi_series(q, sigma)
    return _mi_quadrature(q, sigma)


def binary_mi(q_plus: ArrayLike, sigma: ArrayLike) -> np.ndarray | float:
    """``I(xi; xi + N(0, sigma^2))`` in nats for ``xi in {-1,+1}``, ``P(xi=+1) = q_plus``.

    Eq. (binary-mi) of the paper; the per-step MI of a PAC-MI disagreement step
    (Lemma 1). Vectorised over broadcastable arrays (returns a float for scalar
    input). Exact limits: ``q_plus in {0, 1}`` gives 0, ``sigma = 0`` gives
    ``h(q_plus)``, ``sigma = inf`` gives 0.

    Raises:
        ValueError: ``q_plus`` outside [0, 1], ``sigma`` negative, or NaN.
    """
    if isinstance(q_plus, float) and isinstance(sigma, float) and 0.0 <= q_plus <= 1.0 \
            and sigma >= 0.0:
        return _mi_scalar(q_plus, sigma)
    qa = np.asarray(q_plus, dtype=np.float64)
    sa = np.asarray(sigma, dtype=np.float64)
    _check_q(qa)
    bad = np.isnan(sa) | (sa < 0.0)
    if np.any(bad):
        raise ValueError(f"sigma must be >= 0 (inf allowed); got {sa[bad].ravel()[0]!r}")
    qb, sb = np.broadcast_arrays(qa, sa)
    out = np.array([_mi_scalar(float(q), float(s)) for q, s in zip(qb.ravel(), sb.ravel())])
    out = out.reshape(qb.shape)
    return float(out) if out.ndim == 0 else out


def _check_scalar(x: float, name: str) -> float:
    try:
        xf = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number; got {x!r}") from None
    if not math.isfinite(xf):
        raise ValueError(f"{name} must be finite; got {x!r}")
    return xf


#: relative slack below beta that the root finder aims at, so that the MI realised
#: at the returned sigma lies in [beta (1 - 1e-9), beta / (1 + CHARGE_MARGIN)].
_TARGET_SLACK = 2e-10

#: relative margin added to an evaluated MI to make it a charge, an upper bound of the
#: true MI: it covers the evaluator's relative error (< 4e-13) and the relative error of
#: a caller's minority mass (a mechanism's posterior after many float updates)
CHARGE_MARGIN = 5e-11


def mi_charge(q_plus: ArrayLike, sigma: ArrayLike) -> np.ndarray | float:
    """The MI a mechanism charges for a noised release: ``binary_mi * (1 + CHARGE_MARGIN)``.

    An upper bound of ``I(xi; xi + N(0, sigma^2))`` that stays one when ``q_plus`` is
    off by a relative 1e-11; :func:`calibrate` keeps it ``<= beta``.
    """
    return binary_mi(q_plus, sigma) * (1.0 + CHARGE_MARGIN)


def sigma_for_mi(q_plus: float, beta: float) -> float:
    """``BinaryMI^{-1}(q_plus, beta)``: the noise scale whose binary-channel MI is ``beta``.

    Algorithm 1, line 11. Brent's method on ``log I(e^t) = log beta`` in
    ``t = log sigma``, bracketed from the I-MMSE upper bound
    ``I <= 2 q (1-q) / sigma^2``, with a relative tolerance on the MI. The
    calibration is conservative: ``mi_charge(q_plus, result) <= beta`` always
    (so ``binary_mi(q_plus, result) <= beta / (1 + CHARGE_MARGIN)``), and
    ``binary_mi(q_plus, result) >= beta (1 - 1e-9)``. Pass the minority mass
    (``q_plus`` or ``1 - q_plus``, whichever is smaller) computed directly when it
    is small: the result is as accurate as the ``q_plus`` given.

    Args:
        q_plus: P(xi = +1), in the open interval (0, 1).
        beta: target MI in nats, ``0 < beta < h(q_plus)``.

    Raises:
        ValueError: q_plus outside (0, 1), beta <= 0, beta >= h(q_plus), NaN or inf.
    """
    return calibrate(q_plus, beta)[0]


def calibrate(q_plus: float, beta: float) -> tuple[float, float]:
    """:func:`sigma_for_mi` together with the MI realised at the returned sigma.

    Returns ``(sigma, binary_mi(q_plus, sigma))`` without a second evaluation, with
    ``binary_mi(q_plus, sigma) * (1 + CHARGE_MARGIN) <= beta``; same arguments and
    errors as :func:`sigma_for_mi`.
    """
    q = _check_scalar(q_plus, "q_plus")
    b = _check_scalar(beta, "beta")
    if not 0.0 < q < 1.0:
        raise ValueError(f"q_plus must lie in the open interval (0, 1); got {q_plus!r}")
    if b <= 0.0:
        raise ValueError(f"beta must be > 0; got {beta!r}")
    h = -q * math.log(q) - (1.0 - q) * math.log1p(-q)
    if b >= h:
        raise ValueError(
            f"beta={beta!r} is not achievable: it must be below h(q_plus)={h!r} "
            f"(the entropy of one bit with q_plus={q_plus!r})"
        )
    q = min(q, 1.0 - q)
    log_target = math.log(b) + math.log1p(-_TARGET_SLACK)

    seen: dict[float, float] = {}

    def f(t: float) -> float:  # memoised: brentq re-evaluates the bracket ends
        mi = seen.get(t)
        if mi is None:
            mi = seen[t] = _mi_scalar(q, math.exp(t))
        return (math.log(mi) if mi > 0.0 else -math.inf) - log_target

    # I-MMSE: I <= 2 q (1-q) / sigma^2, so this t makes f <= 0 (up to rounding).
    qp = q * (1.0 - q)
    t_hi = 0.5 * math.log(2.0 * qp / b)
    f_hi = f(t_hi)
    while f_hi > 0.0:
        t_hi += 0.1
        f_hi = f(t_hi)
    # First guess: invert the low-SNR expansion I = 2 qp s - 4 (qp)^2 s^2 (exact to O(s^3)).
    if b < 0.25:
        s_guess = 2.0 * b / (2.0 * qp * (1.0 + math.sqrt(1.0 - 4.0 * b)))
        t_lo = min(-0.5 * math.log(s_guess), t_hi - 1e-9)
    else:
        t_lo = t_hi - 0.5 * -f_hi - 1e-3
    f_lo = f(t_lo)
    if f_lo < 0.0:  # d log I / d log sigma is about -2 at low SNR, shallower elsewhere
        step = 0.5 * -f_lo + 1e-3
        while f_lo < 0.0:
            t_hi, f_hi = t_lo, f_lo
            t_lo = t_hi - step
            f_lo = f(t_lo)
            step = 2.0 * step + 0.25
    elif f_hi < -1e-6 and f_lo > 1e-9:
        # tighten the upper end with one slope -2 step from the (good) lower end
        t_try = t_lo + 0.5 * f_lo * 1.01 + 1e-12
        if t_try < t_hi:
            f_try = f(t_try)
            if f_try <= 0.0:
                t_hi, f_hi = t_try, f_try
            else:
                t_lo, f_lo = t_try, f_try
    if f_lo == 0.0:
        t = t_lo
    elif f_hi == 0.0:
        t = t_hi
    else:
        # |d log I / d log sigma| <= ~2, so xtol 4e-11 in t is <= 1e-10 relative on the MI
        t = optimize.brentq(f, t_lo, t_hi, xtol=4e-11, rtol=4 * np.finfo(float).eps)
    # Conservative nudge: never return a sigma whose charge mi (1 + CHARGE_MARGIN) exceeds beta.
    sigma = math.exp(t)
    mi = seen[t] if t in seen else _mi_scalar(q, sigma)
    bump = 1e-12
    while mi * (1.0 + CHARGE_MARGIN) > b:
        t += bump
        bump *= 2.0
        sigma = math.exp(t)
        mi = _mi_scalar(q, sigma)
    return sigma, mi


# ------------------------------------------------------------------ the channel on a grid

#: largest number of lattice nodes summed directly by :func:`discrete_binary_mi`
_MAX_NODES = 4_000_001
#: the aliasing term ``exp(-aliasing_exponent)`` is below the smallest positive double
_UNDERFLOW_EXPONENT = 800.0


def aliasing_exponent(sigma: float, grid: float) -> float:
    """``A = pi^2 sigma^2 / (4 grid)``: the lattice channel's MI differs from the continuous one by
    at most a factor ``1 + exp(-A)`` (see :func:`discrete_binary_mi`)."""
    return math.pi ** 2 * sigma * sigma / (4.0 * grid)


def discrete_binary_mi(q_plus: float, sigma: float, grid: float) -> float:
    """``I(xi; xi + grid * X)`` in nats: the binary-input channel PAC-MI runs.

    ``xi in {-1, +1}`` with ``P(xi = +1) = q_plus``; ``X`` is the discrete Gaussian on the integers
    with ``P(X = x) ∝ exp(-x^2 / (2 (sigma / grid)^2))``; ``1 / grid`` must be an integer, so both
    inputs lie on the lattice ``grid * Z`` and the log-likelihood ratio of an output ``y`` is
    ``2 y / sigma^2``, as for Gaussian noise. The MI is then ``sum_k w_k f(z_k) / sum_k w_k`` over the
    lattice nodes ``z_k = k grid / sigma`` with ``w_k = exp(-z_k^2 / 2)``, ``f`` the integrand of
    eq. (binary-mi).

    Evaluation. Where ``A = aliasing_exponent(sigma, grid) <= 800`` the lattice sum is taken
    directly (nodes to ``|z| <= 13``). Beyond, Poisson summation: numerator and normaliser are the
    Gaussian integrals of :func:`binary_mi` plus aliasing terms, which are bounded through
    ``f``'s analyticity in the strip ``|Im z| < pi sigma / 2`` (shifting the contour to
    ``pi sigma / 4``) by a relative ``exp(pi^2 sigma^2 / 32 - pi^2 sigma^2 / (2 grid)) <= exp(-A)``
    for ``grid <= 1``; that is below ``1e-347``, so the continuous evaluator's value is the lattice
    channel's MI to its own relative error (below 4e-13, measured; see the module docstring). PAC-MI's grid (:func:`paczero.privacy.exact_noise.noise_grid`)
    gives ``A >= 2^39 sigma``: the continuous branch, whose charge is unchanged.
    Checked against 40-digit mpmath lattice sums on both branches (tests/test_exact_noise.py).

    Raises:
        ValueError: ``q_plus`` outside [0, 1], ``sigma`` not positive and finite, or ``1 / grid`` not
            an integer.
    """
    q = _check_scalar(q_plus, "q_plus")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q_plus must lie in [0, 1]; got {q_plus!r}")
    sigma = _check_scalar(sigma, "sigma")
    grid = _check_scalar(grid, "grid")
    if sigma <= 0.0 or grid <= 0.0:
        raise ValueError(f"sigma and grid must be > 0; got {sigma!r}, {grid!r}")
    if (1 / Fraction(grid)).denominator != 1:  # exactly: a float test would let grid = 0.1 (1/0.1 == 10.0) pass
        raise ValueError(f"1 / grid must be an integer (both inputs on the lattice); got grid={grid!r}")
    q = min(q, 1.0 - q)
    if q == 0.0:
        return 0.0
    if aliasing_exponent(sigma, grid) > _UNDERFLOW_EXPONENT:
        return _mi_scalar(q, sigma)
    scale = sigma / grid  # the discrete Gaussian's scale in lattice units
    n = int(math.ceil(13.0 * scale))
    if 2 * n + 1 > _MAX_NODES:
        raise ValueError(f"grid {grid!r} is too fine for a direct lattice sum at sigma={sigma!r}")
    k = np.arange(-n, n + 1, dtype=np.float64)
    z = k / scale
    w = np.exp(-0.5 * z * z)
    return _mi_on_nodes(q, sigma, z, w / w.sum())
