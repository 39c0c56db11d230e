"""The report of a learning-rate-tuned table (``cpu-tuned``, ``cpu-regime``): each method's grid on the first
seed's dev split, the value chosen there, and the chosen cells side by side on the test split, an out-of-domain
file and the train-vs-held-out loss attack.

A method is a recipe name without its ``-lr<value>`` suffix. Its learning rate is chosen on the first data
seed (the smallest seed any of its cells ran) by the released weights' dev accuracy, ties going to the lower
dev loss (the SST-2 tables: by the lower dev loss, a proper score that 100-500 dev rows resolve better): a choice
that reads dev only. The chosen cell's other seeds then give the table's figures. Where a table holds the
non-private first-order ceiling (``adamw``), each method's gain is also given as the fraction of the ceiling's
gain it keeps, and every chosen cell's dev loss is plotted against the example forwards it spent (the budget
curve: how long a method must train before its dev loss stops falling).
"""
from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict

from paczero.config import DP_MECHANISMS
from paczero.experiments.report.budget import (CEILING, FLAT_TOL, LONGER, budget_curves, curve_end, forwards_per_second,
                                               longer_run_noise)
from paczero.experiments.report.cells import Cell, fmt_ms, guarantee, mean_std
from paczero.experiments.report.classes import recall_section
from paczero.experiments.report.labels import BY_DEV_LOSS, cell_label, is_longer, is_plain, zero_label
from paczero.experiments.report.paired import (RESOLVED, fmt_interval, gains_by_seed, method_section,
                                               resolved_from, run_gain, seed_note, t_interval)
from paczero.experiments.report.tables import _comparison_order, dp_by_epsilon, dp_in_words, markdown_table, zero_shot_stats

LR_SUFFIX = re.compile(r"-lr[0-9.e+-]+$")
#: the tables reported in this layout
TUNED_TABLES = ("cpu-tuned", "cpu-regime", "cpu-practitioner", "cpu-sst2", "gpu-sst2", "cpu-agnews", "cpu-sst5")
#: also each method's gain over the zero-shot of its runs
GAIN_TABLES = ("cpu-practitioner", "cpu-sst2", "gpu-sst2", "cpu-agnews", "cpu-sst5")


def method_of(cell: Cell) -> str:
    """The method a grid cell belongs to: its recipe name without the ``-lr`` suffix."""
    return LR_SUFFIX.sub("", cell.name)


def _seed_run(cell: Cell, seed: int):
    return next((r for r in cell.runs if r.seed == seed), None)


def _dev(cell: Cell, seed: int) -> tuple[float, float] | None:
    run = _seed_run(cell, seed)
    if run is None or not run.summary.get("dev"):
        return None
    dev = run.summary["dev"]
    return 100.0 * float(dev.get(run.summary.get("metric", "accuracy"), float("nan"))), float(dev.get("loss", "nan"))


def choose(cells: list[Cell]) -> dict[str, tuple[Cell, int, list[tuple[Cell, tuple | None]]]]:
    """Per method: (the chosen cell, the seed that chose it, every cell of the grid with its dev figures)."""
    out = {}
    by_method: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        by_method[method_of(c)].append(c)
    for method, grid in by_method.items():
        seed = min(r.seed for c in grid for r in c.runs if r.seed is not None)
        scored = [(c, _dev(c, seed)) for c in sorted(grid, key=lambda c: c.cfg["lr"])]
        ranked = [(c, d) for c, d in scored if d is not None]
        if not ranked:
            continue
        if grid[0].table in BY_DEV_LOSS:
            best = min(ranked, key=lambda cd: (cd[1][1], -cd[1][0]))[0]
        else:
            best = max(ranked, key=lambda cd: (cd[1][0], -cd[1][1]))[0]
        out[method] = (best, seed, scored)
    return out


def _extra(cell: Cell, key: str, field: str) -> tuple:
    values = []
    for r in cell.runs:
        found = r.summary.get(key) or {}
        v = found.get(field)
        if v is not None:
            values.append(100.0 * float(v) if field == "accuracy" else float(v))
    return mean_std(values)


def _same(value) -> str:
    """A setting as :func:`zero_shot_stats` keys it (JSON: a dict's integer keys become strings)."""
    return json.dumps(value, sort_keys=True, default=str)


