"""Every default the prose quotes agrees with the code: docs, READMEs and module docstrings.

``docs/options.md`` is generated from the option parsers (``test_options_doc.py``); this test covers the
rest. It finds each place that names a setting (a connector option such as ``maxBytesPerPartition``, or a
server flag such as ``--chunk-bytes``) next to the word "default", takes the values quoted there (numbers
with their units, and code spans), parses each with the setting's own parser, and requires that one of
them is the setting's default in the code. A value is attributed to the closest setting named before it
(``X (default 1 h)``); in a table with a "default" column, the value in that column belongs to the settings
named in the row's first cell. A value the setting's parser cannot read is no claim about it (``7 days``
next to a byte size). Prose that names a default without a value is not checked: write the value.

``docs/benchmarks.md`` and ``docs/decisions/`` are records of past runs and decisions ("the defaults of the
time"), so they are not checked.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durastream_server.cli import build_parser
from durastream_spark import docs
from durastream_spark.sink.options import ORDERED, TRANSACTIONAL, SinkOptions
from durastream_spark.source.options import SourceOptions

REPO = Path(__file__).resolve().parents[2]
MARKDOWN = sorted(
    [
        REPO / "README.md",
        REPO / "notebooks" / "README.md",
        REPO / "server" / "README.md",
        *(p for p in (REPO / "docs").glob("*.md") if p.name not in ("options.md", "benchmarks.md")),
    ]
)
PACKAGES = [REPO / "durastream_spark", REPO / "server" / "durastream_server"]
# Options without a default worth quoting: required, paths, secrets, or Spark's own.
NO_DEFAULT = {
    "url",
    "streams",
    "pattern",
    "stream",
    "header.<Name>",
    "tokenFile",
    "tls.caBundle",
    "checkpointLocation",
    "queryName",
}


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]  # a quoted value -> something comparable with ``defaults``
    defaults: tuple[Any, ...]


def _comparable(parsed: Any) -> Any:
    """A parsed options object without the fields that keep the user's raw text."""
    if isinstance(parsed, SourceOptions):
        return dataclasses.replace(parsed, starting_text=None, ending_text=None, ending_given=False)
    return parsed


def connector_settings() -> list[Setting]:
    settings = []
    for doc in docs.documented():
        if doc.key in NO_DEFAULT:
            continue

        def parse(text: str, doc: docs.OptionDoc = doc) -> Any:
            return _comparable(docs._parse(doc.scope, {doc.key: text}))

        defaults: tuple[Any, ...] = (_comparable(docs._parse(doc.scope, {})),)
        if doc.key == "maxBytesPerRequest":  # the default depends on the mode
            base = SinkOptions.parse(docs.BASE[docs.SINK])
            defaults = tuple(parse(str(base.request_bytes(m))) for m in (TRANSACTIONAL, ORDERED))
        settings.append(Setting(doc.key, parse, defaults))
    return settings


def server_settings() -> list[Setting]:
    settings = []
    for action in build_parser()._actions:
        flags = [f for f in action.option_strings if f.startswith("--")]
        if not flags or action.default in (None, [], argparse.SUPPRESS) or action.nargs == 0:
            continue

        def parse(text: str, action: argparse.Action = action) -> Any:
            if action.metavar == "SECONDS":  # "10 s" in prose is the flag's "10"
                text = re.sub(r"\s*(s|seconds?)$", "", text.strip())
            value = action.type(text) if callable(action.type) else text
            if action.choices is not None and value not in action.choices:
                raise ValueError(f"not one of {action.choices}")
            return value

        settings.append(Setting(flags[0], parse, (action.default,)))
    return settings


SETTINGS = {s.name: s for s in connector_settings() + server_settings()}
_NAME = re.compile(
    "|".join(
        rf"(?<![\w.-]){re.escape(name)}(?![\w-])"
        for name in sorted(SETTINGS, key=len, reverse=True)
    )
)
_CODE = re.compile(r"``(.+?)``|`([^`]+)`")
_QUANTITY = re.compile(
    r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?(?:KiB|MiB|GiB|TiB|[kmgt]b?|bytes|ms|s|m|h))?(?!\w)(?!\.\d)",
    re.IGNORECASE,
)


