"""The CPU tables' arithmetic for scripts/make_recipes.py: their settings and the measured seconds from
scripts/recipe_templates/cpu-tables.yaml, a run's estimated seconds, and the READMEs of cpu-scale, cpu-tuned and
cpu-regime (each row a method or cell, its learning rates, steps and minutes; the grid's hours)."""
from __future__ import annotations

from pathlib import Path

import yaml

TEMPLATES = Path(__file__).resolve().parent / "recipe_templates"
#: the CPU tables' settings and the seconds their READMEs' estimates are made of, as data (each value's reason there)
CPU = yaml.safe_load((TEMPLATES / "cpu-tables.yaml").read_text())
CPU_SHARED, CPU_SEEDS, CPU_DATA, TUNED_OOD = CPU["shared"], CPU["seeds"], CPU["data"], CPU["ood"]
CPU_REGIME_SHARED = {**CPU_SHARED, **CPU["regime"]}
_S = CPU["seconds"]
CPU_S_DIRECTION, CPU_S_START = _S["direction"], _S["start"]
CPU_S_FORWARD, CPU_S_FT_EXTRA = (_S["lora_step_128"] - CPU_S_DIRECTION) / 128, _S["ft_step_128"] - _S["lora_step_128"]
CPU_FP32_S_DIRECTION, CPU_FP32_S_FORWARD, CPU_FP32_MEASURED = CPU_S_DIRECTION, _S["fp32_forward"], _S["fp32_measured"]
REGIME_OOD_ROWS = CPU["regime_ood_rows"]


def sci(x: float) -> str:
    """5e-4, 1e-3: the paper's way of writing small settings."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


#: the tables tuned on dev from the strong prompt, each a grid as data: scripts/recipe_templates/<table>-grid.yaml
#: (cpu-practitioner: IMDb sentences; cpu-sst2 and gpu-sst2: SST-2, the paper's task; cpu-agnews and cpu-sst5: four
#: and five classes from a weak start)
TUNED_GRIDS = ("cpu-practitioner", "cpu-sst2", "gpu-sst2", "cpu-agnews", "cpu-sst5")
PRACTITIONER = TEMPLATES / "cpu-practitioner-grid.yaml"


def practitioner_cells(path: Path = PRACTITIONER, table: str = "cpu-practitioner") -> list[dict]:
    """A tuned table: one cell per method and learning rate, CPU_SHARED with the grid's shared keys (and its
    data, seeds and per-forward seconds where the grid gives its own)."""
    grid = yaml.safe_load(path.read_text())
    cells = []
    for method, m in grid["methods"].items():
        for lr in m["lrs"]:
            cfg = dp_fraction({**CPU_SHARED, **grid["shared"], **m["config"], "lr": lr},
                              grid.get("dp_pool_rows", CPU["dp_pool_rows"]), grid.get("dp_test_named", False))
            cells.append({"table": table, "cell": f"{method}-lr{sci(lr)}", "cfg": cfg,
                          "title": f"{m['title']}, lr {sci(lr)}", "seeds": grid.get("seeds", CPU_SEEDS),
                          "source": "", "paper": None, "forwards": m["forwards"], "method": method,
                          "data": grid.get("data", CPU_DATA), "ood": grid.get("ood", TUNED_OOD),
                          "seed_field": grid.get("seed_field", "data_seed")})
    return cells


def dp_fraction(cfg: dict, pool_rows: int, test_named: bool) -> dict:
    """A DP cell's config with the data_fraction that keeps about the rows its sizes ask for of a benchmark file
    of ``pool_rows`` public rows (the stable split of a DP run draws each row apart, so the sizes are expected
    ones; ``test_named``: the file names its test rows, which are used whole); other cells unchanged."""
    if cfg.get("mechanism") not in ("dpzero", "dp-aggzo", "dpzero-aggzo1", "dp-sgd"):
        return cfg
    wanted = cfg["n_train"] + cfg["n_dev"] + (0 if test_named else cfg["n_test"])
    return {**cfg, "data_fraction": round(wanted / pool_rows, 6)} if wanted < pool_rows else cfg


def tuned_cells() -> list[dict]:
    """Every tuned table's cells (:data:`TUNED_GRIDS`)."""
    return [c for table in TUNED_GRIDS for c in practitioner_cells(TEMPLATES / f"{table}-grid.yaml", table)]


