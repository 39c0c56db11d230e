"""Reports: Markdown and CSV tables in the paper's layouts, privacy statements and PNG plots.

    paczero report runs/            # writes runs/report/{report.md, runs.csv, cells.csv, plots/*.png}

Every folder under RUNS_DIR holding a ``summary.json`` is a run. Runs are grouped
into cells by the recipe ``paczero sweep`` recorded beside them (``seed<k>.yaml``),
else by their folder: ``RUNS_DIR/<recipe>/seed<k>/`` belongs to cell ``<recipe>``.
Runs of one recipe whose settings differ (other than :data:`EXECUTION_KEYS`: seed,
device, batching, ...) are separate cells, named with the differing keys; a cell
whose settings differ from its shipped recipe says which, next to the paper's
figure. A cell's numbers are the mean and sample standard deviation (ddof = 1, as
in the paper) over its seeds, with n. Metrics are reported in percent (accuracy
for SST-2, F1 for SQuAD).

Tables follow the paper where the cell's table is known (the first component
of a shipped recipe name): ``headline`` (track x method rows, task x model
columns), ``plateau``/``plateau-lora`` (MI columns; dev, test and unanimity
rows), ``dp-cliff`` (method rows, epsilon columns); every other cell appears in
the per-cell table. The paper's published numbers
(``paczero/recipes/paper_results.csv``) are shown next to ours and overlaid on
the plots as a reference series.
"""
from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

PAPER_RESULTS = Path(__file__).parent / "recipes" / "paper_results.csv"
DP_MECHANISMS = ("dpzero", "dp-aggzo")
RUN_COLUMNS = ["cell", "table", "seed", "task", "model", "track", "mechanism", "mi_budget", "epsilon",
               "num_directions", "steps", "lr", "clip", "metric", "test", "dev", "zero_shot_test", "selected_step",
               "unanimity_rate", "free_frac", "mi_bound", "mia_bound", "matched_dp_epsilon", "mi_spent_realised",
               "epsilon_rdp", "epsilon_pld", "delta", "noise_multiplier", "sample_rate", "seconds_per_step", "run_dir"]
CELL_COLUMNS = ["cell", "table", "method", "task", "model", "track", "steps", "n", "seeds", "test_mean", "test_std",
                "dev_mean", "dev_std", "unanimity_mean", "mi_bound_max", "mia_bound_max", "mi_spent_realised_max",
                "paper_test", "paper_std", "paper_n", "recipe_changed"]


# ---------------------------------------------------------------------------- loading
@dataclass
class Run:
    cell: str
    table: str
    run_dir: Path
    summary: dict

    @property
    def cfg(self) -> dict:
        return self.summary["config"]

    @property
    def privacy(self) -> dict:
        return self.summary.get("privacy") or {}

    def metric(self, split: str) -> float | None:
        """The task metric on ``split`` ("test", "dev"), in percent."""
        values = self.summary.get(split) or {}
        v = values.get(self.summary.get("metric", "accuracy"))
        return None if v is None else 100.0 * float(v)

    @property
    def zero_shot_test(self) -> float | None:
        zs = (self.summary.get("zero_shot") or {}).get("test") or {}
        v = zs.get(self.summary.get("metric", "accuracy"))
        return None if v is None else 100.0 * float(v)


def find_runs(runs_dir: str | Path, *, exclude: Path | None = None) -> list[Run]:
    """Every run (a folder with summary.json) under ``runs_dir``, sorted by cell and seed."""
    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        raise ValueError(f"runs folder {str(runs_dir)!r} does not exist")
    runs = []
    for path in sorted(root.rglob("summary.json")):
        run_dir = path.parent
        if exclude is not None and exclude in run_dir.parents:
            continue
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if "config" not in summary:
            continue
        cell = _recorded_recipe(run_dir)
        if cell is None:
            rel = run_dir.relative_to(root)
            cell_path = rel.parent if re.fullmatch(r"seed\d+", rel.name) and rel.parent != Path(".") else rel
            cell = str(cell_path) if str(cell_path) != "." else run_dir.name
        runs.append(Run(cell, cell.split("/")[0] if "/" in cell else "other", run_dir, summary))
    return sorted(runs, key=lambda r: (r.cell, r.cfg.get("seed", 0)))


