"""The arithmetic of one PAC release, apart from the mechanisms' bookkeeping (:mod:`paczero.mechanisms.pac`):
the two sides' posterior masses in log space, the charge of tolerance unanimity, and the noised value on
its grid.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..privacy.exact_noise import discrete_gaussian
from ..privacy.binary_channel import CHARGE_MARGIN

#: smallest charge for tolerance unanimity: ``h(m)`` when ``m (1 - log m)`` underflows
_MIN_CHARGE = 2.2250738585072014e-308  # smallest normal double


def _log_side_masses(log_post: np.ndarray, plus: np.ndarray) -> tuple[float, float]:
    """Normalised log posterior masses of the +1 and -1 sides (-inf for no mass).

    Each side is a logsumexp over its own entries, so a small side keeps its full
    relative precision (no ``1 -`` a sum near 1) and no side underflows.
    """
    out = []
    for side in (log_post[plus], log_post[~plus]):
        mx = float(side.max()) if side.size else -math.inf
        out.append(mx if mx == -math.inf else mx + math.log(float(np.exp(side - mx).sum())))
    log_plus, log_minus = out
    top = max(log_plus, log_minus)
    log_total = top + math.log1p(math.exp(min(log_plus, log_minus) - top))
    return log_plus - log_total, log_minus - log_total


def _noised_value(rng, s_secret: int, sigma: float, grid: float) -> float:
    """``y~ = grid * (s_{j*} / grid + X)``, ``X`` an exact discrete Gaussian of scale ``sigma / grid``.

    ``1 / grid`` is an integer and ``|s / grid + X| < 2^53``, so ``y~`` is that lattice point exactly:
    both signs reach every lattice point, and the last bits of ``y~`` say nothing of ``s_{j*}``.
    """
    scale = Fraction(sigma) / Fraction(grid)
    n = s_secret * int(Fraction(1) / Fraction(grid)) + discrete_gaussian(rng, scale * scale)
    if abs(n) >= 2 ** 53:  # probability below exp(-2^20): never in practice, and refused if it were
        raise RuntimeError("noised release off the exactly representable range")
    return math.ldexp(float(n), math.frexp(grid)[1] - 1)


def _tolerance_charge(log_m: float) -> float:
    """An upper bound of ``h(m)`` from ``log m``: ``m (1 - log m) (1 + CHARGE_MARGIN)``.

    ``h(m) = m (1 - log m) - m^2 / 2 - ... <= m (1 - log m)``; the margin covers the
    relative error of the mechanism's m. Never below :data:`_MIN_CHARGE`.
    """
    log_c = log_m + math.log1p(-log_m) + math.log1p(CHARGE_MARGIN)
    return max(math.exp(log_c), _MIN_CHARGE)
