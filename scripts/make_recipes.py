"""Generate paczero/recipes/<table>/<cell>.yaml (one recipe per cell), paper_results.csv and the CPU tables'
READMEs from the grid, paczero/recipes/grid.csv: one row per cell with the values (JSON) that differ from its
base (``base``: "task size track", the paper's defaults in :func:`base`; ``cpu``: CPU_SHARED), its seeds,
title, source (the paper's tables, the line of the authors' script in bilgehanertan/paczero) and the figures.
Edit the grid or scripts/recipe_templates/, then ``python scripts/make_recipes.py`` (``--check``: exit 1 if a
file on disk is stale). What the paper leaves unstated is said in each recipe's header (:func:`unstated`,
docs/reproducing.md); the CPU tables are not the paper's and their READMEs give every setting's reason.
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

ROOT = Path(__file__).resolve().parents[1] / "paczero" / "recipes"
GRID, CITED = ROOT / "grid.csv", ROOT / "cited_results.csv"
TEMPLATES = Path(__file__).resolve().parent / "recipe_templates"
MODELS = {"1.3b": "facebook/opt-1.3b", "6.7b": "facebook/opt-6.7b"}
#: the order of a recipe's keys (a cell has a subset of them)
KEY_ORDER = ["model", "track", "lora_r", "lora_alpha", "dtype", "task", "columns", "template", "verbalizer", "n_train",
             "n_dev", "n_test", "mechanism", "num_subsets", "mi_budget", "schedule", "epsilon", "delta", "dp_clip",
             "sample_rate", "accountant", "batch_size", "noised_coef", "coin_step", "num_directions", "steps", "lr",
             "lr_schedule", "clip", "mu", "weight_decay", "eval_every", "eval_zero_shot", "dev_best", "select_metric",
             "heldout_attack", "checkpoint_every", "token_budget", "rungs", "objective", "max_new_tokens",
             "max_length", "answer_stop"]
#: the scripts' SQuAD training and generation (--non_diff; run_paczo.py's max_length, max_new_tokens, eos_token)
SQUAD_AS_SCRIPTS = {"objective": "f1", "max_new_tokens": 50, "max_length": 2048, "answer_stop": "newline-token"}
#: the CPU tables' shared settings (their READMEs give each value's reason)
CPU_SHARED = {"model": "smollm2-135m-instruct", "lora_r": 8, "lora_alpha": 16, "dtype": "bf16", "task": "sst2",
              "columns": {"sentence": "text"}, "template": "{sentence} It was",
              "verbalizer": {0: " terrible", 1: " great"}, "n_train": 64, "n_dev": 100, "n_test": 500, "mu": 1e-2,
              "weight_decay": 0.0, "eval_zero_shot": True, "dev_best": True, "select_metric": "loss",
              "checkpoint_every": 25, "token_budget": 2048}
#: the regime table's settings on top of CPU_SHARED: the paper's M = 128 on a larger universe, in fp32 (this
#: table's machine has no native bf16) at fp32's mu (docs/performance.md, bf16 on CPU)
CPU_REGIME_SHARED = {**CPU_SHARED, "dtype": "fp32", "mu": 1e-3, "n_train": 256, "checkpoint_every": 10}
CPU_SEEDS = [0, 1, 2]
CPU_DATA = ("imdb.jsonl, the IMDb file of the UCI Sentiment Labelled Sentences (Kotzias et al., KDD 2015; "
            "CC BY 4.0): 1000 review sentences, 500 positive, rows {\"text\", \"label\"}")
TUNED_OOD = ("yelp.jsonl, the Yelp file of the same collection (CC BY 4.0): 1000 restaurant-review sentences, "
             "500 positive, the same rows")
#: seconds on the 2-core machine, bf16, mu = 1e-2, measured 2026-11-24 (docs/results.md): a direction's fixed cost
#: (the intercept of `paczero bench --model smollm2-135m-instruct --track lora --dtype bf16 --no-scaling --no-memory`
#: at N = 16 and 64 on the demo sentences: a step of 0.909 s for 32 forwards, 2.199 s for 128), one example's forward
#: (the cpu-scale PAC-ZPL LoRA runs' median step, 2.81 s for 128 forwards, less the fixed cost; an evaluation's
#: forward is counted the same), full FT's extra per step (the PAC-ZPL FT runs' median step, 4.56 s, less the LoRA
#: runs'), and a run's start (process, model load)
CPU_S_DIRECTION = 0.479
CPU_S_FORWARD, CPU_S_FT_EXTRA, CPU_S_START = (2.81 - CPU_S_DIRECTION) / 128, 4.56 - 2.81, 15.0
#: the regime table's machine, 2-core AMD EPYC (AVX2, no native bf16), fp32, mu = 1e-3, 2026-11-26: one example's
#: forward, the process CPU seconds of `paczero regime` over 1000 IMDb sentences (2000 forwards of a direction)
#: halved for its 2 threads (the machine was shared: wall seconds were 2.4x that); a direction's fixed cost is
#: CPU_S_DIRECTION's (the bf16 machine's intercept; at most 20 s of a run here)
CPU_FP32_S_DIRECTION, CPU_FP32_S_FORWARD = CPU_S_DIRECTION, 0.054
CPU_FP32_MEASURED = ("2026-11-26 on a 2-core AMD EPYC (AVX2, no native bf16), fp32: a forward is the process CPU "
                     "time of `paczero regime` over 1000 IMDb sentences (2000 forwards of one direction) halved for "
                     "its 2 threads (the machine was shared), the fixed cost the bf16 machine's intercept (`cpu-scale`)")


#: the practitioner's table (from the strong prompt) as data: scripts/recipe_templates/cpu-practitioner-grid.yaml
PRACTITIONER = TEMPLATES / "cpu-practitioner-grid.yaml"


def practitioner_cells(path: Path = PRACTITIONER) -> list[dict]:
    """The practitioner's table: one cell per method and learning rate, CPU_SHARED with the grid's shared keys."""
    grid = yaml.safe_load(path.read_text())
    cells = []
    for method, m in grid["methods"].items():
        for lr in m["lrs"]:
            cfg = {**CPU_SHARED, **grid["shared"], **m["config"], "lr": lr}
            cells.append({"table": "cpu-practitioner", "cell": f"{method}-lr{_sci(lr)}", "cfg": cfg,
                          "title": f"{m['title']}, lr {_sci(lr)}", "seeds": CPU_SEEDS, "source": "",
                          "paper": None, "forwards": m["forwards"], "method": method})
    return cells


def base(task: str, size: str, track: str) -> dict:
    """A paper cell's defaults: the paper's N, dev size and mu, the scripts' selection metric and eval_every."""
    return {
        "model": MODELS[size], "track": track, "lora_r": 8, "lora_alpha": 16, "dtype": "fp16",
        "task": task, "n_train": 1000, "n_dev": 500, "n_test": None,
        "mu": 1e-3, "weight_decay": 0.0, "eval_every": 100, "dev_best": True,  # eval_every: _common.sh's --eval_steps
        "select_metric": "loss" if task == "sst2" else "f1",  # the scripts' metric_for_best_model
        "checkpoint_every": 50 if track == "lora" else (100 if size == "1.3b" else 250),
        **(SQUAD_AS_SCRIPTS if task == "squad" else {}),
    }


