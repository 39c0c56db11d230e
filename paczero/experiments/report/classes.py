"""Each class's recall on test for a tuned table's chosen cells: the base model's (zero-shot) beside the released
model's, from the same runs (summary.json ``zero_shot.test_recall`` and ``test_recall``, recorded by every
classification run), so that a reader sees which classes a method gained on and which it gave up."""
from __future__ import annotations

import statistics

from paczero.experiments.report.cells import Cell


def _mean(values: list) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100.0 * x:.1f}"


def recall_section(named: list[tuple[str, Cell]]) -> str:
    """A note and a table: per chosen cell (``(label, cell)``), each class's test recall in percent, the zero-shot
    figure → the released model's, means over the cell's runs that record both, with their number n; empty where
    no run records them (a task other than classification, or runs older than the record)."""
    classes: list[str] = []
    rows = []
    for label, cell in named:
        runs = [r for r in cell.runs if r.summary.get("test_recall") and
                (r.summary.get("zero_shot") or {}).get("test_recall")]
        if not runs:
            continue
        for run in runs:
            classes += [name for name in run.summary["test_recall"] if name not in classes]
        rows.append((label, runs))
    if not rows:
        return ""
    table = ["| Method | n | " + " | ".join(classes) + " |", "|---|---|" + "---|" * len(classes)]
    for label, runs in rows:
        entries = []
        for name in classes:
            zero = _mean([r.summary["zero_shot"]["test_recall"].get(name) for r in runs])
            tuned = _mean([r.summary["test_recall"].get(name) for r in runs])
            entries.append(f"{_pct(zero)} → {_pct(tuned)}")
        table.append(f"| {label} | {len(runs)} | " + " | ".join(entries) + " |")
    note = ("Per-class recall on test, % (the share of each class's test rows predicted as that class): the base "
            "model's from the run's own prompt → the released model's, means over the chosen cell's runs (n).")
    return note + "\n\n" + "\n".join(table)
