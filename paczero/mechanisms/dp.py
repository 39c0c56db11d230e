"""The DP zeroth-order baselines: DPZero (K=1), DP-AggZO (K directions) and DP-AggZO at K=1.

Both are ``(epsilon, delta)``-DP under add-or-remove-one adjacency, accounted
with Google's dp-accounting (:mod:`paczero.privacy.dp`). Per step:

1. ``batch_indices(N)`` draws a real Poisson sample: every example of the
   universe joins independently with probability exactly ``q`` (the float ``q`` the
   accountants analyse, as a rational: :func:`paczero.privacy.exact_noise.bernoulli_mask`; an empty batch is
   possible and is still a step: the engine must call ``step`` with a [K, 0]
   array, and the release is pure noise);
2. ``step(scalars)`` clips each example's contribution to norm ``C``, rounds it
   to integer units of ``C 2^-40`` (L2 norm still at most ``2^40`` units, checked
   in integers), sums, adds an exact discrete Gaussian of scale ``sigma 2^40``
   units and normalises (:mod:`paczero.privacy.exact_noise`: a float Gaussian's last bits
   would tell the sum it was added to). The accountants analyse the Gaussian
   mechanism; the discrete one adds ``discretization_delta`` (at most about 1e-21) to delta.

The Poisson sample, the discrete Gaussian noise and DP-AggZO's discrete-Laplace-noised
dataset size are all drawn from the *private* generator
(:func:`paczero.privacy.subsets.private_generator`), never from the public perturbation
seed: the public DPZero and DP-AggZO code draw the noise from the generator they
just seeded with the public direction seed, so anyone holding the transcript can
recompute the noise and subtract it.

Paper settings (Table dp-cliff, SST-2 OPT-1.3B FT; epsilon in
{0.2, 0.3, 0.5, 1, 2}, delta = 1e-5): see :data:`DPZERO_PAPER_DEFAULTS` and
:data:`DP_AGGZO_PAPER_DEFAULTS` (lr is the engine's, listed for completeness).
The table's DPZero numbers came from the DP-AggZO code at K = 1
(:class:`DPZeroAggZO1`, ``dpzero-aggzo1``); :class:`DPZero` is DPZero as its
own paper specifies it.
"""
from __future__ import annotations

from abc import abstractmethod

import math
from fractions import Fraction
from typing import Any

import numpy as np

from paczero.privacy.exact_noise import GRID_BITS, bernoulli_mask, discrete_gaussian, discrete_laplace
from paczero.mechanisms.base import Mechanism, Release
from paczero.privacy import dp as dp_privacy
from paczero.privacy.secure_random import generator_from_state, generator_state
from paczero.privacy.subsets import private_generator

#: DPZero K=1 as in Zhang et al. 2024 and the paper's Table dp-cliff
DPZERO_PAPER_DEFAULTS = {"steps": 20_000, "lr": 5e-6, "clip": 25.0, "sample_rate": 0.064, "delta": 1e-5}

#: DP-AggZO K=64 as in Bao et al. 2025 and the paper's Table dp-cliff
DP_AGGZO_PAPER_DEFAULTS = {
    "num_directions": 64,
    "steps": 1000,
    "lr": 5e-6,
    "clip": 25.0,
    "sample_rate": 0.064,
    "delta": 1e-5,
}

#: the epsilon grid of Table dp-cliff
PAPER_EPSILONS = (0.2, 0.3, 0.5, 1.0, 2.0)

_STATE_VERSION = 1


def _mia_bound(epsilon: float, delta: float) -> float:
    """MIA posterior success bound of an (epsilon, delta)-DP release: e^eps / (1 + e^eps) + delta."""
    try:
        from paczero.privacy import dp_mia_bound
    except ImportError:  # the shared conversion is not there yet
        return min(1.0, 1.0 / (1.0 + math.exp(-epsilon)) + delta)
    return float(dp_mia_bound(epsilon, delta))


def clip_scalars(scalars: np.ndarray, clip: float) -> np.ndarray:
    """DPZero clipping: each per-example scalar into [-clip, clip]."""
    return np.clip(scalars, -clip, clip)


