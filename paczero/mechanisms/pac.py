"""The PAC-private per-step releases: PAC-MI, PAC-ZPL and the hybrid schedule.

Algorithm 1 of the paper. Each step the M candidate subsets give one sign each;
the mechanism keeps the adversary's posterior over the secret index j* (a
log-posterior; an entry is -inf once a release has ruled the candidate out) and
releases one bit. The minority mass ``m = min(q+, 1 - q+)`` is computed from the
log-masses of the two sides (each a logsumexp over its own entries), never as
``1 -`` a sum near 1; ``Release.q_plus`` is the mass of the +1 side, for the logs.

* exact unanimity (the minority side has zero posterior mass; e.g. all M signs
  equal): release ``s_{j*}``; MI 0, posterior unchanged (Lemma 1);
* tolerance unanimity (``0 < m <= tau``, tau = 1e-12, Appendix B): releasing
  ``s_{j*}`` leaks ``h(m)``; it is charged ``m (1 - log m) (1 + CHARGE_MARGIN)``
  (``>= h(m)``, at most 2.9e-11 nats) and the posterior is conditioned on the
  released sign. When the budget cannot pay it, a fair coin is released
  instead (MI 0);
* disagreement, PAC-MI (Section 3.1): ``y~ = s_{j*} + gamma X`` with ``X`` an
  exact discrete Gaussian of scale ``sigma / gamma`` on the public power-of-two
  grid ``gamma = noise_grid(sigma)`` (:mod:`paczero.privacy.exact_noise`: a float ``s + sigma z``
  would tell ``s`` by its last bits), ``sigma = public_sigma(calibrate(m, beta_t))`` (20 significant
  bits: the same on every machine), ``beta_t`` from eq. (adaptive-beta) capped at ``0.999 h(m)``;
  release ``sgn(y~)``; Bayes update of the posterior on ``y~`` (the lattice
  channel's likelihood ratio is the Gaussian one, ``exp(2 y~ / sigma^2)``);
  charge ``discrete_binary_mi(m, sigma, gamma) (1 + CHARGE_MARGIN) <= beta_t``,
  an upper bound of the MI of the channel that runs;
* disagreement, PAC-ZPL (Section 3.2, eq. zpl-coin), and PAC-MI without
  budget: a fair coin; MI 0.

``noised_coef`` and ``coin_step`` change only how far a release moves the weights,
never what is released or charged (docs/privacy.md, "Update rules"): the paper's
``"bit"`` and ``"move"`` by default; ``"posterior-mean"``: a noised release moves
them by the public posterior mean of s_{j*} after it, ``q+' - q-'``; ``"skip"``: a
coin release draws nothing and moves nothing (``Release.bit`` 0), so PAC-ZPL's
output is a function of public inputs alone.

Every charge is added to ``mi_spent`` rounded upwards, and a charge that would
take ``mi_spent`` above the total budget is never made (the release becomes a
coin), so the sum of the charges never exceeds the budget. The tolerance
charges are also summed in ``tolerance_mi`` (``tolerance_mi_bound`` of the
privacy statement): the part of ``mi_spent`` paid for tolerance unanimity.
PAC-ZPL's posterior stays uniform, so its minority mass is 0 or >= 1/M and
only exact unanimity happens.

With K directions per step (Appendix K) the per-step budget is split into
``beta_t / K`` per release and the posterior is updated sequentially.

The noise and the coins come from :func:`paczero.privacy.subsets.private_generator`; so does j* when not
given (a run gives it, drawn with the design on a key of its own: :func:`paczero.privacy.subsets.secret_generator`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..privacy.exact_noise import MAX_SIGMA, noise_grid, public_sigma
from ..privacy import dp_epsilon_matching_mi, mia_bound
from ..privacy.binary_channel import CHARGE_MARGIN, calibrate, discrete_binary_mi
from ..privacy.secure_random import generator_from_state, generator_state
from ..privacy.subsets import SeedLike, check_design, private_generator, subset_signs
from .base import Mechanism, Release
from .pac_arithmetic import _log_side_masses, _noised_value, _tolerance_charge

__all__ = ["PacMI", "PacZPL", "COIN_STEPS", "NOISED_COEFS", "UNANIMITY_TOL", "ENTROPY_CAP"]

#: what a coin release does to the weights: the paper's rule moves them along the coin; "skip" leaves them
COIN_STEPS = ("move", "skip")
#: how far a noised release moves the weights: its sign, or the posterior mean of s_{j*} after it
NOISED_COEFS = ("bit", "posterior-mean")
#: unanimity tolerance tau of Appendix B
UNANIMITY_TOL = 1e-12
#: feasibility cap beta_t <= ENTROPY_CAP * h(q+) of Appendix B
ENTROPY_CAP = 0.999
#: relative safety margin on the remaining budget, so that float rounding in
#: ``spent + mi`` can never push mi_spent above the total budget
_BUDGET_MARGIN = 1e-12
#: units in the last place of the total budget kept out of each step's budget: every
#: charge adds at most 2 ulps of rounding (it is rounded upwards), so the K releases
#: of a step (K <= 32) always fit; a charge that does not fit becomes a coin
_RESERVE_ULPS = 64


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
        coin_step: str = "move",
    ) -> None:
        if coin_step not in COIN_STEPS:
            raise ValueError(f"coin_step must be one of {COIN_STEPS}; got {coin_step!r}")
        self.coin_step = coin_step
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
        self._tolerance_mi = 0.0  # the part of _mi_spent charged for tolerance unanimity (each charge >= h(m))

    # ------------------------------------------------------------------ config
    def _config(self) -> dict[str, Any]:
        return {"mechanism": self.name, "num_subsets": self.num_subsets, "coin_step": self.coin_step}

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

    def _pay(self, charge: float) -> bool:
        """Add ``charge`` to mi_spent, rounded upwards; False (nothing added) when the
        total would exceed the budget (PAC-ZPL has none)."""
        total = getattr(self, "total_mi", None)
        if total is None:
            return False
        spent = math.nextafter(self._mi_spent + charge, math.inf)  # >= the exact sum
        if spent > total:
            return False
        self._mi_spent = spent
        return True

    def _coin(self, q_plus: float, agreement: float) -> Release:
        if self.coin_step == "skip":  # nothing is drawn and the weights stay where they are
            return Release(bit=0, branch="coin", coef=0.0, beta=0.0, q_plus=q_plus, agreement=agreement)
        bit = 1 if self._rng.random() < 0.5 else -1
        return Release(bit=bit, branch="coin", coef=float(bit), beta=0.0,
                       q_plus=q_plus, agreement=agreement)

    def _release_one(self, signs: np.ndarray, beta: float) -> Release:
        plus = signs == 1
        log_plus, log_minus = _log_side_masses(self._log_post, plus)
        q_plus = math.exp(log_plus)  # public, for the logs; never used for calibration
        log_m = min(log_plus, log_minus)  # the minority side's own log-mass
        m = math.exp(log_m)
        agreement = int(np.count_nonzero(plus)) / self.num_subsets
        s_secret = int(signs[self._secret])
        self._releases += 1
        if log_m == -math.inf:  # exact unanimity: s_{j*} is a function of the transcript
            self._unanimous += 1
            return Release(bit=s_secret, branch="unanimous", coef=float(s_secret), beta=beta,
                           q_plus=q_plus, agreement=agreement)
        if m <= UNANIMITY_TOL:  # tolerance unanimity: s_{j*} leaks h(m) <= charge
            charge = _tolerance_charge(log_m)
            if not self._pay(charge):
                return self._coin(q_plus, agreement)
            self._unanimous += 1
            self._tolerance_mi += charge
            # the adversary now knows s_{j*}: rule out the candidates that disagree
            log_post = np.where(signs == s_secret, self._log_post, -math.inf)
            self._log_post = log_post - log_post.max()
            self._post_cache = None
            return Release(bit=s_secret, branch="unanimous", coef=float(s_secret), mi=charge,
                           beta=beta, q_plus=q_plus, agreement=agreement)
        if not self._noised_phase() or beta <= 0.0:
            return self._coin(q_plus, agreement)
        h_m = -m * log_m - (1.0 - m) * math.log1p(-m)
        beta = min(beta, ENTROPY_CAP * h_m)
        sigma = public_sigma(calibrate(m, beta)[0])  # the same on every machine (exact_noise.public_sigma)
        if sigma > MAX_SIGMA:  # MI below 2^-80: a coin (MI 0) costs less and moves as little
            return self._coin(q_plus, agreement)
        grid = noise_grid(sigma)
        charge = discrete_binary_mi(m, sigma, grid) * (1.0 + CHARGE_MARGIN)  # the channel that runs
        if charge > beta or not self._pay(charge):
            return self._coin(q_plus, agreement)
        y = _noised_value(self._rng, s_secret, sigma, grid)
        bit = 1 if y >= 0.0 else -1
        # p[m] <- p[m] N(y; s_m, sigma^2) (the lattice likelihoods, up to a factor common to all m): in
        # log space the s-dependent part is c s_m with
        # c = y / sigma^2; the normalising shift is folded in so each entry is rounded once
        c = y / (sigma * sigma)
        moved = self._log_post + c * signs
        top = float(moved.max())
        shift = top + math.log(float(np.exp(moved - top).sum()))
        self._log_post = self._log_post + np.where(plus, c - shift, -c - shift)
        self._post_cache = None
        coef = float(bit)
        if getattr(self, "noised_coef", "bit") == "posterior-mean":  # E[s_{j*} | transcript]: public
            after_plus, after_minus = _log_side_masses(self._log_post, plus)
            coef = math.exp(after_plus) - math.exp(after_minus)
        return Release(bit=bit, branch="noised", coef=coef, sigma=sigma, y_tilde=y, grid=grid,
                       mi=charge, beta=beta, q_plus=q_plus, agreement=agreement)

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

        Computes the subset signs with :func:`paczero.privacy.subsets.subset_signs`
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
            rng_state=generator_state(self._rng),
            design=None if self.design is None else self.design.copy(),
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in self._config().items():
            old_default = {"coin_step": "move", "noised_coef": "bit"}  # states saved before these keys existed
            if key not in state and key not in old_default:
                raise ValueError(f"state is missing field {key!r}")
            if state.get(key, old_default.get(key)) != value:
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
        self._rng = generator_from_state(state["rng_state"])
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
        """The public guarantee and the run's counters. Never contains the secret,
        the posterior or any sign.

        ``mi_bound`` is the guarantee: ``I(S*; transcript) <= mi_bound`` nats, the
        total budget (Theorem 1), or 0 without a noised phase (Theorem 2).
        ``mia_bound`` is its MIA success bound (eq. pac_mi_bound, prior 1/2) and
        ``matched_dp_epsilon`` the DP epsilon with the same MIA bound (a reference
        point only). ``mi_spent`` is the sum of this run's per-release charges: a
        realised value of one run, not a bound; the guarantee bounds its
        expectation over runs (the proof of Theorem 1: I = E[sum beta_used]).
        """
        budget = self._budget()
        bound = 0.0 if budget is None else budget  # no budget: disagreement is a coin, MI 0
        return {
            "mechanism": self.name,
            "private": True,
            "mi_total_budget": budget,
            "mi_bound": bound,
            "mia_bound": mia_bound(bound),
            "matched_dp_epsilon": dp_epsilon_matching_mi(bound) if bound > 0.0 else 0.0,
            "matched_dp_delta": 1e-5,
            "mi_spent": self._mi_spent,
            "steps": self._steps,
            "free_steps": self._free_steps,
            "unanimity_rate": self.unanimity_rate,
            "num_subsets": self.num_subsets,
            "unanimity_tolerance": UNANIMITY_TOL,
            "tolerance_mi_bound": self._tolerance_mi,
            "coin_step": self.coin_step,
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
        coin_step: ``"move"`` (the paper's rule: theta moves along the coin) or ``"skip"``
            (theta stays; no coin is drawn). See the module docstring.
    """

    name = "pac-zpl"

    def privacy_statement(self) -> dict[str, Any]:
        out = super().privacy_statement()
        out["mi_total_budget"] = 0.0  # Theorem 2: I(S*; transcript) = 0, so mi_bound 0 and mia_bound 1/2
        return out