# ---- where the prose is ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    where: str
    text: str  # the sentence or table row, for the failure message
    setting: str
    values: tuple[str, ...]


def markdown_units(text: str) -> Iterator[tuple[str, bool, str]]:
    """``(unit, is_default_cell, names_text)``: sentences, and the default cells of tables."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    header: list[str] | None = None
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if any(_RST_BORDER.match(line) for line in lines):
            yield from rst_table_units(lines)
            continue
        if lines and all(line.lstrip().startswith("|") for line in lines):
            header = [c.strip().lower() for c in lines[0].strip().strip("|").split("|")]
            for line in lines[2:]:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if "default" in header and len(cells) == len(header):
                    yield cells[header.index("default")], True, cells[0]
                yield line, False, line
            continue
        yield from ((s, False, s) for s in sentences(" ".join(lines)))


_RST_BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")


def rst_table_units(lines: list[str]) -> Iterator[tuple[str, bool, str]]:
    """A reStructuredText simple table (docstrings): the "default" column's cell of each row."""
    borders = [i for i, line in enumerate(lines) if _RST_BORDER.match(line)]
    spans = [m.span() for m in re.finditer(r"=+", lines[borders[0]])]

    def cells(line: str) -> list[str]:
        return [line[a:b].strip() if i + 1 < len(spans) else line[a:].strip()
                for i, (a, b) in enumerate(spans)]  # fmt: skip

    header = [c.lower() for c in cells(lines[borders[0] + 1])] if len(borders) > 1 else []
    if "default" not in header or len(borders) < 3:
        return
    rows: list[list[str]] = []
    for line in lines[borders[1] + 1 : borders[2]]:
        row = cells(line)
        if rows and not row[0]:  # a continuation line
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], row, strict=True)]
        else:
            rows.append(row)
    for row in rows:
        yield row[header.index("default")], True, row[0]


def sentences(paragraph: str) -> list[str]:
    return re.split(r"(?<=[.!?:;])\s+(?=[A-Z`(\[*-])|\s+-\s+(?=\S)", paragraph)


def docstrings() -> Iterator[tuple[str, str]]:
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text("utf-8")))
            if doc:
                yield str(path.relative_to(REPO)), doc


def claims_in(where: str, text: str) -> Iterator[Claim]:
    for unit, is_default_cell, names_text in markdown_units(text):
        if is_default_cell:
            values = tuple(value for _, value, _ in _values(unit))
            for name in {m.group(0) for m in _NAME.finditer(names_text.split("|")[0])}:
                yield Claim(where, f"{names_text} | {unit}", name, values)
            continue
        if "default" not in unit.lower():
            continue
        yield from _attributed(where, unit)


def _values(text: str) -> Iterator[tuple[int, str, str | None]]:
    """``(position, value, setting)``: code spans and quantities; ``setting`` when the span names it
    (```failOnDataLoss=true```, ```--durability fsync```)."""
    for match in _CODE.finditer(text):
        code = match.group(1) or match.group(2)
        inner = _NAME.search(code)
        rest = _NAME.sub(" ", code).replace("=", " ").strip()
        rest = re.sub(r"\s+[A-Z_]+$", "", rest) if inner else rest  # a metavar: `--port PORT`
        if rest:
            yield match.start(), rest, inner.group(0) if inner else None
    blanked = _CODE.sub(lambda m: " " * len(m.group(0)), text)
    for match in _QUANTITY.finditer(blanked):
        yield match.start(), match.group(0).replace(",", ""), None  # 10,000 is 10000


def _attributed(where: str, unit: str) -> Iterator[Claim]:
    """Each quoted value belongs to the closest setting named before it (or the first one after)."""
    names = list(_NAME.finditer(unit))
    if not names:
        return
    by_name: dict[str, list[str]] = {}
    for position, value, owner in _values(unit):
        if owner is None:
            before = [n for n in names if n.start() < position]
            owner = (before[-1] if before else names[0]).group(0)
        by_name.setdefault(owner, []).append(value)
    for name, values in by_name.items():
        yield Claim(where, unit, name, tuple(values))


