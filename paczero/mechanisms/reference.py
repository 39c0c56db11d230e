"""Non-private reference releases: MeZO and the mechanism-ablation surrogates.

Appendix "Mechanism decomposition" (Table ablation) replaces the PAC release
with deterministic surrogates to locate where the utility comes from:

* ``raw_full``   -- mean of the clipped scalars over the whole universe (MeZO at full batch)
* ``quant_full`` -- sign of that mean
* ``raw_half``   -- mean over the secret subset ``S_{j*}`` only
* ``quant_half`` -- sign of the secret-subset mean
* ``random_sign``-- a fair coin every step (the negative control)
* ``mezo``       -- plain MeZO: mean over a fresh mini-batch (or the universe)
* ``adamw``      -- non-private first-order fine-tuning: AdamW on the mean loss of a fresh mini-batch
  (the ceiling of a table; its step is :mod:`paczero.fo.adamw_step`)

None of them carries any privacy guarantee; their ``privacy_statement`` says
``"private": False``. They take the per-sample scalars (``step``) rather than
subset signs. Each owns a generator (the secret index, coins, mini-batches),
seeded like the private one so that runs are reproducible with ``seed=``.
"""
from __future__ import annotations

from abc import abstractmethod

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..privacy.secure_random import generator_from_state, generator_state
from ..privacy.subsets import SeedLike, check_design, private_generator
from .base import Mechanism, Release

__all__ = ["RawFull", "QuantFull", "RawHalf", "QuantHalf", "RandomSign", "MeZO", "NonPrivateAdamW"]


def _sign(x: float) -> int:
    return 1 if x >= 0.0 else -1  # sgn(0) = +1 (Appendix B)


class _Reference(Mechanism):
    """Common plumbing: argument checks, step counter, generator, state, statement."""

    name = "reference"
    needs_design = False

    def __init__(
        self,
        num_subsets: int | None = None,
        *,
        design: ArrayLike | None = None,
        secret: int | None = None,
        seed: SeedLike = None,
    ) -> None:
        self.design = None if design is None else check_design(design, num_subsets)
        if self.needs_design and self.design is None:
            raise ValueError(f"{self.name} needs the [M, N] design (pass design=...)")
        self.num_subsets = None if self.design is None else int(self.design.shape[0])
        if num_subsets is not None and self.num_subsets is None:
            self.num_subsets = int(num_subsets)
        self._rng = private_generator(seed)
        self._secret: int | None = None
        if self.needs_design:
            m = self.num_subsets
            if secret is None:
                self._secret = int(self._rng.integers(m))
            elif isinstance(secret, (int, np.integer)) and not isinstance(secret, bool) \
                    and 0 <= secret < m:
                self._secret = int(secret)
            else:
                raise ValueError(f"secret must be an int in [0, num_subsets={m})")
        self._steps = 0

    # engine interface ----------------------------------------------------------
    def _scalars(self, scalars: np.ndarray) -> np.ndarray:
        g = np.asarray(scalars, dtype=np.float64)
        if g.ndim != 2 or g.shape[0] == 0 or g.shape[1] == 0:
            raise ValueError(f"scalars must have shape [K, B] with K, B >= 1; got {g.shape}")
        if not np.all(np.isfinite(g)):
            raise ValueError("scalars must be finite (found NaN or inf)")
        if self.needs_design and g.shape[1] != self.design.shape[1]:
            raise ValueError(f"scalars cover {g.shape[1]} examples but the design has "
                             f"N={self.design.shape[1]} columns")
        return g

    @abstractmethod
    def _one(self, g: np.ndarray) -> Release:
        """The release of one direction from its per-sample scalars."""

    def step(self, scalars: np.ndarray) -> list[Release]:
        g = self._scalars(scalars)
        out = [self._one(row) for row in g]
        self._steps += 1
        return out

    @property
    def mi_spent(self) -> float:
        return 0.0

    @property
    def steps(self) -> int:
        return self._steps

    # state --------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {"mechanism": self.name}

    def state_dict(self) -> dict[str, Any]:
        state = dict(self._config())
        state.update(steps=self._steps, secret=self._secret,
                     rng_state=generator_state(self._rng),
                     design=None if self.design is None else self.design.copy())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in self._config().items():
            if key not in state:
                raise ValueError(f"state is missing field {key!r}")
            if state[key] != value:
                raise ValueError(f"field {key!r} mismatch: state has {state[key]!r}, "
                                 f"this mechanism has {value!r}")
        design = state.get("design")
        if self.design is not None and design is not None and (
            self.design.shape != np.shape(design) or not np.array_equal(self.design, design)
        ):
            raise ValueError("field 'design' mismatch: the state was saved with another design")
        if design is not None:
            self.design = check_design(design)
        self._rng = generator_from_state(state["rng_state"])
        self._secret = state["secret"]
        self._steps = int(state["steps"])

    def privacy_statement(self) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "private": False,
            "mi_total_budget": None,
            "mi_bound": None,
            "mia_bound": None,
            "mi_spent": None,
            "matched_dp_epsilon": None,
            "steps": self._steps,
            "free_steps": 0,
            "unanimity_rate": None,
            "note": "non-private reference: no privacy guarantee",
        }


