"""Offset tokens: canonical, fixed-width, sortable, and strict about what they accept (hazard 22)."""

import pytest

from durastream_server.offsets import InvalidOffset, format_offset, parse_offset, parse_position


def test_round_trip_and_order() -> None:
    positions = [0, 1, 9, 10, 99, 10**15, 10**16 - 1]
    tokens = [format_offset(p) for p in positions]
    assert [parse_position(t) for t in tokens] == positions
    assert tokens == sorted(tokens)
    assert all(len(t) == 33 for t in tokens)


def test_sentinels() -> None:
    assert parse_offset("-1") == "-1"
    assert parse_offset("now") == "now"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0_5",
        "1_0",
        "0000000000000000_5",
        "abc",
        "-2",
        "NOW",
        "0000000000000001_0000000000000000",
    ],
)
def test_non_canonical_rejected(text: str) -> None:
    with pytest.raises(InvalidOffset):
        parse_offset(text)
