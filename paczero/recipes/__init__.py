"""The shipped recipes: one YAML file per cell of the paper's tables, and ``paper_results.csv``.

A recipe's name is its path below this folder without ``.yaml`` (``headline/sst2-opt1.3b-ft-zpl``).
``paczero train --recipe``, ``paczero recipes``, ``paczero sweep`` and ``paczero report`` find them here.
"""
from __future__ import annotations

from pathlib import Path

from paczero.config import ConfigError

__all__ = ["recipes_root", "list_recipes", "resolve_recipe", "required_data", "check_data_given"]


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


def required_data(source: str | Path) -> str | None:
    """The data file a recipe trains on but does not ship (its header's ``recipe: {requires_data: ...}``,
    e.g. the CPU-scale table's imdb.jsonl), else None."""
    import yaml

    try:
        header = (yaml.safe_load(Path(source).read_text()) or {}).get("recipe")
    except (OSError, yaml.YAMLError, AttributeError):
        return None  # an unreadable file is reported where it is loaded
    return header.get("requires_data") if isinstance(header, dict) else None


def check_data_given(source: str | Path, values: dict, how: str) -> None:
    """Raise ConfigError, one line naming the file and ``how`` to pass it (``--data PATH``, ``--set
    data=PATH``), when the recipe at ``source`` needs a data file that ``values`` does not give."""
    need = required_data(source)
    if need and values.get("data") in (None, ""):
        root = recipes_root()
        path = Path(source)
        name = str(path.relative_to(root).with_suffix("")) if root in path.parents else str(source)
        raise ConfigError(f"recipe {name} trains on a data file paczero does not ship: give its path with {how} "
                          f"(the file: {need})")