def read_grid(path: Path = GRID) -> list[dict]:
    """The grid's cells: table, cell, title, seeds, source, config (base and row merged), paper, forwards, method."""
    cells = []
    for row in csv.DictReader(path.open()):
        meta = {"table", "cell", "base", "seeds", "forwards", "method", "source", "title", "paper"}
        values = {k: json.loads(v) for k, v in row.items() if k not in meta and v != ""}
        shared = {"cpu": CPU_SHARED, "cpu-regime": CPU_REGIME_SHARED}.get(row["base"])
        cfg = {**(shared if shared is not None else base(*row["base"].split())), **values}
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


def _sci(x: float) -> str:
    """5e-4, 1e-3: the paper's way of writing small settings."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


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
        out.append(f"lr {_sci(cfg['lr'])}, clip {cfg['clip']:g}{m} (those of the 1.3B LoRA PAC-MI headline recipe; "
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
        out.append(f"mu {_sci(cfg['mu'])} (stated for the headline recipes only)")
    return out


def _protocol_lines(cfg: dict) -> str:
    """The settings taken from the authors' scripts, and where this recipe deliberately differs from them."""
    metric = {"loss": "the lowest dev loss", "f1": "the highest dev F1"}[cfg["select_metric"]]
    dp = (" The DPZero cell runs dpzero-aggzo1, the authors' DP-AggZO code with K = 1 (their run_dpaggzo ... N=1); "
          "dpzero is DPZero as its own paper specifies it." if cfg["mechanism"] == "dpzero-aggzo1" else "")
    squad = (" SQuAD trains on minus the F1 of a greedy generation (objective f1, their --non_diff), generated as "
             "theirs: at most 50 new tokens, ending at the newline token or EOS, the answer stripped, prompts cut "
             "from the left to fit 2048 tokens with the answer (answer_stop newline-token, max_length 2048)."
             if cfg["task"] == "squad" else "")
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


