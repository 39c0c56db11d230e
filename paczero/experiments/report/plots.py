"""A report's PNG plots: accuracy against the MI budget, the DP cliff, unanimity, one run's trajectory, a cell's
curves (paczero/run/curves.py)."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from paczero.config import DP_MECHANISMS
from paczero.experiments.report.cells import DP_NAMES, Cell, Run, mean_std, model_label, read_log, task_data_label, update_rules


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def plot_mi_plateau(cells: list[Cell], paper_rows: list[dict], path: Path, overlay: bool) -> Path | None:
    """Test accuracy vs MI budget (log x): one series per table (or model/track) of PAC-MI cells."""
    series: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        if c.cfg["mechanism"] == "pac-mi" and c.cfg.get("num_directions", 1) == 1:
            rules = update_rules(c.cfg)
            key = (c.table if c.table.startswith("plateau") else
                   f"{task_data_label(c.cfg)} {model_label(c.cfg['model'])} {c.cfg['track']}") + \
                (f", {', '.join(rules)}" if rules else "")
            series[key].append(c)
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, cs in sorted(series.items()):
        cs = sorted(cs, key=lambda c: c.cfg["mi_budget"])
        stats = [c.stat("test") for c in cs]
        ax.errorbar([c.cfg["mi_budget"] for c in cs], [s[0] for s in stats], yerr=[s[1] or 0.0 for s in stats],
                    marker="o", capsize=3, label=f"{key} (ours)")
    if overlay:
        for table, name in (("plateau", "paper: plateau FT 1.3B"), ("plateau-lora", "paper: plateau LoRA 1.3B")):
            pts = sorted((float(r["mi_budget"]), float(r["reported_test"])) for r in paper_rows if r["table"] == table)
            if pts and table in series:
                ax.plot(*zip(*pts), "--", marker="x", alpha=0.7, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("MI budget (nats, log scale)")
    ax.set_ylabel("test %")
    ax.set_title("Accuracy vs MI budget (PAC-MI)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_dp_cliff(cells: list[Cell], paper_rows: list[dict], path: Path, overlay: bool) -> Path | None:
    """Test accuracy vs epsilon for DP cells, with the PAC-ZPL level (MI = 0) as a horizontal line. Series with
    other K or T are drawn a hair apart in ε (the ticks stay at the cells' ε), so that equal points stay visible."""
    dp = [c for c in cells if c.cfg["mechanism"] in DP_MECHANISMS]
    if not dp:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    series: dict[tuple, list[Cell]] = defaultdict(list)
    for c in dp:
        series[(c.cfg["mechanism"], c.cfg.get("num_directions", 1), c.cfg["steps"])].append(c)
    for i, ((mech, k, steps), cs) in enumerate(sorted(series.items())):
        cs = sorted(cs, key=lambda c: c.cfg["epsilon"])
        stats = [c.stat("test") for c in cs]
        name = DP_NAMES.get(mech, mech)
        nudge = 10 ** (0.012 * (i - (len(series) - 1) / 2))  # side by side on the log axis: equal points stay visible
        ax.errorbar([c.cfg["epsilon"] * nudge for c in cs], [s[0] for s in stats], yerr=[s[1] or 0.0 for s in stats],
                    marker="os^Dv"[i % 5], capsize=3, label=f"{name} K={k} T={steps} (ours)")
    ref = dp[0].cfg
    zpl: dict[tuple, list[Cell]] = defaultdict(list)  # one line per update rule
    for c in cells:
        if c.cfg["mechanism"] == "pac-zpl" and all(c.cfg[k] == ref[k] for k in ("task", "model", "track")):
            zpl[tuple(update_rules(c.cfg))].append(c)
    for i, (rules, cs) in enumerate(sorted(zpl.items())):
        m, s, n = mean_std(r.metric("test") for c in cs for r in c.runs)
        ax.axhline(m, color="k", ls=("-", "-.")[i % 2],
                   label=f"PAC-ZPL, MI = 0{', ' + ', '.join(rules) if rules else ''} (ours, n={n})")
        if s:
            ax.axhspan(m - s, m + s, color="k", alpha=0.1)
    # the paper's curves are OPT-1.3B on SST-2: drawn beside cells of its dp-cliff table, not beside another experiment
    drawn: set[float] = set()
    if overlay and any(c.table == "dp-cliff" for c in dp):
        for mech, k, steps in sorted({(r["mechanism"], r["num_directions"], r["steps"]) for r in paper_rows
                                       if r["table"] == "dp-cliff"}):
            pts = sorted((float(r["epsilon"]), float(r["reported_test"])) for r in paper_rows
                         if r["table"] == "dp-cliff" and (r["mechanism"], r["num_directions"], r["steps"]) == (mech, k, steps))
            if len(pts) > 1:
                drawn.update(x for x, _ in pts)
                ax.plot(*zip(*pts), "--", marker="x", alpha=0.6,
                        label=f"paper: {DP_NAMES.get(mech, mech)} K={k}")
        zp = [r for r in paper_rows if r["recipe"] == f"headline/{ref['task']}-opt{model_label(ref['model']).lower()}-"
              f"{ref['track']}-zpl"]
        if zp:
            ax.axhline(float(zp[0]["reported_test"]), color="k", ls="--", alpha=0.6, label="paper: PAC-ZPL, MI = 0")
    ax.set_xscale("log")
    eps = sorted({c.cfg["epsilon"] for c in dp} | drawn)
    ax.set_xticks(eps, [f"{x:g}" for x in eps])  # the ε values drawn, not log-scale minor labels that overlap
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("DP ε (δ = 1e-5, log scale)")
    ax.set_ylabel("test %")
    ax.set_title("The DP-ZO cliff vs PAC-ZPL at MI = 0")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_privacy_utility(cells: list[Cell], path: Path) -> Path | None:
    """Test accuracy (mean ± std over seeds) against the MIA bound of each cell's guarantee, PAC and DP on one
    axis: the bound on an informed adversary's membership-inference success at prior 0.5 (0.5: no advantage).
    A non-private reference has no bound and stands at 1; the zero-shot base model is a horizontal line."""
    from paczero.experiments.report.cells import guarantee, method_label
    from paczero.experiments.report.tables import zero_shot_stats

    points = []
    for c in cells:
        mean, std, _ = c.stat("test")
        if mean is None:
            continue
        mia = guarantee(c)[1]
        family = "DP" if c.cfg["mechanism"] in DP_MECHANISMS else "non-private" if mia is None else "PAC"
        points.append((1.0 if mia is None else mia, mean, std or 0.0, family, c))
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.0, 4.8))
    markers = {"PAC": "o", "DP": "s", "non-private": "D"}
    points.sort(key=lambda p: p[0])
    for i, (x, y, err, family, c) in enumerate(points):
        near = [q for q in points if abs(q[0] - x) < 0.01]  # cells at one bound stand side by side
        dx = 0.008 * (near.index(points[i]) - (len(near) - 1) / 2)
        ft = c.cfg["track"] == "ft"
        label = f"{method_label(c.cfg)}, {c.cfg['track']}"
        label += "" if family == "non-private" else f"; {guarantee(c)[0]}"
        ax.errorbar([x + dx], [y], yerr=[err], marker=markers[family], color=f"C{i % 10}", capsize=3, ls="none",
                    mfc="white" if ft else None, label=label)
    for cfg, st in zero_shot_stats(cells):
        if st["test"][0] is not None:
            ax.axhline(st["test"][0], color="k", ls=":", alpha=0.6,
                       label=f"zero-shot {model_label(cfg['model'])} (n={st['test'][2]})")
    ax.set_xlim(0.47, 1.04)
    ax.set_xlabel("MIA success bound of the guarantee (prior 0.5; 1: no bound)")
    ax.set_ylabel("test %")
    ax.set_title("Privacy against utility (circles PAC, squares DP, diamond non-private; hollow: full FT)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_trajectory(run: Run, path: Path) -> Path | None:
    """Cumulative MI charged (realised), zero-cost-step fraction and running unanimity fraction vs step (log.jsonl)."""
    log = read_log(run.run_dir)
    if not log:
        return None
    steps = [r["step"] + 1 for r in log]
    unanimous, frac = 0, []
    for i, r in enumerate(log, 1):
        branches = r.get("branch") if isinstance(r.get("branch"), list) else [r.get("branch")]
        unanimous += all(b == "unanimous" for b in branches)
        frac.append(unanimous / i)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cum = [r.get("cum_mi") or 0.0 for r in log]
    ax.plot(steps, cum, color="tab:red", label="cumulative MI charged, this run (nats)")
    if run.cfg.get("mi_budget"):
        ax.axhline(run.cfg["mi_budget"], color="tab:red", ls=":", alpha=0.6, label="MI budget (the guarantee)")
    top = max([*cum, run.cfg.get("mi_budget") or 0.0])
    ax.set_ylim(0.0, 1.05 * top if top > 0 else 1.0)  # MI is >= 0: 0 is the floor (PAC-ZPL charges none)
    ax.set_xlabel("step")
    ax.set_ylabel("cumulative MI charged (nats)", color="tab:red")
    ax2 = ax.twinx()
    ax2.plot(steps, [r.get("free_frac", 0.0) for r in log], color="tab:blue", label="zero-MI step fraction")
    ax2.plot(steps, frac, color="tab:green", ls="--", label="unanimity fraction")
    ax2.set_ylim(0, 1.02)
    ax2.set_ylabel("fraction of steps")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="center right")
    ax.set_title(f"{run.cell} seed {run.seed}", fontsize=9)
    return _save(fig, path)


