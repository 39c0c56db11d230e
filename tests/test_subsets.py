"""paczero.privacy.subsets: balanced design, subset signs, private generator."""
from __future__ import annotations

import secrets

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paczero.privacy.subsets import balanced_design, private_generator, subset_signs


def assert_balanced(design: np.ndarray, n: int, m: int) -> None:
    assert design.shape == (m, n) and design.dtype == np.bool_
    assert np.all(design.sum(axis=0) == m // 2)  # every example in exactly M/2 subsets
    sizes = design.sum(axis=1)
    assert sizes.min() >= n // 2 and sizes.max() <= (n + 1) // 2  # sizes differ by <= 1


@pytest.mark.parametrize("n, m", [(1000, 128), (1000, 126), (7, 2), (2, 2), (3, 64), (999, 10)])
def test_balanced_design_exact_sums(n, m):
    assert_balanced(balanced_design(n, m, rng=0), n, m)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(2, 300), half=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_balanced_design_random_sizes(n, half, seed):
    assert_balanced(balanced_design(n, 2 * half, rng=seed), n, 2 * half)


def test_balanced_design_is_randomised_and_reproducible():
    a, b = balanced_design(200, 16, rng=1), balanced_design(200, 16, rng=2)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, balanced_design(200, 16, rng=1))
    assert not np.array_equal(balanced_design(200, 16), balanced_design(200, 16))  # OS entropy
    # not a cyclic pattern: rows are not shifts of one another
    rows = {tuple(np.roll(a[0], k)) for k in range(200)}
    assert sum(tuple(r) in rows for r in a[1:]) == 0


@pytest.mark.parametrize("n, m", [(1, 2), (10, 3), (10, 0), (10, 1), (10.0, 2), (10, True)])
def test_balanced_design_rejects_bad_sizes(n, m):
    with pytest.raises(ValueError):
        balanced_design(n, m, rng=0)


def test_subset_signs_means_and_zero_convention():
    design = np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 1], [0, 1, 1, 0]], dtype=bool)
    g = np.array([0.0, 0.0, 2.0, -3.0])
    np.testing.assert_array_equal(subset_signs(g, design), [1, -1, -1, 1])  # mean 0 -> +1
    s = subset_signs(np.stack([g, -g]), design)
    assert s.shape == (2, 4) and s.dtype == np.int8
    np.testing.assert_array_equal(s[1], [1, 1, 1, -1])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), k=st.integers(1, 3))
def test_subset_signs_match_direct_means(seed, k):
    rng = np.random.default_rng(seed)
    design = balanced_design(30, 6, rng=rng)
    g = rng.normal(size=(k, 30))
    direct = np.array([[1 if g[i, d].mean() >= 0 else -1 for d in design] for i in range(k)])
    np.testing.assert_array_equal(subset_signs(g, design), direct)


def test_subset_signs_rejects_bad_input():
    design = balanced_design(6, 2, rng=0)
    with pytest.raises(ValueError, match="examples"):
        subset_signs(np.zeros(5), design)
    with pytest.raises(ValueError, match="finite"):
        subset_signs(np.array([np.nan, 0, 0, 0, 0, 0]), design)
    with pytest.raises(ValueError, match="shape"):
        subset_signs(np.zeros((1, 1, 6)), design)
    with pytest.raises(ValueError, match="empty"):
        subset_signs(np.zeros(6), np.zeros((2, 6), dtype=bool))
    with pytest.raises(ValueError, match="2-D"):
        subset_signs(np.zeros(6), np.ones(6, dtype=bool))


def test_private_generator_defaults_to_os_entropy(monkeypatch):
    """Red if the default generator is keyed from anything but the OS CSPRNG (secrets.token_bytes)."""
    calls = []
    real = secrets.token_bytes

    def spy(k):
        calls.append(k)
        return real(k)

    monkeypatch.setattr(secrets, "token_bytes", spy)
    a, b = private_generator(), private_generator()
    assert calls == [32, 32]
    assert a.integers(2**62) != b.integers(2**62)


def test_private_generator_seeding():
    assert private_generator(5).random() == private_generator(5).random()
    g = np.random.default_rng(0)
    assert private_generator(g) is g
    for bad in (-1, 1.5, "7", True):
        with pytest.raises(ValueError, match="seed"):
            private_generator(bad)
