"""Command line: ``paczero train | eval | predict | push | privacy | recipes | sweep | report | audit | bench | regime``.

Every field of :class:`paczero.config.TrainConfig` is a flag of ``train``
(``mi_budget`` is ``--mi-budget``). Values merge in this order: defaults, a
recipe (``--recipe NAME``) or a config file (``--config FILE``), then flags.
Bad input prints one line ``paczero: error: ...`` and exits with code 2
before anything expensive happens.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import typing
from pathlib import Path

from paczero.config import ConfigError
from paczero.flags import (TEMPLATE_HELP, Flatten, add_config_flags, config_from_args, items_of, parse_mapping,
                           parse_template, parse_verbalizer)
from paczero.recipes import list_recipes, resolve_recipe


class UsageError(Exception):
    pass


#: flags other tools spell otherwise, and paczero's flag for each (the hint of an unrecognised one)
_FLAG_ALIASES = {
    "--learning-rate": "--lr", "--lr-rate": "--lr", "--learningrate": "--lr", "--learning_rate": "--lr",
    "--epochs": "--steps (a step scores all of U; there are no epochs)", "--num-epochs": "--steps",
    "--num-train-epochs": "--steps", "--max-steps": "--steps", "--iterations": "--steps", "--iters": "--steps",
    "--eps": "--epsilon", "--output-dir": "--out-dir", "--output": "--out-dir", "--model-name": "--model",
    "--model-name-or-path": "--model", "--train-file": "--data", "--dataset": "--data", "--prompt": "--template",
    "--label-names": "--labels", "--max-grad-norm": "--dp-clip", "--subsets": "--num-subsets",
}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):  # a flag is named whole: a prefix (--num-subset) is not taken for one
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> typing.NoReturn:  # one line, exit 2
        raise UsageError(message + self._did_you_mean(message))

    def _did_you_mean(self, message: str) -> str:
        """For unrecognised flags, the closest flags this (sub)command has."""
        import difflib
        import re

        m = re.match(r"unrecognized arguments: (.*)", message)
        if not m:
            return ""
        parsers = [self] + [sp for a in self._actions if isinstance(a, argparse._SubParsersAction)
                            for sp in a.choices.values()]
        known = sorted({o for p in parsers for a in p._actions for o in a.option_strings if o.startswith("--")})
        hints = []
        for arg in m.group(1).split():
            flag = arg.split("=")[0]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75) if flag.startswith("--") else []
            if flag in _FLAG_ALIASES and _FLAG_ALIASES[flag].split()[0] in known:
                close = [_FLAG_ALIASES[flag]]
            if close:
                hints.append(f"{flag} -> {close[0]}")
        return f" (did you mean {', '.join(hints)}?)" if hints else ""


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="paczero", description="PAC-private zeroth-order fine-tuning of language models.")
    parser.add_argument("--version", action="version", version=f"paczero {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_add_train, _add_eval, _add_predict, _add_push, _add_privacy, _add_recipes, _add_sweep, _add_report,
                _add_audit, _add_bench, _add_regime):
        add(sub)
    return parser


def _add_train(sub) -> None:
    """`paczero train`: the config's keys as flags, and where the settings come from."""
    p = sub.add_parser("train", help="fine-tune a model (PAC-ZPL, PAC-MI, hybrid, DP baselines, references)",
                       description="Fine-tune a model. Values merge in this order: defaults, --recipe or --config, "
                                   "then the flags below (each is the config key of the same name).")
    g = p.add_argument_group("where the settings come from")
    g.add_argument("--recipe", help="a shipped recipe, e.g. headline/sst2-opt1.3b-ft-zpl (see 'paczero recipes')")
    g.add_argument("--config", help="a YAML file of TrainConfig keys")
    g.add_argument("--print-config", action="store_true", help="print the merged config and exit")
    add_config_flags(p)