def plot_curves(cell: Cell, path: Path) -> Path | None:
    """The curves of a cell's runs (train loss, dev metric, privacy spent, unanimity), one line per run."""
    from paczero.run.curves import draw_curves

    def label(r: Run) -> str:
        return f"seed {r.seed}" if re.fullmatch(r"seed\d+", r.run_dir.name) else f"{r.run_dir.name} (seed {r.seed})"

    return draw_curves([(label(r), r.run_dir) for r in cell.runs], path, f"{cell.name} (n={len(cell.runs)})")


def plot_unanimity(cells: list[Cell], path: Path, overlay: bool) -> Path | None:
    """Unanimity rate per PAC cell (mean ± std over seeds), with the paper's f % where published."""
    pac = [c for c in cells if c.stat("unanimity")[0] is not None and c.cfg["mechanism"] not in DP_MECHANISMS]
    if not pac:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(pac) + 2), 4.5))
    xs = list(range(len(pac)))
    stats = [c.stat("unanimity") for c in pac]
    ax.bar(xs, [s[0] for s in stats], yerr=[s[1] or 0.0 for s in stats], capsize=2, label="ours")
    if overlay:
        pts = [(x, float(c.paper["free_frac"])) for x, c in zip(xs, pac) if c.paper and c.paper.get("free_frac")]
        if pts:
            ax.scatter(*zip(*pts), color="k", marker="x", zorder=3, label="paper f %")
    ax.set_xticks(xs, [c.name for c in pac], rotation=75, ha="right", fontsize=6)
    ax.set_ylabel("unanimity rate %")
    ax.set_title("Unanimity rate per cell")
    ax.legend(fontsize=7)
    return _save(fig, path)


# ---------------------------------------------------------------------------- writing