def _zero_shot_ood(cells: list[Cell], settings: dict | None = None) -> tuple:
    """The zero-shot out-of-domain accuracy over data seeds, of the runs whose zero-shot settings are ``settings``
    (:func:`zero_shot_stats`'s groups; None: every run)."""
    per_seed: dict = defaultdict(list)
    for c in cells:
        for r in c.runs:
            if settings is not None and any(_same(r.asked.get(k)) != _same(v) for k, v in settings.items()):
                continue
            v = ((r.summary.get("zero_shot") or {}).get("ood_test") or {}).get("accuracy")
            if v is not None:
                per_seed[r.cfg.get("data_seed")].append(100.0 * float(v))
    return mean_std([statistics.fmean(v) for v in per_seed.values()])


def gains(cell: Cell, split: str = "test") -> dict[str, tuple]:
    """Each run's gain over the zero-shot of the same run (the base model on the same examples, from the same
    prompt, in the run's dtype), over the cell's runs: accuracy in points, loss (negative: lower than zero-shot),
    as mean ± std, n."""
    return {f: mean_std(run_gain(r, split, f) for r in cell.runs) for f in ("accuracy", "loss")}


def empirical_epsilon(cell: Cell) -> str:
    """The one-run canary audit's ε lower bound (95 %) of a cell's runs that hold one (``paczero audit RUN`` of a
    run trained with ``--canaries M`` writes RUN/canary_audit.json), against its stated ε; "—" where no run was
    audited."""
    from paczero.audit.canaries import RESULT_FILE

    found = []
    for r in cell.runs:
        path = r.run_dir / RESULT_FILE
        if path.exists():
            found.append(json.loads(path.read_text()))
    if not found:
        return "—"
    return "; ".join(f"≥ {f['epsilon_lower_bound']:.2f} ({f['canaries']} canaries, {f['correct']}/{f['guesses']} "
                     "right)" for f in found)


def ceiling_fraction(gain: tuple, ceiling: tuple, lower_is_better: bool = False) -> str:
    """A method's mean gain as a percentage of the ceiling's mean gain ("—" where either is missing or the
    ceiling gained nothing: no improvement, a loss that rose, an accuracy that fell, or, over two seeds or more,
    a mean gain whose 95 % t-interval includes 0 (:data:`~paczero.experiments.report.paired.RESOLVED`), which
    no share can be read against)."""
    if gain[0] is None or ceiling[0] is None or ceiling[0] == 0 or (lower_is_better and ceiling[0] > 0) \
            or (not lower_is_better and ceiling[0] < 0):
        return "—"  # the ceiling bought nothing on this figure: no share to keep
    if ceiling[1] is not None and not resolved_from(*ceiling):
        return "—"  # the ceiling's gain is not resolved from 0 over its seeds
    return f"{round(100.0 * gain[0] / ceiling[0])} %"  # an int: a share that rounds to 0 is 0 % (not -0 %)


