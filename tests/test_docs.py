"""The README and docs/ as a user meets them: a short README that opens with the two
commands, every docs page reachable from it, and no link or anchor that leads nowhere.

Anchors follow GitHub's rule for headings (its ``github-slugger``): lowercase, drop every
character that is not a letter, digit, space, hyphen or underscore, turn each space into a
hyphen, and number repeats (``-1``, ``-2``). Each check is a function that returns what is
wrong, so the tests at the end can show it finds a break when there is one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.docs import anchors, prose, slug
from testkit.tools import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
#: The issue's bound: a README a newcomer reads, not a manual.
README_LIMIT = 20_000

INLINE_CODE = re.compile(r"(`+).*?\1")
#: Inline links and images: [text](target "title"); reference links are not used here.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def links(text: str) -> list[str]:
    found = []
    for line in prose(text):
        found += LINK.findall(INLINE_CODE.sub("", line))
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file is missing, or whose ``#anchor`` is not a
    heading of the page it points to."""
    broken = []
    for target in links(page.read_text()):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and anchor not in anchors(dest.read_text()):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return broken


def linked_pages(page: Path) -> set[Path]:
    """The files ``page`` links to."""
    targets = (t.partition("#")[0] for t in links(page.read_text()) if not SCHEME.match(t))
    return {(page.parent / t).resolve() for t in targets if t}


def opening_commands(text: str) -> list[str]:
    """The lines of the ``sh`` block that must come first after the title (empty when the
    README opens with anything else)."""
    lines = text.splitlines()
    rest = [line for line in lines[1:] if line.strip()] if lines[0].startswith("# ") else []
    if not rest or rest[0].strip() != "```sh":
        return []
    block = []
    for line in rest[1:]:
        if line.strip() == "```":
            return block
        block.append(line)
    return []


def has_the_two_commands(block: list[str]) -> bool:
    return all(any(line.startswith(cmd) for line in block) for cmd in ("make run", "make test"))


# --- the repository's README and docs ------------------------------------------------------


def test_readme_is_short():
    size = len(README.read_text())
    assert size < README_LIMIT, f"README.md has {size} characters; move detail to docs/"


def test_readme_opens_with_make_run_and_make_test():
    assert has_the_two_commands(opening_commands(README.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_resolve(page):
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_the_readme():
    assert DOCS, "docs/ has no pages"
    assert [p.name for p in DOCS if p.resolve() not in linked_pages(README)] == []


#: Notes kept outside the repository, which a reader of a clone cannot open.
OUTSIDE = ("FACTS" + ".md", "../" + "shared/")


def outside_citations(root: Path) -> list[str]:
    """Each line of the code, tests, CI scripts and docs that cites a file outside the
    repository: a fact cites the upstream source it rests on, or a doc in this one."""
    found = []
    for folder in ("webhook", "tests", ".ci", "docs", "charts", "examples"):
        for path in sorted((root / folder).rglob("*")):
            if not path.is_file() or path.suffix in (".pyc", ".whl", ".tgz"):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), 1):
                if any(name in line for name in OUTSIDE):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_nothing_cites_a_file_outside_the_repository():
    assert outside_citations(ROOT) == []


def test_a_citation_of_a_file_outside_is_found(tmp_path):
    (tmp_path / "webhook").mkdir()
    (tmp_path / "webhook" / "x.py").write_text("# Counting follows " + OUTSIDE[0] + ".\n")
    assert outside_citations(tmp_path) == [f"webhook/x.py:1: # Counting follows {OUTSIDE[0]}."]


# --- the checks find what is broken ---------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        (
            "Written or defaulted? The `backoffLimit` rule",
            "written-or-defaulted-the-backofflimit-rule",
        ),
        ("HTTP/2: not offered", "http2-not-offered"),
        ("Cluster defaults (admins)", "cluster-defaults-admins"),
        ("Simulating failures: `--simulate`", "simulating-failures---simulate"),
        ("retry_webhook metrics", "retry_webhook-metrics"),
    ],
)
def test_slug_is_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_broken_links_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n"
        "[ok](other.md) [ok](other.md#a-section) [repeat](other.md#a-section-1) [self](#here)\n"
        "[web](https://example.com/x.md) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n"
        "[gone](missing.md) [bad](other.md#no-such) [badself](#there)\n"
    )
    broken = broken_links(page)
    assert [b.split(":")[0] for b in broken] == ["missing.md", "other.md#no-such", "#there"]


def test_linked_pages_misses_an_unlinked_page(tmp_path):
    (tmp_path / "docs").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("# R\n\n[a](docs/a.md#x) `[b](docs/b.md)`\n")
    assert linked_pages(readme) == {(tmp_path / "docs" / "a.md").resolve()}


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("# T\n\n```sh\nmake run    # serve\nmake test   # test\n```\n", True),
        ("# T\n\nIntro first.\n\n```sh\nmake run\nmake test\n```\n", False),
        ("# T\n\n```sh\nmake run\n```\n\n```sh\nmake test\n```\n", False),
        ("# T\n\n```bash\nmake run\nmake test\n```\n", False),
        ("Intro\n\n```sh\nmake run\nmake test\n```\n", False),
    ],
)
def test_opening_check_needs_both_commands_first(text, ok):
    assert has_the_two_commands(opening_commands(text)) is ok


def test_the_license_declared_everywhere_is_the_one_shipped():
    """pyproject.toml, the image's label and the build context all name Apache-2.0; the
    LICENSE file is its text (the wheel and the image carry it)."""
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text().splitlines()
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()
    assert "!LICENSE" in (ROOT / ".dockerignore").read_text().splitlines()
