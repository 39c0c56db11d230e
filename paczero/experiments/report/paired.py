"""Paired statistics of a tuned table's chosen cells: each run's gain over its own zero-shot, a t-interval of a
mean, and the difference between two methods on the data seeds both ran.

A gain or a difference is *resolved* where its 95 % t-interval excludes 0 (:data:`RESOLVED`): the mean ± the
0.975 quantile of Student's t with n - 1 degrees of freedom times s / sqrt(n), s the sample standard deviation
(ddof = 1) of the per-seed values. That is a two-sided one-sample t-test at p < 0.05 on the per-seed values; for
a difference between methods, the paired t-test on the seeds both ran. One seed gives no interval.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter

from paczero.experiments.report.cells import Cell, Run

#: what the report calls a resolved gain or difference, in the words its pages use
RESOLVED = "its 95 % t-interval excludes 0 (a two-sided t-test at p < 0.05 on the per-seed values)"
LEVEL = 0.95


def t_interval(values: list[float], level: float = LEVEL) -> tuple[float | None, float | None, float | None, int]:
    """(mean, low, high, n) of the t-interval of ``values``' mean; low and high are None for fewer than two
    values (and the mean too for none)."""
    from scipy.stats import t

    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return None, None, None, 0
    mean = statistics.fmean(xs)
    if n < 2:
        return mean, None, None, n
    half = float(t.ppf(0.5 + level / 2.0, n - 1)) * statistics.stdev(xs) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def resolved(low: float | None, high: float | None) -> bool:
    """Whether an interval excludes 0 (:data:`RESOLVED`); False without an interval."""
    return low is not None and high is not None and (low > 0.0 or high < 0.0)


def resolved_from(mean: float | None, std: float | None, n: int, level: float = LEVEL) -> bool:
    """:func:`resolved` for a mean ± sample std over n values (the same t-interval, from its summary)."""
    from scipy.stats import t

    if mean is None or std is None or n < 2:
        return False
    return abs(mean) > float(t.ppf(0.5 + level / 2.0, n - 1)) * std / math.sqrt(n)


def fmt_interval(mean: float | None, low: float | None, high: float | None, n: int, digits: int = 2) -> str:
    """``+1.22 [0.02, 2.42] (n=3)``; ``+1.22 (n=1)`` without an interval; ``—`` without a value."""
    if mean is None:
        return "—"
    core = f"{mean:+.{digits}f}"
    if low is not None:
        core += f" [{low:+.{digits}f}, {high:+.{digits}f}]"
    return f"{core} (n={n})"


def data_seed(run: Run):
    """The data seed a run drew its examples with (its config's ``data_seed``, else the sweep's seed)."""
    return run.cfg.get("data_seed", run.seed)


def run_gain(run: Run, split: str = "test", field: str = "accuracy") -> float | None:
    """The run's figure on ``split`` minus its own zero-shot figure (the base model in the run's dtype, the
    same prompt and examples): accuracy in points, loss as it is. None where either is missing."""
    tuned = run.summary.get(split) or {}
    zero = (run.summary.get("zero_shot") or {}).get(split) or {}
    if tuned.get(field) is None or zero.get(field) is None:
        return None
    scale = 100.0 if field == "accuracy" else 1.0
    return scale * (float(tuned[field]) - float(zero[field]))


def gains_by_seed(cell: Cell, split: str = "test", field: str = "accuracy") -> dict:
    """Per data seed: the cell's run gain (:func:`run_gain`; the mean where a seed ran more than once)."""
    found: dict = {}
    for r in cell.runs:
        g = run_gain(r, split, field)
        if g is not None:
            found.setdefault(data_seed(r), []).append(g)
    return {s: statistics.fmean(v) for s, v in found.items()}


def paired_difference(a: Cell, b: Cell, split: str = "test", field: str = "accuracy") -> tuple:
    """(mean, low, high, n, seeds) of ``a``'s gain minus ``b``'s on the data seeds both ran: each method's
    gain over the zero-shot of its own runs, so that rows in different dtypes compare gain with gain."""
    ga, gb = gains_by_seed(a, split, field), gains_by_seed(b, split, field)
    seeds = sorted(set(ga) & set(gb), key=str)
    return (*t_interval([ga[s] - gb[s] for s in seeds]), seeds)


def seeds_of(cell: Cell) -> tuple:
    """The data seeds of a cell's runs, sorted."""
    return tuple(sorted({data_seed(r) for r in cell.runs}, key=str))


def _seed_words(seeds: tuple) -> str:
    return ", ".join(map(str, seeds))


def seed_note(rows: list[tuple[str, Cell]]) -> str:
    """One sentence: whether every row ran the same data seeds (and so the same n), else which rows ran others."""
    if not rows:
        return ""
    sets = {name: seeds_of(c) for name, c in rows}
    common = Counter(sets.values()).most_common(1)[0][0]
    others = [(name, s) for name, s in sets.items() if s != common]
    if not others:
        return (f"Every row ran the same {len(common)} data seed{'s' if len(common) != 1 else ''} "
                f"({_seed_words(common)}): the rows are paired, at one n.")
    return (f"Rows ran different data seeds, so their n differ and only the seeds two rows share pair them: "
            f"data seeds {_seed_words(common)} (n={len(common)}) but "
            + "; ".join(f"{name}: {_seed_words(s)} (n={len(s)})" for name, s in others) + ".")


def method_matrix(rows: list[tuple[str, Cell]], digits: int = 2) -> tuple[list[str], list[list[str]], list[str]]:
    """Every pair of ``rows`` (name, chosen cell): the header, the rows (row i minus column j above the diagonal,
    the test-accuracy gain difference with its 95 % t-interval over the seeds both ran, in bold where resolved)
    and the resolved pairs in words."""
    header = ["Row − column (test acc gain, pts)", *(f"({j + 1})" for j in range(1, len(rows)))]
    body, found = [], []
    for i, (name, a) in enumerate(rows):
        line = [f"({i + 1}) {name}"]
        for j in range(1, len(rows)):
            if j <= i:
                line.append("")
                continue
            mean, low, high, n, _seeds = paired_difference(a, rows[j][1])
            text = fmt_interval(mean, low, high, n, digits)
            if resolved(low, high):
                text = f"**{text}**"
                found.append(f"({i + 1}) − ({j + 1}) {mean:+.{digits}f}")
            line.append(text)
        body.append(line)  # the last row is empty: it names the last column
    return header, body, found


def method_section(rows: list[tuple[str, Cell]]) -> str | None:
    """The Markdown of :func:`method_matrix` with what it shows and the resolved pairs; None for fewer than two
    rows."""
    from paczero.experiments.report.tables import markdown_table

    if len(rows) < 2:
        return None
    header, body, found = method_matrix(rows)
    note = ("Method against method, paired on data seeds: each entry is the row's test-accuracy gain minus the "
            "column's (each over the zero-shot of its own runs), the mean over the data seeds both methods ran, "
            "with its 95 % t-interval [low, high] and n (the paired t-test); bold where resolved, that is where "
            f"{RESOLVED}. Every pair is shown, as a reader may ask of any two; over "
            f"{len(rows) * (len(rows) - 1) // 2} pairs about one in twenty would be resolved by chance alone where "
            "no method differs. Resolved pairs: " + ("; ".join(found) if found else "none") + ".")
    return "\n\n".join([note, markdown_table(header, body)])