def cpu_eval_forwards(cfg: dict) -> int:
    """A run's evaluation forwards: zero-shot dev and test, the dev evaluations, the final test."""
    return cfg["n_dev"] + cfg["n_test"] + cfg["steps"] // cfg["eval_every"] * cfg["n_dev"] + cfg["n_test"]


def cpu_seconds(cfg: dict, forwards: float) -> float:
    """A cell's estimated seconds per run: steps x (directions x fixed + forwards x s + FT's extra) + evaluations
    + start."""
    per_step = (cfg["num_directions"] * CPU_S_DIRECTION + forwards * CPU_S_FORWARD
                + (CPU_S_FT_EXTRA if cfg["track"] == "ft" else 0.0))
    return cfg["steps"] * per_step + cpu_eval_forwards(cfg) * CPU_S_FORWARD + CPU_S_START


def render_cpu(c: dict) -> str:
    """A CPU table's recipe: its header (long lines wrapped as comments), the recipe block and the config."""
    table, cfg, fw = c["table"], c["cfg"], c["forwards"]
    seconds = regime_seconds(cfg, fw) if table == "cpu-regime" else cpu_seconds(cfg, fw)
    head = (TEMPLATES / f"{table}-header.txt").read_text().format(
        title=c["title"], name=f"{table}/{c['cell']}", data=CPU_DATA, ood=TUNED_OOD, minutes=seconds / 60,
        seeds=" ".join(map(str, CPU_SEEDS)), seed0=CPU_SEEDS[0], steps=cfg["steps"], forwards=fw, track=cfg["track"])
    head = "\n".join(line if len(line) <= 110 else "\n# ".join(textwrap.wrap(line, 108, break_on_hyphens=False))
                     for line in head.splitlines()) + "\n"
    recipe = {"recipe": {"name": f"{table}/{c['cell']}", "table": table, "cell": c["cell"], "title": c["title"],
                         "seeds": CPU_SEEDS, "seed_field": "data_seed", "requires_data": CPU_DATA}}
    unused = {"mu"} if cfg["mechanism"] == "dp-sgd" else set()  # a gradient step perturbs nothing
    return head + dump(recipe) + "\n" + dump({k: cfg[k] for k in KEY_ORDER if k in cfg and k not in unused})


def cpu_scale_readme(cells: list[dict]) -> str:
    rows, total = [], 0.0
    for c in cells:
        cfg, fw = c["cfg"], c["forwards"]
        s = cpu_seconds(cfg, fw)
        total += s * len(CPU_SEEDS)
        setting = (f"M {cfg['num_subsets']}" if "num_subsets" in cfg else
                   f"q {cfg['sample_rate']:g}, dp_clip {cfg['dp_clip']:g}" if "epsilon" in cfg else "batch: universe")
        rows.append(f"| `{c['cell']}` | {c['title']} | {cfg['track']} | {cfg['steps']} | {_sci(cfg['lr'])} | "
                    f"{setting} | {fw:g} | {s / 60:.1f} |")
    return (TEMPLATES / "cpu-scale-README.md").read_text().format(
        table="cpu-scale", data=CPU_DATA, seeds=" ".join(map(str, CPU_SEEDS)), rows="\n".join(rows),
        n_cells=len(cells), n_seeds=len(CPU_SEEDS), s_direction=CPU_S_DIRECTION, s_forward_ms=CPU_S_FORWARD * 1000,
        s_ft_extra=CPU_S_FT_EXTRA, s_start=CPU_S_START, eval_forwards=cpu_eval_forwards(cells[0]["cfg"]),
        hours=total / 3600)


