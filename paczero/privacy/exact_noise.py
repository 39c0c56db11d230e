"""Exact noise on a grid: discrete Gaussian and discrete Laplace samplers from private bits.

A float sampler (``s + sigma * z`` with ``z`` a float made from uniform bits) can only produce a
sparse, hypothesis-dependent set of doubles: an adversary who knows the code checks whether a
published value is reachable from ``s = +1`` or from ``s = -1`` and often finds only one
(Mironov, "On significance of the least significant bits for differential privacy", CCS 2012).
Every noisy value paczero publishes, or lets move the released weights, is instead an integer
drawn exactly, times a public power-of-two grid on which every hypothesis lies:

* :func:`discrete_gaussian` -- ``P(x) ∝ exp(-x^2 / (2 sigma^2))`` on the integers, and
  :func:`discrete_laplace` -- ``P(x) ∝ exp(-|x| / scale)``: the rejection samplers of Canonne,
  Kamath and Steinke ("The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
  Algorithms 1-3), in exact rational arithmetic (:class:`fractions.Fraction`) on uniform
  integers from the private generator; no float is involved, so the output distribution is
  exactly the stated one.
* :func:`public_sigma` -- a calibrated ``sigma`` rounded up to ``SIGMA_BITS`` significant bits. The
  calibration's last bits belong to the machine (numpy's CPU-dispatched ``exp``/``log`` and the BLAS
  kernels order its sums differently on AVX2, AVX-512 and Arm), and the exact sampler's draw depends on
  every bit of its scale; rounded, the scale (and with it the release) is the same on every machine for
  the same subset signs, and the noise is never smaller than calibrated.
* :func:`noise_grid` -- the grid ``gamma = 2^(floor(log2 sigma) - GRID_BITS)`` of a PAC-MI
  release: ``1 / gamma`` is an integer, so ``s_{j*} = +-1`` both lie on it, ``y~ = gamma *
  (s / gamma + X)`` with ``X`` a discrete Gaussian of scale ``sigma / gamma`` (about
  ``2^GRID_BITS``), and ``y~`` is a double computed without rounding.

The privacy accounting of these mechanisms is in :mod:`paczero.privacy.binary_channel`
(:func:`~paczero.privacy.binary_channel.discrete_binary_mi`) and :mod:`paczero.privacy.dp`
(:func:`~paczero.privacy.dp.discretization_delta`); docs/privacy.md explains the design.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["randbelow", "bernoulli", "bernoulli_mask", "bernoulli_exp", "discrete_laplace", "discrete_gaussian",
           "public_sigma", "noise_grid", "on_grid", "GRID_BITS", "MAX_SIGMA", "SIGMA_BITS"]

#: bits of the grid below sigma: the discrete Gaussian's scale in grid units is in [2^40, 2^41)
GRID_BITS = 40
#: the finest grid used: 1/gamma <= 2^51, so s/gamma + X stays below 2^53 (exact in a double)
_FINEST_EXPONENT = -51
#: the largest PAC-MI noise scale released on a grid (gamma <= 1); a larger sigma has MI below
#: 2^-80 nats and is released as a fair coin instead
MAX_SIGMA = 2.0 ** GRID_BITS
#: significant bits of a released noise scale: a machine moves a calibrated sigma by far less than
#: 2^-SIGMA_BITS of itself (measured: at most 2^-44 between numpy's AVX-512 and AVX2 loops)
SIGMA_BITS = 20


def randbelow(rng, n: int) -> int:
    """A uniform integer in ``[0, n)`` for any ``n >= 1`` (rejection on whole words: unbiased)."""
    n = int(n)
    if n < 1:
        raise ValueError(f"randbelow needs n >= 1; got {n}")
    if n == 1:
        return 0
    own = getattr(rng, "randbelow", None)
    if own is not None:
        return own(n)
    bits = (n - 1).bit_length()
    nbytes = (bits + 7) // 8
    while True:  # a numpy Generator (tests): its bytes() stream
        x = int.from_bytes(rng.bytes(nbytes), "little") >> (8 * nbytes - bits)
        if x < n:
            return x


def bernoulli(rng, p: Fraction) -> bool:
    """True with probability exactly ``p`` (a rational in [0, 1])."""
    if not 0 <= p <= 1:
        raise ValueError(f"bernoulli needs 0 <= p <= 1; got {p}")
    return randbelow(rng, p.denominator) < p.numerator


def bernoulli_mask(rng, p: Fraction | float, n: int) -> np.ndarray:
    """``n`` independent draws, each True with probability exactly ``p`` (a rational in [0, 1]; a float
    is taken as the exact binary rational it denotes): draw ``u`` uniform in ``[0, den)`` and keep
    ``u < num``. A float test ``random() < p`` would keep at ``p`` plus the rounding of ``p`` to the
    uniforms' 2^-53 grid. Denominators up to 2^63 (every float ``p >= 2^-11``) draw all ``n`` at once
    with the generator's unbiased ``integers``; larger ones one at a time through :func:`randbelow`."""
    p = Fraction(p)
    if not 0 <= p <= 1:
        raise ValueError(f"bernoulli_mask needs 0 <= p <= 1; got {p}")
    n = int(n)
    if n < 0:
        raise ValueError(f"bernoulli_mask needs n >= 0; got {n}")
    num, den = p.numerator, p.denominator
    if den == 1 or n == 0:
        return np.full(n, num == 1, dtype=bool)
    if den <= 2 ** 63:
        return np.asarray(rng.integers(0, den, size=n), dtype=np.int64) < num
    return np.fromiter((randbelow(rng, den) < num for _ in range(n)), dtype=bool, count=n)