def clip_rows(vectors: np.ndarray, clip: float) -> np.ndarray:
    """DP-AggZO clipping: each row (one example's K-vector) scaled to L2 norm <= clip."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    scale = np.ones_like(norms)
    np.divide(clip, norms, out=scale, where=norms > clip)
    return vectors * scale


#: one clipped contribution spans at most this many grid units (L2 norm), exactly
UNIT = 2 ** GRID_BITS


def grid_rows(clipped: np.ndarray, clip: float) -> list[list[int]]:
    """Clipped ``[B, K]`` rows as integer vectors in units of ``clip / 2^GRID_BITS``, each of L2 norm
    ``<= 2^GRID_BITS`` exactly (checked in integers; a row the rounding pushed over is scaled back
    toward zero), so the sum's L2 sensitivity is ``2^GRID_BITS`` units under add-or-remove-one."""
    units = np.rint(clipped * (UNIT / clip))
    out = []
    limit = UNIT * UNIT
    for row in units:
        ints = [int(v) for v in row]
        norm2 = sum(v * v for v in ints)
        if norm2 > limit:
            root = math.isqrt(norm2 - 1) + 1  # ceil(sqrt(norm2)) >= the norm
            ints = [(v * UNIT) // root if v >= 0 else -((-v * UNIT) // root) for v in ints]
        out.append(ints)
    return out


def noisy_grid_sum(rng, rows: list[list[int]], k: int, noise_multiplier: float) -> list[int]:
    """The K coordinate sums of integer rows plus exact discrete Gaussian noise of scale
    ``noise_multiplier * 2^GRID_BITS`` units (:func:`paczero.privacy.exact_noise.discrete_gaussian`)."""
    sums = [sum(row[i] for row in rows) for i in range(k)]
    scale = Fraction(noise_multiplier) * UNIT
    return [s + discrete_gaussian(rng, scale * scale) for s in sums]


class _PoissonGaussianMechanism(Mechanism):
    """Shared part: configuration, Poisson sampling, state and privacy statement."""

    def __init__(
        self,
        num_examples: int,
        epsilon: float,
        delta: float,
        steps: int,
        sample_rate: float,
        clip: float,
        num_directions: int,
        accountant: str,
        seed: int | np.random.Generator | None,
    ) -> None:
        if isinstance(num_examples, bool) or int(num_examples) != num_examples or num_examples < 1:
            raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
        if isinstance(num_directions, bool) or int(num_directions) != num_directions or num_directions < 1:
            raise ValueError(f"num_directions must be a positive integer, got {num_directions!r}")
        clip = dp_privacy.check_finite("clip", clip)
        if clip <= 0:
            raise ValueError(f"clip must be > 0, got {clip!r}")
        self.num_examples = int(num_examples)
        self.epsilon = dp_privacy.check_epsilon(epsilon)
        self.delta = dp_privacy.check_delta(delta)
        self.total_steps = dp_privacy.check_steps(steps)
        self.sample_rate = dp_privacy.check_sample_rate(sample_rate)
        self.clip = clip
        self.num_directions = int(num_directions)
        self.accountant = dp_privacy.check_accountant(accountant)
        self._rng = private_generator(seed)
        self._steps = 0
        self._pending: int | None = None  # size of the batch drawn and not yet consumed
        self.noise_multiplier = self._calibrate()

    # ---- hooks for the two baselines
    #: state keys a subclass adds to state_dict (checked present before anything is loaded)
    _extra_state_keys: tuple[str, ...] = ()

    @abstractmethod
    def _calibrate(self) -> float:
        """The Gaussian noise multiplier for the target (epsilon, delta)."""

    @abstractmethod
    def _denominator(self) -> float:
        """What the noisy sum is divided by (the expected batch size)."""

    @abstractmethod
    def _epsilon(self, steps: int, accountant: str) -> float:
        """Epsilon after ``steps`` steps under ``accountant``."""

    def _load_extra_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Validate the subclass's ``_extra_state_keys``; return the attributes to set."""
        return {}

    # ---- Mechanism interface
    def batch_indices(self, n_examples: int) -> np.ndarray:
        """A Poisson sample of the universe at rate q, from the private generator."""
        if n_examples != self.num_examples:
            raise ValueError(
                f"{self.name} was calibrated for num_examples={self.num_examples}, got {n_examples!r}"
            )
        if self._pending is not None:
            raise RuntimeError(f"{self.name}: batch_indices called twice without a step in between")
        if self._steps >= self.total_steps:
            raise RuntimeError(
                f"{self.name}: all {self.total_steps} calibrated steps are spent; more would exceed epsilon"
            )
        mask = bernoulli_mask(self._rng, Fraction(self.sample_rate), self.num_examples)  # exactly q, no rounding
        indices = np.flatnonzero(mask).astype(np.int64)
        self._pending = int(indices.size)
        return indices

    def _check_scalars(self, scalars: np.ndarray) -> np.ndarray:
        if self._pending is None:
            raise RuntimeError(f"{self.name}: step called without batch_indices")
        scalars = np.asarray(scalars, dtype=np.float64)
        expected = (self.num_directions, self._pending)
        if scalars.shape != expected:
            raise ValueError(f"{self.name}: scalars must have shape [K, B], K = {self.num_directions} directions "
                             "by the B examples of the batch drawn (B is private: neither it nor the shape given "
                             "is shown)")
        if not np.all(np.isfinite(scalars)):
            raise ValueError(f"{self.name}: scalars contain NaN or inf")
        return scalars

    def _finish_step(self) -> None:
        self._pending = None
        self._steps += 1

    @property
    def mi_spent(self) -> float:
        return 0.0

    @property
    def steps(self) -> int:
        return self._steps

    def _config(self) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "num_examples": self.num_examples,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "total_steps": self.total_steps,
            "sample_rate": self.sample_rate,
            "clip": self.clip,
            "num_directions": self.num_directions,
            "accountant": self.accountant,
        }

    def state_dict(self) -> dict[str, Any]:
        """Configuration, progress and the private generator state (secret: owner-only files)."""
        return {
            "version": _STATE_VERSION,
            **self._config(),
            "noise_multiplier": self.noise_multiplier,
            "steps_taken": self._steps,
            "pending_batch_size": self._pending,
            "generator_state": generator_state(self._rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"{self.name}: state must be a dict, got {type(state).__name__}")
        if state.get("mechanism") != self.name:
            raise ValueError(f"state is for mechanism {state.get('mechanism')!r}, not {self.name!r}")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"{self.name}: unsupported state version {state.get('version')!r}")
        for key, value in self._config().items():
            if state.get(key) != value:
                raise ValueError(f"{self.name}: state has {key}={state.get(key)!r}, this mechanism {value!r}")
        missing = {"noise_multiplier", "steps_taken", "pending_batch_size", "generator_state"} - state.keys()
        missing |= set(self._extra_state_keys) - state.keys()
        if missing:
            raise ValueError(f"{self.name}: state lacks {sorted(missing)}")
        steps_taken = state["steps_taken"]
        if not 0 <= steps_taken <= self.total_steps:
            raise ValueError(f"{self.name}: steps_taken={steps_taken!r} outside [0, {self.total_steps}]")
        # Keep the noise the run was started with, even if dp-accounting has changed since.
        noise_multiplier = dp_privacy.check_noise_multiplier(state["noise_multiplier"])
        extra = self._load_extra_state(state)
        rng = generator_from_state(state["generator_state"])  # raises ValueError on a malformed state
        self._rng = rng
        self.noise_multiplier = noise_multiplier
        self._steps = int(steps_taken)
        pending = state["pending_batch_size"]
        self._pending = None if pending is None else int(pending)
        for key, value in extra.items():
            setattr(self, key, value)

    def privacy_statement(self) -> dict[str, Any]:
        """(epsilon, delta) under RDP and PLD, for the steps taken and for all T planned.

        ``mia_bound`` is the MIA posterior bound of the calibration target
        ``(epsilon_target, delta)``, which bounds every epsilon reported here
        under the calibrating accountant.
        """
        return {
            "mechanism": self.name,
            "private": True,
            "epsilon_target": self.epsilon,
            "delta": self.delta,
            "epsilon_rdp": self._epsilon(self._steps, "rdp"),
            "epsilon_pld": self._epsilon(self._steps, "pld"),
            "epsilon_rdp_planned": self._epsilon(self.total_steps, "rdp"),
            "epsilon_pld_planned": self._epsilon(self.total_steps, "pld"),
            "accountant": self.accountant,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "clip": self.clip,
            "num_directions": self.num_directions,
            "steps": self._steps,
            "planned_steps": self.total_steps,
            "mia_bound": _mia_bound(self.epsilon, self.delta),
            "adjacency": "add-or-remove-one",
            "noise": f"exact discrete Gaussian on the clip * 2^-{GRID_BITS} grid",
            "delta_discretization": dp_privacy.discretization_delta(
                self.epsilon, self.noise_multiplier, self.total_steps, self.num_directions),
        }


