"""The shipped recipes: one YAML file per cell of the paper's tables, and ``paper_results.csv``.

A recipe's name is its path below this folder without ``.yaml`` (``headline/sst2-opt1.3b-ft-zpl``).
``paczero train --recipe``, ``paczero recipes``, ``paczero sweep`` and ``paczero report`` find them here.
"""
from __future__ import annotations

from pathlib import Path

from paczero.config import ConfigError

__all__ = ["recipes_root", "list_recipes", "resolve_recipe"]


def recipes_root() -> Path:
    """The folder that holds the shipped recipes."""
    return Path(__file__).parent


def list_recipes() -> list[str]:
    """Every shipped recipe's name, sorted."""
    root = recipes_root()
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def resolve_recipe(name: str) -> Path:
    """The file of the shipped recipe ``name``. Raises ConfigError (naming close matches) if there is none."""
    path = recipes_root() / f"{name}.yaml"
    if not path.exists():
        near = [r for r in list_recipes() if name.split("/")[-1] in r][:5]
        raise ConfigError(f"unknown recipe {name!r}" + (f"; did you mean {', '.join(near)}?" if near else
                                                         "; list them with 'paczero recipes'"))
    return path
