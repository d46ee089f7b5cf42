"""Record framing: round trips, header-only decoding, and checksum failures (hazards 18, 32)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from durastream_server.storage import codec
from durastream_server.storage.codec import FRAME_SIZE, CorruptRecord, Kind
from durastream_server.storage.records import AppendEntry, ProducerTuple, SoftDelete, StreamHeader


def _split(frame: bytes | bytearray) -> tuple[codec.FrameInfo, bytes]:
    info = codec.parse_frame(frame)
    body = bytes(frame[FRAME_SIZE:])
    assert len(body) == info.body_len
    return info, body


@pytest.mark.parametrize(
    "entry",
    [
        AppendEntry(0, (b'{"a":1}', b"[2]", b'"x"'), 1_700_000_000_000),
        AppendEntry(5, (b"raw bytes \x00\xff",), 7, closes=True),
        AppendEntry(9, (), 8, closes=True, producer=ProducerTuple("w\u00e9", 3, 41)),
        AppendEntry(
            2**40,
            (b"m" * 70_000,),
            -1,
            producer=ProducerTuple("p", 2**63, 2**64 - 1),
            stream_seq="seq-\u2603-0001",
            digest=bytes(range(32)),
        ),
    ],
)
def test_append_round_trip(entry: AppendEntry) -> None:
    info, body = _split(codec.encode_append(entry))
    assert info.kind == Kind.APPEND
    assert codec.body_crc_ok(info, body)
    assert codec.decode_append(body, 0, info.body_len) == entry
    # The meta part alone (no payload) is enough for recovery and index scans.
    meta_len = codec.append_meta_len(body, 0)
    meta = codec.decode_append_meta(body[:meta_len], 0, info.body_len)
    assert meta.position == entry.position
    assert meta.size == entry.size
    assert meta.lengths == tuple(len(m) for m in entry.messages)
    assert meta.producer == entry.producer
    assert meta.stream_seq == entry.stream_seq
    assert meta.closes == entry.closes
    assert meta.digest == entry.digest
    assert codec.message_lengths(body, 0) == meta.lengths


def test_header_and_soft_delete_round_trip() -> None:
    header = StreamHeader(
        path="/a/b \u00fc",
        content_type="application/json",
        created_at_ms=1,
        ttl_seconds=60,
        fork_source_id="abc",
        fork_source_path="/src",
        fork_position=123,
        fork_offset_requested="0000000000000000_0000000000000123",
        fork_sub_offset=2,
        append_time_floor_ms=1_700_000_000_123,
    )
    info, body = _split(codec.encode_header(header))
    assert info.kind == Kind.HEADER and codec.body_crc_ok(info, body)
    assert codec.decode_header(body) == header
    info, body = _split(codec.encode_soft_delete(SoftDelete(99)))
    assert info.kind == Kind.SOFT_DELETE and codec.body_crc_ok(info, body)
    assert codec.decode_soft_delete(body) == SoftDelete(99)


@pytest.mark.parametrize(
    "body",
    [
        b'["a list"]',
        b'{"path": "s", "content_type": 5, "created_at_ms": 1}',
        b'{"path": null, "content_type": "text/plain", "created_at_ms": 1}',
        b'{"path": "s", "content_type": "text/plain", "created_at_ms": true}',
        b'{"path": "s", "content_type": "text/plain", "created_at_ms": 1, "expires_at": 0}',
        b'{"path": "s", "content_type": "text/plain", "created_at_ms": 1, "fork_position": "0"}',
        b'{"path": "s", "content_type": "text/plain"}',
    ],
)
def test_header_of_the_wrong_shape_is_corrupt(body: bytes) -> None:
    """A header whose checksum holds but whose fields have the wrong JSON types is damaged: it is
    quarantined by recovery, never handed to the engine to fail there."""
    with pytest.raises(CorruptRecord, match="bad stream header"):
        codec.decode_header(body)


def _generic_header_frame(header: StreamHeader) -> bytes:
    """The header record as the encoder makes it for any header (``encode_header``'s general case)."""
    values = {f.name: getattr(header, f.name) for f in fields(StreamHeader)}
    return bytes(codec.encode_frame(Kind.HEADER, codec._HEADER_JSON.encode(values).encode()))


@pytest.mark.parametrize(
    "header",
    [
        StreamHeader(path="put/s000001", content_type="application/json", created_at_ms=1),
        StreamHeader(
            path='a/\u00fc "quoted" \\ back\tslash \U0001f600 \ud800 %s %d',
            content_type='text/plain; charset="utf-8"',
            created_at_ms=1_795_819_311_768,
            fork_position=2**63 - 1,
            fork_sub_offset=7,
            append_time_floor_ms=1_700_000_000_123,
        ),
        StreamHeader(path="x", content_type="", created_at_ms=0),
        # Not plain (a TTL, an expiry, a fork): the general encoder.
        StreamHeader(path="t", content_type="application/json", created_at_ms=1, ttl_seconds=5),
        StreamHeader(
            path="f",
            content_type="text/plain",
            created_at_ms=1,
            fork_source_id="abc",
            fork_source_path="src",
            fork_offset_requested="0000000000000000_0000000000000001",
        ),
        StreamHeader(path="b", content_type="text/plain", created_at_ms=True),  # type: ignore[arg-type]
    ],
)
def test_header_record_is_the_encoders_bytes(header: StreamHeader) -> None:
    """A plain header's record (not a fork, no expiry: nearly every create) is made from a template:
    byte for byte what the JSON encoder makes of it, and it reads back as the same header."""
    assert codec._PLAIN is not None  # the template matches the header's fields
    assert bytes(codec.encode_header(header)) == _generic_header_frame(header)
    info, body = _split(codec.encode_header(header))
    assert info.kind == Kind.HEADER and codec.body_crc_ok(info, body)
    if type(header.created_at_ms) is int:
        assert codec.decode_header(body) == header


def test_header_types_cover_every_field() -> None:
    assert set(codec._HEADER_TYPES) == {f.name for f in fields(StreamHeader)}


def test_any_flipped_byte_is_detected() -> None:
    frame = bytes(codec.encode_append(AppendEntry(0, (b"hello", b"world"), 1, stream_seq="7")))
    for i in range(len(frame)):
        damaged = bytearray(frame)
        damaged[i] ^= 0x40
        try:
            info = codec.parse_frame(damaged)
        except CorruptRecord:
            continue  # magic or version byte
        body = bytes(damaged[FRAME_SIZE:])
        if info.body_len != len(body):
            continue  # a damaged length makes the record run past its end: also detected
        assert not codec.body_crc_ok(info, body), f"flip at byte {i} went unnoticed"


def test_partial_frame_and_bad_magic() -> None:
    frame = codec.encode_append(AppendEntry(0, (b"x",), 1))
    with pytest.raises(CorruptRecord):
        codec.parse_frame(frame[:5])
    with pytest.raises(CorruptRecord):
        codec.parse_frame(b"\x00" * 32)


def test_inconsistent_lengths_are_rejected() -> None:
    frame = bytearray(codec.encode_append(AppendEntry(0, (b"abc", b"de"), 1)))
    info, body = _split(frame)
    # Drop the last payload byte but keep the lengths: the sizes no longer add up.
    with pytest.raises(CorruptRecord):
        codec.decode_append_meta(body[:-1], 0, info.body_len - 1)
