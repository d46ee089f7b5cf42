"""docs/server.md documents every flag of ``durastream-server`` (taken from the argparse parser itself)."""

from __future__ import annotations

import re
from pathlib import Path

from durastream_server import __version__
from durastream_server.cli import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"
SERVER_MD = DOCS / "server.md"


def parser_flags() -> list[str]:
    return [flag for action in build_parser()._actions for flag in action.option_strings]


def flags_table() -> str:
    text = SERVER_MD.read_text(encoding="utf-8")
    return text.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]


def test_every_flag_is_in_the_flags_table() -> None:
    table = flags_table()
    missing = [
        flag for flag in parser_flags() if not re.search(rf"`{re.escape(flag)}(?![\w-])", table)
    ]
    assert not missing, f"docs/server.md's Flags table does not mention {missing}"


def test_every_flag_in_the_table_exists() -> None:
    known = set(parser_flags())
    documented = set(re.findall(r"^\| `(--?[\w-]+)", flags_table(), re.MULTILINE))
    documented |= set(re.findall(r"`(-h)`", flags_table()))
    assert documented, "no flags found in the table"
    assert not documented - known, f"documented but not accepted: {documented - known}"


def test_linked_docs_exist() -> None:
    text = SERVER_MD.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)", text):
        assert (DOCS / target).is_file(), f"docs/server.md links to missing {target}"


def test_version_in_examples_is_current() -> None:
    text = SERVER_MD.read_text(encoding="utf-8")
    assert f"durastream-server {__version__}" in text