class DPZero(_PoissonGaussianMechanism):
    """DPZero (Zhang et al. 2024), K = 1.

    Per step: clip each sampled example's two-point scalar into [-C, C], sum on
    the grid, add discrete Gaussian noise of scale sigma C, divide by the expected
    batch size q * N. The result
    is released as ``coef`` (the engine does theta <- theta - lr * coef * z).
    sigma is calibrated with dp-accounting so that T Poisson-subsampled
    Gaussian steps are (epsilon, delta)-DP under ``accountant``.

    Paper setting (Table dp-cliff): T = 20,000, lr = 5e-6, C = 25, q = 0.064,
    delta = 1e-5, epsilon in {0.2, 0.3, 0.5, 1, 2}. ``steps`` is the planned T;
    ``batch_indices`` refuses to go past it.

    ``public_size``: the N of the normaliser ``q * N`` when the universe's true
    size is private (add-or-remove-one adjacency: a neighbouring dataset has
    another size, so the release must not depend on it); the engine passes the
    configured ``n_train``. Default: ``num_examples``.
    """

    name = "dpzero"

    def __init__(
        self,
        num_examples: int,
        epsilon: float,
        delta: float,
        steps: int,
        sample_rate: float,
        clip: float,
        *,
        accountant: str = "rdp",
        seed: int | np.random.Generator | None = None,
        public_size: int | None = None,
    ) -> None:
        super().__init__(num_examples, epsilon, delta, steps, sample_rate, clip, 1, accountant, seed)
        if public_size is not None and (isinstance(public_size, bool) or int(public_size) != public_size
                                        or public_size < 1):
            raise ValueError(f"public_size must be a positive integer, got {public_size!r}")
        self.public_size = None if public_size is None else int(public_size)

    def _calibrate(self) -> float:
        return dp_privacy.calibrate_noise_multiplier(
            self.epsilon, self.delta, self.sample_rate, self.total_steps, self.accountant
        )

    def _denominator(self) -> float:
        return self.sample_rate * (self.num_examples if self.public_size is None else self.public_size)

    def _epsilon(self, steps: int, accountant: str) -> float:
        return dp_privacy.dpzero_epsilon(
            self.noise_multiplier, self.sample_rate, steps, self.delta, accountant
        )

    def step(self, scalars: np.ndarray) -> list[Release]:
        scalars = self._check_scalars(scalars)
        rows = grid_rows(clip_scalars(scalars[0], self.clip)[:, None], self.clip)
        noisy = noisy_grid_sum(self._rng, rows, 1, self.noise_multiplier)[0]
        denominator = self._denominator()
        self._finish_step()
        coef = math.ldexp(float(noisy), -GRID_BITS) * self.clip / denominator  # public arithmetic on an integer
        return [Release(bit=0, branch="dp", coef=coef, sigma=self.noise_multiplier * self.clip / denominator,
                        mi=0.0)]


