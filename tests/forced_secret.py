"""A secret generator that keeps a run's own secret stream (its design) but returns a chosen j*: the tests that
compare runs differing only in j* (tests/test_side_channels.py, tests/test_coin_step.py) install it with
``monkeypatch.setattr(paczero.privacy.subsets, "secret_generator", forced(j))``."""
from paczero.privacy.secure_random import SecureGenerator


class ForcedSecret(SecureGenerator):
    """The run's own secret stream (the design comes from it unchanged), but j* = ``secret``."""

    def __init__(self, seed: int, secret: int):
        super().__init__(SecureGenerator.from_seed(seed, purpose="secret")._key)
        self.secret = secret

    def integers(self, low, high=None, size=None):
        return self.secret


def forced(secret: int):
    """The replacement of ``paczero.privacy.subsets.secret_generator`` that gives j* = ``secret``."""
    return lambda seed: ForcedSecret(seed, secret)
