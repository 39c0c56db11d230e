"""Where a report's runs come from: the sweep that ran them (``sweep.jsonl``), the commands that run them
again, the machines (summary.json ``environment``), the wall time, and the small files that let the report
be written again without the weights (``paczero report --keep-runs``)."""
from __future__ import annotations

import json
import shlex
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

from paczero.config import DP_MECHANISMS
from paczero.run.curves import read_records
from paczero.experiments.report.cells import EXECUTION_KEYS, Run

#: a run's files that the report reads (the weights, checkpoints and journal stay behind)
SMALL_FILES = ("summary.json", "log.jsonl", "evals.jsonl", "rungs.jsonl", "canary_audit.json")


def sweep_records(root: Path, exclude: Path | None = None) -> list[dict]:
    """Every record of every ``sweep.jsonl`` under ``root`` (a sweep's out-root holds one), but those under
    ``exclude`` (a report's folder inside ``root``, whose kept runs hold copies); each names its file (``_file``)."""
    return [{**r, "_file": str(path)} for path in sorted(root.rglob("sweep.jsonl"))
            if exclude is None or exclude.resolve() not in path.resolve().parents for r in read_records(path)]


def wall_seconds(records: list[dict], dp_runs: frozenset | set = frozenset()) -> dict[tuple[str, int], float]:
    """Per (recipe, seed): the seconds of the run's processes the sweep timed (each finished or failed attempt;
    an attempt killed with the sweep itself has no record); none from a sweep that ran one of ``dp_runs``
    ((recipe, seed) of DP runs): with its span, the other cells' times would give a DP run's."""
    out: dict[tuple[str, int], float] = defaultdict(float)
    private = {r.get("_file") for r in records if (r.get("recipe"), r.get("seed")) in dp_runs}
    for r in records:
        if r.get("_file") in private and r.get("_file") is not None:
            continue
        if r.get("seconds") is not None and r.get("recipe") is not None:
            out[(r["recipe"], r.get("seed"))] += float(r["seconds"])
    return dict(out)


def sweep_root(records: list[dict]) -> str | None:
    """The ``--out-root`` the sweep ran with, as its records name it (``OUT_ROOT/<recipe>/seed<k>``)."""
    for r in records:
        run_dir, tail = str(r.get("run_dir", "")), f"/{r.get('recipe')}/seed{r.get('seed')}"
        if run_dir.endswith(tail):
            return run_dir[: -len(tail)] or "."
    return None


def sweep_span(records: list[dict]) -> tuple[str, str] | None:
    """The first and the last time the sweeps recorded (ISO, local time of the machine): their own start and
    end records (a cell's record carries no time)."""
    times = sorted(str(r["time"]) for r in records if r.get("time") and r.get("sweep"))
    return (times[0], times[-1]) if times else None


def side_by_side(records: list[dict]) -> int:
    """The most cells one sweep had running at once (``--gpus``, ``--workers``): each sweep.jsonl's ``started``
    records against its outcomes, in the order written; 1 for cells run one after another, 0 for none."""
    most, running = 0, defaultdict(set)
    for r in records:
        cell = (r.get("recipe"), r.get("seed"))
        if r.get("status") == "started":
            running[r.get("_file")].add(cell)
            most = max(most, len(running[r.get("_file")]))
        elif r.get("status") in ("done", "failed", "stopped"):
            running[r.get("_file")].discard(cell)
        elif r.get("sweep"):  # a sweep's start or end: a cell left running by a killed sweep is not running now
            running[r.get("_file")].clear()
    return most


def machines(runs: list[Run]) -> list[str]:
    """The environments the runs recorded (summary.json ``environment``), each with its number of runs."""
    counts: Counter[str] = Counter()
    for r in runs:
        env = r.summary.get("environment")
        if not env:
            counts["not recorded"] += 1
            continue
        counts[f"{env.get('hardware')} ({env.get('device')}); torch {env.get('torch')}, paczero "
               f"{env.get('paczero')}, Python {env.get('python')}, {env.get('os')}"] += 1
    return [f"{text}: {n} run{'s' if n > 1 else ''}" for text, n in counts.most_common()]


