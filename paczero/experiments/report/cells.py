"""A report's data: the runs under a folder, their cells (one recipe and one setting), labels and rows."""
from __future__ import annotations

import csv
import json
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from paczero.config import DP_MECHANISMS
from paczero.run.curves import read_records
from paczero.recipes import recipes_root


PAPER_RESULTS = recipes_root() / "paper_results.csv"
RUN_COLUMNS = ["cell", "table", "seed", "task", "model", "track", "mechanism", "mi_budget", "epsilon",
               "num_directions", "steps", "lr", "clip", "metric", "test", "dev", "zero_shot_test", "selected_step",
               "select_metric", "unanimity_rate", "free_frac", "mi_bound", "mia_bound", "matched_dp_epsilon",
               "mi_spent_realised", "epsilon_rdp", "epsilon_pld", "delta", "noise_multiplier", "sample_rate",
               "seconds_per_step", "run_dir"]
CELL_COLUMNS = ["cell", "table", "method", "task", "model", "track", "steps", "n", "seeds", "test_mean", "test_std",
                "dev_mean", "dev_std", "unanimity_mean", "mi_bound_max", "mia_bound_max", "mi_spent_realised_max",
                "paper_test", "paper_std", "paper_n", "recipe_changed"]


# ---------------------------------------------------------------------------- loading


@dataclass
class Run:
    cell: str
    table: str
    run_dir: Path
    summary: dict

    @property
    def cfg(self) -> dict:
        return self.summary["config"]

    @property
    def asked(self) -> dict:
        """The run's config as it was asked for. A run whose prompt ``template: auto`` chose on dev records the
        template (and, where they were chosen too, the answer words) it chose: an outcome of the run, like its
        metrics, which may differ between seeds; here they read as asked, so such runs pool into one cell. The
        words were chosen where the candidates had several sets, or one set that the class names give (the
        words auto forms from ``labels``: the same candidates whether or not they were also given)."""
        prompt = self.summary.get("prompt") or {}
        if prompt.get("source") != "auto":
            return self.cfg
        words = {json.dumps(c.get("verbalizer"), sort_keys=True) for c in prompt.get("candidates") or []}
        named = {str(i): " " + str(n).strip() for i, n in enumerate(self.cfg.get("labels") or [])}
        chosen = len(words) != 1 or (named and words == {json.dumps(named, sort_keys=True)})
        return {**self.cfg, "template": "auto", **({"verbalizer": None} if chosen else {})}

    @property
    def privacy(self) -> dict:
        return self.summary.get("privacy") or {}

    @property
    def seed(self) -> int | None:
        """The run's seed: k of a sweep's ``seed<k>`` folder (the seed the sweep set, in whichever config field
        its recipe's ``seed_field`` names), else the config's public seed."""
        m = re.fullmatch(r"seed(\d+)", self.run_dir.name)
        return int(m.group(1)) if m else self.cfg.get("seed")

    def metric(self, split: str) -> float | None:
        """The task metric on ``split`` ("test", "dev"), in percent."""
        values = self.summary.get(split) or {}
        v = values.get(self.summary.get("metric", "accuracy"))
        return None if v is None else 100.0 * float(v)

    @property
    def rungs(self) -> list[dict]:
        """A ladder run's rungs (summary.json ``rungs``): this one trajectory's weights at each rung."""
        return self.summary.get("rungs") or []

    def rung_metric(self, rung: dict | None, split: str) -> float | None:
        """The task metric of a rung on ``split`` ("test", "dev"), in percent."""
        v = ((rung or {}).get(split) or {}).get(self.summary.get("metric", "accuracy"))
        return None if v is None else 100.0 * float(v)

    @property
    def zero_shot_test(self) -> float | None:
        zs = (self.summary.get("zero_shot") or {}).get("test") or {}
        v = zs.get(self.summary.get("metric", "accuracy"))
        return None if v is None else 100.0 * float(v)