def all_claims() -> list[Claim]:
    found = []
    for path in MARKDOWN:
        found += claims_in(str(path.relative_to(REPO)), path.read_text("utf-8"))
    for where, doc in docstrings():
        found += claims_in(where, doc)
    return found


def contradiction(claim: Claim) -> str | None:
    """Why ``claim`` disagrees with the code, or ``None`` (agrees, or quotes no value it can read)."""
    setting = SETTINGS[claim.setting]
    read = []
    for value in claim.values:
        try:
            read.append(setting.parse(value))
        except Exception:  # noqa: BLE001 - any value the parser refuses is not a claim about it
            continue
    if not read or any(value in setting.defaults for value in read):
        return None
    return (
        f"{claim.where}: {claim.setting} is quoted as default with {list(claim.values)}, but the "
        f"code's default differs:\n    {claim.text.strip()[:300]}"
    )


# ---- the tests ----------------------------------------------------------------------------------------


def test_every_quoted_default_agrees_with_the_code() -> None:
    claims = all_claims()
    problems = [p for p in map(contradiction, claims) if p]
    assert not problems, "\n".join(problems)
    checked = {c.setting for c in claims if c.values}
    # The check really looks at the places where defaults are quoted.
    assert {
        "maxBytesPerPartition",
        "--chunk-bytes",
        "--max-body-bytes",
        "transactionTtl",
    } <= checked


@pytest.mark.parametrize(
    "text",
    [
        "Tasks are large: `maxBytesPerPartition` defaults to 128 MiB.",
        "Chunks (`--chunk-bytes`, default 1 MiB) bound the memory.",
        "| flag | default | meaning |\n| --- | --- | --- |\n| `--chunk-bytes BYTES` | `1048576` | x |",
        "- **A batch must commit within `transactionTtl` (default 2 h).**",
        "Server chunks are 4 MiB (`--chunk-bytes` default) and `maxBytesPerRequest` defaults to 8 MiB.",
        "The sink's `maxMessagesPerRequest` (default 20,000) stays below the server's limit.",
        "========================  ========  ====\n"
        "option                    default   what\n"
        "========================  ========  ====\n"
        "``maxBytesPerPartition``  ``128m``  x\n"
        "========================  ========  ====",
    ],
)
def test_a_contradiction_is_found(text: str) -> None:
    problems = [p for p in map(contradiction, claims_in("example.md", text)) if p]
    assert problems, f"not found in {text!r}"


@pytest.mark.parametrize(
    "text",
    [
        "`maxBytesPerPartition` defaults to 256 MiB (twice Spark's 128 MiB).",
        "| flag | default | meaning |\n| --- | --- | --- |\n| `--chunk-bytes BYTES` | `4194304` (4 MiB) | x |",
        "`--durability fsync` (default): an append waits for `fdatasync`.",
        "`failOnDataLoss=true` (default) fails the query.",
        "Staged requests default to 4 MiB (`maxBytesPerRequest`; ordered mode keeps 1 MiB).",
        "The sink's `maxMessagesPerRequest` (default 10,000) stays below the server's limit.",
    ],
)
def test_agreeing_defaults_pass(text: str) -> None:
    claims = list(claims_in("example.md", text))
    assert claims and not [p for p in map(contradiction, claims) if p]


def test_the_default_schema_is_quoted_as_the_source_returns_it() -> None:
    from durastream_spark import source

    quoted = re.compile(r"[Dd]efault schema(?: is)?\W+`+(stream [^`]+)`+")
    found = [
        (where, m.group(1))
        for where, text in [
            *((str(p.relative_to(REPO)), p.read_text("utf-8")) for p in MARKDOWN),
            *docstrings(),
        ]
        for m in quoted.finditer(text)
    ]
    assert len(found) >= 3, found
    assert all(schema == source.DEFAULT_SCHEMA for _, schema in found), found
