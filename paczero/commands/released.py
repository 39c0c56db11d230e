"""`paczero eval`, `predict` and `push`: a finished run or a released model."""
from __future__ import annotations

import argparse
import json
import sys

from paczero.flags import TEMPLATE_HELP, parse_mapping, parse_template, parse_verbalizer


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


def _cmd_eval(ns) -> int:
    from paczero.evaluate import evaluate_target

    overrides = {k: getattr(ns, k) for k in ("task", "data", "columns", "template", "n_test", "n_dev",
                                             "token_budget", "device", "dtype", "verbalizer", "labels",
                                             "base_model") if hasattr(ns, k)}
    result = evaluate_target(ns.target, split=ns.split, overrides=overrides)
    print(json.dumps(result, indent=1))
    return 0


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


def _cmd_predict(ns) -> int:
    from paczero.evaluate import predict_target

    overrides = {k: getattr(ns, k) for k in ("columns", "token_budget", "device", "dtype", "base_model")
                 if hasattr(ns, k)}
    predict_target(ns.target, ns.data, out=ns.out, overrides=overrides)
    return 0


def _add_push(sub) -> None:
    """`paczero push`: a run's released model to the Hugging Face hub."""
    p = sub.add_parser("push", help="upload a run's released model (RUN/model: weights, task.json, model card) to "
                       "the Hugging Face hub")
    p.add_argument("target", help="a finished run folder, or its released model folder")
    p.add_argument("--repo-id", required=True, help="the hub repository, e.g. me/sst2-pac-zpl (created if need be)")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--commit-message", help="the commit's message (default: names the task and the step)")


def _cmd_push(ns) -> int:
    from paczero.run.release import PushError, push

    try:
        url = push(ns.target, ns.repo_id, private=ns.private, commit_message=ns.commit_message)
    except PushError as e:  # the hub refused or could not be reached: not bad input
        print(f"paczero: error: {e}", file=sys.stderr)
        return 1
    print(f"pushed to {url}")
    return 0


#: each command's parser and handler
COMMANDS = {
    "eval": (_add_eval, _cmd_eval),
    "predict": (_add_predict, _cmd_predict),
    "push": (_add_push, _cmd_push),
}