def _recorded_recipe(run_dir: Path) -> str | None:
    """The recipe a sweep ran in ``run_dir``: the name in the header of its ``seed<k>.yaml`` beside it."""
    import yaml

    materialised = run_dir.with_name(run_dir.name + ".yaml")
    try:
        header = (yaml.safe_load(materialised.read_text()) or {}).get("recipe") or {}
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        return None
    name = header.get("name") if isinstance(header, dict) else None
    return str(name) if name else None


def load_paper_results(path: Path = PAPER_RESULTS) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------- statistics
def mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation (ddof = 1; None for one value) and n, ignoring missing values."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None), len(xs)


def fmt_ms(mean: float | None, std: float | None, n: int, digits: int = 2) -> str:
    """``89.51 ± 1.12 (n=4)``, as in the paper; ``60.55 (n=1)`` for one seed; ``—`` for none."""
    if mean is None:
        return "—"
    core = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
    return f"{core} (n={n})"


def method_label(cfg: dict) -> str:
    mech, k = cfg.get("mechanism"), cfg.get("num_directions", 1)
    if mech == "pac-mi":
        label = f"PAC-MI {cfg.get('mi_budget'):g}"
        if cfg.get("schedule") == "uniform":
            label += " uniform"
    elif mech == "pac-zpl":
        label = "PAC-ZPL"
    elif mech == "hybrid":
        label = f"hybrid {cfg.get('mi_budget'):g}@{cfg.get('switch_step')}"
    elif mech == "dpzero":
        return f"DPZero K=1 ε={cfg.get('epsilon'):g}"
    elif mech == "dp-aggzo":
        return f"DP-AggZO K={k} ε={cfg.get('epsilon'):g}"
    else:
        label = str(mech)
    return label + (f" K={k}" if k and k > 1 else "")


def model_label(model: str) -> str:
    m = re.search(r"opt-(\d+(?:\.\d+)?)b", model.lower())
    return f"{m.group(1)}B" if m else model.split("/")[-1]


#: config keys that say where and how a run was executed, not what it measures: runs that differ only in
#: these pool into one cell (the seed is what a cell's runs differ in)
EXECUTION_KEYS = frozenset({"seed", "private_seed", "out_dir", "overwrite", "resume", "progress", "device",
                            "device_map", "token_budget", "lockstep_batches", "compile", "checkpoint_every",
                            "eval_zero_shot"})


def experiment(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in EXECUTION_KEYS}


@dataclass
class Cell:
    """The runs of one recipe (one cell of a table), over seeds, all with the same settings.
    ``changed``: the keys whose values differ from the shipped recipe of the same name (its paper figure is
    then a reference for another experiment)."""
    name: str
    table: str
    runs: list[Run] = field(default_factory=list)
    paper: dict | None = None
    changed: list[str] = field(default_factory=list)

    @property
    def cfg(self) -> dict:
        return self.runs[0].cfg

    def stat(self, what: str) -> tuple[float | None, float | None, int]:
        if what in ("test", "dev"):
            return mean_std(r.metric(what) for r in self.runs)
        if what == "unanimity":
            return mean_std(_pct(r.privacy.get("unanimity_rate")) for r in self.runs)
        raise KeyError(what)

    def text(self, what: str = "test", paper: bool = True) -> str:
        s = fmt_ms(*self.stat(what))
        if paper and self.paper and what == "test" and self.paper.get("reported_test"):
            std = self.paper.get("std")
            s += f" [paper {float(self.paper['reported_test']):.2f}" + (f" ± {float(std):.2f}" if std else "")
            s += (f"; recipe changed: {', '.join(self.changed)}]" if self.changed else "]")
        return s


def _pct(v: Any) -> float | None:
    return None if v is None else 100.0 * float(v)


def group_cells(runs: list[Run], paper_rows: list[dict]) -> list[Cell]:
    """One cell per recipe and settings: runs of one recipe with other settings (a sweep re-run with other
    ``--set`` values) are separate cells, named with the keys that tell them apart."""
    by_recipe = {r["recipe"]: r for r in paper_rows if r.get("recipe")}
    variants: dict[str, dict[str, list[Run]]] = defaultdict(dict)
    for run in runs:
        variants[run.cell].setdefault(json.dumps(experiment(run.cfg), sort_keys=True, default=str), []).append(run)
    cells = []
    for name, groups in variants.items():
        configs = [experiment(g[0].cfg) for g in groups.values()]
        differing = sorted(k for k in set().union(*configs) if len({json.dumps(c.get(k), default=str)
                                                                     for c in configs}) > 1)
        for group, cfg in zip(groups.values(), configs):
            label = name if not differing else f"{name} [{' '.join(f'{k}={cfg.get(k)}' for k in differing)}]"
            cells.append(Cell(label, group[0].table, group, paper=by_recipe.get(name),
                              changed=_changed_from_recipe(name, cfg)))
    return cells


