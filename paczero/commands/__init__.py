"""The commands of ``paczero``, a module a family: ``training`` (train), ``released`` (eval, predict, push),
``privacy`` (privacy, audit), ``experiments`` (recipes, sweep, report, regime, bench). Each module's ``COMMANDS``
maps a command's name to the function that adds its parser and the one that runs it; ``parser`` holds the parser
class every command uses (one error line, the flag a misspelt one meant). ``paczero/cli.py`` assembles them."""
