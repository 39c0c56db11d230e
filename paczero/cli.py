"""Command line: ``paczero train | eval | predict | push | privacy | recipes | sweep | report | audit | bench | regime``.

Every field of :class:`paczero.config.TrainConfig` is a flag of ``train``
(``mi_budget`` is ``--mi-budget``). Values merge in this order: defaults, a
recipe (``--recipe NAME``) or a config file (``--config FILE``), then flags.
Bad input prints one line ``paczero: error: ...`` and exits with code 2
before anything expensive happens. The commands live in
:mod:`paczero.commands`, a module a family; this module assembles them.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from paczero.commands import experiments, privacy, released, training
from paczero.commands.parser import Parser, UsageError

#: every command's parser and handler, by name
COMMANDS = {**training.COMMANDS, **released.COMMANDS, **privacy.COMMANDS, **experiments.COMMANDS}
#: the order of ``paczero --help``
ORDER = ("train", "eval", "predict", "push", "privacy", "recipes", "sweep", "report", "audit", "bench", "regime")


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="paczero", description="PAC-private zeroth-order fine-tuning of language models.")
    parser.add_argument("--version", action="version", version=f"paczero {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in ORDER:
        COMMANDS[name][0](sub)
    return parser


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
        return COMMANDS[ns.command][1](ns)
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