def cpu_eval_forwards(cfg: dict) -> int:
    """A run's evaluation forwards: zero-shot dev and test, the dev evaluations, the final test."""
    return cfg["n_dev"] + cfg["n_test"] + cfg["steps"] // cfg["eval_every"] * cfg["n_dev"] + cfg["n_test"]


def regime_eval_forwards(cfg: dict) -> int:
    """A regime run's evaluation forwards: zero-shot dev, test and out-of-domain file, 5 dev evaluations, the final
    test and out-of-domain file, the loss attack's records of U and of test."""
    return (cfg["n_dev"] + cfg["n_test"] + REGIME_OOD_ROWS + 5 * cfg["n_dev"] + cfg["n_test"] + REGIME_OOD_ROWS
            + cfg["n_train"] + cfg["n_test"])


def run_seconds(table: str, cfg: dict, forwards: float) -> float:
    """A CPU cell's estimated seconds per run: steps x (directions x fixed + forwards x s + FT's extra) + the
    evaluations' forwards x s + start; the regime table's in fp32, on its own machine."""
    if table == "cpu-regime":
        s_forward, evals, extra = CPU_FP32_S_FORWARD, regime_eval_forwards(cfg), 0.0
    else:
        s_forward, evals = CPU_S_FORWARD, cpu_eval_forwards(cfg)
        extra = CPU_S_FT_EXTRA if cfg["track"] == "ft" else 0.0
    per_step = cfg["num_directions"] * CPU_S_DIRECTION + forwards * s_forward + extra
    return cfg["steps"] * per_step + evals * s_forward + CPU_S_START


def cpu_scale_readme(cells: list[dict]) -> str:
    rows, total = [], 0.0
    for c in cells:
        cfg, fw = c["cfg"], c["forwards"]
        s = run_seconds("cpu-scale", cfg, fw)
        total += s * len(CPU_SEEDS)
        setting = (f"M {cfg['num_subsets']}" if "num_subsets" in cfg else
                   f"q {cfg['sample_rate']:g}, dp_clip {cfg['dp_clip']:g}" if "epsilon" in cfg else "batch: universe")
        rows.append(f"| `{c['cell']}` | {c['title']} | {cfg['track']} | {cfg['steps']} | {sci(cfg['lr'])} | "
                    f"{setting} | {fw:g} | {s / 60:.1f} |")
    return (TEMPLATES / "cpu-scale-README.md").read_text().format(
        table="cpu-scale", data=CPU_DATA, seeds=" ".join(map(str, CPU_SEEDS)), rows="\n".join(rows),
        n_cells=len(cells), n_seeds=len(CPU_SEEDS), s_direction=CPU_S_DIRECTION, s_forward_ms=CPU_S_FORWARD * 1000,
        s_ft_extra=CPU_S_FT_EXTRA, s_start=CPU_S_START, eval_forwards=cpu_eval_forwards(cells[0]["cfg"]),
        hours=total / 3600)


