"""(epsilon, delta) accounting and calibration for the DP zeroth-order baselines.

Pure numpy + Google's ``dp-accounting``; no torch, no hand-written RDP formulas.
Three pieces, in the manner of dp-accounting itself:

* *what happened* -- :func:`dpzero_event` and :func:`dp_aggzo_event` build the
  ``DpEvent`` of a whole run: ``steps`` Poisson-subsampled Gaussian releases at
  rate ``q`` (DPZero), plus, for DP-AggZO, one Laplace-noised dataset size;
* *what it costs* -- :func:`dpzero_epsilon` and :func:`dp_aggzo_epsilon` compose
  that event under the RDP or the PLD accountant (add-or-remove-one adjacency);
* *how to choose the noise* -- :func:`calibrate_noise_multiplier` and
  :func:`calibrate_dp_aggzo` call ``mechanism_calibration.calibrate_dp_mechanism``,
  which returns a noise multiplier whose epsilon does not exceed the target.

The noise multiplier ``sigma`` is relative to the L2 sensitivity: the mechanism
adds noise of scale ``sigma C`` to a sum of contributions each clipped to norm ``C``.
It runs on a grid (:mod:`paczero.privacy.exact_noise`): contributions in integer units of
``C 2^-40``, the noise an exact discrete Gaussian; :func:`discretization_delta` is
the delta that adds to the Gaussian mechanism the accountants analyse.

DP-AggZO's budget split follows the public DP-AggZO code (Bao et al. 2025,
``opt/src/dp_trainer_aggzo.py``): the Gaussian part is calibrated to
``0.95 * epsilon`` at the full ``delta``; the dataset size ``N`` (a count, L1
sensitivity 1 under add/remove adjacency) is released once, before training, as
``N + X``, ``X`` discrete Laplace of scale ``b = 1 / (0.05 * epsilon)``, i.e.
``0.05 * epsilon``-DP (:func:`count_event`). By
basic composition the run is ``(epsilon, delta)``-DP; :func:`dp_aggzo_epsilon`
reports the (usually slightly tighter) composed epsilon of both parts.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

from dp_accounting import dp_event
from dp_accounting import mechanism_calibration
from dp_accounting import privacy_accountant
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from .exact_noise import GRID_BITS

ACCOUNTANTS = ("rdp", "pld")

#: share of epsilon DP-AggZO spends on the Gaussian part; the rest noises N
DP_AGGZO_GAUSSIAN_FRACTION = 0.95

#: dp-accounting's default PLD grid; coarser grids stay pessimistic (upper bounds)
DEFAULT_PLD_DISCRETIZATION = 1e-4


class _QuietOrderExclusion(logging.Filter):
    """dp-accounting's RDP accountant logs a warning for every Renyi order whose fractional-order series
    does not converge (dozens per calibration at large sampling rates), then leaves that order out of the
    minimum over orders: the epsilon it reports can only grow, so it stays an upper bound. The message says
    nothing a user can act on; every other absl message passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("_compute_log_a_frac failed to converge")


logging.getLogger("absl").addFilter(_QuietOrderExclusion())


# --------------------------------------------------------------------------- validation


def check_finite(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a real number, got {value!r}") from err
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def check_epsilon(epsilon: float) -> float:
    epsilon = check_finite("epsilon", epsilon)
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    return epsilon


def check_delta(delta: float) -> float:
    delta = check_finite("delta", delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    return delta


def check_sample_rate(sample_rate: float) -> float:
    sample_rate = check_finite("sample_rate", sample_rate)
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    return sample_rate


def check_steps(steps: int, *, allow_zero: bool = False) -> int:
    if isinstance(steps, bool) or not float(check_finite("steps", steps)).is_integer():
        raise ValueError(f"steps must be an integer, got {steps!r}")
    steps = int(steps)
    if steps < (0 if allow_zero else 1):
        raise ValueError(f"steps must be >= {0 if allow_zero else 1}, got {steps!r}")
    return steps


def check_noise_multiplier(noise_multiplier: float) -> float:
    noise_multiplier = check_finite("noise_multiplier", noise_multiplier)
    if noise_multiplier <= 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    return noise_multiplier


def check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def _check_discretization(value: float) -> float:
    value = check_finite("pld_discretization", value)
    if value <= 0:
        raise ValueError(f"pld_discretization must be > 0, got {value!r}")
    return value


def make_accountant(
    accountant: str = "rdp", pld_discretization: float = DEFAULT_PLD_DISCRETIZATION
) -> privacy_accountant.PrivacyAccountant:
    """A fresh dp-accounting accountant (add-or-remove-one adjacency)."""
    check_accountant(accountant)
    if accountant == "rdp":
        return rdp_privacy_accountant.RdpAccountant()
    return pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=_check_discretization(pld_discretization)
    )


# --------------------------------------------------------------------------- events


def dpzero_event(noise_multiplier: float, sample_rate: float, steps: int) -> dp_event.DpEvent:
    """``steps`` Poisson-subsampled Gaussian releases (one per training step)."""
    if steps == 0:
        return dp_event.NoOpDpEvent()
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)),
        steps,
    )