def _add_eval(sub) -> None:
    """`paczero eval`: a run, a released model or a model on a task."""
    p = sub.add_parser("eval", help="evaluate a finished run (its selected weights), a released model or a model "
                       "on a task")
    p.add_argument("target", help="a run folder, a released model folder (RUN/model: its task.json sets the task), "
                   "or a model name/path")
    p.add_argument("--split", choices=["dev", "test", "both"], default="both",
                   help="which of the run's (or the task's) splits (default: both)")
    p.add_argument("--data", default=argparse.SUPPRESS,
                   help="evaluate on every example of this file instead (its test rows if it has a split column)")
    p.add_argument("--columns", type=parse_mapping, default=argparse.SUPPRESS,
                   help="the file's column names, e.g. sentence=text,label=stars")
    for name, kind, text in (("task", str, "the task (default: the run's)"),
                             ("template", parse_template, "the prompt template (default: the run's)" + TEMPLATE_HELP),
                             ("n-test", int, "test examples (default: the run's)"),
                             ("n-dev", int, "dev examples (default: the run's)"),
                             ("token-budget", int, "tokens per micro-batch (default: the run's)"),
                             ("device", str, "auto, cpu or cuda[:N] (default: the run's)"),
                             ("dtype", str, "auto, fp32, bf16 or fp16 (default: the run's)"),
                             ("verbalizer", parse_verbalizer, "classification answer words: label -> option "
                              "text, e.g. '0= terrible,1= great' (default: the run's)"),
                             ("labels", str, "classification class names, e.g. neg,pos: how the file's label "
                              "values map to classes, not the answer words (default: the run's)"),
                             ("base-model", str, "a released LoRA adapter's base model (default: the one its "
                              "task.json names)")):
        p.add_argument("--" + name, dest=name.replace("-", "_"), default=argparse.SUPPRESS, type=kind, help=text)


def _add_predict(sub) -> None:
    """`paczero predict`: a classifier's label and class probabilities for each row of a file."""
    p = sub.add_parser("predict", help="label each row of a file with a released classifier (or a run's selected "
                       "weights): its predicted label and every class's probability, as CSV")
    p.add_argument("target", help="a released model folder (RUN/model), a run folder, or a model name/path")
    p.add_argument("--data", required=True, help="the rows to label: CSV, TSV, JSON lines, JSON or Parquet with a "
                   "text column (a label column, if any, is kept beside the prediction and scored)")
    p.add_argument("--out", help="write the CSV to this new file (default: stdout); an existing file is not replaced")
    p.add_argument("--columns", type=parse_mapping, default=argparse.SUPPRESS,
                   help="the file's column names, e.g. sentence=message (label=COLUMN where it holds labels)")
    for name, kind, text in (("token-budget", int, "tokens per micro-batch (default: the run's)"),
                             ("device", str, "auto, cpu or cuda[:N] (default: the run's)"),
                             ("dtype", str, "auto, fp32, bf16 or fp16 (default: the run's)"),
                             ("base-model", str, "a released LoRA adapter's base model (default: the one its "
                              "task.json names)")):
        p.add_argument("--" + name, dest=name.replace("-", "_"), default=argparse.SUPPRESS, type=kind, help=text)


def _add_push(sub) -> None:
    """`paczero push`: a run's released model to the Hugging Face hub."""
    p = sub.add_parser("push", help="upload a run's released model (RUN/model: weights, task.json, model card) to "
                       "the Hugging Face hub")
    p.add_argument("target", help="a finished run folder, or its released model folder")
    p.add_argument("--repo-id", required=True, help="the hub repository, e.g. me/sst2-pac-zpl (created if need be)")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--commit-message", help="the commit's message (default: names the task and the step)")


def _add_privacy(sub) -> None:
    """`paczero privacy`: an MI budget's MIA bound and matched epsilon, or the reverse."""
    p = sub.add_parser("privacy", help="MIA bound and matched DP epsilon of an MI budget (or the reverse)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--mi", type=float, help="total MI budget in nats")
    g.add_argument("--epsilon", type=float, help="a DP epsilon: the MI with the same MIA bound")
    g.add_argument("--mia", type=float, help="a target MIA success bound: the MI that guarantees it")
    p.add_argument("--delta", type=float, default=1e-5, help="the DP delta of --epsilon and of the matched epsilon "
                   "(default: 1e-05)")
    p.add_argument("--json", action="store_true", help="print the numbers as one JSON object")


def _add_recipes(sub) -> None:
    """`paczero recipes`: the shipped recipes."""
    p = sub.add_parser("recipes", help="list the shipped recipes (one per paper cell), by table")
    p.add_argument("--show", help="print one recipe")


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


