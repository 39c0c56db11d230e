"""`paczero train`: a run from a recipe, a config file and flags."""
from __future__ import annotations

import json
import os
import sys

from paczero.flags import add_config_flags, config_from_args


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


#: each command's parser and handler
COMMANDS = {
    "train": (_add_train, _cmd_train),
}
