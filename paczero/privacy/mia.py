"""Membership-inference bounds from an MI budget, and their DP comparison points.

PAC Privacy bounds the posterior success rate of every adversary through the
binary KL divergence, eq. (pac_mi_bound) of the paper:

    KL(1 - delta_A || 1 - delta_0) <= I(X; M(X)).

With balanced subsets (every record in exactly M/2 of the candidate sets) the
prior success of membership inference is ``1 - delta_0 = 1/2``. An
(epsilon, delta)-DP mechanism bounds the same success by
``e^eps / (1 + e^eps) + delta`` (Section 2); :func:`mi_matching_dp` is the MI
budget giving the same MIA bound, the paper's "matched-MIA" annotation (a
numerical reference point only: it transfers no DP guarantee).
"""
from __future__ import annotations

import math

from scipy import optimize

__all__ = ["binary_kl", "mia_bound", "mi_for_mia", "dp_mia_bound", "mi_matching_dp",
           "dp_epsilon_matching_mi"]


def _real(x: float, name: str) -> float:
    try:
        xf = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number; got {x!r}") from None
    if math.isnan(xf):
        raise ValueError(f"{name} must not be NaN; got {x!r}")
    return xf


def _prior(prior: float) -> float:
    pr = _real(prior, "prior")
    if not 0.0 < pr < 1.0:
        raise ValueError(f"prior must lie in the open interval (0, 1); got {prior!r}")
    return pr


def binary_kl(p: float, prior: float) -> float:
    """``KL(p || prior) = p log(p/prior) + (1-p) log((1-p)/(1-prior))`` in nats.

    The left-hand side of eq. (pac_mi_bound). Near ``p = prior`` a Taylor series
    ``sum_{n>=2} d^n / (n(n-1)) [(-1)^n / prior^(n-1) + 1 / (1-prior)^(n-1)]``
    (``d = p - prior``) avoids the cancellation of the closed form.
    """
    pf = _real(p, "p")
    pr = _prior(prior)
    if not 0.0 <= pf <= 1.0:
        raise ValueError(f"p must lie in [0, 1]; got {p!r}")
    d = pf - pr
    if abs(d) < 1e-3 * min(pr, 1.0 - pr):
        a, b = -d / pr, d / (1.0 - pr)
        return sum(
            (pr * a**n + (1.0 - pr) * b**n) / (n * (n - 1)) for n in range(2, 9)
        )
    out = 0.0
    if pf > 0.0:
        out += pf * math.log(pf / pr)
    if pf < 1.0:
        out += (1.0 - pf) * math.log((1.0 - pf) / (1.0 - pr))
    return out


def mia_bound(mi: float, prior: float = 0.5) -> float:
    """Largest posterior success rate ``p >= prior`` with ``KL(p || prior) <= mi``.

    Eq. (pac_mi_bound) inverted (Corollary 1): the MIA success guaranteed by a
    total MI budget ``mi`` (nats) when the informed adversary's prior success is
    ``prior``. ``mia_bound(1/4) ~= 0.84``, ``mia_bound(1/128) ~= 0.56``,
    ``mia_bound(0) = prior``. Rounded up (conservative).

    Raises:
        ValueError: mi negative or NaN, prior outside (0, 1).
    """
    m = _real(mi, "mi")
    pr = _prior(prior)
    if m < 0.0:
        raise ValueError(f"mi must be >= 0; got {mi!r}")
    if m == 0.0:
        return pr
    if m >= -math.log(pr):  # KL(1 || prior) = -log(prior)
        return 1.0
    p = optimize.brentq(lambda x: binary_kl(x, pr) - m, pr, 1.0, xtol=1e-15, rtol=1e-15)
    while binary_kl(p, pr) < m and p < 1.0:
        p = math.nextafter(p, 2.0)
    return min(p, 1.0)


def mi_for_mia(p: float, prior: float = 0.5) -> float:
    """The MI budget whose MIA bound is ``p``: ``KL(p || prior)`` for ``p in [prior, 1]``.

    The inverse of :func:`mia_bound` (eq. pac_mi_bound).

    Raises:
        ValueError: p outside [prior, 1], prior outside (0, 1), NaN.
    """
    pf = _real(p, "p")
    pr = _prior(prior)
    if not pr <= pf <= 1.0:
        raise ValueError(f"p must lie in [prior, 1] = [{pr!r}, 1]; got {p!r}")
    return binary_kl(pf, pr)


def _eps_delta(epsilon: float, delta: float) -> tuple[float, float]:
    e = _real(epsilon, "epsilon")
    d = _real(delta, "delta")
    if e < 0.0:
        raise ValueError(f"epsilon must be >= 0; got {epsilon!r}")
    if not 0.0 <= d < 1.0:
        raise ValueError(f"delta must lie in [0, 1); got {delta!r}")
    return e, d


def dp_mia_bound(epsilon: float, delta: float = 0.0, prior: float = 0.5) -> float:
    """MIA success bound of an (epsilon, delta)-DP mechanism: ``e^eps/(1+e^eps) + delta``.

    Section 2 of the paper (after Sridhar et al.), at the balanced prior 1/2.
    For another prior success rate ``pi`` the likelihood-ratio bound ``e^eps``
    gives ``pi e^eps / (pi e^eps + 1 - pi) + delta``. Capped at 1.
    ``dp_mia_bound(1, 1e-5) ~= 0.7311``.
    """
    e, d = _eps_delta(epsilon, delta)
    pr = _prior(prior)
    if e == math.inf:
        return 1.0
    # pi e^eps / (pi e^eps + 1 - pi) written as a logistic of (eps + logit(pi))
    x = e + math.log(pr) - math.log1p(-pr)
    base = 1.0 / (1.0 + math.exp(-x))
    return min(1.0, base + d)


def mi_matching_dp(epsilon: float, delta: float = 1e-5, prior: float = 0.5) -> float:
    """The MI budget whose MIA bound equals that of (epsilon, delta)-DP.

    ``mi_for_mia(dp_mia_bound(epsilon, delta, prior), prior)``: the paper's
    matched-MIA annotation, e.g. epsilon = 2 -> 0.33 nats, epsilon = 6 -> 0.68 nats.
    """
    p = dp_mia_bound(epsilon, delta, prior)
    return mi_for_mia(p, _prior(prior))


def dp_epsilon_matching_mi(mi: float, delta: float = 1e-5, prior: float = 0.5) -> float:
    """The DP epsilon whose MIA bound (at ``delta``) equals ``mia_bound(mi, prior)``.

    The inverse of :func:`mi_matching_dp`. Returns 0.0 when the MIA bound of
    ``mi`` is at most ``prior + delta`` (in particular for ``mi = 0``), and the
    largest finite epsilon, ``logit(1 - delta) - logit(prior)``, once the MI
    bound reaches 1 (``mi >= -log(prior)``; infinite when ``delta = 0``).
    """
    p = mia_bound(mi, prior)
    _, d = _eps_delta(0.0, delta)
    pr = _prior(prior)
    target = p - d
    if target <= pr:
        return 0.0
    if target >= 1.0:
        return math.inf
    # solve logistic(eps + logit(prior)) = target
    return max(0.0, (math.log(target) - math.log1p(-target)) - (math.log(pr) - math.log1p(-pr)))