def _changed_from_recipe(name: str, cfg: dict) -> list[str]:
    """The keys a shipped recipe ``name`` sets that ``cfg`` holds with another value ([] for no such recipe)."""
    from paczero.cli import recipes_root
    from paczero.config import load_yaml

    path = recipes_root() / f"{name}.yaml"
    if not path.is_file():
        return []
    recipe = load_yaml(path)
    return sorted(k for k, v in recipe.items()
                  if k not in EXECUTION_KEYS and json.dumps(cfg.get(k), default=str) != json.dumps(v, default=str))


# ---------------------------------------------------------------------------- tables
def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def esc(x: Any) -> str:
        return "" if x is None else str(x).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in rows]
    return "\n".join(lines)


def pivot(cells: list[Cell], row_key, col_key, value) -> tuple[list[str], list[list[str]]]:
    """A paper-style grid: one row per row_key(cell), one column per col_key(cell)."""
    rows: dict[Any, dict[Any, str]] = defaultdict(dict)
    cols: list[Any] = []
    for c in cells:
        r, k = row_key(c), col_key(c)
        rows[r][k] = value(c)
        if k not in cols:
            cols.append(k)
    cols = sorted(cols, key=_sort_key)
    out = [[*(_as_tuple(r)), *(rows[r].get(k, "—") for k in cols)] for r in sorted(rows, key=_sort_key)]
    return [str(_label(k)) for k in cols], out


def _as_tuple(x: Any) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _label(k: Any) -> str:
    return " ".join(str(p) for p in _as_tuple(k))


def _sort_key(k: Any):
    return tuple((0, p, "") if isinstance(p, (int, float)) else (1, 0, str(p)) for p in _as_tuple(k))


def headline_table(cells: list[Cell], paper: bool) -> str:
    cols, rows = pivot(cells, lambda c: (c.cfg["track"].replace("lora", "LoRA").replace("ft", "FT"), method_label(c.cfg)),
                       lambda c: (_task_label(c.cfg["task"]), model_label(c.cfg["model"])),
                       lambda c: c.text("test", paper))
    return markdown_table(["Track", "Method", *cols], rows)


def plateau_table(cells: list[Cell], paper: bool) -> str:
    cells = sorted(cells, key=lambda c: c.cfg.get("mi_budget") or 0.0)
    header = ["MI (nats)", *(f"{c.cfg.get('mi_budget'):g}" for c in cells)]
    rows = [["dev %", *(fmt_ms(*c.stat("dev")) for c in cells)],
            ["test %", *(fmt_ms(*c.stat("test")) for c in cells)],
            ["unanimity f %", *(fmt_ms(*c.stat("unanimity"), digits=1) for c in cells)]]
    if paper and any(c.paper for c in cells):
        rows.append(["paper test %", *((c.paper or {}).get("reported_test", "—") for c in cells)])
        rows.append(["paper f %", *((c.paper or {}).get("free_frac", "—") or "—" for c in cells)])
    return markdown_table(header, rows)


def dp_cliff_table(cells: list[Cell], paper: bool) -> str:
    def row(c: Cell):
        name = "DPZero" if c.cfg["mechanism"] == "dpzero" else ("DP-AggZO" if c.cfg["mechanism"] == "dp-aggzo"
                                                                else method_label(c.cfg))
        return (f"{name} K={c.cfg.get('num_directions', 1)} {c.cfg['track'].upper()}", c.cfg["steps"])
    cols, rows = pivot(cells, row, lambda c: c.cfg.get("epsilon") if c.cfg.get("epsilon") is not None else math.inf,
                       lambda c: c.text("test", paper))
    return markdown_table(["Method", "T", *(f"ε={c}" if c != "inf" else "—" for c in cols)], rows)


def cell_table(cells: list[Cell], paper: bool) -> str:
    rows = []
    for c in cells:
        rows.append([c.name, method_label(c.cfg), _task_label(c.cfg["task"]), model_label(c.cfg["model"]),
                     c.cfg["track"], c.cfg["steps"], c.text("test", paper), fmt_ms(*c.stat("dev")),
                     fmt_ms(*c.stat("unanimity"), digits=1)])
    return markdown_table(["Cell", "Method", "Task", "Model", "Track", "T", "Test %", "Dev %", "Unanimity %"], rows)


