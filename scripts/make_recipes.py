"""Generate paczero/recipes/<table>/<cell>.yaml (one recipe per cell), paper_results.csv and the CPU tables'
READMEs from the grid, paczero/recipes/grid.csv: one row per cell with the values (JSON) that differ from its
base (``base``: "task size track", the paper's defaults, :func:`base` from recipe_templates/paper-defaults.yaml;
``cpu`` and ``cpu-regime``: the CPU tables' settings, recipe_templates/cpu-tables.yaml, whose arithmetic is
scripts/cpu_tables.py), its seeds, title, source (the paper's tables, the line of the authors' script in
bilgehanertan/paczero) and the figures. Edit the grid or scripts/recipe_templates/, then
``python scripts/make_recipes.py`` (``--check``: exit 1 if a file on disk is stale). What the paper leaves unstated
is said in each recipe's header (:func:`unstated`, docs/reproducing.md); the CPU tables are not the paper's and
their READMEs give every setting's reason.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import textwrap
from pathlib import Path

import yaml

from cpu_tables import (CPU, CPU_DATA, CPU_REGIME_SHARED, CPU_SEEDS, CPU_SHARED, TEMPLATES, TUNED_OOD, cpu_regime_readme,
                        cpu_scale_readme, cpu_tuned_readme, dp_fraction, run_seconds, sci, tuned_cells, TUNED_GRIDS)

ROOT = Path(__file__).resolve().parents[1] / "paczero" / "recipes"
GRID, CITED = ROOT / "grid.csv", ROOT / "cited_results.csv"
#: the paper cells' defaults, their protocol sentences and the order of a recipe's keys, as data
PAPER = yaml.safe_load((TEMPLATES / "paper-defaults.yaml").read_text())
KEY_ORDER = PAPER["key_order"]


def base(task: str, size: str, track: str) -> dict:
    """A paper cell's defaults: the paper's N, dev size and mu, the scripts' selection metric and eval_every."""
    return {**PAPER["base"], "model": PAPER["models"][size], "track": track, "task": task,
            "select_metric": "loss" if task == "sst2" else "f1",  # the scripts' metric_for_best_model
            "checkpoint_every": 50 if track == "lora" else (100 if size == "1.3b" else 250),
            **(PAPER["squad_as_scripts"] if task == "squad" else {})}


def read_grid(path: Path = GRID) -> list[dict]:
    """The grid's cells: table, cell, title, seeds, source, config (base and row merged), paper, forwards, method."""
    cells = []
    for row in csv.DictReader(path.open()):
        meta = {"table", "cell", "base", "seeds", "forwards", "method", "source", "title", "paper"}
        values = {k: json.loads(v) for k, v in row.items() if k not in meta and v != ""}
        shared = {"cpu": CPU_SHARED, "cpu-regime": CPU_REGIME_SHARED}.get(row["base"])
        cfg = {**(shared if shared is not None else base(*row["base"].split())), **values}
        if shared is not None:  # the CPU tables' file: a DP cell keeps about its sizes' rows of it
            cfg = dp_fraction(cfg, CPU["dp_pool_rows"], test_named=False)
        cells.append({"table": row["table"], "cell": row["cell"], "title": row["title"], "cfg": cfg,
                      "seeds": [int(s) for s in row["seeds"].split()], "source": row["source"], "paper": _paper(row),
                      "forwards": json.loads(row["forwards"]) if row["forwards"] else None,
                      "method": row["method"] or None})
    return cells


def _paper(row: dict) -> dict | None:
    """The paper's figures of a cell (None for the CPU tables): its table, then the grid's JSON (rungs by T)."""
    if not row["paper"]:
        return None
    paper = {"table": row["source"].split(";")[0], **json.loads(row["paper"])}
    return {**paper, "rungs": {int(t): fig for t, fig in paper["rungs"].items()}} if "rungs" in paper else paper


class _Dumper(yaml.SafeDumper):
    """Block mappings, inline lists: one key per line, per-seed values on one line."""


_Dumper.ignore_aliases = lambda self, data: True  # a value shared by two places is written out twice
_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
_Dumper.add_representer(dict, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v.items(), flow_style=False))


def dump(d: dict) -> str:
    return yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120)


def _comment(text: str, width: int = 100) -> list[str]:
    return ["# " + line for line in textwrap.wrap(text, width=width, break_on_hyphens=False)]


