"""The public record of one training step: the line ``log.jsonl`` gets (docs/outputs.md)."""
from __future__ import annotations

import math


def _num(x: float):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def step_record(step, releases, mechanism, lr, train_loss, seconds, rows) -> dict:
    """Transcript values and diagnostics, no secrets: per release (a list when K > 1) the branch, bit,
    coefficient, noised value, its grid and sigma; per step the MI figures, lr, train loss, rows, time."""
    def each(field):
        values = [getattr(r, field) for r in releases]
        return values[0] if len(values) == 1 else values

    first = releases[0]
    return {
        "step": step,
        "branch": each("branch"),
        "bit": each("bit"),
        "coef": each("coef"),
        "y_tilde": each("y_tilde"),
        "grid": each("grid"),
        "q_plus": _num(first.q_plus),
        "agreement": _num(first.agreement),
        "sigma": each("sigma"),
        "beta": sum(r.beta for r in releases),
        "mi_step": sum(r.mi for r in releases),
        "cum_mi": mechanism.mi_spent,
        "free_frac": mechanism.free_steps / max(mechanism.steps, 1),  # steps charged no MI
        "unanimity": getattr(mechanism, "unanimity_rate", None),       # the paper's f (PAC mechanisms)
        "lr": lr,
        "train_loss": train_loss,
        "rows": rows,
        "seconds": None if seconds is None else round(seconds, 4),
    }