def cpu_tuned_readme(cells: list[dict]) -> str:
    """Each method's grid is its learning rates but the lowest and the highest (its edges, run only when the
    choice lies at that end)."""
    methods: dict = {}
    for c in cells:
        methods.setdefault(c["method"], (c["title"].rsplit(", lr", 1)[0], c["cfg"], c["forwards"], []))[3].append(
            c["cfg"]["lr"])
    family = {m: ("dp" if cfg["mechanism"] in ("dpzero-aggzo1", "dp-aggzo") else "pac")
              for m, (_, cfg, _, _) in methods.items()}
    grid = {fam: sorted(next(lrs for m, (_, _, _, lrs) in methods.items() if family[m] == fam))[1:-1]
            for fam in ("pac", "dp")}
    patterns = [f"cpu-tuned/{{{','.join(m for m in methods if family[m] == fam)}}}-lr"
                f"{{{','.join(_sci(x) for x in grid[fam])}}}" for fam in ("pac", "dp")]
    in_grid = [(c["cfg"], c["forwards"]) for c in cells if c["cfg"]["lr"] in grid[family[c["method"]]]]
    rows = [f"| `{m}-lr*` | {t} | {cfg['steps']} | {', '.join(_sci(x) for x in sorted(lrs))} | "
            f"{cfg['lr_schedule']} | {cpu_seconds(cfg, fw) / 60:.1f} |" for m, (t, cfg, fw, lrs) in methods.items()]
    return (TEMPLATES / "cpu-tuned-README.md").read_text().format(
        table="cpu-tuned", data=CPU_DATA, ood=TUNED_OOD, rows="\n".join(rows), grid_n=len(in_grid), patterns=patterns,
        grid_hours=sum(cpu_seconds(cfg, fw) for cfg, fw in in_grid) / 3600,
        seeds_hours=sum(cpu_seconds(cfg, fw) for _, cfg, fw, _ in methods.values()) * (len(CPU_SEEDS) - 1) / 3600)


#: the regime table's out-of-domain file (Yelp): its sentences, evaluated zero-shot and at the end
REGIME_OOD_ROWS = 1000


def regime_eval_forwards(cfg: dict) -> int:
    """A regime run's evaluation forwards: zero-shot dev, test and out-of-domain file, 5 dev evaluations, the final
    test and out-of-domain file, the loss attack's records of U and of test."""
    return (cfg["n_dev"] + cfg["n_test"] + REGIME_OOD_ROWS + 5 * cfg["n_dev"] + cfg["n_test"] + REGIME_OOD_ROWS
            + cfg["n_train"] + cfg["n_test"])


def regime_seconds(cfg: dict, forwards: float) -> float:
    """A regime cell's estimated seconds per run in fp32: steps x (directions x fixed + forwards x s) + the
    evaluations' forwards x s + start."""
    per_step = cfg["num_directions"] * CPU_FP32_S_DIRECTION + forwards * CPU_FP32_S_FORWARD
    return cfg["steps"] * per_step + regime_eval_forwards(cfg) * CPU_FP32_S_FORWARD + CPU_S_START


def _regime_steps(cfg: dict, n: int, minutes: float = 20.0) -> int:
    """The most PAC steps (a multiple of 5, for 5 dev evaluations) a run at universe size ``n`` fits in ``minutes``."""
    fixed = regime_eval_forwards({**cfg, "n_train": n}) * CPU_FP32_S_FORWARD + CPU_S_START
    return int((minutes * 60 - fixed) / (CPU_FP32_S_DIRECTION + 2 * n * CPU_FP32_S_FORWARD)) // 5 * 5