def gain_table(cells: list[Cell]) -> str:
    """The chosen cell of every method as gains over the strong zero-shot, in domain and out of domain, with the
    accuracy gain's 95 % t-interval, the data seeds of each row and, where the rows ran in more than one dtype,
    each row's dtype (its gain is over the zero-shot of its own dtype); where the table holds the ceiling
    (``adamw``), the fraction of its gain each method keeps; then every method against every other, paired on
    the data seeds both ran (:func:`~paczero.experiments.report.paired.method_section`)."""
    zero = zero_shot_stats(cells)
    chosen = sorted(choose(cells).items(), key=lambda kv: _comparison_order(kv[1][0]))
    tops: dict[bool, dict] = {}  # the ceiling from each prompt source: its first chosen AdamW cell
    for _, (c, _s, _g) in chosen:
        if c.cfg["mechanism"] == CEILING:
            tops.setdefault(is_plain(c), gains(c))
    kept = ["Ceiling kept: acc", "Ceiling kept: loss"] if tops else []
    ends = cells[0].table in BY_DEV_LOSS
    audited = any(empirical_epsilon(c) != "—" for _, (c, _s, _g) in chosen)
    ood = any(gains(c, "ood_test")["accuracy"][0] is not None for _, (c, _s, _g) in chosen)  # else no columns
    dtypes = len({c.cfg.get("dtype") for _, (c, _s, _g) in chosen} | {st.get("dtype") for st, _ in zero}) > 1
    rows = [[zero_label(settings, zero), *([settings.get("dtype")] if dtypes else []), "—", *(["0"] if ends else []),
             fmt_ms(*st["test"]), fmt_ms(*st["test_loss"], digits=3), "0", "—", "0",
             *(["0", "0"] if ood else []), *(["0 %", "0 %"] if kept else []), "none needed (reads no training data)",
             *(["—"] if audited else []), "—", *(["—"] if ends else [])] for settings, st in zero]
    for method, (c, _seed, _grid) in chosen:
        text, _mia = guarantee(c)
        g, o = gains(c), gains(c, "ood_test")
        end = curve_end(budget_curves(c)) if ends else ""
        if end.startswith("still falling"):
            end += longer_run_noise(c.cfg)
        top = tops.get(is_plain(c), {"accuracy": (None, None), "loss": (None, None)})  # the ceiling from its prompt
        share = [ceiling_fraction(g["accuracy"], top["accuracy"]), ceiling_fraction(g["loss"], top["loss"], True)] \
            if kept else []
        interval = t_interval(list(gains_by_seed(c).values()))
        rows.append([cell_label(c), *([c.cfg.get("dtype")] if dtypes else []), f"{c.cfg['lr']:g}",
                     *([str(c.cfg["steps"])] if ends else []),
                     fmt_ms(*c.stat("test")), fmt_ms(*c.stat("test_loss"), digits=3),
                     fmt_ms(*g["accuracy"], digits=2), fmt_interval(*interval) if interval[1] is not None else "—",
                     fmt_ms(*g["loss"], digits=4),
                     *([fmt_ms(*o["accuracy"], digits=2), fmt_ms(*o["loss"], digits=4)] if ood else []), *share, text,
                     *([empirical_epsilon(c)] if audited else []), fmt_ms(*_extra(c, "heldout_attack", "auc"), digits=3),
                     *([end] if ends else [])])
    note = ("Gains: each run's test figure minus the zero-shot figure of the same run (the base model in the run's "
            "dtype, the same prompt and examples), mean ± sample std over the chosen cell's data seeds (n); loss "
            f"gains below 0 are improvements. A gain is resolved where {RESOLVED}; the accuracy gain's interval is "
            "given beside it (mean [low, high], over the data seeds).")
    if dtypes:
        note += (" The rows ran in more than one dtype (column dtype): each dtype's zero-shot is a row of its own, and "
                 "each row's gain is over the zero-shot of its own runs, so of its own dtype.")
    if kept:
        note += (" Ceiling kept: the method's mean gain as a share of the mean gain of the non-private first-order "
                 "ceiling (AdamW on the same trainable parameters, no clipping, no noise"
                 + (", from the same prompt: the plain-prompt rows against AdamW from the plain prompt" if len(tops) > 1
                    else "") + "); \"—\" where the ceiling's own gain is not resolved or the table has no ceiling "
                 "from that prompt.")
    if ends:
        note += (f" Dev loss at the final budget: the chosen cell's mean dev curve (the budget plot) is \"rising\" "
                 f"where its final point lies more than {FLAT_TOL} above its lowest (it overfits or grows noisier; "
                 "the dev-best step is released), else \"still falling\" where the lowest point of its last third "
                 "lies more than that below every earlier one (a longer run would likely gain more; a DP-SGD run at the "
                 f"same ε only with more noise on every step, which the cell prices for {LONGER}x the steps), else "
                 "\"flat\".")
    if audited:
        note += (" Empirical ε: the lower bound at 95 % confidence of the one-run canary audit (docs/audit.md) of the "
                 "cell's audited runs; a lower bound never proves privacy, and "
                 "one above the stated ε would show the run does not keep its guarantee.")
    named = [(cell_label(c), c) for _, (c, _s, _g) in chosen]
    note += " " + seed_note(named)
    table = markdown_table(
        ["Method", *(["dtype"] if dtypes else []), "lr (chosen on dev)", *(["Steps T"] if ends else []), "Test acc %",
         "Test loss", "Gain acc (pts)", "Gain acc, 95 % t-interval", "Gain loss",
         *(["Gain acc, out-of-domain", "Gain loss, out-of-domain"] if ood else []), *kept, "Guarantee",
         *(["Empirical ε (one-run audit)"] if audited else []), "Loss-attack AUC",
         *(["Dev loss at the final budget"] if ends else [])], rows)
    return "\n\n".join(filter(None, [note, table, method_section(named), recall_section(named)]))


