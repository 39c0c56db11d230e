"""The hybrid schedule: PAC-MI's budget over the first steps, then a zero-MI tail (PAC-ZPL's rule)."""
from __future__ import annotations

from typing import Any

from numpy.typing import ArrayLike

from ..privacy.subsets import SeedLike
from .pac import _BUDGET_MARGIN, PacMI, _int_arg

__all__ = ["Hybrid"]


class Hybrid(PacMI):
    """Budget-then-ZPL schedule (the paper's proposed future work, Section 5).

    PAC-MI with its budget spread over the first ``switch_step`` steps
    (eq. adaptive-beta with horizon ``switch_step``), then a tail that keeps
    the inherited posterior: unanimity is judged on the posterior weight,
    disagreement gets a fair coin (MI 0) and the posterior changes only by
    ruling out candidates on tolerance unanimity. Exact unanimity is free;
    tolerance unanimity (minority mass in (0, tau]) is charged its residual
    from what is left of the budget, and becomes a coin once nothing is left,
    so the total stays at most ``total_mi``. The MI phase also ends early once
    the remaining budget is exhausted.

    Args:
        num_subsets: M (even).
        total_mi: total budget in nats.
        total_steps: T, the length of the whole run.
        switch_step: number of PAC-MI steps, ``0 <= switch_step <= total_steps``.
        schedule, design, secret, seed, coin_step, noised_coef: as for :class:`PacMI`.
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
        coin_step: str = "move",
        noised_coef: str = "bit",
    ) -> None:
        self.switch_step = _int_arg(switch_step, "switch_step", 0)
        super().__init__(num_subsets, total_mi, total_steps, schedule,
                         design=design, secret=secret, seed=seed, coin_step=coin_step,
                         noised_coef=noised_coef)
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