def privacy_rows(run: Run) -> dict[str, Any]:
    """The run's guarantee (``mi_bound``, ``mia_bound``, ``matched_dp_epsilon``; DP: its (ε, δ) and the MIA
    bound of the target) and, for PAC runs, the realised spend as its own column (``mi_spent_realised``:
    one run's sum of per-release charges, not a bound)."""
    p, cfg = run.privacy, run.cfg
    out = {"mi_bound": None, "mia_bound": p.get("mia_bound"), "matched_dp_epsilon": None, "mi_spent_realised": None,
           "epsilon_rdp": None, "epsilon_pld": None, "delta": None, "noise_multiplier": None, "sample_rate": None}
    if cfg.get("mechanism") in DP_MECHANISMS:
        out.update({k: p.get(k) for k in ("epsilon_rdp", "epsilon_pld", "delta", "noise_multiplier", "sample_rate")})
    elif p.get("private") is not False:
        out.update(mi_bound=p.get("mi_bound"), matched_dp_epsilon=p.get("matched_dp_epsilon"),
                   mi_spent_realised=p.get("mi_spent"))
        if "mi_bound" not in p and p.get("mi_total_budget") is not None:
            # a statement that names no bound: the guarantee is its budget's (Theorem 1)
            from paczero.privacy import dp_epsilon_matching_mi, mia_bound

            b = float(p["mi_total_budget"])
            out.update(mi_bound=b, mia_bound=mia_bound(b), matched_dp_epsilon=dp_epsilon_matching_mi(b) if b else 0.0)
    return out


def privacy_table(runs: list[Run]) -> str:
    rows = []
    for r in runs:
        p = r.privacy
        if r.cfg.get("mechanism") in DP_MECHANISMS:
            stmt = (f"({_g(p.get('epsilon_rdp'))}, {_g(p.get('delta'))})-DP by RDP; ε={_g(p.get('epsilon_pld'))} by PLD; "
                    f"σ={_g(p.get('noise_multiplier'))}, q={_g(p.get('sample_rate'))}, {p.get('steps')} steps")
        elif p.get("private") is False:
            stmt = "non-private reference (no claim)"
        else:
            g = privacy_rows(r)
            stmt = (f"I(S*; transcript) ≤ {_g(g['mi_bound'])} nats"
                    + f"; matched DP ε={_g(g['matched_dp_epsilon'])} (reference only, δ=1e-5)"
                    + f"; realised spend {_g(p.get('mi_spent'))} nats (this run, not a bound)")
            if p.get("secret_source") not in (None, "os-entropy"):
                stmt += "; FIXED private seed (not private)"
        rows.append([r.cell, r.cfg.get("seed"), method_label(r.cfg), stmt, _g(privacy_rows(r)["mia_bound"])])
    return markdown_table(["Cell", "Seed", "Method", "Privacy statement", "MIA bound"], rows)


def _g(v: Any) -> str:
    return "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def _task_label(task: str) -> str:
    return {"sst2": "SST-2", "squad": "SQuAD", "demo": "demo"}.get(task, task)