def find_runs(runs_dir: str | Path, *, exclude: Path | None = None) -> list[Run]:
    """Every run (a folder with summary.json) under ``runs_dir``, sorted by cell and seed. A sweep's run belongs
    to its recipe's cell; runs outside a sweep (each in its own folder) whose settings are the same but for
    :data:`EXECUTION_KEYS` (seeds, folder, device, ...) pool into one cell, named by their folders."""
    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        raise ValueError(f"runs folder {str(runs_dir)!r} does not exist")
    runs: list[Run] = []
    outside: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for path in sorted(root.rglob("summary.json")):
        run_dir = path.parent
        if exclude is not None and exclude in run_dir.parents:
            continue
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict) \
                or "mechanism" not in summary["config"]:
            continue  # not a run's summary
        cell = _recorded_recipe(run_dir)
        loose = False  # a run outside a sweep: its own folder names it
        if cell is None:
            rel = run_dir.relative_to(root)
            cell_path = rel.parent if re.fullmatch(r"seed\d+", rel.name) and rel.parent != Path(".") else rel
            cell, loose = (str(cell_path) if str(cell_path) != "." else run_dir.name), cell_path == rel
        run = Run(cell, cell.split("/")[0] if "/" in cell else "other", run_dir, summary)
        runs.append(run)
        if loose:
            outside[(run.table, json.dumps(experiment(run.asked), sort_keys=True, default=str))].append(run)
    for group in outside.values():  # runs outside a sweep with one configuration: one cell, its seeds its runs
        names = sorted(r.cell for r in group)
        for r in group:
            r.cell = " + ".join(names) if len(names) <= 3 else f"{names[0]} + {len(names) - 1} more"
    return sorted(runs, key=lambda r: (r.cell, r.seed or 0))


def _recorded_recipe(run_dir: Path) -> str | None:
    """The recipe a sweep ran in ``run_dir``: the name in the header of its ``seed<k>.yaml`` beside it."""
    import yaml

    materialised = run_dir.with_name(run_dir.name + ".yaml")
    try:
        header = (yaml.safe_load(materialised.read_text()) or {}).get("recipe") or {}
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        return None
    name = header.get("name") if isinstance(header, dict) else None
    return str(name) if name else None


def load_paper_results(path: Path = PAPER_RESULTS) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------- statistics


def mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation (ddof = 1; None for one value) and n, ignoring missing values."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None), len(xs)


def fmt_ms(mean: float | None, std: float | None, n: int, digits: int = 2) -> str:
    """``89.51 ± 1.12 (n=4)``, as in the paper; ``60.55 (n=1)`` for one seed; ``—`` for none."""
    if mean is None:
        return "—"
    core = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
    return f"{core} (n={n})"


def update_rules(cfg: dict) -> list[str]:
    """The update rules of a PAC run that differ from the paper's (``noised_coef``, ``coin_step``), in words."""
    return (["noised steps by the posterior mean"] if cfg.get("noised_coef") == "posterior-mean" else []) + \
        (["coin steps skipped"] if cfg.get("coin_step") == "skip" else [])


def method_label(cfg: dict) -> str:
    mech, k = cfg.get("mechanism"), cfg.get("num_directions", 1)
    if mech == "pac-mi":
        label = f"PAC-MI {cfg.get('mi_budget'):g}"
        if cfg.get("schedule") == "uniform":
            label += " uniform"
    elif mech == "pac-zpl":
        label = "PAC-ZPL"
    elif mech == "hybrid":
        label = f"hybrid {cfg.get('mi_budget'):g}@{cfg.get('switch_step')}"
    elif mech == "dpzero":
        return f"DPZero K=1 ε={cfg.get('epsilon'):g}"
    elif mech == "dp-aggzo":
        return f"DP-AggZO K={k} ε={cfg.get('epsilon'):g}"
    elif mech == "dpzero-aggzo1":
        return f"{DP_NAMES[mech]} K=1 ε={cfg.get('epsilon'):g}"
    elif mech == "dp-sgd":
        return f"DP-SGD ε={cfg.get('epsilon'):g}"
    elif mech == "mezo":
        label = "MeZO (non-private)"
    elif mech == "adamw":
        return "AdamW (non-private, first-order)"
    else:
        label = str(mech)
    return label + (f" K={k}" if k and k > 1 else "")