def bernoulli_exp(rng, gamma: Fraction) -> bool:
    """True with probability exactly ``exp(-gamma)`` for a rational ``gamma >= 0`` (CKS Algorithm 1)."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp needs gamma >= 0; got {gamma}")
    while gamma > 1:  # exp(-gamma) = exp(-1)^floor(gamma) * exp(-frac(gamma))
        if not bernoulli_exp(rng, Fraction(1)):
            return False
        gamma -= 1
    k = 1
    while bernoulli(rng, gamma / k):
        k += 1
    return k % 2 == 1


def discrete_laplace(rng, scale: Fraction | float | int) -> int:
    """``X`` with ``P(X = x) ∝ exp(-|x| / scale)`` on the integers, exactly (CKS Algorithm 2).

    ``scale`` is taken as the exact rational it denotes (a float's exact binary value).
    """
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError(f"discrete_laplace needs scale > 0; got {scale}")
    t, s = scale.numerator, scale.denominator  # scale = t / s
    while True:
        u = randbelow(rng, t)
        if not bernoulli_exp(rng, Fraction(u, t)):
            continue
        v = 0
        while bernoulli_exp(rng, Fraction(1)):
            v += 1
        y = (u + t * v) // s
        negative = bernoulli(rng, Fraction(1, 2))
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(rng, sigma2: Fraction | float | int) -> int:
    """``X`` with ``P(X = x) ∝ exp(-x^2 / (2 sigma2))`` on the integers, exactly (CKS Algorithm 3).

    ``sigma2`` (the scale squared) is taken as the exact rational it denotes.
    """
    sigma2 = Fraction(sigma2)
    if sigma2 <= 0:
        raise ValueError(f"discrete_gaussian needs sigma2 > 0; got {sigma2}")
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1  # floor(sigma) + 1
    centre = sigma2 / t
    while True:
        y = discrete_laplace(rng, t)
        gamma = (abs(y) - centre) ** 2 / (2 * sigma2)
        if bernoulli_exp(rng, gamma):
            return y


def public_sigma(sigma: float) -> float:
    """``sigma`` rounded up to :data:`SIGMA_BITS` significant bits (exactly; a positive finite double in)."""
    if not (math.isfinite(sigma) and sigma > 0.0):
        raise ValueError(f"public_sigma needs a positive finite sigma; got {sigma!r}")
    mantissa, exponent = math.frexp(sigma)  # sigma = mantissa 2^exponent, mantissa in [0.5, 1)
    return math.ldexp(math.ceil(math.ldexp(mantissa, SIGMA_BITS)), exponent - SIGMA_BITS)


def noise_grid(sigma: float) -> float:
    """The public grid ``gamma`` (a power of two) of a PAC-MI release with noise scale ``sigma``.

    ``gamma = 2^(floor(log2 sigma) - GRID_BITS)``, no finer than ``2^-51``; ``1 / gamma`` is an
    integer for ``sigma <= MAX_SIGMA``.
    """
    if not (math.isfinite(sigma) and 0.0 < sigma <= MAX_SIGMA):
        raise ValueError(f"noise_grid needs 0 < sigma <= {MAX_SIGMA:g}; got {sigma!r}")
    exponent = math.frexp(sigma)[1] - 1 - GRID_BITS  # sigma = m 2^e, m in [0.5, 1): floor(log2) = e - 1
    return math.ldexp(1.0, max(exponent, _FINEST_EXPONENT))


def on_grid(value: float, grid: float) -> int | None:
    """The integer ``n`` with ``value == n * grid`` exactly, or None (exact rational arithmetic)."""
    ratio = Fraction(value) / Fraction(grid)
    return ratio.numerator if ratio.denominator == 1 else None