def plot_budget(cells: list[Cell], path):
    """Each chosen cell's dev loss against the example forwards it spent (log scale): where a curve flattens,
    training longer buys nothing more on dev."""
    from paczero.experiments.report.plots import _pyplot

    chosen = [(c, budget_curves(c)) for c in sorted(chosen_cells(cells), key=_comparison_order)]
    chosen = [(c, pts) for c, pts in chosen if len(pts) > 1]
    if not chosen:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    zero = [pts[0][1] for _c, pts in chosen if pts[0][0] == 0.0]
    trained = [y for _c, pts in chosen for x, y in pts if x > 0.0]
    top_y = max(zero + trained[:1]) + 0.04  # a curve that rises far above the zero-shot (overfitting) leaves the plot
    for i, (c, pts) in enumerate(chosen):
        xs, ys = zip(*[(x, y) for x, y in pts if x > 0.0])
        name = f"{cell_label(c)}, lr {c.cfg['lr']:g}, T = {c.cfg['steps']} (n={len(c.runs)})"
        if max(ys) > top_y:
            name += f"; rises to {max(ys):.2f}"
        ax.plot(xs, ys, marker="o", ms=3, color=f"C{i % 10}", label=name)
    if zero:  # the base model's dev loss: the budget's starting point (step 0)
        ax.axhline(statistics.fmean(zero), color="k", ls=":", alpha=0.6, label="zero-shot (no training)")
    ax.set_ylim(min(trained + zero) - 0.01, top_y)
    ax.set_xscale("log")
    ax.set_xlabel("example forwards spent (a forward and a backward count as three)")
    rate = forwards_per_second(cells)
    if rate:  # the same budget in minutes of this table's machine, at the rate its timed runs measured
        top = ax.secondary_xaxis("top", functions=(lambda f: f / rate / 60.0, lambda m: m * 60.0 * rate))
        top.set_xlabel(f"minutes on the runs' machine at their measured {rate:.0f} example forwards per second "
                       "(median of the runs that publish their time)", fontsize=8)
    ax.set_ylabel("dev loss (mean over the cell's runs)")
    ax.grid(alpha=0.3)
    ax.set_title("How long to train: dev loss against budget, each method at its chosen learning rate", fontsize=9,
                 pad=24 if rate else 6)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)  # below: the curves stay visible
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def tuned_table(cells: list[Cell]) -> str:
    """The chosen cell of every method (its figures over seeds) beside zero-shot, then each method's grid; for a
    table of :data:`GAIN_TABLES`, its gains over zero-shot first."""
    if cells and cells[0].table in GAIN_TABLES:
        return "\n\n".join([gain_table(cells), _tuned_table(cells)])
    return _tuned_table(cells)


def _budget_label(c: Cell) -> str:
    """:func:`label`, and in the SST-2 tables (whose methods may run at more than one budget) its steps T."""
    return cell_label(c) + (f", T = {c.cfg['steps']}" if c.table in BY_DEV_LOSS and not is_longer(c) else "")