def count_event(laplace_scale: float, accountant: str) -> dp_event.DpEvent:
    """The dataset size released once as ``N + X``, ``X`` discrete Laplace with ``P(x) ∝ exp(-|x| / b)``.

    A count of sensitivity 1 with this noise is ``a``-DP, ``a = 1 / b`` (rounded upwards here), and
    its privacy loss takes only the values ``+-a`` (the pair of output laws is binary randomized
    response's). PLD: dp-accounting's exact ``DiscreteLaplaceDpEvent``; RDP (which has no event for
    it under add-or-remove adjacency): ``ZCDpEvent(a^2 / 2)``, the zCDP of any ``a``-DP mechanism
    (Bun and Steinke 2016, Proposition 1.4).
    """
    a = math.nextafter(1.0 / laplace_scale, math.inf)
    if accountant == "pld":
        return dp_event.DiscreteLaplaceDpEvent(a, 1)
    return dp_event.ZCDpEvent(0.5 * a * a)


def dp_aggzo_event(
    noise_multiplier: float, laplace_scale: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> dp_event.DpEvent:
    """DP-AggZO: one discrete-Laplace count release (sensitivity 1) composed with the Gaussian steps."""
    return dp_event.ComposedDpEvent(
        [count_event(laplace_scale, accountant), dpzero_event(noise_multiplier, sample_rate, steps)]
    )


def discretization_delta(epsilon: float, noise_multiplier: float, steps: int, num_directions: int) -> float:
    """The delta a run adds by drawing its Gaussian noise as an exact discrete Gaussian.

    The mechanisms add to an integer sum (contributions clipped to ``2^GRID_BITS`` grid units) a
    discrete Gaussian of scale ``s = noise_multiplier * 2^GRID_BITS`` per coordinate. Rounding
    ``sum + N(0, s^2)`` to the integers is post-processing of the Gaussian mechanism the accountants
    analyse, and the discrete Gaussian is within total variation ``tau <= 1 / (32 s^2)`` of that
    rounded Gaussian (midpoint rule: ``sum_n |R(n) - phi(n)| <= (int |phi''| + TV(phi''))/24 <=
    (sqrt 2 + sqrt 6 / s) / (24 s^2)``; the discrete normaliser differs from the continuous one by
    ``< 3 exp(-2 pi^2 s^2)``). Over ``steps`` steps of ``num_directions`` coordinates the two runs
    are within ``T K tau``, so an ``(epsilon, delta)`` guarantee of the accounted mechanism gives
    ``(epsilon, delta + (1 + e^epsilon) T K tau)`` for the one that runs; this returns that
    addition (1e-26 to 1e-21 at the paper's dp-cliff settings).
    """
    s = check_noise_multiplier(noise_multiplier) * 2.0 ** GRID_BITS
    if s < 2.0 ** 10:
        raise ValueError(f"noise multiplier {noise_multiplier!r} is too small for the 2^-{GRID_BITS} grid")
    return (1.0 + math.exp(epsilon)) * steps * num_directions / (32.0 * s * s)


# --------------------------------------------------------------------------- epsilon


@functools.lru_cache(maxsize=512)
def _epsilon_of(
    noise_multiplier: float,
    laplace_scale: float | None,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str,
    pld_discretization: float,
) -> float:
    if laplace_scale is None:
        event = dpzero_event(noise_multiplier, sample_rate, steps)
    else:
        event = dp_aggzo_event(noise_multiplier, laplace_scale, sample_rate, steps, accountant)
    return float(make_accountant(accountant, pld_discretization).compose(event).get_epsilon(delta))


def dpzero_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
    *,
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """Epsilon at ``delta`` of ``steps`` DPZero steps (0.0 for zero steps)."""
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    sample_rate = check_sample_rate(sample_rate)
    steps = check_steps(steps, allow_zero=True)
    delta = check_delta(delta)
    check_accountant(accountant)
    if steps == 0:
        return 0.0
    discretization = _check_discretization(pld_discretization)
    return _epsilon_of(noise_multiplier, None, sample_rate, steps, delta, accountant, discretization)


def dp_aggzo_epsilon(
    noise_multiplier: float,
    laplace_scale: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
    *,
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """Epsilon at ``delta`` of DP-AggZO after ``steps`` steps: Laplace count + Gaussian steps.

    At zero steps only the Laplace-noised dataset size has been released.
    """
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    laplace_scale = check_finite("laplace_scale", laplace_scale)
    if laplace_scale <= 0:
        raise ValueError(f"laplace_scale must be > 0, got {laplace_scale!r}")
    sample_rate = check_sample_rate(sample_rate)
    steps = check_steps(steps, allow_zero=True)
    delta = check_delta(delta)
    check_accountant(accountant)
    discretization = _check_discretization(pld_discretization)
    return _epsilon_of(noise_multiplier, laplace_scale, sample_rate, steps, delta, accountant, discretization)


# --------------------------------------------------------------------------- calibration


@functools.lru_cache(maxsize=128)
def _calibrate(
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str,
    pld_discretization: float,
) -> float:
    return float(
        mechanism_calibration.calibrate_dp_mechanism(
            lambda: make_accountant(accountant, pld_discretization),
            lambda sigma: dpzero_event(sigma, sample_rate, steps),
            epsilon,
            delta,
        )
    )


def calibrate_noise_multiplier(
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    *,
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """Smallest noise multiplier (to 1e-6) whose ``steps``-fold Poisson-subsampled
    Gaussian is ``(epsilon, delta)``-DP under ``accountant``.

    Uses dp-accounting's ``calibrate_dp_mechanism``, which guarantees the epsilon
    at the returned value is at most ``epsilon``. Results are cached; under RDP
    the paper's DPZero setting (T=20,000, q=0.064, delta=1e-5) takes about 1 s.
    """
    return _calibrate(
        check_epsilon(epsilon),
        check_delta(delta),
        check_sample_rate(sample_rate),
        check_steps(steps),
        check_accountant(accountant),
        _check_discretization(pld_discretization),
    )


@dataclass(frozen=True)
class DPAggZOCalibration:
    """Noise scales of a DP-AggZO run.

    ``noise_multiplier`` -- Gaussian std per coordinate relative to the clip C,
    calibrated to ``epsilon_gaussian``; ``laplace_scale`` -- scale b of the
    Laplace noise on the dataset size (sensitivity 1), pure ``epsilon_laplace``-DP.
    """

    noise_multiplier: float
    laplace_scale: float
    epsilon_gaussian: float
    epsilon_laplace: float


def calibrate_dp_aggzo(
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    *,
    gaussian_fraction: float = DP_AGGZO_GAUSSIAN_FRACTION,
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> DPAggZOCalibration:
    """DP-AggZO's split: ``gaussian_fraction * epsilon`` (default 0.95) to the
    Gaussian steps at the full ``delta``, the rest to ``Lap(1 / ((1 - f) epsilon))``
    on the dataset size. Basic composition makes the run ``(epsilon, delta)``-DP.
    """
    epsilon = check_epsilon(epsilon)
    gaussian_fraction = check_finite("gaussian_fraction", gaussian_fraction)
    if not 0 < gaussian_fraction < 1:
        raise ValueError(f"gaussian_fraction must lie in (0, 1), got {gaussian_fraction!r}")
    epsilon_gaussian = gaussian_fraction * epsilon
    epsilon_laplace = epsilon - epsilon_gaussian
    sigma = calibrate_noise_multiplier(
        epsilon_gaussian, delta, sample_rate, steps, accountant, pld_discretization=pld_discretization
    )
    return DPAggZOCalibration(
        noise_multiplier=sigma,
        laplace_scale=1.0 / epsilon_laplace,
        epsilon_gaussian=epsilon_gaussian,
        epsilon_laplace=epsilon_laplace,
    )
