"""The command line's parser: one error line for bad usage, and the flag a misspelt one meant."""
from __future__ import annotations

import argparse
import typing


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


class Parser(argparse.ArgumentParser):
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