#: the DP baselines' names in tables and plots
DP_NAMES = {"dpzero": "DPZero", "dp-aggzo": "DP-AggZO", "dpzero-aggzo1": "DPZero (DP-AggZO code)", "dp-sgd": "DP-SGD"}


def model_label(model: str) -> str:
    m = re.search(r"opt-(\d+(?:\.\d+)?)b", model.lower())
    return f"{m.group(1)}B" if m else model.split("/")[-1]


#: config keys that say where and how a run was executed, not what it measures: runs that differ only in
#: these pool into one cell (the seeds are what a cell's runs differ in: the public seed, or the data seed
#: where the recipe's sweep seeds set that, as the paper's recipes do)


EXECUTION_KEYS = frozenset({"seed", "data_seed", "private_seed", "out_dir", "overwrite", "resume", "progress",
                            "report_to", "device", "device_map", "token_budget", "lockstep_batches", "compile",
                            "checkpoint_every", "eval_zero_shot", "push_to_hub", "hub_private", "threads"})


def experiment(cfg: dict) -> dict:
    """A run's settings that define its experiment (execution keys aside); a key the run's config predates
    counts as its default (a run recorded before ``noised_coef`` existed ran the paper's rule)."""
    from paczero.config import TrainConfig

    defaults = json.loads(json.dumps(TrainConfig().to_dict()))
    full = {**{k: v for k, v in defaults.items() if k not in cfg}, **cfg}
    return {k: v for k, v in full.items() if k not in EXECUTION_KEYS}


@dataclass
class Cell:
    """The runs of one recipe (one cell of a table), over seeds, all with the same settings.
    ``changed``: the keys whose values differ from the shipped recipe of the same name (its paper figure is
    then a reference for another experiment)."""
    name: str
    table: str
    runs: list[Run] = field(default_factory=list)
    paper: dict | None = None
    changed: list[str] = field(default_factory=list)
    paper_rungs: dict[int, dict] = field(default_factory=dict)  # a ladder: the paper's figure at each rung

    @property
    def cfg(self) -> dict:
        return self.runs[0].cfg

    @property
    def by_dev_best_rung(self) -> bool:
        """Whether the cell's figure is each seed's dev-best rung (the paper's, for its canonical ladder cells)."""
        return (self.paper or {}).get("rung_statistic") == "dev-best-rung" and all(r.rungs for r in self.runs)

    def stat(self, what: str) -> tuple[float | None, float | None, int]:
        if what in ("test", "dev") and self.by_dev_best_rung:
            return mean_std(r.rung_metric(dev_best_rung(r), what) for r in self.runs)
        if what in ("test", "dev"):
            return mean_std(r.metric(what) for r in self.runs)
        if what == "unanimity":
            return mean_std(_pct(r.privacy.get("unanimity_rate")) for r in self.runs)
        if what == "test_loss":
            return mean_std((r.summary.get("test") or {}).get("loss") for r in self.runs)
        raise KeyError(what)

    def text(self, what: str = "test", paper: bool = True) -> str:
        s = fmt_ms(*self.stat(what))
        if paper and self.paper and what == "test" and self.paper.get("reported_test"):
            std = self.paper.get("std")
            s += f" [paper {float(self.paper['reported_test']):.2f}" + (f" ± {float(std):.2f}" if std else "")
            s += (f"; recipe changed: {', '.join(self.changed)}]" if self.changed else "]")
        return s + (" (each seed's dev-best rung)" if self.by_dev_best_rung and what in ("test", "dev") else "")


def dev_best_rung(run: Run) -> dict | None:
    """The run's rung whose dev metrics are best by the run's selection metric (``select_metric``, else the
    task's; "loss": the lowest): a choice that reads dev only. A tie goes to the earlier rung."""
    metric = run.summary.get("select_metric") or run.cfg.get("select_metric") or run.summary.get("metric", "accuracy")
    sign = -1.0 if metric == "loss" else 1.0
    scored = [(sign * r["dev"][metric], -r["step"], i) for i, r in enumerate(run.rungs)
              if r.get("dev") and r["dev"].get(metric) is not None]
    return run.rungs[max(scored)[2]] if scored else None


def _pct(v: Any) -> float | None:
    return None if v is None else 100.0 * float(v)


