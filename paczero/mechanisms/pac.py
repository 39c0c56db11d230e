"""The PAC-private per-step releases: PAC-MI, PAC-ZPL and the hybrid schedule.

Algorithm 1 of the paper. Each step the M candidate subsets give one sign each;
the mechanism keeps the adversary's posterior over the secret index j* and
releases one bit:

* unanimity (q+ <= tau or q+ >= 1 - tau, tau = 1e-12, Appendix B): release
  ``s_{j*}``; no MI, posterior unchanged (Lemma 1);
* disagreement, PAC-MI (Section 3.1): ``y~ = s_{j*} + N(0, sigma^2)`` with
  ``sigma = sigma_for_mi(q+, beta_t)``, ``beta_t`` from eq. (adaptive-beta)
  capped at ``0.999 h(q+)``; release ``sgn(y~)``; Bayes update of the
  posterior on ``y~``; charge ``binary_mi(q+, sigma) <= beta_t``;
* disagreement, PAC-ZPL (Section 3.2, eq. zpl-coin): a fair coin; MI 0.

With K directions per step (Appendix K) the per-step budget is split into
``beta_t / K`` per release and the posterior is updated sequentially.

All private randomness (j*, noise, coins) comes from
:func:`paczero.subsets.private_generator`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..privacy import binary_entropy, dp_epsilon_matching_mi, mia_bound
from ..privacy.binary_channel import calibrate
from ..subsets import SeedLike, check_design, private_generator, subset_signs
from .base import Mechanism, Release

__all__ = ["PacMI", "PacZPL", "Hybrid", "UNANIMITY_TOL", "ENTROPY_CAP"]

#: unanimity tolerance tau of Appendix B
UNANIMITY_TOL = 1e-12
#: feasibility cap beta_t <= ENTROPY_CAP * h(q+) of Appendix B
ENTROPY_CAP = 0.999
#: relative safety margin on the remaining budget, so that float rounding in
#: ``spent + mi`` can never push mi_spent above the total budget
_BUDGET_MARGIN = 1e-12
SCHEDULES = ("adaptive", "uniform")


def _int_arg(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int; got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value!r}")
    return int(value)


def _budget_arg(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number; got {value!r}") from None
    if not math.isfinite(v) or v < 0.0:
        raise ValueError(f"{name} must be finite and >= 0; got {value!r}")
    return v


class _PacBase(Mechanism):
    """Shared state and release logic of the PAC mechanisms.

    State: the log-posterior over j* (kept in log space), the secret, the
    private generator, the MI spent, and counters. Subclasses set the budget
    rule (:meth:`_step_budget`) and whether disagreement is noised or a coin
    (:meth:`_noised_phase`).
    """

    name = "pac"

    def __init__(
        self,
        num_subsets: int,
        *,
        design: ArrayLike | None = None,
        secret: int | None = None,
        seed: SeedLike = None,
    ) -> None:
        m = _int_arg(num_subsets, "num_subsets", 2)
        if m % 2:
            raise ValueError(f"num_subsets must be even (balanced design); got {num_subsets!r}")
        self.num_subsets = m
        self.design = None if design is None else check_design(design, m)
        self._rng = private_generator(seed)
        if secret is None:
            self._secret = int(self._rng.integers(m))
        else:
            if isinstance(secret, (bool, np.bool_)) or not isinstance(secret, (int, np.integer)) \
                    or not 0 <= secret < m:
                raise ValueError(f"secret must be an int in [0, num_subsets={m})")
            self._secret = int(secret)
        self._log_post = np.full(m, -math.log(m))
        self._post_cache: np.ndarray | None = None
        self._mi_spent = 0.0
        self._steps = 0
        self._free_steps = 0
        self._releases = 0
        self._unanimous = 0
        self._tolerance_mi = 0.0  # sum of h(q+) on tolerance-detected (not exact) unanimity

    # ------------------------------------------------------------------ config
    def _config(self) -> dict[str, Any]:
        return {"mechanism": self.name, "num_subsets": self.num_subsets}

    def _step_budget(self) -> float:
        """beta_t of the step about to be taken (before the entropy cap)."""
        return 0.0

    def _noised_phase(self) -> bool:
        """True when disagreement is answered by a noised release (PAC-MI)."""
        return False

    # ------------------------------------------------------------- properties
    @property
    def posterior(self) -> np.ndarray:
        """The adversary's posterior over j* (length M, sums to 1)."""
        return self._posterior().copy()

    def _posterior(self) -> np.ndarray:
        if self._post_cache is None:
            w = np.exp(self._log_post - self._log_post.max())
            self._post_cache = w / w.sum()
        return self._post_cache

    @property
    def mi_spent(self) -> float:
        return self._mi_spent

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def free_steps(self) -> int:
        return self._free_steps

    @property
    def unanimity_rate(self) -> float:
        """Fraction of releases (over all steps and directions) on the unanimity branch."""
        return self._unanimous / self._releases if self._releases else 0.0

    # ---------------------------------------------------------------- release
    def _check_signs(self, signs: ArrayLike, ndim: int) -> np.ndarray:
        s = np.asarray(signs)
        expected = "[M]" if ndim == 1 else "[K, M]"
        if s.ndim != ndim or s.shape[-1] != self.num_subsets or s.size == 0:
            raise ValueError(
                f"signs must have shape {expected} with M={self.num_subsets}; got {s.shape}"
            )
        if not np.all((s == 1) | (s == -1)):
            raise ValueError("signs must take values in {-1, +1}")
        return s.astype(np.int8)

    def _release_one(self, signs: np.ndarray, beta: float) -> Release:
        post = self._posterior()
        plus = signs == 1
        q_plus = float(post @ plus)
        agreement = int(np.count_nonzero(plus)) / self.num_subsets
        s_secret = int(signs[self._secret])
        self._releases += 1
        if q_plus <= UNANIMITY_TOL or q_plus >= 1.0 - UNANIMITY_TOL:
            self._unanimous += 1
            if 0.0 < q_plus < 1.0:  # residual MI of the tolerance, bounded by h(tau)
                self._tolerance_mi += float(binary_entropy(q_plus))
            return Release(bit=s_secret, branch="unanimous", coef=float(s_secret), beta=beta,
                           q_plus=q_plus, agreement=agreement)
        if self._noised_phase() and beta > 0.0:
            beta = min(beta, ENTROPY_CAP * float(binary_entropy(q_plus)))
        if not self._noised_phase() or beta <= 0.0:
            bit = 1 if self._rng.random() < 0.5 else -1
            return Release(bit=bit, branch="coin", coef=float(bit), beta=0.0,
                           q_plus=q_plus, agreement=agreement)
        sigma, mi = calibrate(q_plus, beta)  # sigma_for_mi, and binary_mi(q+, sigma) <= beta
        y = s_secret + sigma * float(self._rng.standard_normal())
        bit = 1 if y >= 0.0 else -1
        self._mi_spent += mi
        # p[m] <- p[m] N(y; s_m, sigma^2): in log space the s-dependent part is y s_m / sigma^2
        self._log_post = self._log_post + (y / (sigma * sigma)) * signs
        self._log_post -= self._log_post.max()
        self._log_post -= math.log(np.exp(self._log_post).sum())
        self._post_cache = None
        return Release(bit=bit, branch="noised", coef=float(bit), sigma=sigma, y_tilde=y,
                       mi=mi, beta=beta, q_plus=q_plus, agreement=agreement)

    def release_many(self, signs_k: ArrayLike) -> list[Release]:
        """One step with K directions (Appendix K): ``[K, M]`` signs -> K releases.

        The step budget ``beta_t`` is split as ``beta_t / K`` per release; the
        posterior is updated after each release, so release k sees the
        posterior left by releases 1..k-1. K = 1 is identical to :meth:`release`.
        """
        return self._step_releases(self._check_signs(signs_k, 2))

    def _step_releases(self, s: np.ndarray) -> list[Release]:
        k = s.shape[0]
        beta_each = self._step_budget() / k
        out = [self._release_one(row, beta_each) for row in s]
        self._steps += 1
        if all(r.mi == 0.0 for r in out):
            self._free_steps += 1
        return out

    def release(self, signs: ArrayLike) -> Release:
        """One step, one direction: the M subset signs -> the released bit (Algorithm 1)."""
        return self._step_releases(self._check_signs(signs, 1)[None, :])[0]

    def step(self, scalars: np.ndarray) -> list[Release]:
        """Engine entry point: ``[K, N]`` per-sample scalars -> K releases.

        Computes the subset signs with :func:`paczero.subsets.subset_signs`
        (requires ``design``) and calls :meth:`release_many`.
        """
        if self.design is None:
            raise ValueError(f"{self.name}.step needs the [M, N] design (pass design=...)")
        g = np.asarray(scalars, dtype=np.float64)
        if g.ndim != 2:
            raise ValueError(f"scalars must have shape [K, N]; got {g.shape}")
        return self.release_many(subset_signs(g, self.design))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state = dict(self._config())
        state.update(
            secret=self._secret,
            log_posterior=self._log_post.copy(),
            mi_spent=self._mi_spent,
            steps=self._steps,
            free_steps=self._free_steps,
            releases=self._releases,
            unanimous=self._unanimous,
            tolerance_mi=self._tolerance_mi,
            rng_state=self._rng.bit_generator.state,
            design=None if self.design is None else self.design.copy(),
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in self._config().items():
            if key not in state:
                raise ValueError(f"state is missing field {key!r}")
            if state[key] != value:
                if key == "mechanism":
                    raise ValueError(f"field 'mechanism': state is for {state[key]!r}, "
                                     f"this mechanism is {value!r}")
                raise ValueError(f"field {key!r} mismatch: state has {state[key]!r}, "
                                 f"this mechanism has {value!r}")
        design = state.get("design")
        if design is not None:
            design = check_design(design, self.num_subsets)
            if self.design is not None and (
                self.design.shape != design.shape or not np.array_equal(self.design, design)
            ):
                raise ValueError("field 'design' mismatch: the state was saved with another design")
            self.design = design
        log_post = np.asarray(state["log_posterior"], dtype=np.float64)
        if log_post.shape != (self.num_subsets,):
            raise ValueError("field 'log_posterior' has the wrong shape")
        secret = state["secret"]
        if not isinstance(secret, (int, np.integer)) or not 0 <= secret < self.num_subsets:
            raise ValueError("field 'secret' is out of range")
        rng_state = state["rng_state"]
        bitgen = getattr(np.random, rng_state["bit_generator"])()
        bitgen.state = rng_state
        self._rng = np.random.Generator(bitgen)
        self._secret = int(secret)
        self._log_post = log_post.copy()
        self._post_cache = None
        self._mi_spent = float(state["mi_spent"])
        self._steps = int(state["steps"])
        self._free_steps = int(state["free_steps"])
        self._releases = int(state["releases"])
        self._unanimous = int(state["unanimous"])
        self._tolerance_mi = float(state["tolerance_mi"])

    # -------------------------------------------------------------- statement
    def _budget(self) -> float | None:
        return None

    def privacy_statement(self) -> dict[str, Any]:
        """Public guarantee so far: MI spent, its MIA bound (eq. pac_mi_bound), the
        matched-MIA DP epsilon (a reference point only), step counts. Never
        contains the secret, the posterior or any sign."""
        budget = self._budget()
        spent = self._mi_spent
        return {
            "mechanism": self.name,
            "private": True,
            "mi_total_budget": budget,
            "mi_spent": spent,
            "mia_bound": mia_bound(spent),
            "mia_bound_of_budget": None if budget is None else mia_bound(budget),
            "matched_dp_epsilon": dp_epsilon_matching_mi(spent) if spent > 0.0 else 0.0,
            "matched_dp_delta": 1e-5,
            "steps": self._steps,
            "free_steps": self._free_steps,
            "unanimity_rate": self.unanimity_rate,
            "num_subsets": self.num_subsets,
            "unanimity_tolerance": UNANIMITY_TOL,
            "tolerance_mi_bound": self._tolerance_mi,
        }


class PacZPL(_PacBase):
    """PAC-ZPL (Section 3.2): ``s_{j*}`` on unanimity, a fair private coin otherwise.

    The posterior stays at the uniform prior and every step has MI exactly 0
    (Theorem 2), so the MIA bound is the prior 1/2 (Corollary 2).

    Args:
        num_subsets: M (even).
        design: ``[M, N]`` balanced design, needed by :meth:`step`.
        secret: j* (default: drawn from the private generator).
        seed: int / Generator / None (OS entropy) for the private generator.
    """

    name = "pac-zpl"

    def privacy_statement(self) -> dict[str, Any]:
        out = super().privacy_statement()
        out["mi_total_budget"] = 0.0
        out["mia_bound_of_budget"] = mia_bound(0.0)
        return out


class PacMI(_PacBase):
    """PAC-MI (Algorithm 1, Section 3.1, Theorem 1): ``I(S*; Y_{1:T}) <= total_mi``.

    Disagreement steps release ``sgn(s_{j*} + N(0, sigma_t^2))`` with sigma_t
    calibrated by :func:`paczero.privacy.sigma_for_mi` to
    ``beta_t = min(budget rule, 0.999 h(q+))``. Budget rule:
    ``"adaptive"`` -- eq. (adaptive-beta), ``max(0, total - spent) / (T - t + 1)``;
    ``"uniform"`` -- ``total / T``. After T steps (or once the budget is
    exhausted) disagreement falls back to a fair coin (the beta -> 0 limit).

    Args:
        num_subsets: M (even).
        total_mi: total budget MI_tot in nats (>= 0).
        total_steps: T (>= 1).
        schedule: "adaptive" (default) or "uniform".
        design, secret, seed: as for :class:`PacZPL`.
    """

    name = "pac-mi"

    def __init__(
        self,
        num_subsets: int,
        total_mi: float,
        total_steps: int,
        schedule: str = "adaptive",
        *,
        design: ArrayLike | None = None,
        secret: int | None = None,
        seed: SeedLike = None,
    ) -> None:
        self.total_mi = _budget_arg(total_mi, "total_mi")
        self.total_steps = _int_arg(total_steps, "total_steps", 1)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")
        self.schedule = schedule
        super().__init__(num_subsets, design=design, secret=secret, seed=seed)

    def _config(self) -> dict[str, Any]:
        cfg = super()._config()
        cfg.update(total_mi=self.total_mi, total_steps=self.total_steps, schedule=self.schedule)
        return cfg

    def _mi_horizon(self) -> int:
        return self.total_steps

    def _step_budget(self) -> float:
        t = self._steps + 1
        horizon = self._mi_horizon()
        if t > horizon:
            return 0.0
        remaining = max(0.0, self.total_mi - self._mi_spent) * (1.0 - _BUDGET_MARGIN)
        if self.schedule == "adaptive":
            return remaining / (horizon - t + 1)
        return min(self.total_mi / horizon, remaining)

    def _noised_phase(self) -> bool:
        return True

    def _budget(self) -> float | None:
        return self.total_mi

    def privacy_statement(self) -> dict[str, Any]:
        out = super().privacy_statement()
        out.update(schedule=self.schedule, total_steps=self.total_steps)
        return out


class Hybrid(PacMI):
    """Budget-then-ZPL schedule (the paper's proposed future work, Section 5).

    PAC-MI with its budget spread over the first ``switch_step`` steps
    (eq. adaptive-beta with horizon ``switch_step``), then a zero-MI tail that
    keeps the inherited posterior: unanimity is judged on the posterior weight
    (q+ within tau of 0 or 1), disagreement gets a fair coin, and the
    posterior is frozen. The tail adds no conditional MI, so the total stays
    at most ``total_mi``. The MI phase also ends early once the remaining
    budget is exhausted.

    Args:
        num_subsets: M (even).
        total_mi: total budget in nats.
        total_steps: T, the length of the whole run.
        switch_step: number of PAC-MI steps, ``0 <= switch_step <= total_steps``.
        schedule, design, secret, seed: as for :class:`PacMI`.
    """

    name = "hybrid"

    def __init__(
        self,
        num_subsets: int,
        total_mi: float,
        total_steps: int,
        switch_step: int,
        schedule: str = "adaptive",
        *,
        design: ArrayLike | None = None,
        secret: int | None = None,
        seed: SeedLike = None,
    ) -> None:
        self.switch_step = _int_arg(switch_step, "switch_step", 0)
        super().__init__(num_subsets, total_mi, total_steps, schedule,
                         design=design, secret=secret, seed=seed)
        if self.switch_step > self.total_steps:
            raise ValueError(f"switch_step={switch_step!r} exceeds total_steps={total_steps!r}")

    def _config(self) -> dict[str, Any]:
        cfg = super()._config()
        cfg["switch_step"] = self.switch_step
        return cfg

    def _mi_horizon(self) -> int:
        return self.switch_step

    def _noised_phase(self) -> bool:
        exhausted = self.total_mi - self._mi_spent <= _BUDGET_MARGIN * self.total_mi
        return self._steps < self.switch_step and not exhausted

    @property
    def in_tail(self) -> bool:
        """True once the zero-MI tail has started."""
        return not self._noised_phase()

    def privacy_statement(self) -> dict[str, Any]:
        out = super().privacy_statement()
        out.update(switch_step=self.switch_step, in_tail=self.in_tail)
        return out
