"""The private generator is a cryptographic stream (SHAKE-256 in counter mode) with exact, resumable state.

Checked against hashlib computed here, not against the module's own helpers, and against the
distributions' closed forms."""
import hashlib

import numpy as np
import pytest
from scipy import stats

from paczero.privacy.secure_random import SecureGenerator, generator_from_state, generator_state
from paczero.privacy.subsets import private_generator


def _block(key: bytes, counter: int, nbytes: int) -> bytes:
    return hashlib.shake_256(b"paczero-private-v1\x00" + key + counter.to_bytes(16, "little")).digest(nbytes)


def test_private_draws_are_the_shake256_stream():
    """Red if the private generator is not SHAKE-256 keyed with its secret key (e.g. PCG64, whose
    state published full-precision noise can give away): the uniforms are recomputed from hashlib."""
    gen = private_generator()
    key = bytes.fromhex(gen.state["key"])
    assert len(key) == 32
    u = gen.random(5)
    words = np.frombuffer(_block(key, 0, 40), dtype="<u8")
    assert np.array_equal(u, (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53)
    x = gen.random()
    assert x == float(np.frombuffer(_block(key, 1, 8), dtype="<u8")[0] >> np.uint64(11)) * 2.0 ** -53


def test_seeded_stream_is_reproducible_and_state_round_trips():
    """Red if a restored state does not continue the very same stream (resume would change the secret draws)."""
    a = private_generator(7)
    a.random(3)
    state = generator_state(a)
    b = generator_from_state(state)
    assert [a.standard_normal(), a.integers(10), a.laplace()] == [b.standard_normal(), b.integers(10), b.laplace()]
    assert private_generator(7).random() == private_generator(7).random()
    assert private_generator(7).random() != private_generator(8).random()
    with pytest.raises(ValueError):
        generator_from_state({"bit_generator": "shake256-ctr", "key": "zz", "counter": 0})
    with pytest.raises(ValueError):
        generator_from_state({"bit_generator": "NoSuchGenerator"})


@pytest.mark.parametrize("draw,dist", [
    (lambda g: g.standard_normal(40000), stats.norm()),
    (lambda g: g.normal(1.0, 3.0, size=40000), stats.norm(1.0, 3.0)),
    (lambda g: g.laplace(0.0, 2.0, size=40000), stats.laplace(0.0, 2.0)),
    (lambda g: g.random(40000), stats.uniform()),
])
def test_distributions(draw, dist):
    """Red if a sampler is off (e.g. a normal built from a uniform on (0, 1) with the sign bit reused)."""
    x = draw(SecureGenerator.from_seed(1))
    assert stats.kstest(x, dist.cdf).pvalue > 1e-4


def test_integers_and_permutations_are_uniform():
    """Red on modulo bias or a biased shuffle: chi-square against the uniform law."""
    g = SecureGenerator.from_seed(2)
    counts = np.bincount(g.integers(3, size=30000), minlength=3)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert set(np.unique(g.integers(5, 9, size=2000))) == {5, 6, 7, 8}
    firsts = np.bincount([g.permutation(4)[0] for _ in range(4000)], minlength=4)
    assert stats.chisquare(firsts).pvalue > 1e-4
    assert sorted(g.permutation(10)) == list(range(10))