class DPAggZO(_PoissonGaussianMechanism):
    """DP-AggZO (Bao et al. 2025): K directions aggregated per example.

    Per step: each sampled example's K-vector of two-point scalars is divided
    by K and L2-clipped to C; the clipped vectors are summed on the grid, discrete
    Gaussian noise of scale sigma C is added per coordinate, and the sum is divided
    by the noisy expected batch size q * (N + X), X discrete Laplace of scale b drawn
    once at construction (clamped below at N = 1, post-processing). That gives g_k; DP-AggZO updates
    theta -= lr * sum_k g_k z_k, so with the engine's
    theta <- theta - (lr / K) * sum_k coef_k z_k we release coef_k = K * g_k.

    Budget: 0.95 * epsilon to the Gaussian steps, 0.05 * epsilon to the
    Laplace count (b = 1 / (0.05 epsilon)), as in the public DP-AggZO code.

    Paper setting (Table dp-cliff): K = 64, T = 1000, lr = 5e-6, C = 25,
    q = 0.064, delta = 1e-5, epsilon in {0.2, 0.3, 0.5, 1, 2}.
    """

    name = "dp-aggzo"
    _extra_state_keys = ("laplace_scale", "noisy_num_examples")

    def __init__(
        self,
        num_examples: int,
        epsilon: float,
        delta: float,
        steps: int,
        sample_rate: float,
        clip: float,
        num_directions: int,
        *,
        accountant: str = "rdp",
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(
            num_examples, epsilon, delta, steps, sample_rate, clip, num_directions, accountant, seed
        )
        # an integer: the count plus exact discrete Laplace noise of scale b (no float bits to read)
        self.noisy_num_examples = float(self.num_examples + discrete_laplace(self._rng, self.laplace_scale))

    def _calibrate(self) -> float:
        calibration = dp_privacy.calibrate_dp_aggzo(
            self.epsilon, self.delta, self.sample_rate, self.total_steps, self.accountant
        )
        self.laplace_scale = calibration.laplace_scale
        return calibration.noise_multiplier

    def _denominator(self) -> float:
        return self.sample_rate * max(self.noisy_num_examples, 1.0)

    def _epsilon(self, steps: int, accountant: str) -> float:
        return dp_privacy.dp_aggzo_epsilon(
            self.noise_multiplier, self.laplace_scale, self.sample_rate, steps, self.delta, accountant
        )

    def step(self, scalars: np.ndarray) -> list[Release]:
        scalars = self._check_scalars(scalars)
        k = self.num_directions
        rows = grid_rows(clip_rows(scalars.T / k, self.clip), self.clip)  # [B, K] integer units
        noisy = noisy_grid_sum(self._rng, rows, k, self.noise_multiplier)
        denominator = self._denominator()
        coef_sigma = k * self.noise_multiplier * self.clip / denominator
        self._finish_step()
        return [Release(bit=0, branch="dp", coef=k * (math.ldexp(float(n), -GRID_BITS) * self.clip) / denominator,
                        sigma=coef_sigma, mi=0.0) for n in noisy]

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "laplace_scale": self.laplace_scale,
            "noisy_num_examples": self.noisy_num_examples,
        }

    def _load_extra_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "laplace_scale": dp_privacy.check_finite("laplace_scale", state["laplace_scale"]),
            "noisy_num_examples": dp_privacy.check_finite(
                "noisy_num_examples", state["noisy_num_examples"]
            ),
        }

    def privacy_statement(self) -> dict[str, Any]:
        """As the base statement, plus the Laplace scale and the epsilon split.

        The epsilons include the Laplace-noised dataset size (spent at step 0).
        """
        return {
            **super().privacy_statement(),
            "laplace_scale": self.laplace_scale,
            "epsilon_split": {
                "gaussian": dp_privacy.DP_AGGZO_GAUSSIAN_FRACTION * self.epsilon,
                "laplace": (1 - dp_privacy.DP_AGGZO_GAUSSIAN_FRACTION) * self.epsilon,
            },
        }