def group_cells(runs: list[Run], paper_rows: list[dict]) -> list[Cell]:
    """One cell per recipe and settings: runs of one recipe with other settings (a sweep re-run with other
    ``--set`` values) are separate cells, named with the keys that tell them apart."""
    by_recipe = {r["recipe"]: r for r in paper_rows if r.get("recipe") and not r.get("rung")}
    by_rung: dict[str, dict[int, dict]] = defaultdict(dict)  # a ladder recipe's figure at each rung
    for r in paper_rows:
        if r.get("recipe") and r.get("rung"):
            by_rung[r["recipe"]][int(r["rung"])] = r
    variants: dict[str, dict[str, list[Run]]] = defaultdict(dict)
    for run in runs:
        variants[run.cell].setdefault(json.dumps(experiment(run.asked), sort_keys=True, default=str), []).append(run)
    cells = []
    for name, groups in variants.items():
        configs = [experiment(g[0].asked) for g in groups.values()]
        differing = sorted(k for k in set().union(*configs) if len({json.dumps(c.get(k), default=str)
                                                                     for c in configs}) > 1)
        for group, cfg in zip(groups.values(), configs):
            label = name if not differing else f"{name} [{' '.join(f'{k}={cfg.get(k)}' for k in differing)}]"
            cells.append(Cell(label, group[0].table, group, paper=by_recipe.get(name),
                              changed=_changed_from_recipe(name, cfg), paper_rungs=by_rung.get(name, {})))
    return cells


def _changed_from_recipe(name: str, cfg: dict) -> list[str]:
    """The keys a shipped recipe ``name`` sets that ``cfg`` holds with another value ([] for no such recipe)."""
    from paczero.recipes import recipes_root
    from paczero.config import load_yaml

    path = recipes_root() / f"{name}.yaml"
    if not path.is_file():
        return []
    recipe = load_yaml(path)
    return sorted(k for k, v in recipe.items()
                  if k not in EXECUTION_KEYS and json.dumps(cfg.get(k), default=str) != json.dumps(v, default=str)
                  and (k, v) != ("dtype", "auto"))  # auto: the run recorded what it resolved to


# ---------------------------------------------------------------------------- tables


def privacy_rows(run: Run) -> dict[str, Any]:
    """The run's guarantee (``mi_bound``, ``mia_bound``, ``matched_dp_epsilon``; DP: its (ε, δ) and the MIA
    bound of the target) and, for PAC runs, the realised spend as its own column (``mi_spent_realised``:
    one run's sum of per-release charges, not a bound)."""
    p, cfg = run.privacy, run.cfg
    out = {"mi_bound": None, "mia_bound": p.get("mia_bound"), "matched_dp_epsilon": None, "mi_spent_realised": None,
           "epsilon_rdp": None, "epsilon_pld": None, "delta": None, "noise_multiplier": None, "sample_rate": None}
    if cfg.get("mechanism") in DP_MECHANISMS:
        out.update({k: p.get(k) for k in ("epsilon_rdp", "epsilon_pld", "delta", "noise_multiplier", "sample_rate")})
    elif p.get("private") is not False:
        out.update(mi_bound=p.get("mi_bound"), matched_dp_epsilon=p.get("matched_dp_epsilon"),
                   mi_spent_realised=p.get("mi_spent"))
        if "mi_bound" not in p and p.get("mi_total_budget") is not None:
            # a statement that names no bound: the guarantee is its budget's (Theorem 1)
            from paczero.privacy import dp_epsilon_matching_mi, mia_bound

            b = float(p["mi_total_budget"])
            out.update(mi_bound=b, mia_bound=mia_bound(b), matched_dp_epsilon=dp_epsilon_matching_mi(b) if b else 0.0)
    return out