def _tuned_table(cells: list[Cell]) -> str:
    chosen = choose(cells)
    zero = zero_shot_stats(cells)
    rows = [[zero_label(settings, zero), "—", fmt_ms(*st["test"]), fmt_ms(*_zero_shot_ood(cells, settings)), "—",
             "none needed (reads no training data)", "0.5", "—"] for settings, st in zero]
    for method, (c, _seed, _grid) in sorted(chosen.items(), key=lambda kv: _comparison_order(kv[1][0])):
        text, mia = guarantee(c)
        rows.append([_budget_label(c), f"{c.cfg['lr']:g}", fmt_ms(*c.stat("test")),
                     fmt_ms(*_extra(c, "ood_test", "accuracy")), fmt_ms(*c.stat("unanimity"), digits=1), text,
                     "—" if mia is None else f"{mia:.3f}", fmt_ms(*_extra(c, "heldout_attack", "auc"), digits=3)])
    main = markdown_table(["Method", "lr (chosen on dev)", "Test acc % (in-domain)", "Test acc % (out-of-domain)",
                           "Unanimity %", "Guarantee", "MIA bound", "Loss-attack AUC (U vs held-out)"], rows)
    grid_rows = []
    for method, (c, seed, grid) in sorted(chosen.items(), key=lambda kv: _comparison_order(kv[1][0])):
        best = next(d for g, d in grid if g is c)
        tied = [g for g, d in grid if g is not c and d == best]  # the same dev figures: the smallest lr chosen
        for g, d in grid:
            mark = ("**chosen**" + (" (tied: the smallest lr)" if tied else "")) if g is c else (
                "tied with the chosen" if any(g is t for t in tied) else "")
            run = _seed_run(g, seed)
            if run is not None and run.summary.get("selected_step") == 0:
                mark += (", " if mark else "") + "released the base model (step 0)"
            grid_rows.append([_budget_label(g), f"{g.cfg['lr']:g}",
                              "—" if d is None else f"{d[0]:.1f}", "—" if d is None else f"{d[1]:.4f}",
                              mark, str(seed)])
    grid = markdown_table(["Method", "lr", "Dev acc %", "Dev loss", "", "Seed"], grid_rows)
    note = ("Figures: mean ± sample std over the chosen cell's data seeds (n). The attack scores the released "
            "model's loss on the records of the universe U against the held-out test records of the same file; "
            "(ε, δ)-DP bounds it, the PAC guarantee does not (it bounds membership in the secret subset S* given "
            "U). The grid: each method's learning rates on the first seed's dev split; the chosen one has the "
            + ("lowest dev loss (ties: the higher dev accuracy" if cells and cells[0].table in BY_DEV_LOSS
               else "highest dev accuracy (ties: the lower dev loss") + "; where both tie, the smallest lr, marked "
            "so). A run that released the base model had no step better on dev than the base model's.")
    interval = attack_interval(list(c for c, _, _ in chosen.values()))
    if interval:
        note += " " + interval
    return "\n\n".join([note, main, "Learning-rate grid (dev, first seed):", grid])


def attack_interval(cells: list[Cell]) -> str | None:
    """How far one run's attack AUC can be trusted: the half-widths of its 95 % intervals (each run's
    ``heldout_attack.auc_ci95``) over the given cells' runs, with the record counts behind them."""
    widths, sizes = [], set()
    for c in cells:
        for r in c.runs:
            found = r.summary.get("heldout_attack") or {}
            ci = found.get("auc_ci95")
            if ci and len(ci) == 2:
                widths.append((float(ci[1]) - float(ci[0])) / 2)
                sizes.add((found.get("members"), found.get("heldout")))
    if not widths:
        return None
    counts = "; ".join(f"{m} records of U against {h} held-out" for m, h in sorted(sizes, key=str))
    span = f"±{min(widths):.3f}" + ("" if round(min(widths), 3) == round(max(widths), 3) else f" to ±{max(widths):.3f}")
    return (f"One run's attack AUC has a 95 % interval of {span} ({counts}; over the {len(widths)} runs of the "
            "chosen cells): an AUC within that of 0.5 is no signal.")


def tuned_headline(cells: list[Cell]) -> str | None:
    """One sentence: PAC-ZPL's chosen cells (both coin rules) against MeZO and every DP cell (by ε, then K)."""
    chosen = {m: c for m, (c, _, _) in choose(cells).items()}
    zpl = [c for c in chosen.values() if c.cfg["mechanism"] == "pac-zpl"]
    if not zpl:
        return None
    several_m = len({c.cfg.get("num_subsets") for c in zpl}) > 1  # then each names its M

    def rule(c: Cell) -> str:
        return c.cfg.get("coin_step", "move")

    parts = [f"PAC-ZPL at MI = 0 reaches {fmt_ms(*c.stat('test'))} with coin steps "
             + ("skipped" if rule(c) == "skip" else "moving the weights (the paper's rule)")
             + (f" at M = {c.cfg.get('num_subsets')}" if several_m else "")
             + (" from the plain prompt" if is_plain(c) else "")
             + (f" over {c.cfg['steps']} steps" if is_longer(c) else "")
             for c in sorted(zpl, key=lambda c: (is_plain(c), rule(c) != "skip", -int(c.cfg.get("num_subsets") or 0)))]
    mezo = [c for c in chosen.values() if c.cfg["mechanism"] == "mezo"]
    others = ([f"MeZO's {fmt_ms(*mezo[0].stat('test'))}"] if mezo else []) + \
        [f"{dp_in_words(c.cfg)}'s {fmt_ms(*c.stat('test'))}" for c in dp_by_epsilon(list(chosen.values()))]
    zero = zero_shot_stats(cells)
    def shown(s: dict) -> str:  # the dtype as "in bf16"; with the prompt, both in brackets
        inner = zero_label(s, zero).removeprefix("zero-shot").strip(" ()")
        return "" if not inner else f" in {inner}" if inner == s.get("dtype") else f" ({inner})"

    words = ", ".join(fmt_ms(*st["test"]) + shown(s) for s, st in zero)
    return ("Test accuracy %, each method at its dev-chosen learning rate: " + "; ".join(parts)
            + (", against " + ", ".join(others) if others else "")
            + (f"; the base model zero-shot: {words}" if zero else "") + ".")