class DPZeroAggZO1(DPAggZO):
    """DPZero as the paper's Table dp-cliff ran it: the DP-AggZO code with K = 1.

    The authors' DPZero cells call their DP-AggZO baseline with one direction
    (``N=1``), so the release is :class:`DPAggZO`'s at K = 1, which differs from
    :class:`DPZero` (Zhang et al. 2024) in two places:

    * the budget: the Gaussian steps get ``0.95 * epsilon``, the dataset size
      ``N + Lap(1 / (0.05 epsilon))`` the rest (DPZero: all of it to the steps);
    * the normaliser: ``q * (N + Lap(b))`` (DPZero: the public ``q * n_train``).

    Clipping is the same (a K = 1 row clipped to L2 norm C is the scalar clipped
    into [-C, C]) and ``coef = K * g = g``. Run it as ``mechanism: dpzero-aggzo1``;
    ``dpzero`` stays DPZero as its own paper specifies it.
    """

    name = "dpzero-aggzo1"

    def __init__(
        self,
        num_examples: int,
        epsilon: float,
        delta: float,
        steps: int,
        sample_rate: float,
        clip: float,
        num_directions: int = 1,
        *,
        accountant: str = "rdp",
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if num_directions != 1:
            raise ValueError(f"{self.name} uses one direction per step, got num_directions={num_directions!r}")
        super().__init__(num_examples, epsilon, delta, steps, sample_rate, clip, 1, accountant=accountant, seed=seed)
