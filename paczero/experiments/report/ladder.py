"""A report's T-ladders: the rungs of one run per seed (summary.json ``rungs``), one row per rung."""
from __future__ import annotations

from typing import Any

from paczero.experiments.report.cells import Cell, Run, dev_best_rung, fmt_ms, mean_std
from paczero.experiments.report.tables import markdown_table

RUNG_COLUMNS = ["cell", "seed", "rung", "dev", "test", "dev_best_step", "dev_best_test", "mi_spent_realised",
                "weights", "run_dir"]


def rung_rows(runs: list[Run]) -> list[dict[str, Any]]:
    """One row per run and rung (rungs.csv); metrics in percent."""
    rows = []
    for run in runs:
        for r in run.rungs:
            best = r.get("dev_best") or {}
            rows.append({"cell": run.cell, "seed": run.seed, "rung": r["step"], "dev": run.rung_metric(r, "dev"),
                         "test": run.rung_metric(r, "test"), "dev_best_step": best.get("step"),
                         "dev_best_test": run.rung_metric(best, "test") if best else None,
                         "mi_spent_realised": r.get("mi_spent_realised"), "weights": r.get("weights"),
                         "run_dir": str(run.run_dir)})
    return rows


def ladder_table(cells: list[Cell], paper: bool) -> str:
    """Each ladder cell's rungs: the weights of each seed's one trajectory at rung T (mean ± std over seeds), the
    dev-best weights of the prefix up to T where the runs selected on dev, then each seed's dev-best rung."""
    rows = []
    for c in cells:
        steps = sorted({r["step"] for run in c.runs for r in run.rungs})
        for t in steps:
            at = [(run, next((r for r in run.rungs if r["step"] == t), None)) for run in c.runs]
            prefix = [run.rung_metric(r["dev_best"], "test") for run, r in at if r and r.get("dev_best")]
            rows.append([c.name, t, fmt_ms(*mean_std(run.rung_metric(r, "dev") for run, r in at)),
                         fmt_ms(*mean_std(run.rung_metric(r, "test") for run, r in at)),
                         fmt_ms(*mean_std(prefix)) if prefix else "—",
                         _figure(c.paper_rungs.get(t)) if paper else "—"])
        chosen = [dev_best_rung(run) for run in c.runs]
        rows.append([c.name, "dev-best rung: " + ", ".join(str(r["step"]) if r else "—" for r in chosen),
                     fmt_ms(*mean_std(run.rung_metric(r, "dev") for run, r in zip(c.runs, chosen))),
                     fmt_ms(*mean_std(run.rung_metric(r, "test") for run, r in zip(c.runs, chosen))), "—",
                     _figure(c.paper) if paper and c.by_dev_best_rung else "—"])
    return markdown_table(["Cell", "Rung T", "Dev %", "Test %", "Test %, dev-best of the prefix", "Paper test %"],
                          rows)


def _figure(row: dict | None) -> str:
    if not row or not row.get("reported_test"):
        return "—"
    std = row.get("std")
    return f"{float(row['reported_test']):.2f}" + (f" ± {float(std):.2f}" if std else "")
