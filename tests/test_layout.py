"""The package's shape: no import cycle between paczero's modules, rooms on floors that never import upward, at most
ten modules at the top, and no module above ~500 lines.

Read from the source with ``ast`` (every import, also those inside functions). Red when a module
imports one that imports it back, directly or through others (the recipe registry in cli.py, read by
sweep and report, was such a cycle), when a room (a subpackage, or a module at the top) imports one on a higher
floor (docs/architecture.md's map), when a new room has no floor, or when a file grows past the limit."""
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


#: the rooms of paczero, lowest floor first: a room imports only rooms on its own floor or below (docs/architecture.md)
FLOORS = [
    ["checkpoint"],                               # the run folder's format: atomic, checksummed, owner-only files
    ["config"],                                   # TrainConfig and its checks
    ["machine"],                                  # hardware (dtype, threads), thread share
    ["models"],                                   # model loading
    ["tasks", "recipes", "privacy", "zo"],        # tasks and data; recipes; privacy math and secrets; the ZO engine
    ["mechanisms", "flags"],                      # per-step releases; the flags of every command
    ["fo"],                                       # DP-SGD's first-order step
    ["run"],                                      # one run's life around the loop
    ["audit"],                                    # audits of finished runs (and the loss attack a run may end with)
    ["train"],                                    # the loop
    ["evaluate", "api", "experiments", "bench"],  # paczero eval, the Python API, sweeps/report/regime, the benchmark
    ["commands"],                                 # the commands, a module a family
    ["cli", "__main__"],                          # the command line (assembles the commands)
]
MAX_TOP_MODULES = 10


def _room(name: str) -> str:
    """A module's room: its subpackage below paczero, or the module itself at the top ('' for paczero's __init__)."""
    return name.split(".")[1] if "." in name else ""


def _upward_imports(graph: dict[str, set[str]], floors: list[list[str]]) -> list[str]:
    floor = {room: i for i, rooms in enumerate(floors) for room in rooms}
    found = []
    for n in sorted(graph):
        for m in sorted(graph[n]):
            a, b = _room(n), _room(m)
            if a and b and a != b and floor.get(b, len(floors)) > floor.get(a, -1):
                found.append(f"{n} -> {m}")
    return found


def test_rooms_import_only_their_floor_and_below():
    mods = _modules()
    graph = {name: _imports(name, p, mods) for name, p in mods.items()}
    assert sorted({_room(n) for n in mods} - {r for f in FLOORS for r in f} - {""}) == []  # every room has a floor
    assert _upward_imports(graph, FLOORS) == []
    rooms = collections.defaultdict(set)
    for n, deps in graph.items():
        rooms[_room(n)] |= {_room(m) for m in deps if _room(m) and _room(m) != _room(n)}
    rooms.pop("", None)
    assert _cycles(rooms) == []  # nor a cycle between two rooms of one floor
    # control: the checker sees an import that runs back up, and one into a room with no floor
    assert _upward_imports({"paczero.run.build": {"paczero.train"}}, FLOORS) == ["paczero.run.build -> paczero.train"]
    assert _upward_imports({"paczero.run.build": {"paczero.attic.x"}}, FLOORS) == [
        "paczero.run.build -> paczero.attic.x"]


def test_at_most_ten_modules_at_the_top():
    """The top of paczero holds the user's doors (cli, flags, api, config, models, evaluate), the loop and the run
    folder's format; everything else lives in a room by role."""
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_MODULES, top


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
    rooms = [p.parent.relative_to(ROOT.parent).as_posix().replace("/", ".") for p in ROOT.rglob("__init__.py")]
    assert sorted(set(rooms) - set(shipped)) == []  # every room by role (run, machine, audit, experiments, ...)
    assert (ROOT.parent / "benchmarks" / "__init__.py").is_file()  # a package find_packages could take
    assert not [p for p in shipped if p.split(".")[0] != "paczero"]