class RawFull(_Reference):
    """``raw_full``: coef = mean of the scalars over the universe (MeZO at full batch)."""

    name = "raw_full"

    def _one(self, g: np.ndarray) -> Release:
        return Release(bit=0, branch="direct", coef=float(g.mean()))


class QuantFull(_Reference):
    """``quant_full``: coef = sign of the full-universe mean."""

    name = "quant_full"

    def _one(self, g: np.ndarray) -> Release:
        b = _sign(float(g.mean()))
        return Release(bit=b, branch="direct", coef=float(b))


class RawHalf(_Reference):
    """``raw_half``: coef = mean over the secret subset ``S_{j*}`` (needs ``design``)."""

    name = "raw_half"
    needs_design = True

    def _one(self, g: np.ndarray) -> Release:
        return Release(bit=0, branch="direct", coef=float(g[self.design[self._secret]].mean()))


class QuantHalf(_Reference):
    """``quant_half``: coef = sign of the secret-subset mean (needs ``design``)."""

    name = "quant_half"
    needs_design = True

    def _one(self, g: np.ndarray) -> Release:
        b = _sign(float(g[self.design[self._secret]].mean()))
        return Release(bit=b, branch="direct", coef=float(b))


class RandomSign(_Reference):
    """``random_sign``: a fair coin every step, ignoring the data (negative control)."""

    name = "random_sign"

    def _one(self, g: np.ndarray) -> Release:
        b = 1 if self._rng.random() < 0.5 else -1
        return Release(bit=b, branch="direct", coef=float(b))


class MeZO(_Reference):
    """Plain MeZO: coef = mean of the clipped scalars of a fresh mini-batch.

    ``batch_size=None`` scores the whole universe every step; otherwise
    :meth:`batch_indices` draws ``batch_size`` distinct examples per step from
    this mechanism's (non-private, seedable) generator.
    """

    name = "mezo"

    def __init__(self, batch_size: int | None = None, *, design: ArrayLike | None = None,
                 seed: SeedLike = None, num_subsets: int | None = None) -> None:
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(f"batch_size must be None or an int >= 1; got {batch_size!r}")
        self.batch_size = None if batch_size is None else int(batch_size)
        super().__init__(num_subsets, design=design, seed=seed)
        if not isinstance(seed, np.random.Generator):  # non-private: the batches come from numpy's seeded generator
            self._rng = np.random.default_rng(seed)

    def batch_indices(self, n_examples: int) -> np.ndarray | None:
        if self.batch_size is None:
            return None
        if self.batch_size > n_examples:
            raise ValueError(f"batch_size={self.batch_size} exceeds the universe size {n_examples}")
        return np.sort(self._rng.choice(n_examples, size=self.batch_size, replace=False))

    def _config(self) -> dict[str, Any]:
        return {"mechanism": self.name, "batch_size": self.batch_size}

    def _one(self, g: np.ndarray) -> Release:
        return Release(bit=0, branch="direct", coef=float(g.mean()))


class NonPrivateAdamW(MeZO):
    """``adamw``: plain first-order fine-tuning, the non-private ceiling of a table. Each step the engine
    (:func:`paczero.fo.adamw_step.adamw_step`) takes one AdamW step on the mean loss of the mini-batch that
    :meth:`batch_indices` draws (``batch_size`` distinct examples from a seeded, public generator; ``None``:
    the whole universe). No clipping, no noise, no privacy claim."""

    name = "adamw"

    def step(self, scalars: np.ndarray) -> list[Release]:
        raise TypeError("adamw takes a gradient step, not per-direction scalars: train it with "
                        "paczero.fo.adamw_step (release() records the step)")

    def release(self) -> Release:
        """The step's public record (nothing is released but the weights); ends the step."""
        self._steps += 1
        return Release(bit=0, branch="direct", coef=None)

    def privacy_statement(self) -> dict[str, Any]:
        statement = super().privacy_statement()
        statement["note"] = ("non-private reference: first-order AdamW fine-tuning on the data, no clipping and no "
                             "noise; no privacy guarantee")
        return statement
