"""Decoding frames bodies built by the documented layout (docs/extensions.md section 2)."""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.json as pj
import pytest

from durastream_spark.errors import MalformedFrames
from durastream_spark.protocol.frames import (
    TIMESTAMP_TYPE,
    decode_frames,
    encode_frames,
    offset_token,
    offset_tokens,
)

POSITIONS = [0, 7, 14, 10**15 + 3]
TIMESTAMPS = [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_500, 0]
VALUES = [b'{"a":1}', b'{"b":2}', b"", b'{"c":"\xc3\xa9"}']


def test_round_trip_frames() -> None:
    frames = decode_frames(encode_frames(POSITIONS, TIMESTAMPS, VALUES))
    assert frames.count == 4 and frames.lines is False
    assert frames.positions.type == pa.uint64()
    assert frames.positions.to_pylist() == POSITIONS
    assert frames.timestamps.type == TIMESTAMP_TYPE
    assert frames.timestamps.cast(pa.int64()).to_pylist() == TIMESTAMPS
    assert frames.values.type == pa.large_binary()
    assert frames.values.to_pylist() == VALUES
    assert frames.values_without_newline() is frames.values


def test_values_are_not_copied() -> None:
    body = encode_frames(POSITIONS, TIMESTAMPS, VALUES)
    source = pa.py_buffer(body)
    frames = decode_frames(source)
    data = frames.values.buffers()[2]
    assert data.address == source.address + len(body) - sum(map(len, VALUES))
    assert frames.positions.buffers()[1].address == source.address + 16


def test_empty_body() -> None:
    frames = decode_frames(encode_frames([], [], []))
    assert frames.count == 0
    assert frames.values.to_pylist() == []
    assert frames.offsets().to_pylist() == []
    assert frames.ndjson.size == 0


def test_frames_lines_give_ndjson_for_pyarrow_json() -> None:
    values = [b'{"id": 1, "name": "a"}', b'{"id": 2,  "name": "b"}']
    frames = decode_frames(encode_frames([0, 22], [5, 6], values, lines=True))
    assert frames.lines is True
    assert frames.values_without_newline().to_pylist() == values
    table = pj.read_json(
        pa.BufferReader(frames.ndjson),
        parse_options=pj.ParseOptions(
            explicit_schema=pa.schema([("id", pa.int32()), ("name", pa.string())])
        ),
    )
    assert table.to_pylist() == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]


def test_offset_tokens() -> None:
    tokens = offset_tokens(pa.array(POSITIONS, pa.uint64()))
    assert tokens.to_pylist() == [
        "0000000000000000_0000000000000000",
        "0000000000000000_0000000000000007",
        "0000000000000000_0000000000000014",
        "0000000000000000_1000000000000003",
    ]
    assert offset_token(7) == tokens[1].as_py()
    with pytest.raises(MalformedFrames):
        offset_tokens(pa.array([10**16], pa.uint64()))
    with pytest.raises(ValueError):
        offset_token(-1)


def _corrupt(body: bytes, at: int, packed: bytes) -> bytes:
    return body[:at] + packed + body[at + len(packed) :]


GOOD = encode_frames([0, 3], [1, 2], [b"abc", b"de"])
GOOD_LINES = encode_frames([0, 3], [1, 2], [b"abc", b"de"], lines=True)
BOUNDARIES_AT = 16 + 8 * 2 + 8 * 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"DSF1", "shorter than the 16-byte header"),
        (_corrupt(GOOD, 0, b"XXXX"), "expected magic"),
        (_corrupt(GOOD, 8, struct.pack("<I", 6)), "unknown flags"),
        (_corrupt(GOOD, 12, struct.pack("<I", 1)), "reserved"),
        (_corrupt(GOOD, 4, struct.pack("<I", 9)), "too short for 9 messages"),
        (GOOD[:-1], "values section holds 4 bytes"),
        (GOOD + b"x", "values section holds 6 bytes"),
        (_corrupt(GOOD, BOUNDARIES_AT, struct.pack("<Q", 1)), "start at 1"),
        (_corrupt(GOOD, BOUNDARIES_AT + 8, struct.pack("<Q", 6)), "decrease"),
        (_corrupt(GOOD_LINES, len(GOOD_LINES) - 1, b"x"), "does not end with LF"),
    ],
)
def test_malformed_bodies_are_rejected(body: bytes, message: str) -> None:
    with pytest.raises(MalformedFrames, match=message):
        decode_frames(body)
