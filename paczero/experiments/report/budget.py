"""A tuned table's budget: each chosen cell's dev loss against the example forwards it spent, where that curve
stands at its final budget, and what a longer DP run would cost (:mod:`paczero.experiments.report.tuned` shows
them in its gain table and budget plot)."""
from __future__ import annotations

import json
import statistics
from collections import defaultdict

from paczero.config import DP_MECHANISMS
from paczero.experiments.report.cells import Cell

CEILING = "adamw"  # the non-private first-order reference: the gain the private methods are read against


def forwards_per_step(cfg: dict) -> float:
    """A step's expected example forwards (the budget's unit): two per scored example and direction for the
    zeroth-order methods (the whole universe, a mini-batch, or the expected Poisson batch q N); a forward and a
    backward, counted as three forwards, per example of a first-order step."""
    n = float(cfg["n_train"])
    mech = cfg["mechanism"]
    if mech == "dp-sgd":
        return 3.0 * cfg["sample_rate"] * n
    if mech == CEILING:
        return 3.0 * (cfg.get("batch_size") or n)
    k = cfg.get("num_directions") or 1
    if mech in DP_MECHANISMS:
        return 2.0 * k * cfg["sample_rate"] * n
    batch = cfg.get("batch_size") if mech == "mezo" else None
    return 2.0 * k * (batch or n)


def budget_curves(cell: Cell) -> list[tuple[float, float]]:
    """The chosen cell's dev loss against the example forwards spent, averaged over its runs at each step its
    runs share (step 0: the zero-shot)."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for r in cell.runs:
        zero = ((r.summary.get("zero_shot") or {}).get("dev") or {}).get("loss")
        if zero is not None:
            per_step[0].append(float(zero))
        path = r.run_dir / "evals.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            loss = (rec.get("dev") or {}).get("loss") if isinstance(rec.get("dev"), dict) else rec.get("dev_loss")
            if loss is not None and rec.get("step") is not None:
                per_step[int(rec["step"])].append(float(loss))
    if not per_step:
        return []
    n = max(len(v) for v in per_step.values())
    fw = forwards_per_step(cell.cfg)
    return [(step * fw, statistics.fmean(v)) for step, v in sorted(per_step.items()) if len(v) == n]


FLAT_TOL = 0.003  # nats of mean dev loss: less than this apart, two points of a budget curve count as level


def curve_end(points: list[tuple[float, float]], tol: float = FLAT_TOL) -> str:
    """Where a budget curve stands at its final budget: "rising" where its final point lies more than ``tol``
    above its lowest (the run overfits, or its noise grew: the dev-best step is the one released); else "still
    falling" where the lowest dev loss of its last third (by budget) lies more than ``tol`` below every earlier
    point (a longer run would likely buy more); otherwise "flat". "—" for fewer than four points."""
    if len(points) < 4:
        return "—"
    end = points[-1][0]
    late = [loss for x, loss in points if x > 2.0 * end / 3.0]
    early = [loss for x, loss in points if x <= 2.0 * end / 3.0]
    if not late or not early:
        return "—"
    best = min(points, key=lambda p: p[1])
    if points[-1][1] > best[1] + tol:  # its lowest point lies behind it, even where that was in the last third
        return f"rising (lowest at {best[0]:.3g} forwards, {points[-1][1] - best[1]:+.3f} since)"
    if min(late) < min(early) - tol:
        return f"still falling ({min(late) - min(early):+.3f} in the last third)"
    return "flat"


LONGER = 4  # how many times as long a run the "still falling" note of a DP cell prices


def longer_run_noise(cfg: dict) -> str:
    """Why a DP-SGD cell whose dev curve still falls is not simply run longer: at its fixed (ε, δ) a run of
    ``LONGER`` times the steps needs a larger noise multiplier on every step (the same accountant's calibration
    as the run's). "" for other mechanisms."""
    if cfg.get("mechanism") != "dp-sgd" or not cfg.get("epsilon"):
        return ""
    from paczero.privacy.dp import calibrate_noise_multiplier

    steps, acct = int(cfg["steps"]), cfg.get("accountant") or "rdp"
    now, longer = (calibrate_noise_multiplier(float(cfg["epsilon"]), float(cfg["delta"]), float(cfg["sample_rate"]),
                                              t, acct) for t in (steps, LONGER * steps))
    return (f"; at ε = {float(cfg['epsilon']):g} a run of {LONGER * steps} steps needs noise multiplier "
            f"{longer:.1f} on every step, against {now:.1f} at {steps}")


def forwards_per_second(cells: list[Cell]) -> float | None:
    """The table's measured speed in example forwards per second: the median over its runs that publish their
    time (a DP run's time is private and unpublished) of forwards spent over train seconds."""
    rates = []
    for c in cells:
        for r in c.runs:
            secs = r.summary.get("train_seconds")
            if secs:
                rates.append(forwards_per_step(c.cfg) * float(c.cfg["steps"]) / float(secs))
    return statistics.median(rates) if rates else None
