"""Every link between the repository's documents resolves: files, directories and ``#anchors``.

Checked: inline links ``[text](target)`` and reference definitions ``[name]: target`` outside code, in the
READMEs and ``docs/``. A relative target must exist; an ``#anchor`` must be a heading of the target (as
GitHub makes anchors from headings). A section named in quotes right after a link (``[source.md](source.md),
"Spark versions"``) must be a heading of that document too: that is how deploy.md once sent readers to a
section that did not exist.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        REPO / "README.md",
        REPO / "notebooks" / "README.md",
        REPO / "server" / "README.md",
        REPO / "bench" / "README.md",
        *(REPO / "docs").glob("*.md"),
        *(REPO / "docs" / "decisions").glob("*.md"),
    ]
)

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
_INLINE = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_QUOTED_SECTION = re.compile(r"\]\(([^)#\s]+\.md)\),? \"([^\"]+)\"")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def without_code(text: str) -> str:
    """Fenced blocks and code spans blanked out (their brackets are not links)."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    text = _FENCE.sub("", document.read_text(encoding="utf-8"))
    seen: Counter[str] = Counter()
    found = set()
    for heading in _HEADING.findall(text):
        base = slug(heading)
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def headings(document: Path) -> list[str]:
    text = _FENCE.sub("", document.read_text(encoding="utf-8"))
    return [re.sub(r"[`*_]", "", h) for h in _HEADING.findall(text)]


def links(document: Path) -> list[str]:
    text = without_code(document.read_text(encoding="utf-8"))
    return _INLINE.findall(text) + _REFERENCE.findall(text)


def broken_links(document: Path) -> list[str]:
    problems = []
    for target in links(document):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (document.parent / path_part).resolve() if path_part else document
        if not resolved.exists():
            problems.append(f"{target}: {resolved} does not exist")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading with anchor #{anchor} in {resolved.name}")
    for target, section in _QUOTED_SECTION.findall(without_code(document.read_text("utf-8"))):
        resolved = (document.parent / target).resolve()
        if resolved.exists() and not any(
            h == section or h.startswith(section) for h in headings(resolved)
        ):
            problems.append(f'{target}, "{section}": no such section in {resolved.name}')
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(document: Path) -> None:
    assert not broken_links(document)


def test_the_checker_finds_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Spark >= 4.2: `AvailableNow`\n", "utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Lag\n\n"
        '[ok](other.md#spark--42-availablenow) [ok](#lag) [ok](other.md), "Other"\n'
        "[gone](missing.md) [bad anchor](other.md#spark-versions) [here](#nope)\n"
        '[other.md](other.md), "Spark versions"\n'
        "`[not a link](missing.md)`\n\n```\n[not a link](missing.md)\n```\n",
        "utf-8",
    )
    problems = broken_links(page)
    assert len(problems) == 4, problems
    assert any("missing.md" in p for p in problems)
    assert any("#spark-versions" in p for p in problems)
    assert any("#nope" in p for p in problems)
    assert any('"Spark versions"' in p for p in problems)