def guarantee(c: Cell) -> tuple[str, float | None]:
    """A cell's guarantee in words and its MIA bound (prior 0.5), the weakest of its runs': ``MI = 0``,
    ``MI ≤ b nats`` (PAC), ``(ε, δ)-DP`` by the RDP accountant, or none (a non-private reference)."""
    rows = [privacy_rows(r) for r in c.runs]
    mias = [x["mia_bound"] for x in rows if x["mia_bound"] is not None]
    if c.cfg.get("mechanism") in DP_MECHANISMS:
        eps = [x["epsilon_rdp"] for x in rows if x["epsilon_rdp"] is not None]
        delta = next((x["delta"] for x in rows if x["delta"] is not None), None)
        text = f"({max(eps):.3g}, {delta:g})-DP" if eps and delta is not None else "DP (not recorded)"
        return text, max(mias) if mias else None
    bounds = [x["mi_bound"] for x in rows if x["mi_bound"] is not None]
    if not bounds:
        return "none (non-private reference)", None
    b = max(bounds)
    return ("MI = 0" if b == 0 else f"MI ≤ {b:.3g} nats"), max(mias) if mias else None


def _g(v: Any) -> str:
    return "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def _task_label(task: str) -> str:
    return {"sst2": "SST-2", "squad": "SQuAD", "demo": "demo"}.get(task, task)


def task_data_label(cfg: dict) -> str:
    """The task's data set, or the kind of task and the data file's name where the run read one
    (``classification (imdb.jsonl)``: a file of the user's is not SST-2)."""
    data = cfg.get("data")
    if data in (None, "demo"):
        return _task_label(cfg["task"])
    kind = {"sst2": "classification", "demo": "classification", "squad": "QA"}.get(cfg["task"], cfg["task"])
    return f"{kind} ({str(data).replace(chr(92), '/').rsplit('/', 1)[-1]})"


# ---------------------------------------------------------------------------- plots


def read_log(run_dir: Path) -> list[dict]:
    return read_records(run_dir / "log.jsonl")


def run_row(run: Run) -> dict[str, Any]:
    cfg, p = run.cfg, run.privacy
    steps = p.get("steps") or cfg.get("steps")
    return {
        "cell": run.cell, "table": run.table, "seed": run.seed, "task": cfg.get("task"),
        "model": cfg.get("model"), "track": cfg.get("track"), "mechanism": cfg.get("mechanism"),
        "mi_budget": cfg.get("mi_budget"), "epsilon": cfg.get("epsilon"), "num_directions": cfg.get("num_directions"),
        "steps": cfg.get("steps"), "lr": cfg.get("lr"), "clip": cfg.get("clip"), "metric": run.summary.get("metric"),
        "test": run.metric("test"), "dev": run.metric("dev"), "zero_shot_test": run.zero_shot_test,
        "selected_step": run.summary.get("selected_step"), "select_metric": run.summary.get("select_metric"),
        "unanimity_rate": p.get("unanimity_rate"),
        "free_frac": (p["free_steps"] / steps) if p.get("free_steps") is not None and steps else None,
        **privacy_rows(run), "seconds_per_step": run.summary.get("seconds_per_step"), "run_dir": str(run.run_dir),
    }


def cell_row(c: Cell) -> dict[str, Any]:
    t, d, u = c.stat("test"), c.stat("dev"), c.stat("unanimity")
    rows = [privacy_rows(r) for r in c.runs]
    bounds = [x["mi_bound"] for x in rows if x["mi_bound"] is not None]
    mias = [x["mia_bound"] for x in rows if x["mia_bound"] is not None]
    spent = [x["mi_spent_realised"] for x in rows if x["mi_spent_realised"] is not None]
    p = c.paper or {}
    return {"cell": c.name, "table": c.table, "method": method_label(c.cfg), "task": c.cfg.get("task"),
            "model": c.cfg.get("model"), "track": c.cfg.get("track"), "steps": c.cfg.get("steps"), "n": t[2],
            "seeds": " ".join(str(r.seed) for r in c.runs), "test_mean": t[0], "test_std": t[1],
            "dev_mean": d[0], "dev_std": d[1], "unanimity_mean": u[0], "mi_bound_max": max(bounds) if bounds else None,
            "mia_bound_max": max(mias) if mias else None,
            "mi_spent_realised_max": max(spent) if spent else None, "paper_test": p.get("reported_test") or None,
            "paper_std": p.get("std") or None, "paper_n": p.get("n") or None,
            "recipe_changed": " ".join(c.changed) or None}
