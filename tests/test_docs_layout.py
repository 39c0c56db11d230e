"""Prose apart from run data: docs/ holds the pages, results/ the data they quote, and every relative link of
the README and the pages reaches a file that exists."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the Markdown whose links are checked: the README, every page of docs/, the CHANGELOG, the recipes' READMEs
#: and the notes beside the data
PAGES = sorted({REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").rglob("*.md"),
                *(REPO / "paczero" / "recipes").glob("*/README.md"), *(REPO / "results").glob("*.md")})

#: where a documented ``paczero report`` command is written down
COMMANDS = sorted({*PAGES, *(REPO / "scripts" / "recipe_templates").glob("*.md"), *(REPO / "benchmarks").glob("*.sh"),
                   *(REPO / "scripts").glob("*.sh")})

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_INLINE = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def link_targets(text: str) -> list[str]:
    """The relative targets of a Markdown text's links and images (inline and reference definitions), without
    their ``#anchor``; links inside code (fenced blocks, backticks) are text, not links, and URLs are not files."""
    text = _CODE.sub("", _FENCE.sub("", text))
    out = []
    for target in _INLINE.findall(text) + _REFERENCE.findall(text):
        if _SCHEME.match(target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return [t for t in out if t]


def broken_links(page: Path) -> list[str]:
    """The links of ``page`` whose target (relative to the page's folder) is no file or folder."""
    return [f"{page.relative_to(REPO).as_posix()}: {t}" for t in link_targets(page.read_text())
            if not (page.parent / t).exists()]


def test_the_link_scan_sees_links_and_images_and_skips_code_and_urls():
    """Red if the scan below could not see a link (it would then pass on any page): inline links, images, a
    title, an anchor, a reference definition; and not the ones in code or a URL."""
    text = ("See [a](docs/a.md#part), ![plot](../results/x/plots/p.png \"title\") and [b][1].\n\n"
            "[1]: results/x/runs.csv\n\n`[c](inline/code.md)` [web](https://example.org/y.md) [top](#top)\n"
            "```bash\n[d](fenced/code.md)\n```\n")
    assert link_targets(text) == ["docs/a.md", "../results/x/plots/p.png", "results/x/runs.csv"]


def test_every_relative_link_of_the_readme_and_the_docs_reaches_a_file():
    """Every relative link and image of README.md, CHANGELOG.md, docs/**/*.md, the recipes' READMEs and
    results/*.md resolves, from the page's folder, to a file or folder of the repository (anchors are not
    checked). Red if a report page's plot link still points where the data used to be (``cpu-sst2/plots/...``
    from docs/results/ once the data is under results/), or if a page links a file that was moved or removed."""
    assert len(PAGES) >= 20
    links = sum(len(link_targets(p.read_text())) for p in PAGES)
    assert links > 300  # the report pages' plot links are among them
    broken = [b for p in PAGES for b in broken_links(p)]
    assert not broken, "\n".join(broken[:20])


def test_docs_holds_prose_and_reports_only():
    """docs/ holds prose and reports only: every file under it is a Markdown page, either a page of the
    documentation (``docs/*.md``) or a table's report (``docs/results/*.md``), and no folder lies deeper than
    docs/results/. Run data (run logs and summaries, kept runs, CSVs, plots, stored scalars, the Markdown a
    command writes beside its data such as ``paczero regime``'s ``regime.md``) lives under ``results/TABLE/``,
    and a figure a page shows lives there with the data it plots. Red if a run log is put back under docs/
    (``docs/results/cpu-sst2/runs/.../log.jsonl``), or a plot, CSV or regime folder is."""
    docs = REPO / "docs"
    files = [p.relative_to(docs).as_posix() for p in sorted(docs.rglob("*")) if p.is_file()]
    assert "results.md" in files and "results/cpu-sst2.md" in files
    stray = [f for f in files if not re.fullmatch(r"(results/)?[^/]+\.md", f)]
    assert not stray, f"{len(stray)} files under docs/ that are not pages: {stray[:10]}"


def _report_commands(text: str) -> list[list[str]]:
    """Every ``paczero report`` command written in ``text`` (over line breaks and backticks), as its words: the
    runs folder, then options each with at most one value; the first other word ends it (prose, a comment)."""
    flat = re.sub(r"\\\n", " ", text).replace("`", " ")
    found = re.findall(r"paczero report(\s+[^\s-]\S*(?:\s+--[\w-]+(?:\s+[^\s-]\S*)?)*)", flat)
    return [words.split() for words in found]


def _option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words and words.index(name) + 1 < len(words) else None


def test_every_documented_report_command_writes_data_under_results_and_its_page_under_docs():
    """Each ``paczero report`` command the README, docs, the recipes' READMEs and their templates, results/ and
    the scripts write down: with ``--markdown`` (a published page) the page goes under docs/results/ and the
    data (``--out``) under results/; no command writes data into docs/. Each report page's own command names
    the page itself and ``results/<its name>``. Red if a command still writes ``--out docs/results/TABLE``."""
    assert [w[:3] for w in _report_commands("`paczero report runs/x --out results/x --markdown\ndocs/results/x.md "
                                            "--keep-runs`.")] == [["runs/x", "--out", "results/x"]]
    published = []
    for path in COMMANDS:
        rel = path.relative_to(REPO).as_posix()
        for words in _report_commands(path.read_text()):
            out, markdown = _option(words, "--out"), _option(words, "--markdown")
            assert out is None or not out.startswith("docs"), f"{rel}: {shlex.join(words)}"
            if markdown is not None:
                published.append(rel)
                assert markdown.startswith("docs/results/") and (out or "").startswith("results/"), \
                    f"{rel}: {shlex.join(words)}"
            if rel.startswith("docs/results/") and markdown is not None:
                assert (markdown, out) == (rel, f"results/{path.stem}"), f"{rel}: {shlex.join(words)}"
    pages = {p for p in published if p.startswith("docs/results/")}
    assert len(pages) >= 6 and "paczero/recipes/cpu-sst2/README.md" in published, published