def _lr_table(table: str, cells: list[dict], grid_of) -> tuple[dict, dict, dict]:
    """A tuned table's README fields (a row per method: its learning rates and minutes per run; the grid's cells and
    their hours; the other seeds' hours), its methods (title, config, forwards, learning rates) and each method's
    grid (``grid_of(method, methods)``: the learning rates run first; the others are edges)."""
    methods: dict = {}
    for c in cells:
        methods.setdefault(c["method"], (c["title"].rsplit(", lr", 1)[0], c["cfg"], c["forwards"], []))[3].append(
            c["cfg"]["lr"])
    grid = {m: grid_of(m, methods) for m in methods}
    in_grid = [(c["cfg"], c["forwards"]) for c in cells if c["cfg"]["lr"] in grid[c["method"]]]
    rows = [f"| `{m}-lr*` | {t} | {cfg['steps']} | {', '.join(sci(x) for x in sorted(lrs))} | "
            f"{cfg['lr_schedule']} | {run_seconds(table, cfg, fw) / 60:.1f} |"
            for m, (t, cfg, fw, lrs) in methods.items()]
    hours = sum(run_seconds(table, cfg, fw) for _, cfg, fw, _ in methods.values()) * (len(CPU_SEEDS) - 1) / 3600
    return dict(table=table, data=CPU_DATA, ood=TUNED_OOD, rows="\n".join(rows), grid_n=len(in_grid), seeds_hours=hours,
                grid_hours=sum(run_seconds(table, cfg, fw) for cfg, fw in in_grid) / 3600), methods, grid


def cpu_tuned_readme(cells: list[dict]) -> str:
    """Each family's (PAC, DP) grid is its first method's learning rates but the lowest and the highest (its edges,
    run only when the choice lies at that end)."""
    family = {c["method"]: "dp" if c["cfg"]["mechanism"] in ("dpzero-aggzo1", "dp-aggzo") else "pac" for c in cells}
    fields, methods, grid = _lr_table("cpu-tuned", cells, lambda m, ms: sorted(next(
        lrs for k, (_, _, _, lrs) in ms.items() if family[k] == family[m]))[1:-1])
    patterns = [f"cpu-tuned/{{{','.join(m for m in methods if family[m] == fam)}}}-lr"
                f"{{{','.join(sci(x) for x in next(grid[m] for m in methods if family[m] == fam))}}}"
                for fam in ("pac", "dp")]
    return (TEMPLATES / "cpu-tuned-README.md").read_text().format(**fields, patterns=patterns)


def _regime_steps(cfg: dict, n: int, minutes: float = 20.0) -> int:
    """The most PAC steps (a multiple of 5, for 5 dev evaluations) a run at universe size ``n`` fits in ``minutes``."""
    fixed = regime_eval_forwards({**cfg, "n_train": n}) * CPU_FP32_S_FORWARD + CPU_S_START
    return int((minutes * 60 - fixed) / (CPU_FP32_S_DIRECTION + 2 * n * CPU_FP32_S_FORWARD)) // 5 * 5


def cpu_regime_readme(cells: list[dict]) -> str:
    """Each method's grid is its three learning rates after the lowest: its cpu-tuned choice and the ladder's value
    either side. The others are edges, run only when the choice lies at an end (the lowest, the highest, and
    beyond the highest further edges while the last one won too)."""
    fields, methods, grid = _lr_table("cpu-regime", cells, lambda m, ms: sorted(ms[m][3])[1:4])
    pac = next(cfg for _, cfg, _, _ in methods.values() if cfg["mechanism"] == "pac-zpl")
    dp = next(cfg for _, cfg, _, _ in methods.values() if cfg["mechanism"] == "dpzero-aggzo1")
    return (TEMPLATES / "cpu-regime-README.md").read_text().format(
        **fields, patterns=" \\\n       ".join(f"cpu-regime/{m}-lr{{{','.join(sci(x) for x in grid[m])}}}"
                                              for m in methods),
        pac=pac, dp=dp, forwards=2 * pac["n_train"], s_direction=CPU_FP32_S_DIRECTION,
        step_s=CPU_FP32_S_DIRECTION + 2 * pac["n_train"] * CPU_FP32_S_FORWARD,
        eval_s=regime_eval_forwards(pac) * CPU_FP32_S_FORWARD, t_128=_regime_steps(pac, 128),
        t_512=_regime_steps(pac, 512), t_n=_regime_steps(pac, pac["n_train"]), n_1000=1000 / pac["n_train"],
        s_forward_ms=CPU_FP32_S_FORWARD * 1000, s_start=CPU_S_START, measured=CPU_FP32_MEASURED)