def _add_audit(sub) -> None:
    """`paczero audit`: membership-inference audits of finished runs."""
    p = sub.add_parser("audit", help="membership-inference audit of finished runs (several: pooled); prints only "
                       "public values unless --reveal-secret")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished run folders (fresh secrets each)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the AUC interval")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--reveal-secret", action="store_true",
                   help="also score the attacks against the truth (accuracy, AUC, whether j* was found, verdicts): "
                        "computed with the secret j* and the true membership, so the output is PRIVATE and must "
                        "not be published")
    p.add_argument("--last-bits", action="store_true",
                   help="only the last-bits attack (Mironov): how many of each run's published noised values only one "
                        "sign of s_j* can produce exactly (0 with paczero's exact grid noise; also part of the "
                        "default audit)")
    p.add_argument("--heldout", action="store_true",
                   help="instead: the attack the field measures, on runs of any mechanism: the released model's loss "
                        "on the records of U against the held-out test records of the same file (AUC per run, with "
                        "what bounds it: DP's epsilon does, the PAC guarantee does not)")
    g = p.add_argument_group("the one-run canary audit (Steinke et al. 2023; docs/audit.md)", "of a DP run trained "
                             "with --canaries M (its default audit): reads the run, trains nothing, and prints a lower "
                             "bound on its epsilon at 95 % confidence (also in RUN_DIR/canary_audit.json)")
    g.add_argument("--guess-in", type=int, metavar="K", help="guess 'in' for the K highest scores (default: M/4)")
    g.add_argument("--guess-out", type=int, metavar="K", help="guess 'out' for the K lowest (default: M/4)")


def _add_bench(sub) -> None:
    """`paczero bench`: the step benchmark (paczero/bench). It parses its own arguments when it runs, so that
    building this parser reads no benchmark code; a prefix that no argument starts with hands them all over."""
    p = sub.add_parser("bench", help="time and memory of a ZO step against the inference floor, and the floor "
                       "against a plain transformers forward (one run)", add_help=False, prefix_chars="\0")
    p.add_argument("bench_args", nargs="*")


def _cmd_train(ns) -> int:
    try:
        cfg = config_from_args(ns)
    except ValueError as e:  # under torchrun the other ranks (on other nodes too) stop with this one
        from paczero.run.distributed import stop_ranks

        stop_ranks(e, getattr(ns, "device", None))
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    from paczero.run.release import PushError, check_push_possible, push_finished_run
    from paczero.run.lr_choice import train_or_choose
    from paczero.train import train

    check_push_possible(cfg)
    summary = train_or_choose(cfg, getattr(ns, "lr", None), train)  # --lr a,b,c or auto: a choice on dev
    if "stopped_at" in summary:
        return 130
    if cfg.push_to_hub is not None and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 pushes
        try:
            push_finished_run(cfg)
        except PushError as e:  # the hub refused or could not be reached: not bad input
            print(f"paczero: error: {e}", file=sys.stderr)
            return 1
    return 0


def _cmd_eval(ns) -> int:
    from paczero.evaluate import evaluate_target

    overrides = {k: getattr(ns, k) for k in ("task", "data", "columns", "template", "n_test", "n_dev",
                                             "token_budget", "device", "dtype", "verbalizer", "labels",
                                             "base_model") if hasattr(ns, k)}
    result = evaluate_target(ns.target, split=ns.split, overrides=overrides)
    print(json.dumps(result, indent=1))
    return 0


def _cmd_predict(ns) -> int:
    from paczero.evaluate import predict_target

    overrides = {k: getattr(ns, k) for k in ("columns", "token_budget", "device", "dtype", "base_model")
                 if hasattr(ns, k)}
    predict_target(ns.target, ns.data, out=ns.out, overrides=overrides)
    return 0


def _cmd_push(ns) -> int:
    from paczero.run.release import PushError, push

    try:
        url = push(ns.target, ns.repo_id, private=ns.private, commit_message=ns.commit_message)
    except PushError as e:  # the hub refused or could not be reached: not bad input
        print(f"paczero: error: {e}", file=sys.stderr)
        return 1
    print(f"pushed to {url}")
    return 0


def _cmd_privacy(ns) -> int:
    from paczero.privacy import dp_epsilon_matching_mi, mi_for_mia, mi_matching_dp, mia_bound

    if ns.epsilon is not None:
        mi = mi_matching_dp(ns.epsilon, delta=ns.delta)
    elif ns.mia is not None:
        mi = mi_for_mia(ns.mia)
    else:
        mi = ns.mi
    bound = mia_bound(mi)
    eps = dp_epsilon_matching_mi(mi, delta=ns.delta) if mi > 0 else 0.0
    out = {"mi_nats": mi, "mia_bound": bound, "matched_dp_epsilon": eps, "delta": ns.delta, "prior": 0.5}
    if ns.json:
        print(json.dumps(out))
    else:
        print(f"MI budget        {mi:.6g} nats  (the guarantee I(S*; transcript) <= budget, Theorem 1)")
        print(f"MIA success <=   {bound:.4f}  (prior 0.5; PAC Privacy, eq. pac_mi_bound)")
        print(f"matched DP eps   {eps:.4g}  (delta={ns.delta:g}; same MIA bound, a reference point only, not DP)")
        if bound > 0.99995:
            print("note: a bound of 1 says nothing: at this MI (or epsilon) the informed adversary may succeed always")
    return 0


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