# ---------------------------------------------------------------------------- plots
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
            key = c.table if c.table.startswith("plateau") else \
                f"{_task_label(c.cfg['task'])} {model_label(c.cfg['model'])} {c.cfg['track']}"
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
    """Test accuracy vs epsilon for DP cells, with the PAC-ZPL level (MI = 0) as a horizontal line."""
    dp = [c for c in cells if c.cfg["mechanism"] in DP_MECHANISMS]
    if not dp:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    series: dict[tuple, list[Cell]] = defaultdict(list)
    for c in dp:
        series[(c.cfg["mechanism"], c.cfg.get("num_directions", 1), c.cfg["steps"])].append(c)
    for (mech, k, steps), cs in sorted(series.items()):
        cs = sorted(cs, key=lambda c: c.cfg["epsilon"])
        stats = [c.stat("test") for c in cs]
        name = "DPZero" if mech == "dpzero" else "DP-AggZO"
        ax.errorbar([c.cfg["epsilon"] for c in cs], [s[0] for s in stats], yerr=[s[1] or 0.0 for s in stats],
                    marker="o", capsize=3, label=f"{name} K={k} T={steps} (ours)")
    ref = dp[0].cfg
    zpl = [c for c in cells if c.cfg["mechanism"] == "pac-zpl" and c.cfg["task"] == ref["task"]
           and c.cfg["model"] == ref["model"] and c.cfg["track"] == ref["track"]]
    if zpl:
        m, s, n = mean_std(r.metric("test") for c in zpl for r in c.runs)
        ax.axhline(m, color="k", label=f"PAC-ZPL, MI = 0 (ours, n={n})")
        if s:
            ax.axhspan(m - s, m + s, color="k", alpha=0.1)
    if overlay:
        for mech, k, steps in sorted({(r["mechanism"], r["num_directions"], r["steps"]) for r in paper_rows
                                       if r["table"] == "dp-cliff"}):
            pts = sorted((float(r["epsilon"]), float(r["reported_test"])) for r in paper_rows
                         if r["table"] == "dp-cliff" and (r["mechanism"], r["num_directions"], r["steps"]) == (mech, k, steps))
            if len(pts) > 1:
                ax.plot(*zip(*pts), "--", marker="x", alpha=0.6,
                        label=f"paper: {'DPZero' if mech == 'dpzero' else 'DP-AggZO'} K={k}")
        zp = [r for r in paper_rows if r["recipe"] == f"headline/{ref['task']}-opt{model_label(ref['model']).lower()}-"
              f"{ref['track']}-zpl"]
        if zp:
            ax.axhline(float(zp[0]["reported_test"]), color="k", ls="--", alpha=0.6, label="paper: PAC-ZPL, MI = 0")
    ax.set_xscale("log")
    ax.set_xlabel("DP ε (δ = 1e-5, log scale)")
    ax.set_ylabel("test %")
    ax.set_title("The DP-ZO cliff vs PAC-ZPL at MI = 0")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def read_log(run_dir: Path) -> list[dict]:
    path = run_dir / "log.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


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
    ax.plot(steps, [r.get("cum_mi", 0.0) for r in log], color="tab:red", label="cumulative MI charged, this run (nats)")
    if run.cfg.get("mi_budget"):
        ax.axhline(run.cfg["mi_budget"], color="tab:red", ls=":", alpha=0.6, label="MI budget (the guarantee)")
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
    ax.set_title(f"{run.cell} seed {run.cfg.get('seed')}", fontsize=9)
    return _save(fig, path)


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
def run_row(run: Run) -> dict[str, Any]:
    cfg, p = run.cfg, run.privacy
    steps = p.get("steps") or cfg.get("steps")
    return {
        "cell": run.cell, "table": run.table, "seed": cfg.get("seed"), "task": cfg.get("task"),
        "model": cfg.get("model"), "track": cfg.get("track"), "mechanism": cfg.get("mechanism"),
        "mi_budget": cfg.get("mi_budget"), "epsilon": cfg.get("epsilon"), "num_directions": cfg.get("num_directions"),
        "steps": cfg.get("steps"), "lr": cfg.get("lr"), "clip": cfg.get("clip"), "metric": run.summary.get("metric"),
        "test": run.metric("test"), "dev": run.metric("dev"), "zero_shot_test": run.zero_shot_test,
        "selected_step": run.summary.get("selected_step"), "unanimity_rate": p.get("unanimity_rate"),
        "free_frac": (p["free_steps"] / steps) if p.get("free_steps") is not None and steps else None,
        **privacy_rows(run), "seconds_per_step": run.summary.get("seconds_per_step"), "run_dir": str(run.run_dir),
    }


def cell_row(c: Cell) -> dict[str, Any]:
    t, d, u = c.stat("test"), c.stat("dev"), c.stat("unanimity")
    rows = [privacy_rows(r) for r in c.runs]
    bounds = [x["mi_bound"] for x in rows if x["mi_bound"] is not None]
    mias = [x["mia_bound"] for x in rows if x["mia_bound"] is not None]
    spent = [x["mi_spent_realised"] for x in rows if x["mi_spent_realised"] is not None]
    p = c.paper or {}
    return {"cell": c.name, "table": c.table, "method": method_label(c.cfg), "task": c.cfg.get("task"),
            "model": c.cfg.get("model"), "track": c.cfg.get("track"), "steps": c.cfg.get("steps"), "n": t[2],
            "seeds": " ".join(str(r.cfg.get("seed")) for r in c.runs), "test_mean": t[0], "test_std": t[1],
            "dev_mean": d[0], "dev_std": d[1], "unanimity_mean": u[0], "mi_bound_max": max(bounds) if bounds else None,
            "mia_bound_max": max(mias) if mias else None,
            "mi_spent_realised_max": max(spent) if spent else None, "paper_test": p.get("reported_test") or None,
            "paper_std": p.get("std") or None, "paper_n": p.get("n") or None,
            "recipe_changed": " ".join(c.changed) or None}


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]))
                        for k in columns})