# ---------------------------------------------------------------------------- the paper's cells
#: the cell that tab:ablation shares with tab:headline (same figure, 89.74 +- 1.53, n = 4)
_ABLATION_HEADLINE_ANCHOR = "sst2-opt1.3b-lora-mi0.33-t2000"


def unstated(table: str, cell: str, cfg: dict) -> list[str]:
    """The settings of a recipe that the paper does not state for its table (beyond dtype, lr_schedule,
    eval_every and checkpoint_every, which no table states)."""
    out = []
    from_headline = table == "headline" or (table == "ablation" and cell == _ABLATION_HEADLINE_ANCHOR)
    if table == "ablation" and not from_headline:
        m = f", M = {cfg['num_subsets']}" if cfg["mechanism"] in ("pac-mi", "raw_half", "quant_half") else ""
        out.append(f"lr {sci(cfg['lr'])}, clip {cfg['clip']:g}{m} (those of the 1.3B LoRA PAC-MI headline recipe; "
                   "tab:ablation states none of them)")
    if table == "rank-ablation" and cfg["lora_r"] != 8:
        out.append(f"lora_alpha {cfg['lora_alpha']} (the paper states alpha 16 with r = 8 only)")
    if cfg.get("rungs"):
        out.append(f"one run per seed, its weights saved and evaluated at rungs {', '.join(map(str, cfg['rungs']))} "
                   "(the paper's single trajectory; the schedule spans the last rung), dev_best false (a rung is its "
                   "weights)")
    if table == "zpl-canonical" and cfg.get("rungs"):
        out.append("the cell's figure is each seed's dev-best rung (by the select_metric), pooled; the paper names it "
                   "the peak rung")
    if cfg["mechanism"] in ("dpzero", "dp-aggzo", "dpzero-aggzo1"):
        out.append("accountant rdp (calibrates the noise; the paper names none)")
    if not from_headline:
        out.append(f"mu {sci(cfg['mu'])} (stated for the headline recipes only)")
    return out


def _protocol_lines(cfg: dict) -> str:
    """The settings taken from the authors' scripts, and where this recipe deliberately differs from them."""
    metric = {"loss": "the lowest dev loss", "f1": "the highest dev F1"}[cfg["select_metric"]]
    dp = " " + PAPER["protocol_dp"] if cfg["mechanism"] == "dpzero-aggzo1" else ""
    squad = " " + PAPER["protocol_squad"] if cfg["task"] == "squad" else ""
    return "\n".join(_comment((TEMPLATES / "paper-protocol.txt").read_text().strip().format(
        metric=metric, eval_every=cfg["eval_every"], dp=dp, squad=squad)))


def _unstated_lines(table: str, cell: str, cfg: dict) -> str:
    rest = [f"lr_schedule ({cfg['lr_schedule']})", f"checkpoint_every {cfg['checkpoint_every']}",
            *unstated(table, cell, cfg)]
    return "\n".join([f"# Not stated by the paper, chosen here: dtype {cfg['dtype']} (as MeZO on GPU; use --dtype fp32 "
                      "on CPU),", *_comment(", ".join(rest) + ". See docs/reproducing.md.")])


def render(c: dict) -> str:
    """A paper cell's recipe: its header (protocol, unstated settings), recipe block, config and paper figures."""
    table, cell, cfg, seeds = c["table"], c["cell"], {k: c["cfg"][k] for k in KEY_ORDER if k in c["cfg"]}, c["seeds"]
    name = f"{table}/{cell}"
    head = (TEMPLATES / "paper-header.txt").read_text().format(
        title=c["title"], name=name, seed0=seeds[0], seeds=" ".join(map(str, seeds)),
        protocol=_protocol_lines(cfg), unstated=_unstated_lines(table, cell, cfg))
    recipe = {"recipe": {"name": name, "table": table, "cell": cell, "title": c["title"], "seeds": seeds,
                         "seed_field": "data_seed"}}
    return head + dump(recipe) + "\n" + dump(cfg) + "\n" + dump({"paper": c["paper"]})


RESULT_COLUMNS = CITED.read_text().splitlines()[0].split(",")


