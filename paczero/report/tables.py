"""A report's Markdown tables: the paper's layouts (headline, plateau, dp-cliff), per cell, per run's privacy."""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from typing import Any

from paczero.config import DP_MECHANISMS
from paczero.report.cells import (DP_NAMES, Cell, Run, _g, _task_label, fmt_ms, mean_std, method_label, model_label,
                                  privacy_rows)


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
        name = DP_NAMES.get(c.cfg["mechanism"]) or method_label(c.cfg)
        return (f"{name} K={c.cfg.get('num_directions', 1)} {c.cfg['track'].upper()}", c.cfg["steps"])
    cols, rows = pivot(cells, row, lambda c: c.cfg.get("epsilon") if c.cfg.get("epsilon") is not None else math.inf,
                       lambda c: c.text("test", paper))
    return markdown_table(["Method", "T", *(f"ε={c}" if c != "inf" else "—" for c in cols)], rows)


def cell_table(cells: list[Cell], paper: bool) -> str:
    rows = zero_shot_rows(cells)
    for c in cells:
        rows.append([c.name, method_label(c.cfg), _task_data(c.cfg), model_label(c.cfg["model"]),
                     c.cfg["track"], c.cfg["steps"], c.text("test", paper), fmt_ms(*c.stat("dev")),
                     fmt_ms(*c.stat("unanimity"), digits=1)])
    return markdown_table(["Cell", "Method", "Task", "Model", "Track", "T", "Test %", "Dev %", "Unanimity %"], rows)


def _task_data(cfg: dict) -> str:
    """The task, and the data file's name where the run read one (``SST-2 (imdb.jsonl)``)."""
    data = cfg.get("data")
    return _task_label(cfg["task"]) + (f" ({str(data).replace(chr(92), '/').rsplit('/', 1)[-1]})"
                                       if data not in (None, "demo") else "")


#: what fixes the base model's dev and test figures of a run (with its data_seed: which examples are drawn)
ZERO_SHOT_KEYS = ("task", "data", "columns", "labels", "template", "verbalizer", "model", "dtype", "n_train", "n_dev",
                  "n_test", "max_length", "max_new_tokens", "answer_stop")


def zero_shot_rows(cells: list[Cell]) -> list[list[str]]:
    """One row per base model and data setting of ``cells``: the runs' zero-shot evaluation (summary.json
    ``zero_shot``, the base model before any step), one figure per data seed (the runs of one data seed score
    the same model on the same examples), mean ± std over the data seeds. No row where no run has one."""
    groups: dict[str, dict[Any, list[tuple[float | None, float | None]]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        for r in c.runs:
            zs = r.summary.get("zero_shot") or {}
            metric = r.summary.get("metric", "accuracy")
            pct = [None if (zs.get(s) or {}).get(metric) is None else 100.0 * float(zs[s][metric])
                   for s in ("test", "dev")]
            if pct[0] is not None:
                key = json.dumps({k: r.cfg.get(k) for k in ZERO_SHOT_KEYS}, sort_keys=True, default=str)
                groups[key][r.cfg.get("data_seed")].append((pct[0], pct[1]))
    rows = []
    for key, by_seed in groups.items():
        cfg = json.loads(key)
        test = [statistics.fmean(t for t, _ in v) for v in by_seed.values()]
        dev = [statistics.fmean(d for _, d in v) for v in by_seed.values() if all(d is not None for _, d in v)]
        name = "zero-shot" + (f" ({model_label(cfg['model'])})" if len(groups) > 1 else "")
        rows.append([name, "base model, no training", _task_data(cfg), model_label(cfg["model"]), "—", 0,
                     fmt_ms(*mean_std(test)), fmt_ms(*mean_std(dev)), "—"])
    return rows


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
        rows.append([r.cell, r.seed, method_label(r.cfg), stmt, _g(privacy_rows(r)["mia_bound"])])
    return markdown_table(["Cell", "Seed", "Method", "Privacy statement", "MIA bound"], rows)