def _set_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _as_recipe_gives(k: str, given: Any, cfg: dict) -> Any:
    """The value a run of a recipe records for key ``k`` the recipe gives as ``given``: an unset ``mu`` is the
    dtype's (:data:`~paczero.machine.hardware.MU_FOR_DTYPE`), as the run resolves it."""
    from paczero.machine.hardware import MU_FOR_DTYPE

    if k == "mu" and given is None:
        return MU_FOR_DTYPE.get(cfg.get("dtype"), given)
    return given


def run_overrides(run: Run, recipe: dict, defaults: dict) -> dict[str, Any]:
    """The ``--set`` values that make ``recipe`` (or, for keys it does not set, the defaults) run as ``run`` ran:
    every key but the execution keys whose recorded value the recipe would not give (a key the run's config
    predates counts as its default, as :func:`~paczero.experiments.report.cells.experiment` reads it)."""
    out = {}
    for k, v in {**json.loads(json.dumps(defaults, default=str)), **run.asked}.items():  # template auto read as asked
        given = _as_recipe_gives(k, recipe[k] if k in recipe else defaults.get(k), run.cfg)
        if k not in EXECUTION_KEYS and json.dumps(v, default=str) != json.dumps(given, default=str):
            out[k] = v
    return out


def sweep_commands(runs: list[Run], root: str) -> list[str]:
    """The ``paczero sweep`` commands that run the shipped recipes among ``runs`` again as they ran: one per
    group of recipes that ran the same seeds with the same ``--set`` values (the values the runs hold other
    than their recipe's, such as ``data``), named by their table where the group is all of its recipes. A value
    that only some cells ran with is set in their command alone: set table-wide it would change the others."""
    from paczero.config import TrainConfig, load_yaml
    from paczero.recipes import list_recipes, recipes_root

    defaults = TrainConfig().to_dict()
    seeds: dict[tuple[str, str, str], set] = defaultdict(set)  # (table, recipe, --set values) -> seeds
    for r in runs:
        path = recipes_root() / f"{r.cell}.yaml"
        if "/" not in r.cell or not path.is_file():
            continue
        sets = run_overrides(r, load_yaml(path), defaults)
        seeds[(r.table, r.cell, json.dumps(sets, sort_keys=True, default=str))].add(r.seed)
    groups: dict[tuple[str, tuple, str], list[str]] = defaultdict(list)
    for (table, recipe, sets), found in seeds.items():
        groups[(table, tuple(sorted(s for s in found if s is not None)), sets)].append(recipe)
    lines = []
    for (table, group_seeds, sets), recipes in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]),
                                                                                       sorted(kv[1]), kv[0][1:])):
        whole = sorted(n for n in list_recipes() if n.startswith(table + "/"))
        cmd = ["paczero", "sweep", *([table] if sorted(recipes) == whole else sorted(recipes)), "--seeds",
               *map(str, group_seeds), "--out-root", root]
        values = json.loads(sets)
        if values:
            cmd += ["--set", *(f"{k}={_set_value(v)}" for k, v in sorted(values.items()))]
        lines.append(shlex.join(cmd))
    return lines


def sweep_configs(runs: list[Run]) -> list[Any]:
    """The configs the sweep wrote beside the runs (``seed<k>.yaml``), as read (those it could not read aside)."""
    import yaml

    out = []
    for r in runs:
        try:
            out.append(yaml.safe_load(r.run_dir.with_name(r.run_dir.name + ".yaml").read_text()))
        except (OSError, yaml.YAMLError):
            continue
    return out