def _cmd_report(ns) -> int:
    from paczero.experiments.report import write_report

    import shlex

    args = [*(["--out", ns.out] if ns.out else []), *(["--markdown", ns.markdown] if ns.markdown else []),
            *(["--keep-runs"] if ns.keep_runs else []), *(["--no-paper"] if ns.no_paper else [])]
    out = write_report(ns.runs_dir, ns.out, paper_overlay=not ns.no_paper, markdown=ns.markdown,
                       keep_runs=ns.keep_runs, report_args=shlex.join(args))
    print(f"report written to {out}")
    return 0


def _cmd_audit(ns) -> int:
    from paczero.audit.membership import audit, format_report

    if ns.bootstrap < 1:
        raise ValueError(f"--bootstrap must be >= 1, got {ns.bootstrap}")
    from paczero.audit.canaries import canary_command, planted_runs

    if (ns.guess_in, ns.guess_out) != (None, None) or not (ns.heldout or ns.last_bits) and planted_runs(ns.run_dirs):
        return canary_command(ns)  # runs trained with --canaries M: their one-run audit (no training)
    if ns.heldout:
        from paczero.audit.heldout import format_heldout, heldout_audit

        if ns.reveal_secret or ns.last_bits:
            raise ConfigError("--heldout is an audit of its own (not with --reveal-secret or --last-bits): "
                              "run them one at a time")
        found = heldout_audit(ns.run_dirs, bootstrap=ns.bootstrap)
        print(json.dumps(found, indent=1) if ns.json else format_heldout(found))
        return 0
    from paczero.audit.lsb_attack import audit_transcript, format_transcript_audit

    if ns.last_bits and ns.reveal_secret:
        raise ConfigError("--last-bits reads only published values: it has no secret to reveal")
    last_bits = {str(run): audit_transcript(run) for run in ns.run_dirs}
    lines = [f"{run}: {format_transcript_audit(found)}" for run, found in last_bits.items()]
    if ns.last_bits:
        print(json.dumps(last_bits, indent=1) if ns.json else "\n".join(lines))
        return 0
    report = audit(ns.run_dirs, bootstrap=ns.bootstrap, reveal_secret=ns.reveal_secret)
    if ns.json:
        print(json.dumps({**report, "last_bits": last_bits}, indent=1))
    else:
        print(format_report(report) + "\n\n" + "\n".join(lines))
    return 0


def _cmd_bench(ns) -> int:
    from paczero import bench

    p = _Parser(prog="paczero bench", description=bench.__doc__.splitlines()[0])
    bench.add_arguments(p)
    return bench.run(p.parse_args(ns.bench_args))


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

def version() -> str:
    """The installed paczero's version (its package metadata)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("paczero")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


class _StderrHandler(logging.Handler):
    """paczero's warnings, one line each on stderr (whatever ``sys.stderr`` is when one is emitted)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"paczero: {record.levelname.lower()}: {record.getMessage()}\n")
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _log_to_stderr() -> None:
    logger = logging.getLogger("paczero")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler(logging.WARNING))


def bad_input(e: Exception) -> int:
    """Print the one error line of bad input and return its exit code, 2 (a data-parallel rank other
    than its node's first stays silent: that one prints the line for the node)."""
    if not getattr(e, "quiet", False):
        msg = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        print(f"paczero: error: {msg}", file=sys.stderr)
    return 2


# How long an idle OpenMP worker spins before it sleeps. libgomp's default keeps
# torch's workers spinning well past the end of a forward, so the draw of z that
# follows shares the cores with them; 10,000 spins lets them sleep first. It
# only takes effect if set before torch loads, which the command line does not
# do until a handler runs. A value the user exported is kept.
_GOMP_SPINCOUNT = "10000"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("GOMP_SPINCOUNT", _GOMP_SPINCOUNT)
    parser = _build_parser()
    _log_to_stderr()
    try:
        ns = parser.parse_args(argv)
        handler = {"train": _cmd_train, "eval": _cmd_eval, "predict": _cmd_predict, "privacy": _cmd_privacy, "recipes": _cmd_recipes,
                   "sweep": _cmd_sweep, "report": _cmd_report, "audit": _cmd_audit, "bench": _cmd_bench,
                   "push": _cmd_push, "regime": _cmd_regime}
        return handler[ns.command](ns)
    except (UsageError, ValueError) as e:  # ConfigError, CheckpointError and bad values are ValueErrors
        return bad_input(e)
    except KeyboardInterrupt:
        print("paczero: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