def n_classes(cfg: dict) -> int:
    """The number of classes a run scored (:func:`~paczero.tasks.data.class_labels`; two for a task without)."""
    from paczero.tasks.data import class_labels

    return len(class_labels(cfg.get("task", "sst2"), cfg.get("verbalizer"), cfg.get("labels")) or (0, 1))


def chosen_cells(cells: list[Cell]) -> list[Cell]:
    """The cells a tuned table stands for: each method's chosen one (its grid's other points are choices
    made on dev, not results)."""
    return [c for c, _, _ in choose(cells).values()]


def plot_tuned(cells: list[Cell], path):
    """The chosen cells only, two panels sharing the test-accuracy axis (filled: in-domain test, hollow:
    out-of-domain test; bars: std over seeds). Left: against the MIA bound of each cell's guarantee (PAC
    and DP on one axis; a non-private reference stands at 1), where the MI plateau (PAC-MI flat as the
    budget grows) and the DP cliff (DP at chance for small ε) show. Right: against the measured
    train-vs-held-out loss attack's AUC (0.5: no signal), which DP's ε bounds and the PAC guarantee does not."""
    from paczero.experiments.report.plots import _pyplot

    chosen = sorted(chosen_cells(cells), key=_comparison_order)
    if not chosen:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 5.0), sharey=True)
    markers = {"PAC": "o", "DP": "s", "non-private": "D"}
    for i, c in enumerate(chosen):
        text, mia = guarantee(c)
        family = "DP" if c.cfg["mechanism"] in DP_MECHANISMS else "non-private" if mia is None else "PAC"
        test, ood, auc = c.stat("test"), _extra(c, "ood_test", "accuracy"), _extra(c, "heldout_attack", "auc")
        if test[0] is None:
            continue
        color, marker = f"C{i % 10}", markers[family]
        name = f"{cell_label(c)}, lr {c.cfg['lr']:g}; {text if family != 'non-private' else 'no guarantee'}"
        for ax, x in ((left, 1.0 if mia is None else mia), (right, auc[0])):
            if x is None:
                continue
            ax.errorbar([x], [test[0]], yerr=[test[1] or 0.0], marker=marker, color=color, capsize=3, ls="none",
                        label=name if ax is left else None)
            if ood[0] is not None:
                ax.errorbar([x], [ood[0]], yerr=[ood[1] or 0.0], marker=marker, color=color, mfc="white",
                            capsize=3, ls="none")
            if ax is right and auc[1]:
                ax.errorbar([x], [test[0]], xerr=[auc[1]], color=color, ls="none", capsize=0, alpha=0.5)
    zero = zero_shot_stats(cells)
    k = n_classes(chosen[0].cfg)
    for ax in (left, right):
        if zero and zero[0][1]["test"][0] is not None:
            ax.axhline(zero[0][1]["test"][0], color="k", ls=":", alpha=0.6)
        ax.axhline(100.0 / k, color="grey", ls="--", lw=0.8)  # chance: a uniform guess among the k classes
        ax.grid(alpha=0.3)
    left.set_xlim(0.47, 1.04)
    left.set_xlabel("MIA success bound of the guarantee (prior 0.5; 1: none)")
    right.set_xlabel("loss-attack AUC, U vs held-out records (measured; 0.5: no signal)")
    right.axvline(0.5, color="k", lw=0.8, alpha=0.4)
    left.set_ylabel("test accuracy %")
    left.set_title("what each guarantee bounds", fontsize=9)
    right.set_title("what the attack the field measures finds", fontsize=9)
    fig.suptitle("Each method at its dev-chosen learning rate (filled: in-domain test, hollow: out-of-domain test; "
                 f"dotted: zero-shot in-domain; dashed: chance, 1/{k})", fontsize=10)
    fig.tight_layout()
    fig.legend(fontsize=7, loc="upper center", ncol=2, bbox_to_anchor=(0.5, 0.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
