"""One grammar for byte sizes on both sides: every connector option and every server flag that takes a size.

The grammar lives in ``sizes.py``, which both distributions carry (they do not depend on each other); the
copies must be identical, and every size option and flag must go through it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from durastream_server import sizes as server_sizes
from durastream_server.cli import build_parser
from durastream_spark import docs, sizes
from durastream_spark.errors import OptionError

REPO = Path(__file__).resolve().parents[2]

SPELLINGS = {
    "1048576": 1 << 20,
    "4m": 4 << 20,
    "4M": 4 << 20,
    "4 MiB": 4 << 20,
    "4mb": 4 << 20,
    "512k": 512 << 10,
    "512KB": 512 << 10,
    "1g": 1 << 30,
    "2gib": 2 << 30,
    "1t": 1 << 40,
    "100b": 100,
    " 64m ": 64 << 20,
}
REFUSED = ["1.5g", "64 megabytes", "", "-1", "m", "4mm", "0x10", "4 m b"]


def test_both_distributions_carry_the_same_parser() -> None:
    connector = (REPO / "durastream_spark" / "sizes.py").read_bytes()
    server = (REPO / "server" / "durastream_server" / "sizes.py").read_bytes()
    assert connector == server, (
        "durastream_spark/sizes.py and server/durastream_server/sizes.py differ"
    )


@pytest.mark.parametrize("text", SPELLINGS)
def test_spellings_and_their_values(text: str) -> None:
    assert sizes.parse_byte_size(text) == server_sizes.parse_byte_size(text) == SPELLINGS[text]


@pytest.mark.parametrize("text", REFUSED)
def test_refused_spellings_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"512k, 64m, 1g \(1k = 1024 bytes\)"):
        sizes.parse_byte_size(text)


@pytest.mark.parametrize("size", [1, 1000, 1024, 1536, 4 << 20, 3 << 30, (1 << 40) + 1024, 5 << 40])
def test_formatting_round_trips(size: int) -> None:
    text = sizes.format_byte_size(size)
    assert sizes.parse_byte_size(text) == size
    assert len(text) <= len(str(size))


def byte_size_options() -> list[docs.OptionDoc]:
    found = [doc for doc in docs.documented() if doc.type == docs.BYTE_SIZE]
    assert {d.key for d in found} >= {
        "maxBytesPerTrigger",
        "maxBytesPerPartition",
        "maxBytesPerRequest",
    }
    return found


@pytest.mark.parametrize("doc", byte_size_options(), ids=lambda d: d.key)
def test_every_connector_size_option_takes_the_grammar(doc: docs.OptionDoc) -> None:
    for text in ("4m", "4 MiB", "4096k", str(4 << 20)):
        docs._parse(doc.scope, {doc.key: text})  # raises OptionError if refused
    with pytest.raises(OptionError) as refused:
        docs._parse(doc.scope, {doc.key: "1.5g"})
    assert refused.value.option == doc.key
    assert sizes.SYNTAX in refused.value.accepted


def server_size_flags() -> list[argparse.Action]:
    flags = [a for a in build_parser()._actions if a.metavar == "BYTES"]
    assert {a.option_strings[0] for a in flags} >= {
        "--max-body-bytes",
        "--chunk-bytes",
        "--max-staged-bytes",
        "--max-header-bytes",
    }
    return flags


@pytest.mark.parametrize("action", server_size_flags(), ids=lambda a: a.option_strings[0])
def test_every_server_size_flag_takes_the_grammar(
    action: argparse.Action, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = action.option_strings[0]
    for text, value in (("64m", 64 << 20), ("4 MiB", 4 << 20), ("1g", 1 << 30), ("65536", 65536)):
        args = build_parser().parse_args([flag, text])
        assert getattr(args, action.dest) == value
    with pytest.raises(SystemExit):
        build_parser().parse_args([flag, "1.5g"])
    assert "512k, 64m, 1g" in capsys.readouterr().err
    # --help shows the default in the same grammar.
    assert f"(default: {sizes.format_byte_size(action.default)})" in " ".join(action.help.split())
