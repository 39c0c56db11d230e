"""Private randomness from a cryptographically secure stream.

Every secret draw of a run (the secret index j*, the candidate design, the
PAC-MI noise, the PAC-ZPL coins, the DP baselines' Poisson masks and noise)
comes from a :class:`SecureGenerator`: SHAKE-256 (FIPS 202, Python's
:mod:`hashlib`) used as a keyed stream in counter mode,

    block_c = SHAKE256("paczero-private-v1" || key || c),   c = 0, 1, 2, ...

with a 256-bit key from the operating system's CSPRNG (:func:`secrets.token_bytes`).
A noised release publishes ``y~ = s_{j*} + gamma * X`` (an exact discrete Gaussian
integer ``X`` on a public grid ``gamma``); with a non-cryptographic generator (PCG64, Mersenne Twister) enough published
draws can give the generator's state away, and with it every other draw and
the secret. Knowing any number of blocks of this stream gives nothing about
the others short of breaking SHAKE-256.

The state is ``(key, counter)``: small, JSON-able, and exactly resumable (it
is written only to owner-only files). A fixed integer seed derives the key
from the seed; that is for tests and exact reproduction only, and a run made
with it says so in its privacy statement.

The methods mirror the part of :class:`numpy.random.Generator` that paczero
uses (``random``, ``integers``, ``permutation``), drawn as follows: uniforms on
the 2^-53 grid of [0, 1); integers by rejection (unbiased); and ``randbelow``, a
uniform Python integer below any bound, the source of the exact discrete
Gaussian and Laplace samplers (:mod:`paczero.privacy.exact_noise`) that make every
published noisy value. ``standard_normal``, ``normal`` and ``laplace`` are float
samplers (normals by the inverse CDF of a uniform on (0, 1/2) with 63 bits and a
random sign; Laplace by a random sign times an exponential): nothing published
is drawn with them, since the last bits of their outputs tell which mean
produced them (tests/test_float_attack.py).
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

import numpy as np
from scipy.special import ndtri

__all__ = ["SecureGenerator", "generator_state", "generator_from_state"]

_DOMAIN = b"paczero-private-v1\x00"
_KIND = "shake256-ctr"


class SecureGenerator:
    """A keyed SHAKE-256 stream with a numpy-like sampling interface (see the module docstring).

    Args:
        key: 32 bytes (default: fresh OS entropy).
        counter: the index of the next block (for restoring a state).
    """

    def __init__(self, key: bytes | None = None, counter: int = 0) -> None:
        if key is None:
            key = secrets.token_bytes(32)
        if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
            raise ValueError("key must be 32 bytes")
        if isinstance(counter, bool) or not isinstance(counter, (int, np.integer)) or counter < 0:
            raise ValueError(f"counter must be a non-negative int; got {counter!r}")
        self._key = bytes(key)
        self._counter = int(counter)

    @classmethod
    def from_seed(cls, seed: int, purpose: str = "private") -> "SecureGenerator":
        """A reproducible stream keyed from an integer (tests and exact reproduction only). ``purpose``
        separates the streams one seed keys: ``"private"`` (coins, noise, masks) and ``"secret"`` (j* and
        the candidate design) give unrelated keys."""
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int; got {seed!r}")
        if purpose not in ("private", "secret"):
            raise ValueError(f"purpose must be 'private' or 'secret'; got {purpose!r}")
        key = hashlib.sha256(f"paczero-{purpose}-seed".encode() + b"\x00" + str(int(seed)).encode()).digest()
        return cls(key)

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> dict[str, Any]:
        """``{"bit_generator": "shake256-ctr", "key": hex, "counter": int}`` (secret)."""
        return {"bit_generator": _KIND, "key": self._key.hex(), "counter": self._counter}

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        if not isinstance(value, dict) or value.get("bit_generator") != _KIND:
            raise ValueError(f"not a {_KIND} generator state")
        try:
            key = bytes.fromhex(value["key"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("generator state: malformed key") from None
        self.__init__(key, value.get("counter", -1))

    # ------------------------------------------------------------------ bits
    def _words(self, n: int) -> np.ndarray:
        """``n`` uniform 64-bit words from the next block of the stream."""
        block = hashlib.shake_256(_DOMAIN + self._key + self._counter.to_bytes(16, "little")).digest(8 * n)
        self._counter += 1
        return np.frombuffer(block, dtype="<u8").astype(np.uint64)

    def randbelow(self, n: int) -> int:
        """A uniform Python integer in ``[0, n)``, any ``n >= 1`` (rejection on whole bits: unbiased).

        The exact samplers of :mod:`paczero.privacy.exact_noise` draw every uniform they need from here.
        """
        n = int(n)
        if n < 1:
            raise ValueError(f"randbelow needs n >= 1; got {n}")
        bits = (n - 1).bit_length()
        nbytes = max((bits + 7) // 8, 1)
        while True:
            block = hashlib.shake_256(_DOMAIN + self._key + self._counter.to_bytes(16, "little")).digest(nbytes)
            self._counter += 1
            x = int.from_bytes(block, "little") >> (8 * nbytes - bits)
            if x < n:
                return x

    @staticmethod
    def _count(size) -> tuple[int, tuple[int, ...] | None]:
        if size is None:
            return 1, None
        shape = (int(size),) if np.isscalar(size) else tuple(int(s) for s in size)
        return int(np.prod(shape, dtype=np.int64)), shape

    @staticmethod
    def _shape(values: np.ndarray, shape):
        return float(values[0]) if shape is None else values.reshape(shape)

    # --------------------------------------------------------- distributions
    def random(self, size=None):
        """Uniform on [0, 1), multiples of 2^-53."""
        n, shape = self._count(size)
        u = (self._words(n) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        return self._shape(u, shape)

    def integers(self, low, high=None, size=None):
        """Uniform integers in ``[low, high)`` (``[0, low)`` when ``high`` is None), unbiased."""
        if high is None:
            low, high = 0, low
        low, high = int(low), int(high)
        span = high - low
        if span < 1 or span > 2 ** 63:
            raise ValueError(f"integers: need low < high with a span of at most 2^63; got [{low}, {high})")
        n, shape = self._count(size)
        limit = (2 ** 64 // span) * span  # accept words below the largest multiple of span: no modulo bias
        out = np.empty(0, dtype=np.uint64)
        while out.size < n:
            w = self._words(max(n - out.size, 1) + 2)
            out = np.concatenate([out, w[w < np.uint64(limit)] if limit < 2 ** 64 else w])
        values = (out[:n] % np.uint64(span)).astype(np.int64) + low
        return int(values[0]) if shape is None else values.reshape(shape)

    def standard_normal(self, size=None):
        """Standard normal: a random sign times ``-ndtri(u)``, ``u`` uniform on (0, 1/2)."""
        n, shape = self._count(size)
        w = self._words(n)
        u = ((w >> np.uint64(1)).astype(np.float64) + 0.5) * 2.0 ** -64
        sign = np.where((w & np.uint64(1)) == 1, 1.0, -1.0)
        return self._shape(sign * -ndtri(u), shape)

    def normal(self, loc=0.0, scale=1.0, size=None):
        z = self.standard_normal(size)
        return loc + scale * z

    def laplace(self, loc=0.0, scale=1.0, size=None):
        """Laplace: a random sign times an exponential of mean ``scale``."""
        n, shape = self._count(size)
        w = self._words(n)
        e = -np.log(((w >> np.uint64(1)).astype(np.float64) + 0.5) * 2.0 ** -63)
        sign = np.where((w & np.uint64(1)) == 1, 1.0, -1.0)
        return self._shape(loc + scale * sign * e, shape)

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of ``range(n)`` (sorting distinct random 64-bit keys)."""
        n = int(n)
        while True:
            keys = self._words(max(n, 1))[:n]
            if np.unique(keys).size == n:  # a tie (probability < n^2 / 2^65) would bias the order: redraw
                return np.argsort(keys, kind="stable").astype(np.int64)


def generator_state(rng) -> dict[str, Any]:
    """The restorable state of a private generator (a :class:`SecureGenerator` or a numpy Generator)."""
    if isinstance(rng, SecureGenerator):
        return rng.state
    return rng.bit_generator.state


def generator_from_state(state: dict[str, Any]):
    """The generator :func:`generator_state` describes. Raises ValueError on an unknown kind."""
    if not isinstance(state, dict) or "bit_generator" not in state:
        raise ValueError("generator state is malformed")
    if state["bit_generator"] == _KIND:
        gen = SecureGenerator()
        gen.state = state
        return gen
    try:
        bitgen = getattr(np.random, state["bit_generator"])()
        bitgen.state = state
    except (AttributeError, TypeError, ValueError, KeyError):
        raise ValueError(f"unknown generator state {state.get('bit_generator')!r}") from None
    return np.random.Generator(bitgen)
