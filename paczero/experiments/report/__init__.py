"""Reports: Markdown and CSV tables in the paper's layouts, privacy statements and PNG plots.

    paczero report runs/            # writes runs/report/{report.md, runs.csv, cells.csv, plots/}

Every folder under RUNS_DIR holding a ``summary.json`` is a run. Runs are grouped
into cells by the recipe ``paczero sweep`` recorded beside them (``seed<k>.yaml``),
else by their folder: ``RUNS_DIR/<recipe>/seed<k>/`` belongs to cell ``<recipe>``; runs outside
a sweep (each in its own folder) with one configuration pool into one cell named by their folders.
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
the per-cell table. Ladder runs (``rungs``) add a T-ladder table under their
table, one row per rung of one run per seed, and ``rungs.csv``. The paper's
published numbers (``paczero/recipes/paper_results.csv``) are shown next to
ours and overlaid on the plots as a reference series.
"""
from __future__ import annotations

import csv
import os
import re
from collections import defaultdict
from pathlib import Path

from paczero.experiments.report.cells import (CELL_COLUMNS, RUN_COLUMNS, Cell, Run, cell_row, experiment, find_runs, fmt_ms,
                                  group_cells, load_paper_results, mean_std, read_log, run_row)
from paczero.experiments.report.ladder import RUNG_COLUMNS, ladder_table, rung_rows
from paczero.config import DP_MECHANISMS
from paczero.experiments.report import paths, provenance
from paczero.experiments.report.tuned import (BY_DEV_LOSS, TUNED_TABLES, chosen_cells, plot_budget, plot_tuned,
                                              tuned_headline, tuned_table)
from paczero.experiments.report.plots import (plot_curves, plot_dp_cliff, plot_mi_plateau, plot_privacy_utility, plot_trajectory,
                                  plot_unanimity)
from paczero.experiments.report.tables import (cell_table, comparison_table, dp_cliff_table, headline, headline_table,
                                   plateau_table, privacy_table)
__all__ = ["write_report", "find_runs", "group_cells", "experiment", "read_log", "mean_std", "fmt_ms",
           "Run", "Cell", "RUN_COLUMNS", "CELL_COLUMNS"]


TITLE = "# paczero report: "  # the first line of every report; a Markdown file without it is not overwritten


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]))
                        for k in columns})


def _selection_note(runs: list[Run]) -> str:
    """Which dev metric chose the released weights, with how many runs each (summary.json's select_metric)."""
    counts: dict[str, int] = defaultdict(int)
    for r in runs:
        chosen = r.summary.get("select_metric") or (r.summary.get("metric", "accuracy") if r.cfg.get("dev_best", True)
                                                    else "none (final weights)")
        counts[chosen] += 1
    return " Dev-best selection by: " + ", ".join(f"{k} ({n} run{'s' if n > 1 else ''})"
                                                   for k, n in sorted(counts.items())) + "."


