"""The published pages name no folder of the machine that wrote them: README, docs/ (the result pages),
results/ (their runs.csv and the runs they keep), the recipes' READMEs and the examples."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: an absolute path into a machine's own folders (a relative path such as ``paczero/data/x`` does not match)
MACHINE_PATH = re.compile(r"(?<![\w./~-])/(?:work|tmp|home|root|Users|scratch|mnt)(?:/|\b)")

#: explicit examples that may name such a folder, each with its reason: (file relative to the repository, text)
ALLOWED: list[tuple[str, str]] = []  # none today

PUBLISHED = ("README.md", "CHANGELOG.md", "docs", "results", "examples", "paczero/recipes")
SUFFIXES = {".md", ".csv", ".json", ".jsonl", ".yaml", ".yml", ".py", ".txt"}


def published_files() -> list[Path]:
    out = []
    for name in PUBLISHED:
        path = REPO / name
        out += [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()
                                               and p.suffix in SUFFIXES]
    return out


def machine_paths(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    found = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if MACHINE_PATH.search(line) and not any(rel == f and text in line for f, text in ALLOWED):
            found.append(f"{rel}:{n}: {line.strip()[:160]}")
    return found


def test_the_pattern_finds_an_absolute_path_and_not_a_relative_one():
    """Red if the scan below could not see a machine's folder (it would then pass on anything)."""
    assert MACHINE_PATH.search("--set data=/work/shared/data/imdb.jsonl")
    assert MACHINE_PATH.search('"run_dir": "/tmp/pytest-1/runs/seed0"') and MACHINE_PATH.search("in /home/alice")
    assert not MACHINE_PATH.search("paczero/data/demo.jsonl runs/tmp/x data=PATH/imdb.jsonl ~/work/x")


def test_no_published_page_names_a_folder_of_the_machine_that_wrote_it():
    """README, CHANGELOG, docs/ (every result page), results/ (every runs.csv and kept run), examples/ and the
    recipes hold no absolute path under /work, /tmp, /home, /root, /Users, /scratch or /mnt. Red if a report's
    page, its kept runs or a hand-written page quote one (``paczero report`` writes paths as typed, relative to the
    folder it ran in, or as PATH/...: docs/outputs.md, "Paths in what a sweep and a report publish")."""
    files = published_files()
    assert len(files) > 300  # the result pages' kept runs are among them
    found = [hit for f in files for hit in machine_paths(f)]
    assert not found, "\n".join(found[:20])