def write_report(runs_dir: str | Path, out: str | Path | None = None, *, paper_overlay: bool = True,
                 trajectories: str = "first-seed") -> Path:
    """Write report.md, runs.csv, cells.csv and plots/*.png for every run under ``runs_dir``; return the folder.

    ``trajectories``: ``"first-seed"`` (one trajectory plot per cell) or ``"none"``.
    """
    root = Path(runs_dir).expanduser()
    out_dir = Path(out).expanduser() if out else root / "report"
    runs = find_runs(root, exclude=out_dir)
    if not runs:
        raise ValueError(f"no runs (summary.json) under {str(runs_dir)!r}")
    paper_rows = load_paper_results() if paper_overlay else []
    cells = group_cells(runs, paper_rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(out_dir / "runs.csv", RUN_COLUMNS, [run_row(r) for r in runs])
    _write_csv(out_dir / "cells.csv", CELL_COLUMNS, [cell_row(c) for c in cells])

    plots_dir = out_dir / "plots"
    plots = {
        "Accuracy vs MI budget": plot_mi_plateau(cells, paper_rows, plots_dir / "mi_plateau.png", paper_overlay),
        "DP cliff": plot_dp_cliff(cells, paper_rows, plots_dir / "dp_cliff.png", paper_overlay),
        "Unanimity rate per cell": plot_unanimity(cells, plots_dir / "unanimity.png", paper_overlay),
    }
    if trajectories == "first-seed":
        for c in cells:
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", c.name) + f"_seed{c.runs[0].cfg.get('seed')}.png"
            plots[f"Trajectory: {c.name}"] = plot_trajectory(c.runs[0], plots_dir / "trajectories" / name)

    by_table: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        by_table[c.table].append(c)
    md = [f"# paczero report: {root}", "",
          f"{len(runs)} runs in {len(cells)} cells. Metrics in percent (SST-2/demo: accuracy, SQuAD: F1) on the test "
          "split, at the dev-selected weights; mean ± sample std (ddof = 1) over seeds, with n."
          + (" [paper ...]: the paper's published figure for the cell (\"recipe changed\": these runs' settings "
             "differ from the recipe's in the keys named, so it is a reference for another experiment)."
             if paper_overlay else "")
          + " Runs of one recipe with other settings are separate cells, named with the keys that differ.", ""]
    layouts = {"headline": headline_table, "plateau": plateau_table, "plateau-lora": plateau_table,
               "dp-cliff": dp_cliff_table}
    for table in sorted(by_table):
        layout = layouts.get(table)
        if layout and any(c.name != c.runs[0].cell for c in by_table[table]):
            layout = None  # cells of one recipe with other settings would share a place in the paper's grid
            md += [f"## {table}", "", "Runs of one recipe with other settings: one row per setting.", ""]
        else:
            md += [f"## {table}", ""]
        md += [(layout or cell_table)(by_table[table], paper_overlay), ""]
        if layout:
            md += [cell_table(by_table[table], paper_overlay), ""]
    md += ["## Privacy statement per run", "",
           "PAC runs: the guarantee, I(S*; transcript) ≤ the MI budget (0 for PAC-ZPL), its bound on the informed "
           "adversary's MIA success (prior 0.5) and the DP ε with the same MIA bound (a reference point only; PAC "
           "Privacy is not DP); then the run's realised spend, the sum of its per-release MI charges: one run's value, "
           "not a bound (the guarantee bounds its expectation). DP runs: (ε, δ) by the RDP and PLD accountants; "
           "the MIA bound is the target (ε, δ)'s.", "", privacy_table(runs), ""]
    md += ["## Plots", ""]
    for title, p in plots.items():
        if p is not None:
            md.append(f"- {title}: [{p.relative_to(out_dir)}]({p.relative_to(out_dir)})")
    (out_dir / "report.md").write_text("\n".join(md) + "\n")
    return out_dir
