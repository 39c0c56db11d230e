"""The names a tuned table's report gives its rows: a method with the update rules that differ from the paper's,
the prompt a cell started from where its table has cells from two prompts, the zero-shot rows by dtype and prompt."""
from __future__ import annotations

import json
import re

from paczero.config import PAC_MECHANISMS
from paczero.experiments.report.cells import Cell, method_label, update_rules

#: the tables whose cells start from the prompt template auto chose on dev and from the plain prompt a user writes
PROMPT_TABLES = ("cpu-agnews", "cpu-sst5")
#: the learning rate chosen by dev loss (the others: dev accuracy, then loss)
BY_DEV_LOSS = ("cpu-sst2", "gpu-sst2", "cpu-agnews", "cpu-sst5")


def label(cfg: dict, table: str | None = None, plain: bool = False, longer: bool = False) -> str:
    """The method's name with the update rules that differ from the paper's (and, in the SST-2 tables, whose PAC
    cells run at more than one M, its number of candidate subsets; ``plain``: the prompt it started from;
    ``longer``: its steps T)."""
    rules = update_rules(cfg)
    if table in BY_DEV_LOSS and cfg.get("mechanism") in PAC_MECHANISMS and cfg.get("num_subsets"):
        rules = [*rules, f"M = {cfg['num_subsets']}"]
    if plain:
        rules = [*rules, "from the plain prompt"]
    if longer:
        rules = [*rules, f"T = {cfg['steps']}"]
    name = method_label(cfg)
    if rules and name.endswith(")"):  # "AdamW (non-private, first-order, from the plain prompt)": one bracket
        return f"{name[:-1]}, {', '.join(rules)})"
    return name + (f" ({', '.join(rules)})" if rules else "")


def is_plain(c: Cell) -> bool:
    """Whether a cell of a table with two prompt sources started from the plain prompt, not from the one template
    auto chose on dev (its runs record the prompt's source)."""
    return c.table in PROMPT_TABLES and any((r.summary.get("prompt") or {}).get("source") not in (None, "auto")
                                            for r in c.runs)


def is_longer(c: Cell) -> bool:
    """Whether a cell is a method's longer cell: ``-t<T>`` in its name, the same settings run to T steps."""
    return re.search(r"-t\d+(-lr|$)", c.name) is not None


def cell_label(c: Cell) -> str:
    """:func:`label` of a cell, naming the plain prompt where it started from it (:func:`is_plain`) and its steps
    where it is a method's longer cell (``-t<T>`` in its name: the same settings run further)."""
    return label(c.cfg, c.table, is_plain(c), is_longer(c))


def zero_label(settings: dict, groups: list) -> str:
    """``zero-shot``, with the dtype and the prompt where the table's runs evaluated the base model in more than
    one."""
    dtypes, prompts = {g.get("dtype") for g, _ in groups}, {g.get("template") for g, _ in groups}
    named = ([settings.get("dtype")] if len(dtypes) > 1 else []) + \
        ([_prompt_words(settings.get("template"))] if len(prompts) > 1 else [])
    return "zero-shot" + (f" ({', '.join(named)})" if named else "")


def _prompt_words(template: str | None) -> str:
    """A zero-shot row's prompt: the template, or what chose it where the runs' template auto chose per seed."""
    return "the prompt template auto chose on dev" if template == "auto" else f"prompt {json.dumps(template)}"
