"""The documentation's links hold: every relative link in README.md and docs/**/*.md names a
file of the repository (and, with ``#anchor``, a heading of it), every "docs/....md" the
code, the tests and the docs cite by path exists, with the section they quote, and every
test the docs name (``tests/x.py::test_y``) exists.

Links are read as GitHub renders them: fenced code blocks and inline code are not text, and
a heading's anchor is GitHub's slug of its text (lower case, punctuation dropped, spaces as
hyphens, ``-1``, ``-2``... for repeats).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.M | re.S)
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_TITLE = r"(?:\s+(?:\"[^\"]*\"|'[^']*'))?"
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?" + _TITLE + r"\s*\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?" + _TITLE + r"\s*$", re.M)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links there are not links)."""
    text = _FENCE.sub("", text)
    return _CODE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's markdown text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans keep their text
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"(\*\*|__|\*|_(?=\W|$)|(?<=\W)_)", "", text)  # emphasis markers
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor GitHub gives ``page``'s headings (repeats numbered as it numbers them)."""
    seen: dict[str, int] = {}
    found = set()
    for match in _HEADING.finditer(_FENCE.sub("", page.read_text("utf-8"))):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> Iterator[str]:
    """The targets of ``page``'s inline links, images and reference definitions."""
    text = _prose(page.read_text("utf-8"))
    for pattern in (_INLINE_LINK, _REFERENCE_DEF):
        for match in pattern.finditer(text):
            yield match.group(1)


def broken(page: Path, target: str) -> str | None:
    """Why ``target``, a link on ``page``, does not resolve (None when it does)."""
    if _SCHEME.match(target) or target.startswith("//"):
        return None  # a URL: not the repository's to check
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.is_relative_to(ROOT):
        return f"{target}: outside the repository (users never see {dest})"
    if not dest.exists():
        return f"{target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: {dest.relative_to(ROOT)} has no heading #{anchor}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = [p for t in links(page) if (p := broken(page, t)) is not None]
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_link_check_sees_what_it_must() -> None:
    text = (
        "[a](spec.md#2-the-gradient-document) ![i](x.png 'title') `[not](a-link)`\n"
        "```\n[nor](this)\n```\n[ref]: ../README.md#gradstore\n"
    )
    page = ROOT / "docs" / "probe.md"
    found = [m.group(1) for p in (_INLINE_LINK, _REFERENCE_DEF) for m in p.finditer(_prose(text))]
    assert found == ["spec.md#2-the-gradient-document", "x.png", "../README.md#gradstore"]
    assert broken(page, "spec.md#2-the-gradient-document") is None
    assert "no heading" in (broken(page, "spec.md#no-such-section") or "")
    assert "no such file" in (broken(page, "nowhere.md") or "")
    assert "outside the repository" in (broken(page, "../../shared/notes.md") or "")
    assert broken(page, "https://example.org/x#y") is None


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("2.2 gradstore/1 (dense)", "22-gradstore1-dense"),
        ("The command line: `scripts/bench_cli.py`", "the-command-line-scriptsbench_clipy"),
        ("The peers' own word: round/4", "the-peers-own-word-round4"),
        ("6.5 Order statistics: median, trimmed_mean", "65-order-statistics-median-trimmed_mean"),
        ("Store: put/get × 7", "store-putget--7"),
    ],
)
def test_slugs_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


# -- "docs/....md" cited by path, in code, tests and docs ----------------------------------------
_CITED = re.compile(r"\bdocs/[\w./-]*?\.md\b")
#: ``(docs/x.md, "Section")`` or ``docs/x.md's "Section"``: the quoted text must be in the page.
_QUOTED = re.compile(r"\b(docs/[\w./-]*?\.md)(?:,|'s)\s+\"([^\"]+)\"")
#: ``docs/spec.md, section 6.2`` / ``docs/spec.md (section 2.3)``: spec.md has that section.
_SPEC_SECTION = re.compile(r"\bdocs/spec\.md(?:'s)?,?\s+\(?sections?\s+(\d+(?:\.\d+)?)")


def _citing_files() -> Iterator[Path]:
    for pattern in ("src/**/*.py", "tests/**/*.py", "scripts/**/*.py", "benchmarks/**/*.py"):
        yield from ROOT.glob(pattern)
    yield from PAGES
    yield from (ROOT / p for p in ("pyproject.toml", "docker/container-init.d/001-gradstore.sh"))


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[*`#]|^\s*[-+]\s", " ", text, flags=re.M).split()).lower()


def _spec_sections() -> set[str]:
    spec = (ROOT / "docs" / "spec.md").read_text("utf-8")
    return {m.group(1).rstrip(".") for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)*)\.? ", spec, re.M)}


def test_every_cited_docs_path_exists_with_the_section_it_quotes() -> None:
    sections = _spec_sections()
    problems = []
    for path in _citing_files():
        if not path.is_file() or path == Path(__file__).resolve():
            continue
        text = path.read_text("utf-8")
        flat = " ".join(text.replace('"""', " ").replace("#", " ").split())
        where = path.relative_to(ROOT)
        for cited in set(_CITED.findall(text)):
            if not (ROOT / cited).is_file():
                problems.append(f"{where}: {cited} does not exist")
        for cited, quoted in _QUOTED.findall(flat):
            page = ROOT / cited
            if page.is_file() and _normal(quoted) not in _normal(page.read_text("utf-8")):
                problems.append(f'{where}: {cited} has no "{quoted}"')
        for number in _SPEC_SECTION.findall(flat):
            if number not in sections:
                problems.append(f"{where}: docs/spec.md has no section {number}")
    assert not problems, "\n".join(sorted(problems))


_TEST_CITED = re.compile(r"\b(tests/[\w/]+\.py)::(test_\w+)")


def test_every_test_the_docs_name_exists() -> None:
    problems = []
    for page in PAGES:
        for path, name in _TEST_CITED.findall(page.read_text("utf-8")):
            source = ROOT / path
            if not source.is_file() or not re.search(
                rf"^(async )?def {name}\(", source.read_text("utf-8"), re.M
            ):
                problems.append(f"{page.relative_to(ROOT)}: {path}::{name} does not exist")
    assert not problems, "\n".join(problems)
