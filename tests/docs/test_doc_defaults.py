"""The defaults the docs quote are the CLI's actual defaults (taken from the argparse parser itself).

- ``docs/server.md``'s Flags table: the value in backticks of each flag's default cell (and its ``(64 MiB)``
  gloss, if any);
- ``docs/security.md``'s tables of limits: each row naming a flag quotes its default as a quantity
  (``32 KiB``, ``10 s``, ``16 KiB/s``), and every numeric flag of the "security and exposure" group has
  such a row.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from durastream_server.cli import build_parser
from tests.docs.test_server_doc import DOCS, flags_table

SECURITY_MD = DOCS / "security.md"
UNITS = {"": 1, "B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "s": 1}
_QUANTITY = re.compile(r"(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*(bytes|B|KiB|MiB|GiB|s)?(?:/s)?")


def _actions() -> dict[str, argparse.Action]:
    return {flag: action for action in build_parser()._actions for flag in action.option_strings}


def _quantity(text: str) -> float:
    match = _QUANTITY.fullmatch(text.strip())
    assert match is not None, f"not a quantity: {text!r}"
    return float(match.group(1).replace(",", "")) * UNITS[match.group(2) or ""]


def _rows(markdown: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in markdown.splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    ]


def _shown(default: object) -> str:
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, Path):
        return f"./{default}"
    return str(default)


def test_server_md_flag_defaults_are_the_parsers() -> None:
    actions = _actions()
    checked = 0
    for row in _rows(flags_table()):
        flag = re.match(r"`(--?[\w-]+)", row[0])
        value = re.match(r"`([^`]+)`", row[1])
        if flag is None or value is None:
            continue  # a header row, or a default described in words ("loopback origins only")
        default = actions[flag.group(1)].default
        assert value.group(1) == _shown(default), (flag.group(1), row[1], default)
        gloss = re.search(r"\(([\d.]+ ?[KMG]iB)\)", row[1])
        if gloss:
            assert _quantity(gloss.group(1)) == default, (flag.group(1), row[1])
        checked += 1
    assert checked >= 15


def _security_limits() -> dict[str, str]:
    """Flag -> the default its row in docs/security.md quotes."""
    found = {}
    for row in _rows(SECURITY_MD.read_text(encoding="utf-8")):
        flags = re.findall(r"`(--[\w-]+)`", row[0])
        if len(flags) == 1 and len(row) > 1:
            found[flags[0]] = row[1]
    return found


@pytest.mark.parametrize("flag", sorted(_security_limits()))
def test_security_md_quotes_the_parsers_defaults(flag: str) -> None:
    quoted = _security_limits()[flag]
    default = _actions()[flag].default
    assert _quantity(quoted) == default, (
        f"docs/security.md gives {flag} as {quoted!r}, --help {default}"
    )


def test_every_numeric_security_flag_has_a_limits_row() -> None:
    (group,) = [g for g in build_parser()._action_groups if g.title == "security and exposure"]
    numeric = [
        action.option_strings[0]
        for action in group._group_actions
        if isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
    ]
    assert numeric, "no numeric flags found"
    missing = sorted(set(numeric) - set(_security_limits()))
    assert not missing, f"docs/security.md's limits table does not give a default for {missing}"
