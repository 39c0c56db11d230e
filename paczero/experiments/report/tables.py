"""A report's Markdown tables: the paper's layouts (headline, plateau, dp-cliff), per cell, per run's privacy."""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from typing import Any

from paczero.config import DP_MECHANISMS
from paczero.experiments.report.cells import (DP_NAMES, Cell, Run, _g, _task_label, fmt_ms, guarantee, mean_std, method_label,
                                  model_label, privacy_rows, read_log, task_data_label)


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
        rows.append([c.name, method_label(c.cfg), task_data_label(c.cfg), model_label(c.cfg["model"]),
                     c.cfg["track"], c.cfg["steps"], c.text("test", paper), fmt_ms(*c.stat("dev")),
                     fmt_ms(*c.stat("unanimity"), digits=1)])
    return markdown_table(["Cell", "Method", "Task", "Model", "Track", "T", "Test %", "Dev %", "Unanimity %"], rows)


#: what fixes the base model's dev and test figures of a run (with its data_seed: which examples are drawn)
ZERO_SHOT_KEYS = ("task", "data", "columns", "labels", "template", "verbalizer", "model", "dtype", "n_train", "n_dev",
                  "n_test", "max_length", "max_new_tokens", "answer_stop")


def zero_shot_stats(cells: list[Cell]) -> list[tuple[dict, dict[str, tuple]]]:
    """Per base model and data setting of ``cells``: the runs' zero-shot evaluation (summary.json ``zero_shot``,
    the base model before any step), one figure per data seed (the runs of one data seed score the same model
    on the same examples), as (settings, {"test", "dev", "test_loss": mean, std, n over the data seeds})."""
    groups: dict[str, dict[Any, list[tuple]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        for r in c.runs:
            zs = r.summary.get("zero_shot") or {}
            metric = r.summary.get("metric", "accuracy")
            pct = [None if (zs.get(s) or {}).get(metric) is None else 100.0 * float(zs[s][metric])
                   for s in ("test", "dev")]
            if pct[0] is not None:
                key = json.dumps({k: r.asked.get(k) for k in ZERO_SHOT_KEYS}, sort_keys=True, default=str)
                groups[key][r.cfg.get("data_seed")].append((pct[0], pct[1], (zs.get("test") or {}).get("loss")))
    out = []
    for key, by_seed in groups.items():
        def per_seed(i: int) -> list[float]:
            return [statistics.fmean(v[i] for v in vs) for vs in by_seed.values()
                    if all(v[i] is not None for v in vs)]
        out.append((json.loads(key), {"test": mean_std(per_seed(0)), "dev": mean_std(per_seed(1)),
                                      "test_loss": mean_std(per_seed(2))}))
    return out


def zero_shot_rows(cells: list[Cell]) -> list[list[str]]:
    """The per-cell table's zero-shot rows (:func:`zero_shot_stats`); none where no run has a zero-shot figure."""
    stats = zero_shot_stats(cells)
    return [["zero-shot" + (f" ({model_label(cfg['model'])})" if len(stats) > 1 else ""), "base model, no training",
             task_data_label(cfg), model_label(cfg["model"]), "—", 0, fmt_ms(*st["test"]), fmt_ms(*st["dev"]), "—"]
            for cfg, st in stats]


def _comparison_order(c: Cell) -> tuple:
    mech = c.cfg["mechanism"]
    kind = 3 if mech in DP_MECHANISMS else 1 if mech == "pac-zpl" else 2 if mech in ("pac-mi", "hybrid") else 0
    return ({"lora": 0, "ft": 1}.get(c.cfg["track"], 2), c.cfg["track"], kind, mech, c.cfg.get("mi_budget") or 0.0,
            c.cfg.get("epsilon") or 0.0, c.cfg.get("num_directions", 1), c.name)


def headline(cells: list[Cell]) -> str | None:
    """One sentence for a comparison table, per track: PAC-ZPL's test accuracy (MI = 0) beside the non-private
    MeZO and the strictest DP cell (smallest ε, then fewest directions), and the zero-shot base model
    (mean ± std, n). None without a PAC-ZPL cell."""
    parts = []
    for track in ("lora", "ft"):
        mine = [c for c in cells if c.cfg["track"] == track]
        zpl = next((c for c in mine if c.cfg["mechanism"] == "pac-zpl"), None)
        if zpl is None:
            continue
        others = [f"MeZO's {fmt_ms(*c.stat('test'))}" for c in mine if c.cfg["mechanism"] == "mezo"]
        dp = dp_by_epsilon(mine)
        if dp:
            others.append(f"{dp_in_words(dp[0].cfg)}'s {fmt_ms(*dp[0].stat('test'))}")
        parts.append(f"{'LoRA' if track == 'lora' else 'full fine-tuning'}, PAC-ZPL at MI = 0 reaches "
                     f"{fmt_ms(*zpl.stat('test'))}" + (" against " + " and ".join(others) if others else ""))
    if not parts:
        return None
    zero = [fmt_ms(*st["test"]) for _, st in zero_shot_stats(cells)]
    return ("Test accuracy %: " + "; ".join(parts) + (f"; the base model zero-shot: {zero[0]}" if zero else "") + ".")


def dp_by_epsilon(cells: list[Cell]) -> list[Cell]:
    """The DP cells among ``cells``, the strictest ε first (then fewer directions K)."""
    return sorted((c for c in cells if c.cfg["mechanism"] in DP_MECHANISMS),
                  key=lambda c: (c.cfg.get("epsilon") or 0.0, c.cfg.get("num_directions", 1)))


def dp_in_words(cfg: dict) -> str:
    """A DP cell as a headline names it: ``DPZero ε = 2`` (either DPZero code), ``DP-AggZO K = 4 ε = 2``,
    ``DP-SGD ε = 2``."""
    name = ("DPZero" if cfg["mechanism"] in ("dpzero", "dpzero-aggzo1") else "DP-SGD" if cfg["mechanism"] == "dp-sgd"
            else f"DP-AggZO K = {cfg.get('num_directions', 1)}")
    return f"{name} ε = {cfg['epsilon']:g}"


def median_step_seconds(run: Run) -> float | None:
    """The median of a run's step times (log.jsonl ``seconds``): unlike the mean, not moved by a step that
    waited (a paused process, another job on the machine). None for DP runs, which log no time."""
    xs = [float(r["seconds"]) for r in read_log(run.run_dir) if r.get("seconds") is not None]
    return statistics.median(xs) if xs else None


def comparison_table(cells: list[Cell], walls: dict[tuple[str, int], float] | None = None) -> str:
    """Every method of a table side by side, with what a reader weighs against each other: test accuracy and
    loss, unanimity, the guarantee and its MIA bound, the median seconds per step and the minutes of wall time
    of the cell's fastest run (``walls``: the sweep's seconds per (recipe, seed), summed over a run's attempts;
    none for DP runs, whose time depends on their private Poisson batches). A step or a run that waited (a
    paused process, other load on the machine) only takes longer, so the median step and the fastest run
    stand for a quiet machine. The zero-shot rows come first."""
    walls = walls or {}
    rows = [["zero-shot", "—", 0, fmt_ms(*st["test"]), fmt_ms(*st["test_loss"], digits=3), "—",
             "none needed (reads no training data)", "0.5", "—", "—"] for _, st in zero_shot_stats(cells)]
    for c in sorted(cells, key=_comparison_order):
        text, mia = guarantee(c)
        wall = [walls[(r.cell, r.seed)] / 60.0 for r in c.runs if (r.cell, r.seed) in walls
                and c.cfg["mechanism"] not in DP_MECHANISMS]  # a DP run's time depends on its private batches
        rows.append([method_label(c.cfg), c.cfg["track"], c.cfg["steps"], fmt_ms(*c.stat("test")),
                     fmt_ms(*c.stat("test_loss"), digits=3), fmt_ms(*c.stat("unanimity"), digits=1), text,
                     "—" if mia is None else f"{mia:.3f}",
                     f"{statistics.fmean(xs):.2f}" if (xs := [x for r in c.runs
                                                             if (x := median_step_seconds(r)) is not None]) else "—",
                     f"{min(wall):.1f}" if wall else "—"])
    return markdown_table(["Method", "Track", "T", "Test acc %", "Test loss", "Unanimity %", "Guarantee",
                           "MIA bound", "s/step (median)", "min/run (fastest)"], rows)


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
