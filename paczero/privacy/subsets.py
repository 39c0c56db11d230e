"""Candidate subsets of the PAC instantiation, per-subset signs, private randomness.

Section 2 ("Instantiation and MIA guarantees"): from a universe of N training
examples we build M subsets such that every example lies in exactly M/2 of
them; the secret training set is ``S_{j*}`` with ``j* ~ Unif[M]``, which makes
the prior success of membership inference exactly 1/2. Algorithm 1, line 6,
turns the per-sample scalars into one sign per subset.

Everything that must stay secret (j*, the design, the PAC-MI noise, the ZPL
coins) is drawn from :func:`private_generator`, a cryptographically secure
stream keyed from the operating system's CSPRNG by default
(:mod:`paczero.privacy.secure_random`) and kept apart from the public generator that
draws the perturbation directions.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from .secure_random import SecureGenerator

__all__ = ["private_generator", "secret_generator", "balanced_design", "subset_signs"]

SeedLike = int | np.random.Generator | SecureGenerator | None


def private_generator(seed: SeedLike = None) -> "SecureGenerator | np.random.Generator":
    """The generator for private randomness: a :class:`paczero.privacy.secure_random.SecureGenerator`.

    ``seed=None`` (the default) keys the stream with 256 bits from the OS's
    CSPRNG: never a fixed or public seed. An ``int`` gives a reproducible
    stream for tests and exact reproduction (the secret is then not secret); an
    existing generator (secure, or a numpy ``Generator`` in tests) is returned
    unchanged.

    Raises:
        ValueError: a negative or non-integer seed.
    """
    if seed is None:
        return SecureGenerator()
    if isinstance(seed, (np.random.Generator, SecureGenerator)):
        return seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be None, a non-negative int or a generator; got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative; got {seed!r}")
    return SecureGenerator.from_seed(int(seed))


def secret_generator(seed: int | None = None) -> SecureGenerator:
    """The generator of a run's secret draws (the index j* and the candidate design), on a key of its own.

    ``None`` draws its own 256-bit key from the OS's CSPRNG, independent of the key of
    :func:`private_generator` (coins, noise, Poisson masks): what a run publishes is then a function of
    a key that j* does not depend on, and PAC-ZPL's I = 0 needs no assumption about SHAKE-256. An
    ``int`` derives a key apart from the private stream's (tests and exact reproduction only).
    """
    if seed is None:
        return SecureGenerator()
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be None or a non-negative int; got {seed!r}")
    return SecureGenerator.from_seed(int(seed), purpose="secret")


def balanced_design(n_examples: int, n_subsets: int, rng: SeedLike = None) -> np.ndarray:
    """A random balanced membership matrix ``[M, N]`` (``design[m, i]``: example i is in S_m).

    Every example belongs to exactly ``M/2`` subsets (so the MIA prior is 1/2,
    Section 2) and subset sizes differ by at most one (``floor(N/2)`` or
    ``ceil(N/2)``). Built column by column in random order: each example joins
    the ``M/2`` subsets with the largest remaining deficit, ties broken at
    random (a randomised Gale-Ryser construction, always feasible because
    deficits never differ by more than one).

    Args:
        n_examples: N >= 2.
        n_subsets: M, even and >= 2.
        rng: seed or generator; default: a fresh :func:`private_generator`.

    Raises:
        ValueError: N < 2, M odd or < 2, non-integer sizes.
    """
    for name, v in (("n_examples", n_examples), ("n_subsets", n_subsets)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an int; got {v!r}")
    n, m = int(n_examples), int(n_subsets)
    if n < 2:
        raise ValueError(f"n_examples must be >= 2; got {n_examples!r}")
    if m < 2 or m % 2:
        raise ValueError(f"n_subsets must be even and >= 2; got {n_subsets!r}")
    gen = private_generator(rng)
    half = m // 2
    # target sizes: N/2 each, or (N-1)/2 for a random half of the subsets and (N+1)/2 for the rest
    deficit = np.full(m, n // 2, dtype=np.int64)
    if n % 2:
        deficit[gen.permutation(m)[:half]] += 1
    design = np.zeros((m, n), dtype=bool)
    for col in gen.permutation(n):
        key = deficit + gen.random(m)  # integer part: deficit; fraction: random tie-break
        chosen = np.argpartition(-key, half - 1)[:half]
        design[chosen, col] = True
        deficit[chosen] -= 1
    if np.any(deficit != 0):  # cannot happen (see docstring); guard against silent imbalance
        raise RuntimeError("balanced_design failed to meet its row targets")
    return design


def check_design(design: ArrayLike, n_subsets: int | None = None) -> np.ndarray:
    """Validate a membership matrix: boolean ``[M, N]``, no empty subset; returns it as bool."""
    d = np.asarray(design)
    if d.ndim != 2:
        raise ValueError(f"design must be a 2-D [M, N] boolean array; got shape {d.shape}")
    if d.dtype != np.bool_:
        if not np.all((d == 0) | (d == 1)):
            raise ValueError("design must be boolean (0/1 entries)")
        d = d.astype(bool)
    if n_subsets is not None and d.shape[0] != n_subsets:
        raise ValueError(f"design has {d.shape[0]} subsets (rows) but num_subsets={n_subsets}")
    if np.any(~d.any(axis=1)):
        raise ValueError("design has an empty subset (a row with no member)")
    return d


def subset_signs(scalars: ArrayLike, design: ArrayLike) -> np.ndarray:
    """Signs of the per-subset means of the per-sample scalars (Algorithm 1, line 6).

    ``s_m = sgn(mean_{i in S_m} g_i)`` with the convention ``sgn(0) = +1``
    (Appendix B, "Sign convention at zero").

    Args:
        scalars: ``[N]`` or ``[K, N]`` per-sample scalars (finite).
        design: ``[M, N]`` boolean membership matrix.

    Returns:
        int8 array ``[M]`` or ``[K, M]`` with entries in {-1, +1}.

    Raises:
        ValueError: mismatched N, non-finite scalars, malformed design.
    """
    d = check_design(design)
    g = np.asarray(scalars, dtype=np.float64)
    if g.ndim not in (1, 2):
        raise ValueError(f"scalars must have shape [N] or [K, N]; got {g.shape}")
    if g.shape[-1] != d.shape[1]:
        raise ValueError(
            f"scalars cover {g.shape[-1]} examples but the design has N={d.shape[1]} columns"
        )
    if not np.all(np.isfinite(g)):
        raise ValueError("scalars must be finite (found NaN or inf)")
    sizes = d.sum(axis=1)
    means = (g @ d.T.astype(np.float64)) / sizes
    return np.where(means >= 0.0, 1, -1).astype(np.int8)