def write_report(runs_dir: str | Path, out: str | Path | None = None, *, paper_overlay: bool = True,
                 trajectories: str = "first-seed", markdown: str | Path | None = None, keep_runs: bool = False,
                 report_args: str | None = None) -> Path:
    """Write report.md, runs.csv, cells.csv and plots/*.png for every run under ``runs_dir``; return the folder.

    ``trajectories``: ``"first-seed"`` (per cell: the first seed's trajectory plot and the curves of all its
    runs, ``plots/curves/``) or ``"none"``. ``markdown``: where the Markdown goes (default ``OUT/report.md``;
    its links are relative to it). ``keep_runs``: also copy the runs' small files into ``OUT/runs``
    (:func:`paczero.experiments.report.provenance.keep_runs`), so that ``paczero report OUT/runs`` writes the report again.
    ``report_args``: the options this report was written with, shown in its command (CLI).
    """
    root = Path(runs_dir).expanduser()
    out_dir = Path(out).expanduser() if out else root / "report"
    inside = out_dir.resolve() == root.resolve() or out_dir.resolve() in root.resolve().parents
    runs = find_runs(root, exclude=None if inside else out_dir)  # report OUT/runs: the kept runs are the runs
    if not runs:
        raise ValueError(f"no runs (summary.json) under {str(runs_dir)!r}")
    md_path = Path(markdown).expanduser() if markdown else out_dir / "report.md"
    if md_path.is_dir() or (md_path.is_file() and not md_path.read_text(errors="replace").startswith(TITLE)):
        raise ValueError(f"{str(md_path)!r} exists and is not a paczero report: the report overwrites only its own "
                         "files; give another --markdown path")
    records = provenance.sweep_records(root, exclude=None if inside else out_dir)
    shown = paths.for_report(runs_dir, [*(r.summary for r in runs), *records, *provenance.sweep_configs(runs)],
                             provenance.sweep_root(records))  # no absolute path of this machine in what it writes
    for r in runs:
        r.summary = shown.config(r.summary)
    shown_root = shown(provenance.sweep_root(records) or str(runs_dir))
    paper_rows = load_paper_results() if paper_overlay else []
    cells = group_cells(runs, paper_rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(out_dir / "runs.csv", RUN_COLUMNS, [{**run_row(r), "run_dir": shown(str(r.run_dir))} for r in runs])
    _write_csv(out_dir / "cells.csv", CELL_COLUMNS, [cell_row(c) for c in cells])
    if any(r.rungs for r in runs):
        _write_csv(out_dir / "rungs.csv", RUNG_COLUMNS, [{**row, "run_dir": shown(row.get("run_dir"))}
                                                         for row in rung_rows(runs)])

    plots = _plots(cells, paper_rows, out_dir / "plots", paper_overlay, trajectories)
    md = [f"{TITLE}{shown_root}", "",
          f"{len(runs)} run{'s' if len(runs) != 1 else ''} in {len(cells)} cell{'s' if len(cells) != 1 else ''}. "
          "Metrics in percent (SST-2/demo: accuracy, SQuAD: F1) on the test split, at the dev-selected weights; "
          "mean ± sample std (ddof = 1) over seeds, with n."
          + (" [paper ...]: the paper's published figure for the cell (\"recipe changed\": these runs' settings "
             "differ from the recipe's in the keys named, so it is a reference for another experiment)."
             if paper_overlay else "")
          + " Runs of one recipe with other settings are separate cells, named with the keys that differ."
          + _selection_note(runs), ""]
    dp_runs = {(r.cell, r.seed) for r in runs if r.cfg.get("mechanism") in DP_MECHANISMS}
    md += _table_sections(cells, paper_overlay, provenance.wall_seconds(records, dp_runs))
    md += ["## Privacy statement per run", "",
           "PAC runs: the guarantee, I(S*; transcript) ≤ the MI budget (0 for PAC-ZPL), its bound on the informed "
           "adversary's MIA success (prior 0.5) and the DP ε with the same MIA bound (a reference point only; PAC "
           "Privacy is not DP); then the run's realised spend, the sum of its per-release MI charges: one run's value, "
           "not a bound (the guarantee bounds its expectation). DP runs: (ε, δ) by the RDP and PLD accountants; "
           "the MIA bound is the target (ε, δ)'s.", "", privacy_table(runs), ""]
    md += ["## Plots", ""]
    for title, p in plots.items():
        if p is not None:
            link = Path(os.path.relpath(p, md_path.parent)).as_posix()
            md.append(f"- {title}: [{link}]({link})")
    md += ["", *provenance.made_by(runs, records, shown_root, None if report_args is None else shown.words(report_args))]
    if keep_runs:
        provenance.keep_runs(runs, root, out_dir / "runs", shown)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text("\n".join(md) + "\n")
    return out_dir


def _plots(cells: list[Cell], paper_rows: list, plots_dir: Path, paper_overlay: bool, trajectories: str) -> dict:
    """The report's plots, by title (None where a plot has nothing to show). A learning-rate-tuned table's
    cells are grid points: its privacy-utility plot, MI plateau and DP cliff show the chosen ones."""
    tuned = {t: [c for c in cells if c.table == t] for t in TUNED_TABLES}
    untuned = [c for c in cells if c.table not in TUNED_TABLES]
    results = untuned + [c for cs in tuned.values() for c in chosen_cells(cs)]
    plots = {
        "Accuracy vs MI budget": plot_mi_plateau(results, paper_rows, plots_dir / "mi_plateau.png", paper_overlay),
        "DP cliff": plot_dp_cliff(results, paper_rows, plots_dir / "dp_cliff.png", paper_overlay),
        "Unanimity rate per cell": plot_unanimity(cells, plots_dir / "unanimity.png", paper_overlay),
        "Privacy against utility": plot_privacy_utility(untuned, plots_dir / "privacy_utility.png"),
    }
    for t, cs in tuned.items():  # cpu-tuned's file keeps its name
        name = "privacy_utility_tuned.png" if t == "cpu-tuned" else f"privacy_utility_{t}.png"
        plots[f"Privacy against utility, {t} (chosen learning rates)"] = plot_tuned(cs, plots_dir / name)
        if t in BY_DEV_LOSS:
            plots[f"Budget, {t}: dev loss against example forwards (chosen learning rates)"] = plot_budget(
                cs, plots_dir / f"budget_{t}.png")
    if trajectories == "first-seed":
        for c in cells:
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", c.name)
            plots[f"Trajectory: {c.name}"] = plot_trajectory(c.runs[0], plots_dir / "trajectories"
                                                             / f"{stem}_seed{c.runs[0].seed}.png")
            plots[f"Curves: {c.name}"] = plot_curves(c, plots_dir / "curves" / f"{stem}.png")
    return plots


def _table_sections(cells: list[Cell], paper_overlay: bool, walls) -> list[str]:
    """The Markdown of each table's cells: the table's own layout where it has one, else one row per cell, its
    scope and its T-ladders."""
    md: list[str] = []
    by_table: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        by_table[c.table].append(c)
    layouts = {"headline": headline_table, "plateau": plateau_table, "plateau-lora": plateau_table,
               "dp-cliff": dp_cliff_table,
               "cpu-scale": lambda cs, _paper: "\n\n".join(filter(None, [headline(cs), comparison_table(cs, walls)])),
               **{t: lambda cs, _paper: "\n\n".join(filter(None, [tuned_headline(cs), tuned_table(cs)]))
                  for t in TUNED_TABLES}}
    complete = {"cpu-scale", *TUNED_TABLES}  # layouts that show every figure of the per-cell table
    for table in sorted(by_table):
        layout = layouts.get(table)
        if layout and any(c.name != c.runs[0].cell for c in by_table[table]):
            layout = None  # cells of one recipe with other settings would share a place in the paper's grid
            md += [f"## {table}", "", "Runs of one recipe with other settings: one row per setting.", ""]
        else:
            md += [f"## {table}", ""]
        md += [(layout or cell_table)(by_table[table], paper_overlay), ""]
        if layout and table not in complete:
            md += [cell_table(by_table[table], paper_overlay), ""]
        md += provenance.table_scope(table)
        ladders = [c for c in by_table[table] if any(r.rungs for r in c.runs)]
        if ladders:
            md += [f"### {table}: T-ladders", "",
                   "One run per seed, its weights saved and evaluated at each rung T of that one trajectory (the "
                   "learning-rate schedule spans the last rung). Dev-best rung: each seed's rung with the best dev "
                   "metrics (by its selection metric; a choice that reads dev only).", "",
                   ladder_table(ladders, paper_overlay), ""]
    return md
