"""A run's curves, drawn from its public files: ``curves.png`` in the run folder, and per cell in a report.

Four panels against the step, one line per run (a report's cell draws its seeds together):

- train loss: each step's loss over the universe (``log.jsonl`` ``train_loss``; not logged for the DP
  baselines, whose batch is private);
- dev metric: the task's metric at each dev evaluation (``evals.jsonl``), the zero-shot value at step 0
  and a ring at the step whose weights the run released (``summary.json`` ``selected_step``);
- privacy: the cumulative MI charged (``cum_mi``, nats, from 0 up; the MI budget dotted) for the PAC
  mechanisms, the epsilon spent by the accountant for the DP baselines (target dotted); nothing for the
  non-private references;
- unanimity: the running unanimity rate (``unanimity``) and each step's agreement q+ (``agreement``).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from paczero.config import DP_MECHANISMS, PAC_PRIVATE

_log = logging.getLogger(__name__)


def read_records(path: Path) -> list[dict]:
    """The records of a run's JSON-lines file (log.jsonl, evals.jsonl); [] if absent, a torn line skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a killed run
    return out


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _values(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The steps done and ``key``'s values of the records that hold a number under it."""
    pts = [(r["step"] + 1, float(r[key])) for r in records
           if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return [p[0] for p in pts], [p[1] for p in pts]


def _dev_metric(summary: dict, evals: list[dict]) -> str | None:
    if summary.get("metric"):
        return summary["metric"]
    names = [k for r in evals for k in (r.get("dev") or {})]
    return next((k for k in names if k != "loss"), names[0] if names else None)


def draw_curves(runs: list[tuple[str, Path]], path: Path, title: str) -> Path | None:
    """Draw the curves of ``runs`` ((label, run folder) pairs) into the PNG ``path``; None if no run has a log."""
    data = []
    for label, run_dir in runs:
        log = read_records(run_dir / "log.jsonl")
        if log:
            summary = _json(run_dir / "summary.json")
            cfg = summary.get("config") or _json(run_dir / "run.json").get("config") or {}
            data.append((label, log, read_records(run_dir / "evals.jsonl"), summary, cfg))
    if not data:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    (loss_ax, dev_ax), (priv_ax, unan_ax) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    many = len(data) > 1
    metric, privacy_kind, top = None, set(), 0.0
    for i, (label, log, evals, summary, cfg) in enumerate(data):
        color = colors[i % len(colors)]
        name = label if many else None
        loss_ax.plot(*_values(log, "train_loss"), color=color, lw=0.8, label=name)
        metric = metric or _dev_metric(summary, evals)
        if metric:
            _plot_dev(dev_ax, evals, summary, metric, color, name)
        kind, run_top = _plot_privacy(priv_ax, log, summary, cfg, color, name)
        privacy_kind |= kind
        top = max(top, run_top)
        unan_ax.plot(*_values(log, "unanimity"), color=color, label=name)
        unan_ax.plot(*_values(log, "agreement"), ".", ms=4, alpha=0.5, color=color)

    loss_ax.set_title("train loss (over U)", fontsize=9)
    if _empty(loss_ax):
        _note(loss_ax, "not logged (DP: the batch is private)")
    dev_ax.set_title(f"dev {metric or 'metric'}" + ("" if metric == "loss" else " %")
                     + " (o: released weights)", fontsize=9)
    if privacy_kind == {"dp"}:
        priv_ax.set_title("epsilon spent (accountant; target dotted)", fontsize=9)
    else:
        priv_ax.set_title("cumulative MI charged, nats (budget dotted)" if privacy_kind else "privacy", fontsize=9)
    if privacy_kind:
        priv_ax.set_ylim(0.0, 1.05 * top if top > 0 else 1.0)  # MI and epsilon are >= 0: 0 is the floor
        if privacy_kind == {"pac"} and top == 0:
            _note(priv_ax, "0 nats charged (PAC-ZPL: zero MI per release)")
    else:
        _note(priv_ax, "non-private reference: no privacy accounting")
    unan_ax.set_title("unanimity rate (line), agreement q+ per step (dots)", fontsize=9)
    unan_ax.set_ylim(0.0, 1.02)
    if _empty(unan_ax):
        _note(unan_ax, "no release bits (DP baselines release noisy values)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    if many:
        dev_ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_dev(ax, evals: list[dict], summary: dict, metric: str, color, name) -> None:
    """One run's dev metric per evaluation (from the zero-shot's, where evaluated), its released step circled."""
    steps = [r["step"] for r in evals if (r.get("dev") or {}).get(metric) is not None]
    values = [100.0 * r["dev"][metric] if metric != "loss" else r["dev"][metric] for r in evals
              if (r.get("dev") or {}).get(metric) is not None]
    zero = ((summary.get("zero_shot") or {}).get("dev") or {}).get(metric)
    if zero is not None:
        steps, values = [0] + steps, [100.0 * zero if metric != "loss" else zero] + values
    ax.plot(steps, values, marker=".", color=color, label=name)
    if summary.get("selected_step") in steps:
        j = steps.index(summary["selected_step"])
        ax.plot([steps[j]], [values[j]], "o", mfc="none", ms=10, color=color)


def _plot_privacy(ax, log: list[dict], summary: dict, cfg: dict, color, name) -> tuple[set, float]:
    """One run's privacy spend (DP: epsilon by the accountant; PAC: cumulative MI) and its target, dotted;
    returns the kind plotted ({"dp"}, {"pac"} or none) and the highest value drawn."""
    mechanism, top = cfg.get("mechanism"), 0.0
    if mechanism in DP_MECHANISMS:
        pts = _epsilon_curve(summary, cfg)
        if pts:
            ax.plot(*pts, marker=".", color=color, label=name)
            top = max(pts[1])
        if cfg.get("epsilon"):
            ax.axhline(cfg["epsilon"], color=color, ls=":", alpha=0.7)
            top = max(top, float(cfg["epsilon"]))
        return {"dp"}, top
    if mechanism in PAC_PRIVATE:
        steps, cum = _values(log, "cum_mi")
        ax.plot(steps, cum, color=color, label=name)
        top = max([top, *cum])
        if cfg.get("mi_budget"):
            ax.axhline(cfg["mi_budget"], color=color, ls=":", alpha=0.7)
            top = max(top, float(cfg["mi_budget"]))
        return {"pac"}, top
    return set(), top


def _empty(ax) -> bool:
    return all(len(line.get_xdata()) == 0 for line in ax.lines)


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="0.4")


def _epsilon_curve(summary: dict, cfg: dict, points: int = 6) -> tuple[list[int], list[float]] | None:
    """Epsilon spent at up to ``points`` steps, from the run's public calibration (summary.json ``privacy``)."""
    from paczero.run.trackers import dp_epsilon

    p = summary.get("privacy") or {}
    if p.get("noise_multiplier") is None or not p.get("steps"):
        return None
    steps = sorted({max(1, round(p["steps"] * k / points)) for k in range(1, points + 1)})
    return steps, [dp_epsilon(p, s) for s in steps]


def write_run_curves(run_dir: Path) -> Path | None:
    """``RUN/curves.png``: the run's curves (a drawing that fails warns and leaves the run as it is)."""
    try:
        return draw_curves([(run_dir.name, run_dir)], run_dir / "curves.png", f"{run_dir.name}: curves")
    except Exception as e:  # noqa: BLE001 - a plot never fails a run
        _log.warning(f"curves.png not drawn: {e.__class__.__name__}: {e}")
        return None
