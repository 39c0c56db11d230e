"""`paczero recipes`, `sweep`, `report`, `regime` and `bench`: paper cells, grids, tables, the unanimity
map and the step benchmark."""
from __future__ import annotations

from paczero.commands.parser import Parser
from paczero.config import ConfigError
from paczero.flags import Flatten, add_config_flags, items_of
from paczero.recipes import list_recipes, resolve_recipe


def _add_recipes(sub) -> None:
    """`paczero recipes`: the shipped recipes."""
    p = sub.add_parser("recipes", help="list the shipped recipes (one per paper cell), by table")
    p.add_argument("--show", help="print one recipe")


def _cmd_recipes(ns) -> int:
    if ns.show:
        print(resolve_recipe(ns.show).read_text(), end="")
        return 0
    names = list_recipes()
    if not names:
        print("no recipes shipped")
        return 0
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.split("/")[0], []).append(n)
    for table, items in groups.items():
        print(f"{table} ({len(items)})")
        for n in items:
            print(f"  {n}")
    return 0


def _add_sweep(sub) -> None:
    """`paczero sweep`: a grid of recipes x seeds, local or on SLURM."""
    p = sub.add_parser("sweep", help="run a grid of recipes x seeds (resumable; local, one per GPU, or SLURM)")
    p.add_argument("recipes", nargs="+", help="recipe names, globs ('headline/sst2-*'), table names or YAML files")
    p.add_argument("--seeds", nargs="+", type=items_of(int), action=Flatten, default=[0],
                   help="public seeds, e.g. --seeds 0 1 2 or --seeds 0,1,2 (default: 0)")
    p.add_argument("--out-root", default="runs", help="cell (r, k) runs in OUT_ROOT/r/seedk (default: runs)")
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", metavar="KEY=VALUE",
                   help="override recipe keys for every cell, e.g. --set dtype=bf16 token_budget=16384")
    p.add_argument("--gpus", help="'auto' (every visible GPU) or '0,1': one cell per GPU in parallel")
    p.add_argument("--workers", type=int, default=1,
                   help="cells at once on this machine's CPU cores, which the trainings divide step by step "
                        "(default 1: one after another)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the commands, run nothing")
    p.add_argument("--slurm", action="store_true", help="submit one SLURM job per cell (sbatch, through submitit)")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--timeout-min", type=int, help="SLURM job time limit in minutes (default 1440)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per SLURM job (default 1; 0 for CPU jobs)")
    p.add_argument("--cpus-per-task", type=int, help="CPUs per SLURM job (default 8)")
    p.add_argument("--mem-gb", type=int, help="memory per SLURM job in GB (default 64)")
    p.add_argument("--signal-delay-s", type=int, help="SLURM warns a job this long before its time limit; it "
                   "checkpoints after its step and requeues itself to resume (default 300)")
    p.add_argument("--max-requeues", type=int, help="time limits a cell's job may requeue itself after (default 20)")
    p.add_argument("--slurm-arg", nargs="+", action="extend", metavar="KEY=VALUE", default=[],
                   help="other sbatch options, e.g. --slurm-arg constraint=a100 account=myproj exclude=n1,n2")


def _cmd_sweep(ns) -> int:
    from paczero.experiments.slurm import slurm_parameters
    from paczero.experiments.sweep import parse_overrides, sweep

    given = {k: v for k, v in (("partition", ns.partition), ("timeout_min", ns.timeout_min),
                               ("gpus_per_node", ns.gpus_per_node), ("cpus_per_task", ns.cpus_per_task),
                               ("mem_gb", ns.mem_gb), ("signal_delay_s", ns.signal_delay_s),
                               ("max_requeues", ns.max_requeues)) if v is not None}
    slurm = None
    if ns.slurm:
        slurm = slurm_parameters(**given, extra=ns.slurm_arg)
    elif given or ns.slurm_arg:
        raise ConfigError(f"--{(list(given) or ['slurm_arg'])[0].replace('_', '-')} applies to SLURM jobs: add --slurm")
    if ns.gpus is not None and ns.slurm:
        raise ConfigError("--gpus runs cells on this machine's GPUs; with --slurm use --gpus-per-node")
    results = sweep(ns.recipes, ns.seeds, out_root=ns.out_root, overrides=parse_overrides(ns.overrides),
                    gpus=ns.gpus, workers=ns.workers, slurm=slurm, dry_run=ns.dry_run)
    failed = [r for r in results if r["status"] in ("failed", "stopped")]
    return 1 if failed else 0