def keep_runs(runs: list[Run], root: Path, dest: Path, shown: Callable[[Any], Any] | None = None) -> int:
    """Copy each run's small files (:data:`SMALL_FILES`), the sweep's config beside it (``seed<k>.yaml``) and
    every ``sweep.jsonl`` under ``root`` (without any run's time in a sweep that ran a DP run: its time depends
    on its private batches, and the others' with the sweep's span would give it)
    into ``dest``, at the same relative paths; return the files copied. ``paczero report DEST`` then writes the
    same report without the weights. ``shown`` (a :class:`paczero.experiments.report.paths.PublicPaths`): the
    copies hold each absolute path in its public form; kept copies reported again into themselves (``dest`` is
    ``root``, no run there holds its ``run.json``) are rewritten so, the folders of runs themselves never."""
    copied = 0
    kept_copies = not any((r.run_dir / "run.json").exists() for r in runs)

    def copy(src: Path) -> None:
        nonlocal copied
        target = dest / src.relative_to(root)
        same = src.resolve() == target.resolve()
        if not src.is_file() or (same and (shown is None or not kept_copies)):
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        if shown is None:
            shutil.copyfile(src, target)
        else:
            text = src.read_text()
            public = shown.text(text, src.suffix)
            if not same or public != text:
                target.write_text(public)
        copied += 1

    for r in runs:
        for name in SMALL_FILES:
            copy(r.run_dir / name)
        copy(r.run_dir.with_name(r.run_dir.name + ".yaml"))
    private_time = {(r.cell, r.seed) for r in runs if r.cfg.get("mechanism") in DP_MECHANISMS}
    for path in sorted(root.rglob("sweep.jsonl")):
        target = dest / path.relative_to(root)
        same = path.resolve() == target.resolve()
        if (dest.resolve() in path.resolve().parents and not same) or (same and not kept_copies):
            continue  # a copy kept before, or a sweep's own record
        records = read_records(path)
        dp_sweep = any((rec.get("recipe"), rec.get("seed")) in private_time for rec in records)
        records = [{k: v for k, v in rec.items() if k not in ("time", "seconds")} if dp_sweep and not rec.get("sweep")
                   else {k: v for k, v in rec.items() if k != "time" or rec.get("sweep")} for rec in records]
        if shown is not None:
            records = [shown.config(rec) for rec in records]
        target.parent.mkdir(parents=True, exist_ok=True)  # a DP run's time depends on its private batches
        target.write_text("".join(json.dumps(rec) + "\n" for rec in records))
        copied += 1
    return copied


def table_scope(table: str) -> list[str]:
    """The section ``## What this table supports`` of a shipped table's README (``paczero/recipes/TABLE/``),
    as Markdown lines under the report's table; [] where there is none."""
    from paczero.recipes import recipes_root

    path = recipes_root() / table / "README.md"
    if not path.is_file():
        return []
    lines, out = path.read_text().splitlines(), []
    for line in lines:
        if out and line.startswith("## "):
            break
        if out or line.strip() == "## What this table supports":
            out.append(line)
    return ["#" + out[0], *out[1:], ""] if out else []


def made_by(runs: list[Run], records: list[dict], root: str, report_args: str | None) -> list[str]:
    """The report's last section: the commands that run its runs again, the machines, when and how long."""
    lines = ["## How these runs were made", ""]
    commands = sweep_commands(runs, root)
    if commands:
        lines += ["```bash", *commands]
        if report_args is not None:
            lines.append(shlex.join(["paczero", "report", root, *shlex.split(report_args)]))
        lines += ["```", ""]
    lines += ["Machines (summary.json `environment`):", "", *(f"- {m}" for m in machines(runs)), ""]
    dp_runs = {(r.cell, r.seed) for r in runs if r.cfg.get("mechanism") in DP_MECHANISMS}
    walls = wall_seconds(records, dp_runs)
    span = sweep_span(records)
    timed = [r for r in runs if (r.cell, r.seed) in walls and r.cfg.get("mechanism") not in DP_MECHANISMS]
    at_once = side_by_side(records)
    how = "one after another" if at_once <= 1 else f"up to {at_once} at once"
    untimed = any(r.get("status") in ("done", "failed", "stopped") and "seconds" not in r for r in records)
    if not timed and span:
        why = ("a sweep that runs a DP cell records none (a DP run's time depends on its private Poisson batches, "
               "and with the sweep's span the other runs' times would give it)" if dp_runs or untimed
               else "the sweep recorded no finished run")
        lines.append(f"Wall time: the sweep ran from {span[0]} to {span[1]} ({how}); no run's time is shown: {why}.")
    elif timed:
        dp = len(dp_runs)
        lines.append(f"Wall time: {sum(walls[(r.cell, r.seed)] for r in timed) / 3600.0:.2f} h for {len(timed)} of "
                     f"{len(runs)} runs, {how} (the sweep's record of each run's process: setup, zero-shot "
                     "and dev evaluations, training, test; any pause or other load on the machine included)"
                     + (f"; not shown for the {dp} DP runs, whose time depends on their private Poisson batches, "
                        "nor for the other runs of their sweep" if dp else "")
                     + (f". The sweep ran from {span[0]} to {span[1]}." if span else "."))
    else:
        lines.append("Wall time: not recorded (no sweep.jsonl under the runs folder).")
    return lines + [""]
