"""The per-step release interface shared by every mechanism.

A mechanism is a small stateful object (in the manner of an Opacus accountant):
the training engine computes the clipped per-sample two-point scalars of a step
and hands them to :meth:`Mechanism.step`; the mechanism answers with one
:class:`Release` per direction. Everything the mechanism needs to continue a
run bit-for-bit lives in :meth:`Mechanism.state_dict`, which contains secrets
(the secret index, the private generator state) and is therefore written only
to owner-only checkpoint files, never to logs.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Every value ``Release.branch`` can take.
#: unanimous -- PAC: all candidates in the posterior support agree, release s_{j*} (MI 0)
#: noised    -- PAC-MI: Gaussian-noised release on disagreement (MI beta_t)
#: coin      -- PAC-ZPL / hybrid tail: fair coin from the private generator on disagreement (MI 0)
#: direct    -- non-private references (MeZO, raw_full, ...): no privacy claim
#: dp        -- DP baselines (DPZero, DP-AggZO): accounted in (epsilon, delta), not MI
BRANCHES = ("unanimous", "noised", "coin", "direct", "dp")


@dataclass(frozen=True)
class Release:
    """One released quantity of one step (one direction).

    ``bit`` is the released sign in {-1, +1} for the PAC mechanisms (0 where a
    mechanism releases a real number instead). ``coef`` is the coefficient the
    engine multiplies the direction by in the update
    ``theta <- theta - lr * coef * z``; it equals ``bit`` for PAC mechanisms.
    ``y_tilde`` is the real-valued noised release of the PAC-MI branch (public:
    the transcript adversary sees it), an exact multiple of the public ``grid``
    (0 where nothing is drawn on a grid). ``mi`` is the mutual information charged
    for this release in nats; ``beta`` the budget targeted; ``q_plus`` the
    posterior-weighted agreement probability (NaN where it has no meaning);
    ``agreement`` the unweighted fraction of candidate subsets whose sign is +1.
    """

    bit: int
    branch: str
    coef: float
    sigma: float = 0.0
    y_tilde: float | None = None
    grid: float = 0.0
    mi: float = 0.0
    beta: float = 0.0
    q_plus: float = math.nan
    agreement: float = math.nan

    def public_dict(self) -> dict[str, Any]:
        """The fields that may be logged (everything in a Release is public)."""
        return {
            "bit": self.bit,
            "branch": self.branch,
            "coef": self.coef,
            "sigma": self.sigma,
            "y_tilde": self.y_tilde,
            "grid": self.grid,
            "mi": self.mi,
            "beta": self.beta,
            "q_plus": self.q_plus,
            "agreement": self.agreement,
        }


class Mechanism(ABC):
    """Engine-facing interface.

    Per step the engine calls ``batch_indices(n)`` (which examples of the
    universe it must score: ``None`` means all of them), computes the clipped
    per-sample scalars of those examples for each of the K directions, and
    calls ``step(scalars)`` with a float64 array of shape [K, B]. The result is
    a list of K releases.
    """

    #: short name used in configs, logs and checkpoints
    name: str = "mechanism"

    def batch_indices(self, n_examples: int) -> np.ndarray | None:
        """Indices of the examples whose scalars this step needs (None: the whole universe)."""
        return None

    @abstractmethod
    def step(self, scalars: np.ndarray) -> list[Release]:
        """Consume the [K, B] per-sample scalars of one step; return K releases."""

    @property
    @abstractmethod
    def mi_spent(self) -> float:
        """Total mutual information charged so far, in nats (0 for non-PAC mechanisms)."""

    @property
    @abstractmethod
    def steps(self) -> int:
        """Number of steps taken."""

    @property
    def free_steps(self) -> int:
        """Number of steps on which no privacy cost was charged (unanimity or coin)."""
        return 0

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit (contains secrets)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; raise ValueError on a mismatched mechanism."""

    @abstractmethod
    def privacy_statement(self) -> dict[str, Any]:
        """The public privacy guarantee so far, as a JSON-serialisable dict."""