def paper_results_csv(cells: list[dict]) -> str:
    """The paper's published numbers, one row per cell (percent units), then the figures it cites
    (cited_results.csv), for report overlays."""
    rows = []
    for c in cells:
        cfg, paper = c["cfg"], c["paper"]
        if paper.get("reported_test") is None:  # a cell the paper runs without printing its figure
            continue
        rows.append({"table": c["table"], "recipe": f"{c['table']}/{c['cell']}", "task": cfg["task"],
                     "model": cfg["model"], "track": cfg["track"], "mechanism": cfg["mechanism"],
                     "mi_budget": 0.0 if cfg["mechanism"] == "pac-zpl" else cfg.get("mi_budget"),
                     "epsilon": cfg.get("epsilon"), "num_directions": cfg["num_directions"], "steps": cfg["steps"],
                     "metric": "accuracy" if cfg["task"] == "sst2" else "f1", "reported_test": paper["reported_test"],
                     "std": paper.get("std"), "n": paper.get("n"), "reported_dev": paper.get("reported_dev"),
                     "free_frac": paper.get("reported_free_frac"), "source": paper["table"],
                     "rung_statistic": paper.get("rung_statistic")})
        for rung, fig in (paper.get("rungs") or {}).items():  # a ladder: the paper's figure at each rung
            rows.append({**rows[-1], "steps": rung, "rung": rung, "rung_statistic": None, "free_frac": None,
                         **{k: fig.get(k) for k in ("reported_test", "std", "n", "reported_dev")}})
    buf = io.StringIO()
    w = csv.DictWriter(buf, RESULT_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in RESULT_COLUMNS})
    return buf.getvalue() + "".join(CITED.read_text().splitlines(keepends=True)[1:])


# ---------------------------------------------------------------------------- the CPU tables


def render_cpu(c: dict) -> str:
    """A CPU table's recipe: its header (long lines wrapped as comments), the recipe block and the config."""
    table, cfg, fw = c["table"], c["cfg"], c["forwards"]
    head = (TEMPLATES / f"{table}-header.txt").read_text().format(
        title=c["title"], name=f"{table}/{c['cell']}", data=c.get("data", CPU_DATA), ood=c.get("ood", TUNED_OOD),
        minutes=run_seconds(table, cfg, fw) / 60, seeds=" ".join(map(str, c.get("seeds", CPU_SEEDS))),
        seed0=c.get("seeds", CPU_SEEDS)[0],
        steps=cfg["steps"], forwards=fw, track=cfg["track"])
    head = "\n".join(line if len(line) <= 110 else "\n# ".join(textwrap.wrap(line, 108, break_on_hyphens=False))
                     for line in head.splitlines()) + "\n"
    seeds = c.get("seeds", CPU_SEEDS)
    recipe = {"recipe": {"name": f"{table}/{c['cell']}", "table": table, "cell": c["cell"], "title": c["title"],
                         "seeds": seeds, "seed_field": c.get("seed_field", "data_seed"),
                         "requires_data": c.get("data", CPU_DATA)}}
    unused = {"mu"} if cfg["mechanism"] in ("dp-sgd", "adamw") else set()  # a gradient step perturbs nothing
    return head + dump(recipe) + "\n" + dump({k: cfg[k] for k in KEY_ORDER if k in cfg and k not in unused})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report stale or missing recipes and exit 1, write nothing")
    args = ap.parse_args(argv)
    cells = read_grid() + tuned_cells()
    wanted = {ROOT / c["table"] / f"{c['cell']}.yaml": render(c) if c["paper"] else render_cpu(c) for c in cells}
    assert len(wanted) == len(cells), "duplicate recipe names"
    wanted[ROOT / "paper_results.csv"] = paper_results_csv([c for c in cells if c["paper"] is not None])
    wanted[ROOT / "cpu-scale" / "README.md"] = cpu_scale_readme([c for c in cells if c["table"] == "cpu-scale"])
    wanted[ROOT / "cpu-tuned" / "README.md"] = cpu_tuned_readme([c for c in cells if c["table"] == "cpu-tuned"])
    wanted[ROOT / "cpu-regime" / "README.md"] = cpu_regime_readme([c for c in cells if c["table"] == "cpu-regime"])
    for table in TUNED_GRIDS:
        wanted[ROOT / table / "README.md"] = (TEMPLATES / f"{table}-README.md").read_text()
    existing = {p for t in {c["table"] for c in cells} for p in (ROOT / t).glob("*.yaml")}
    stale = sorted(p for p, text in wanted.items() if not p.exists() or p.read_text() != text)
    extra = sorted(existing - set(wanted))
    if args.check:
        for p in stale + extra:
            print(f"stale: {p.relative_to(ROOT)}")
        return 1 if stale or extra else 0
    for p in extra:
        p.unlink()
    for p, text in wanted.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    print(f"wrote {len(cells)} recipes, paper_results.csv and the CPU tables' READMEs under {ROOT} "
          f"({len(stale)} changed, {len(extra)} removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