class PacMI(_PacBase):
    """PAC-MI (Algorithm 1, Section 3.1, Theorem 1): ``I(S*; Y_{1:T}) <= total_mi``.

    Disagreement steps release ``sgn(s_{j*} + gamma X)`` (X discrete Gaussian, scale sigma_t / gamma) with sigma_t
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
        design, secret, seed, coin_step: as for :class:`PacZPL` (``coin_step`` applies to the coins
            released once the budget is spent or a charge does not fit).
        noised_coef: ``"bit"`` (the paper's) or ``"posterior-mean"`` (see the module docstring).
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
        coin_step: str = "move",
        noised_coef: str = "bit",
    ) -> None:
        if noised_coef not in NOISED_COEFS:
            raise ValueError(f"noised_coef must be one of {NOISED_COEFS}; got {noised_coef!r}")
        self.noised_coef = noised_coef
        self.total_mi = _budget_arg(total_mi, "total_mi")
        self.total_steps = _int_arg(total_steps, "total_steps", 1)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")
        self.schedule = schedule
        super().__init__(num_subsets, design=design, secret=secret, seed=seed, coin_step=coin_step)

    def _config(self) -> dict[str, Any]:
        cfg = super()._config()
        cfg.update(total_mi=self.total_mi, total_steps=self.total_steps, schedule=self.schedule,
                   noised_coef=self.noised_coef)
        return cfg

    def _mi_horizon(self) -> int:
        return self.total_steps

    def _step_budget(self) -> float:
        t = self._steps + 1
        horizon = self._mi_horizon()
        if t > horizon:
            return 0.0
        reserve = _RESERVE_ULPS * math.ulp(self.total_mi)
        remaining = max(0.0, self.total_mi - self._mi_spent - reserve) * (1.0 - _BUDGET_MARGIN)
        if self.schedule == "adaptive":
            return remaining / (horizon - t + 1)
        return min(self.total_mi / horizon, remaining)

    def _noised_phase(self) -> bool:
        return True

    def _budget(self) -> float | None:
        return self.total_mi

    def privacy_statement(self) -> dict[str, Any]:
        out = super().privacy_statement()
        out.update(schedule=self.schedule, total_steps=self.total_steps, noised_coef=self.noised_coef,
                   noise="exact discrete Gaussian on a power-of-two grid (sigma / grid in [2^40, 2^41))")
        return out