def cpu_regime_readme(cells: list[dict]) -> str:
    """Each method's grid is its three learning rates after the lowest: its cpu-tuned choice and the ladder's value
    either side. The others are edges, run only when the choice lies at an end (the lowest, the highest, and
    beyond the highest further edges while the last one won too)."""
    methods: dict = {}
    for c in cells:
        methods.setdefault(c["method"], (c["title"].rsplit(", lr", 1)[0], c["cfg"], c["forwards"], []))[3].append(
            c["cfg"]["lr"])
    grid = {m: sorted(lrs)[1:4] for m, (_, _, _, lrs) in methods.items()}
    patterns = " \\\n       ".join(f"cpu-regime/{m}-lr{{{','.join(_sci(x) for x in grid[m])}}}" for m in methods)
    in_grid = [(c["cfg"], c["forwards"]) for c in cells if c["cfg"]["lr"] in grid[c["method"]]]
    rows = [f"| `{m}-lr*` | {t} | {cfg['steps']} | {', '.join(_sci(x) for x in sorted(lrs))} | "
            f"{cfg['lr_schedule']} | {regime_seconds(cfg, fw) / 60:.1f} |" for m, (t, cfg, fw, lrs) in methods.items()]
    pac = next(cfg for _, cfg, _, _ in methods.values() if cfg["mechanism"] == "pac-zpl")
    dp = next(cfg for _, cfg, _, _ in methods.values() if cfg["mechanism"] == "dpzero-aggzo1")
    return (TEMPLATES / "cpu-regime-README.md").read_text().format(
        table="cpu-regime", data=CPU_DATA, ood=TUNED_OOD, rows="\n".join(rows), grid_n=len(in_grid),
        patterns=patterns, grid_hours=sum(regime_seconds(cfg, fw) for cfg, fw in in_grid) / 3600,
        seeds_hours=sum(regime_seconds(cfg, fw) for _, cfg, fw, _ in methods.values()) * (len(CPU_SEEDS) - 1) / 3600,
        n=pac["n_train"], forwards=2 * pac["n_train"], t_pac=pac["steps"], every_pac=pac["eval_every"],
        t_dp=dp["steps"], every_dp=dp["eval_every"], s_direction=CPU_FP32_S_DIRECTION,
        step_s=CPU_FP32_S_DIRECTION + 2 * pac["n_train"] * CPU_FP32_S_FORWARD, eval_s=regime_eval_forwards(pac)
        * CPU_FP32_S_FORWARD, t_128=_regime_steps(pac, 128), t_512=_regime_steps(pac, 512),
        t_n=_regime_steps(pac, pac["n_train"]),
        n_1000=1000 / pac["n_train"],
        s_forward_ms=CPU_FP32_S_FORWARD * 1000, s_start=CPU_S_START, measured=CPU_FP32_MEASURED)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report stale or missing recipes and exit 1, write nothing")
    args = ap.parse_args(argv)
    cells = read_grid() + practitioner_cells()
    wanted = {ROOT / c["table"] / f"{c['cell']}.yaml": render(c) if c["paper"] else render_cpu(c) for c in cells}
    assert len(wanted) == len(cells), "duplicate recipe names"
    wanted[ROOT / "paper_results.csv"] = paper_results_csv([c for c in cells if c["paper"] is not None])
    wanted[ROOT / "cpu-scale" / "README.md"] = cpu_scale_readme([c for c in cells if c["table"] == "cpu-scale"])
    wanted[ROOT / "cpu-tuned" / "README.md"] = cpu_tuned_readme([c for c in cells if c["table"] == "cpu-tuned"])
    wanted[ROOT / "cpu-regime" / "README.md"] = cpu_regime_readme([c for c in cells if c["table"] == "cpu-regime"])
    wanted[ROOT / "cpu-practitioner" / "README.md"] = (TEMPLATES / "cpu-practitioner-README.md").read_text()
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