def _add_report(sub) -> None:
    """`paczero report`: tables and plots of a folder of runs."""
    p = sub.add_parser("report", help="tables (Markdown, CSV) and plots (PNG) of every run under a folder")
    p.add_argument("runs_dir", help="a folder holding runs (searched recursively for summary.json)")
    p.add_argument("--out", help="where to write the report (default: RUNS_DIR/report)")
    p.add_argument("--no-paper", action="store_true", help="do not overlay the paper's published numbers")
    p.add_argument("--markdown", metavar="FILE", help="write the Markdown report to FILE (default: OUT/report.md)")
    p.add_argument("--keep-runs", action="store_true",
                   help="also copy each run's small files (summary, logs, the sweep's config and record; not the "
                        "weights) into OUT/runs, from which paczero report writes this report again")


def _cmd_report(ns) -> int:
    from paczero.experiments.report import write_report

    import shlex

    args = [*(["--out", ns.out] if ns.out else []), *(["--markdown", ns.markdown] if ns.markdown else []),
            *(["--keep-runs"] if ns.keep_runs else []), *(["--no-paper"] if ns.no_paper else [])]
    out = write_report(ns.runs_dir, ns.out, paper_overlay=not ns.no_paper, markdown=ns.markdown,
                       keep_runs=ns.keep_runs, report_args=shlex.join(args))
    print(f"report written to {out}")
    return 0


# ---------------------------------------------------------------------------- paczero regime
def _add_regime(sub) -> None:
    """`paczero regime`: the share of unanimous directions for every N and M of a grid (paczero/experiments/regime.py)."""
    from paczero.experiments.regime import DEFAULT_M_GRID, DEFAULT_N_GRID

    p = sub.add_parser("regime", help="how often PAC's M subset signs agree, for every universe size N and subset "
                       "count M of a grid, from a model's per-example scalars (no training)",
                       description="Evaluate a model (the config's base model, or --run's released weights) along "
                       "K public directions over n_train examples (two forwards each), store the scalars in "
                       "OUT/scalars.npz (resumable), and write the share of unanimous directions for every (N, M) "
                       "to OUT/regime.csv, regime.md and regime.png. Given only OUT, the map is drawn again from "
                       "the stored scalars.")
    p.add_argument("out", metavar="OUT", help="the folder of the scalars and the map")
    g = p.add_argument_group("the map")
    g.add_argument("--directions", type=int, help="K, the public directions to evaluate (default 16, or all stored)")
    g.add_argument("--n-grid", nargs="+", type=items_of(int), action=Flatten,
                   help=f"universe sizes N (subsamples of the n_train examples; default: those of "
                        f"{', '.join(map(str, DEFAULT_N_GRID))} up to n_train, and n_train)")
    g.add_argument("--m-grid", nargs="+", type=items_of(int), action=Flatten, default=list(DEFAULT_M_GRID),
                   help="subset counts M (even; default: %(default)s)")
    g.add_argument("--draws", type=int, default=20, help="draws of the N examples and of the design per cell "
                   "(default: 20)")
    g = p.add_argument_group("where the settings come from")
    g.add_argument("--run", help="a finished run: its config, and its released weights (selected.safetensors)")
    g.add_argument("--recipe", help="a shipped recipe (its model, data and prompt; n_train sets the universe)")
    g.add_argument("--config", help="a YAML file of TrainConfig keys")
    add_config_flags(p)


def _cmd_regime(ns) -> int:
    from paczero.experiments.regime import regime_command

    return regime_command(ns)


def _add_bench(sub) -> None:
    """`paczero bench`: the step benchmark (paczero/bench). It parses its own arguments when it runs, so that
    building this parser reads no benchmark code; a prefix that no argument starts with hands them all over."""
    p = sub.add_parser("bench", help="time and memory of a ZO step against the inference floor, and the floor "
                       "against a plain transformers forward (one run)", add_help=False, prefix_chars="\0")
    p.add_argument("bench_args", nargs="*")


def _cmd_bench(ns) -> int:
    from paczero import bench

    p = Parser(prog="paczero bench", description=bench.__doc__.splitlines()[0])
    bench.add_arguments(p)
    return bench.run(p.parse_args(ns.bench_args))


#: each command's parser and handler
COMMANDS = {
    "recipes": (_add_recipes, _cmd_recipes),
    "sweep": (_add_sweep, _cmd_sweep),
    "report": (_add_report, _cmd_report),
    "regime": (_add_regime, _cmd_regime),
    "bench": (_add_bench, _cmd_bench),
}
