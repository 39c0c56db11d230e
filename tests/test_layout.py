"""The package's shape: no import cycle between paczero's modules, and no module above ~500 lines.

Read from the source with ``ast`` (every import, also those inside functions). Red when a module
imports one that imports it back, directly or through others (the recipe registry in cli.py, read by
sweep and report, was such a cycle), or when a file grows past the limit."""
import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "paczero"
MAX_LINES = 520


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            while t and t not in mods:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name and not t.startswith(name + "."):
                found.add(t)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(n, stack):
        state[n] = "open"
        for m in sorted(graph[n]):
            if n.startswith(m + "."):  # a module and its own package's __init__: Python's package import order
                continue
            if state.get(m) == "open":
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m, stack + [m])
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return cycles


def test_no_import_cycles():
    mods = _modules()
    graph = collections.defaultdict(set, {name: _imports(name, p, mods) for name, p in mods.items()})
    assert _cycles(graph) == []
    # control: the checker sees a cycle when there is one
    assert _cycles(collections.defaultdict(set, {"a": {"b"}, "b": {"a"}})) == [["a", "b", "a"]]


def test_no_module_above_the_line_limit():
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert {k: v for k, v in sizes.items() if v > MAX_LINES} == {}


def _benchmark_imports(source: str) -> list[str]:
    """The imports of the checkout's ``benchmarks`` package in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found += [n for n in names if n == "benchmarks" or n.startswith("benchmarks.")]
    return found


def test_the_package_imports_no_benchmark_code():
    """The checkout's benchmarks/ (scripts that are not user commands) is not in a wheel: no module of paczero
    imports it (``paczero bench`` is the package's own paczero.bench)."""
    found = {str(p.relative_to(ROOT.parent)): _benchmark_imports(p.read_text()) for p in ROOT.rglob("*.py")}
    assert {k: v for k, v in found.items() if v} == {}
    # control: the checker sees such an import
    assert sorted(_benchmark_imports("def f():\n    from benchmarks.step import run\nimport benchmarks")) == [
        "benchmarks", "benchmarks.step"]


def test_the_wheel_ships_paczero_and_not_the_benchmarks():
    tomllib = pytest.importorskip("tomllib")
    from setuptools import find_packages

    config = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = find_packages(str(ROOT.parent), include=config["include"], exclude=config.get("exclude", ()))
    assert "paczero" in shipped and "paczero.zo" in shipped
    assert "paczero.bench" in shipped  # paczero bench is a user command
    assert (ROOT.parent / "benchmarks" / "__init__.py").is_file()  # a package find_packages could take
    assert not [p for p in shipped if p.split(".")[0] != "paczero"]
