"""DP-SGD (Abadi et al. 2016): the first-order baseline, (epsilon, delta)-DP under add-or-remove-one adjacency.

Per step the engine (:mod:`paczero.fo.dpsgd_step`, per-sample gradients by Opacus):

1. ``batch_indices(N)`` draws the Poisson sample at rate ``q`` from the private generator, exactly as the
   DP zeroth-order baselines do (:class:`paczero.mechanisms.dp.DPZero`): every example joins independently
   with probability exactly ``q``; the batch, its size, its loss and the step's time are private;
2. the engine clips every sampled example's whole gradient to L2 norm ``C`` (``dp_clip``) and sums;
3. ``noise(numel)`` draws the Gaussian noise of scale ``sigma C`` per coordinate from the private
   generator; the engine adds it to the clipped sum, divides by the public ``q * n_train`` and hands
   the result to the optimizer.

The released object is the sequence of noisy gradient sums, one per step: ``T`` Poisson-subsampled
Gaussian mechanisms of L2 sensitivity ``C``, the same event as DPZero's (:func:`paczero.privacy.dp.dpzero_event`),
so the noise multiplier is calibrated and the epsilon reported by the same dp-accounting code (RDP and PLD).
The weights, the dev-best selection and everything after are post-processing of that sequence.

Noise on a finite computer: a gradient has ``d`` coordinates (about 0.4 million for SmolLM2-135M's LoRA
adapters, 135 million for full fine-tuning); the noise is a float Gaussian (SHAKE-256 bits from the
private generator, turned into a normal by the inverse CDF in float64, then rounded to the parameters'
dtype), not an exact discrete Gaussian on a grid as the zeroth-order baselines draw their one value per
step. The (epsilon, delta) stated is the Gaussian mechanism's; docs/privacy.md ("Noise on a finite
computer") says what that means for float noise.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from paczero.mechanisms.base import Release
from paczero.mechanisms.dp import DPZero

#: what the privacy statement says of the noise (docs/privacy.md, "Noise on a finite computer")
FLOAT_NOISE = ("float Gaussian per gradient coordinate from the private SHAKE-256 stream (inverse CDF in float64, "
               "rounded to the parameters' dtype); the (epsilon, delta) are the Gaussian mechanism's, which float "
               "noise approximates (docs/privacy.md)")


#: a dp-sgd run's settings where the user names none (the command line's; a recipe or config file sets its
#: own): the per-example gradient clip of DP-SGD (1.0, not the zeroth-order scalar's 25), a Poisson rate, steps,
#: lr and evaluations that fit it (the cpu-practitioner recipes: SmolLM2-135M LoRA, about 10^4 example forwards)
USER_DEFAULTS = {"dp_clip": 1.0, "sample_rate": 0.5, "steps": 25, "lr": 1e-3, "eval_every": 5}


class DPSGD(DPZero):
    """DP-SGD's privacy side: the Poisson sample, the calibrated noise multiplier, the gradient noise and the
    statement. The clipping and the update are the engine's (:func:`paczero.fo.dpsgd_step.dpsgd_step`). Its
    accounting is DPZero's (T Poisson-subsampled Gaussian steps of sensitivity C), and so are its arguments.

    ``public_size``: the N of the normaliser ``q * N`` (the configured ``n_train``: the true universe size
    is private under add-or-remove adjacency). Default: ``num_examples``.
    """

    name = "dp-sgd"

    @property
    def denominator(self) -> float:
        """What the noisy gradient sum is divided by: the expected batch size ``q * n_train`` (public)."""
        return self._denominator()

    def step(self, scalars: np.ndarray) -> list[Release]:
        raise TypeError("dp-sgd releases a noisy gradient, not per-direction scalars: "
                        "train it with paczero.fo.dpsgd_step (noise() draws its noise)")

    def noise(self, numel: int) -> tuple[np.ndarray, Release]:
        """The step's Gaussian noise, ``numel`` float64 values of scale ``sigma C`` from the private generator,
        and the step's public release record (no coefficient: the noisy gradient itself is not logged).
        Ends the step begun by :meth:`batch_indices`."""
        if self._pending is None:
            raise RuntimeError(f"{self.name}: noise drawn without batch_indices")
        if isinstance(numel, bool) or int(numel) != numel or numel < 1:
            raise ValueError(f"numel must be a positive integer, got {numel!r}")
        z = np.asarray(self._rng.standard_normal(int(numel)), dtype=np.float64) * (self.noise_multiplier * self.clip)
        self._finish_step()
        return z, Release(bit=0, branch="dp", coef=None, sigma=self.noise_multiplier * self.clip / self.denominator)

    def privacy_statement(self) -> dict[str, Any]:
        """As DPZero's statement; the noise is a float Gaussian, so no discretization delta is claimed."""
        statement = super().privacy_statement()
        statement.update(noise=FLOAT_NOISE, delta_discretization=None, num_directions=None,
                         update="first-order: clipped per-example gradients plus Gaussian noise (Opacus clipping)")
        return statement
