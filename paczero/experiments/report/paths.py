"""How a report writes a path: never as an absolute path of the machine that ran it.

A run records its data file resolved (``summary.json`` ``config.data``), so that ``paczero eval`` and
``--resume`` find it from any folder; a sweep records its folders as its ``--out-root`` was typed. What a
report publishes (its Markdown, ``runs.csv``, ``rungs.csv``, the runs it keeps) shows each path

- as it was typed, where it is not absolute (``runs/cpu-scale``, ``sst2-paper.jsonl``);
- relative to the folder ``paczero report`` runs in, where it lies inside that folder;
- else as ``PATH/`` and its last components, as few as tell it apart from the report's other such paths
  (``PATH/imdb.jsonl``; ``PATH/a/imdb.jsonl`` and ``PATH/b/imdb.jsonl`` for two files of one name).

Paths inside the runs folder or the sweep's out-root follow their folder (``PATH/cpu-scale/cpu-scale/.../seed0``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

PLACEHOLDER = "PATH"


def is_machine_path(value: Any) -> bool:
    """Whether ``value`` is an absolute path of a machine (a one-line string starting at the root, not a
    template: no ``{``)."""
    return (isinstance(value, str) and len(value) > 1 and os.path.isabs(value) and "\n" not in value
            and "{" not in value)


def strings(value: Any) -> Iterable[str]:
    """Every string inside a JSON-like value (dict values, list items)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings(v)


def _parts(path: str) -> list[str]:
    return [p for p in Path(os.path.normpath(path)).parts if p != os.sep]


def _under(path: str, folder: str) -> str | None:
    """``path`` relative to ``folder`` (POSIX), "." for the folder itself, None where it lies outside."""
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    if path == folder:
        return "."
    if path.startswith(folder.rstrip(os.sep) + os.sep):
        return Path(os.path.relpath(path, folder)).as_posix()
    return None


class PublicPaths:
    """The public form of each path a report writes (the module's rules), fixed for one report.

    ``cwd``: the folder the command runs in. ``folders``: {absolute folder: how to show it} for the runs folder as
    typed (``~/runs``) and the like; a path under one shows as that form and its rest. ``seen``: every absolute path
    the report may write, so that two paths outside ``cwd`` never share a placeholder."""

    def __init__(self, cwd: str | Path | None = None, folders: dict[str, str] | None = None,
                 seen: Iterable[str] = ()):
        self.cwds = {os.path.normpath(str(c)) for c in (cwd or os.getcwd(), Path(cwd or os.getcwd()).resolve())}
        self.folders = sorted(((os.path.normpath(k), v) for k, v in (folders or {}).items() if is_machine_path(k)),
                              key=lambda kv: -len(kv[0]))
        outside = {os.path.normpath(p) for p in seen if is_machine_path(p)}
        self._outside = sorted(p for p in outside if self._inside(p) is None)
        self._tails: dict[str, str] = {}

    def _inside(self, path: str) -> str | None:
        """The path's form by a folder or the working folder; None where it lies outside both."""
        for folder, shown in self.folders:
            rest = _under(path, folder)
            if rest is not None:
                return shown if rest == "." else f"{shown.rstrip('/')}/{rest}"
        for cwd in self.cwds:
            rest = _under(path, cwd)
            if rest is not None:
                return rest
        return None

    def _tail(self, path: str) -> str:
        if path not in self._tails:
            parts, others = _parts(path), [_parts(p) for p in self._outside if p != path]
            k = 1
            while k < len(parts) and any(o[-k:] == parts[-k:] for o in others):
                k += 1
            self._tails[path] = "/".join([PLACEHOLDER, *parts[-k:]])
        return self._tails[path]

    def __call__(self, value: Any) -> Any:
        """``value``'s public form where it is an absolute path of the machine; anything else as it is."""
        if not is_machine_path(value):
            return value
        path = os.path.normpath(value)
        inside = self._inside(path)
        return inside if inside is not None else self._tail(path)

    def words(self, text: str) -> str:
        """A shell command line (``shlex``) with each absolute path among its words in its public form."""
        import shlex

        return shlex.join(self(w) for w in shlex.split(text))

    def config(self, cfg: dict) -> dict:
        """A copy of a run's config (or any JSON-like value) with every absolute path in its public form."""
        return _walk(cfg, self)

    def text(self, text: str, suffix: str) -> str:
        """A kept file's text (``.json``/``.jsonl`` records or a ``.yaml`` config) with every absolute path in it
        in its public form; nothing else of the file changes."""
        values: set[str] = set()
        if suffix in (".json", ".jsonl"):
            for line in (text.splitlines() if suffix == ".jsonl" else [text]):
                try:
                    values.update(strings(json.loads(line)))
                except ValueError:
                    continue
            pairs = [(json.dumps(v)[1:-1], json.dumps(self(v))[1:-1]) for v in values if is_machine_path(v)]
        else:
            import yaml

            try:
                values.update(strings(yaml.safe_load(text)))
            except yaml.YAMLError:
                return text
            pairs = [(v, self(v)) for v in values if is_machine_path(v)]
        for old, new in sorted(pairs, key=lambda p: -len(p[0])):
            text = text.replace(old, new)
        return text


def _walk(value: Any, shown) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, shown) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, shown) for v in value]
    return shown(value)


def for_report(runs_dir: str | Path, values: Iterable[Any], sweep_root: str | None,
               cwd: str | Path | None = None) -> PublicPaths:
    """The public paths of one report on the runs under ``runs_dir`` (as typed), whose summaries, sweep records
    and sweep configs are ``values``; ``sweep_root``: the ``--out-root`` the sweep recorded. The runs folder
    shows as typed, the sweep's out-root by the rules, and every path under either follows its folder."""
    seen = [s for s in strings(list(values)) if is_machine_path(s)]
    typed = str(runs_dir)
    folders: dict[str, str] = {}
    if is_machine_path(typed):
        seen.append(typed)
    else:
        folders[os.path.abspath(os.path.expanduser(typed))] = typed
    if is_machine_path(sweep_root):
        root = os.path.normpath(sweep_root)
        first = PublicPaths(cwd, folders, [p for p in seen if _under(p, root) is None] + [root])
        folders[root] = first(root)
    return PublicPaths(cwd, folders, seen)
