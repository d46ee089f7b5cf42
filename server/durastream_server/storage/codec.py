"""On-disk encoding of log records: framed, checksummed, and cheap to skip.

Frame (little-endian)::

    magic    2 bytes   b"\\xd5\\x1e"   (not ASCII, so payload text rarely looks like a frame start)
    version  u8        FORMAT_VERSION
    kind     u8        Kind
    length   u32       body length
    crc      u32       crc32(kind byte + body): zlib's CRC-32, computed by crc.py
    body     length bytes

The APPEND body puts everything except the message bytes first, so recovery, index scans and boundary
checks read a few dozen bytes per record and never the payload::

    position     u64    logical position of the first message
    timestamp    i64    milliseconds since the epoch
    n_messages   u32
    meta_len     u32    length of the meta section below
    flags        u8     FLAG_CLOSES | FLAG_PRODUCER | FLAG_STREAM_SEQ | FLAG_GROUP_CONTINUES | FLAG_TXN
    meta:
      [producer]    epoch u64, seq u64, id_len u32, id (utf-8)     if FLAG_PRODUCER
      [stream_seq]  len u32, text (utf-8)                           if FLAG_STREAM_SEQ
      [txn]         count u32, then per handle:                     if FLAG_TXN
                    expires_at_ms i64, len u16, name (utf-8)
      digest        len u16, bytes
      lengths       n_messages x u32
    payload      the messages, concatenated

The HEADER body is the JSON of ``StreamHeader`` (written once per stream, not a hot path); SOFT_DELETE
holds its timestamp. Kinds 5-15 are reserved; recovery refuses kinds it does not know rather than
skipping data it cannot interpret.

Staged appends (docs/decisions/0003-staged-appends.md): a staging file starts with a header record (an
APPEND record without messages, flagged FLAG_GROUP_CONTINUES, holding the handle's name, creation time and
TTL in its digest field; a TXN_HEADER record in files of earlier versions) followed by ordinary APPEND
records. A commit moves such files into the stream's log as segments (rewriting positions, flags and
checksums in place) or copies their records, as a *record group*: every record but the last has
FLAG_GROUP_CONTINUES; the last carries the producer tuple, ``Stream-Seq``, closure, digest and (FLAG_TXN)
the committed handles. Recovery applies a group whole or truncates it.
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass, fields
from enum import IntEnum

from durastream_server.storage.crc import crc32
from durastream_server.storage.records import (
    AppendEntry,
    CommittedHandle,
    ProducerTuple,
    SoftDelete,
    StreamHeader,
)

MAGIC = b"\xd5\x1e"
FORMAT_VERSION = 1


class Kind(IntEnum):
    HEADER = 1
    APPEND = 2
    SOFT_DELETE = 3
    TXN_HEADER = (
        4  # first record of a legacy staging file (staged appends); never in a stream's log
    )
    # 5..15 reserved.


KNOWN_KINDS = frozenset(int(k) for k in Kind)

FLAG_CLOSES = 0x01
FLAG_PRODUCER = 0x02
FLAG_STREAM_SEQ = 0x04
FLAG_GROUP_CONTINUES = 0x08  # not the last record of a record group (staged-append commit)
FLAG_TXN = 0x10  # meta lists the staged-append handles this record's commit made visible
_KNOWN_FLAGS = FLAG_CLOSES | FLAG_PRODUCER | FLAG_STREAM_SEQ | FLAG_GROUP_CONTINUES | FLAG_TXN

FRAME = struct.Struct("<2sBBII")
FRAME_SIZE = FRAME.size  # 12
APPEND_FIXED = struct.Struct("<QqIIB")
APPEND_FIXED_SIZE = APPEND_FIXED.size  # 25

_PRODUCER = struct.Struct("<QQI")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_TXN_ITEM = struct.Struct("<qH")
_SOFT_DELETE = struct.Struct("<q")
_SEED = {int(k): crc32(bytes([int(k)])) for k in Kind}
_EMPTY_FRAME_HEADER = bytes(FRAME_SIZE)


class CorruptRecord(ValueError):
    """Bytes at a record position are not a valid record (bad magic, version, length or checksum)."""


def _frame(kind: int, parts: list[bytes] | tuple[bytes, ...]) -> bytearray:
    """Join ``parts`` into one frame with a single copy, checksum it and fill in the frame header."""
    buf = bytearray().join((_EMPTY_FRAME_HEADER, *parts))
    body = memoryview(buf)[FRAME_SIZE:]
    crc = crc32(body, _SEED[kind])
    body.release()
    FRAME.pack_into(buf, 0, MAGIC, FORMAT_VERSION, kind, len(buf) - FRAME_SIZE, crc)
    return buf


def _frame_bytes(kind: int, body: bytes) -> bytes:
    """``_frame(kind, (body,))`` as bytes, for a body that is already one ``bytes``: one pack and one
    concatenation, no buffer, view and ``pack_into`` (a create's header record: ~0.6 -> ~0.2 us)."""
    return FRAME.pack(MAGIC, FORMAT_VERSION, kind, len(body), crc32(body, _SEED[kind])) + body


# One encoder for every header (``json.dumps`` with options builds one per call), and the header's
# fields read directly (``asdict`` deep-copies each value): a create paid ~40 us here for both.
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
_HEADER_FIELDS = tuple(f.name for f in fields(StreamHeader))


# The header of a stream that is not a fork and never expires (nearly every create: issue 17's
# single-PUT creates) has six fields that vary, two strings and four integers. Its JSON is made from a
# template derived from ``_HEADER_JSON`` itself, with those values put in by ``%``: byte for byte what
# the encoder makes (the strings through the encoder's own C escaping), in ~2 us instead of ~8 (the
# dict, the encoder's Python wrapper and its C pass over eleven keys).
_PLAIN_STRINGS = ("content_type", "path")
_PLAIN_INTEGERS = ("append_time_floor_ms", "created_at_ms", "fork_position", "fork_sub_offset")
# The order the values take in the template (the encoder sorts the keys); ``_plain_template``
# checks that the encoder agrees, so a new or renamed field turns the template off, never wrong.
_PLAIN_ORDER = (
    "append_time_floor_ms",
    "content_type",
    "created_at_ms",
    "fork_position",
    "fork_sub_offset",
    "path",
)
_encode_string = json.encoder.encode_basestring_ascii  # what _HEADER_JSON uses (ensure_ascii)


def _plain_template() -> str | None:
    """``_HEADER_JSON`` of a plain header with ``%s``/``%d`` where the varying values go (None if
    the header's fields are not the ones this module knows)."""
    if set(_PLAIN_ORDER) != set(_PLAIN_STRINGS + _PLAIN_INTEGERS) or not set(_PLAIN_ORDER) <= set(
        _HEADER_FIELDS
    ):
        return None
    marks = {name: f"@{name}@" for name in _PLAIN_ORDER}
    text = _HEADER_JSON.encode({name: marks.get(name) for name in _HEADER_FIELDS})
    if "%" in text:
        return None
    found = sorted((text.index(f'"{mark}"'), name) for name, mark in marks.items())
    if tuple(name for _, name in found) != _PLAIN_ORDER:
        return None
    for name, mark in marks.items():
        text = text.replace(f'"{mark}"', "%s" if name in _PLAIN_STRINGS else "%d")
    return text


_PLAIN = _plain_template()


def encode_header(header: StreamHeader) -> bytes:
    path, content_type = header.path, header.content_type
    floor, created = header.append_time_floor_ms, header.created_at_ms
    position, sub_offset = header.fork_position, header.fork_sub_offset
    if (
        _PLAIN is not None
        and header.ttl_seconds is None
        and header.expires_at is None
        and header.fork_source_id is None
        and header.fork_source_path is None
        and header.fork_offset_requested is None
        and type(path) is str
        and type(content_type) is str
        and type(floor) is int
        and type(created) is int
        and type(position) is int
        and type(sub_offset) is int
    ):
        body = (
            _PLAIN
            % (
                floor,
                _encode_string(content_type),
                created,
                position,
                sub_offset,
                _encode_string(path),
            )
        ).encode("ascii")
    else:
        body = _HEADER_JSON.encode(
            {name: getattr(header, name) for name in _HEADER_FIELDS}
        ).encode()
    return _frame_bytes(Kind.HEADER, body)


def encode_soft_delete(record: SoftDelete) -> bytearray:
    return _frame(Kind.SOFT_DELETE, (_SOFT_DELETE.pack(record.timestamp_ms),))


def encode_frame(kind: Kind, body: bytes) -> bytearray:
    """One frame of any kind around ``body`` (for records other than APPEND, e.g. TXN_HEADER)."""
    return _frame(kind, (body,))


def _encode_txn_handles(handles: tuple[CommittedHandle, ...]) -> bytes:
    parts = [_U32.pack(len(handles))]
    for handle in handles:
        name = handle.name.encode()
        parts.append(_TXN_ITEM.pack(handle.expires_at_ms, len(name)))
        parts.append(name)
    return b"".join(parts)


def encode_append(entry: AppendEntry) -> bytearray:
    """Encode one append. Hot path: a few ``struct.pack`` calls and one join, no per-byte work."""
    msgs = entry.messages
    n = len(msgs)
    flags = FLAG_CLOSES if entry.closes else 0
    meta: list[bytes] = []
    producer = entry.producer
    if producer is not None:
        pid = producer.producer_id.encode()
        meta.append(_PRODUCER.pack(producer.epoch, producer.seq, len(pid)))
        meta.append(pid)
        flags |= FLAG_PRODUCER
    if entry.stream_seq is not None:
        seq = entry.stream_seq.encode()
        meta.append(_U32.pack(len(seq)))
        meta.append(seq)
        flags |= FLAG_STREAM_SEQ
    if entry.continues:
        flags |= FLAG_GROUP_CONTINUES
    if entry.txn_handles:
        meta.append(_encode_txn_handles(entry.txn_handles))
        flags |= FLAG_TXN
    digest = entry.digest
    meta.append(_U16.pack(len(digest)))
    meta.append(digest)
    if n == 1:
        meta.append(_U32.pack(len(msgs[0])))
    elif n:
        meta.append(struct.pack(f"<{n}I", *map(len, msgs)))
    meta_len = sum(map(len, meta))
    fixed = APPEND_FIXED.pack(entry.position, entry.timestamp_ms, n, meta_len, flags)
    return _frame(Kind.APPEND, (fixed, *meta, *msgs))


def encode_append_parts(
    position: int,
    timestamp_ms: int,
    n_messages: int,
    lengths: bytes | memoryview,
    payload: list[bytes | memoryview],
    *,
    continues: bool = False,
    closes: bool = False,
    producer: ProducerTuple | None = None,
    stream_seq: str | None = None,
    digest: bytes = b"",
    txn_handles: tuple[CommittedHandle, ...] = (),
) -> list[bytes | bytearray | memoryview]:
    """The same record as ``encode_append``, from messages that are already laid out: ``lengths`` is
    the packed ``n_messages x u32`` section and ``payload`` the concatenated messages, in pieces.

    Returns the frame as a list of buffers (for ``pwritev``); the payload pieces are not copied, only
    checksummed. Used by the staged-append commit, which moves whole staged records into the log.
    """
    entry = AppendEntry(
        position=position,
        messages=(),
        timestamp_ms=timestamp_ms,
        closes=closes,
        producer=producer,
        stream_seq=stream_seq,
        digest=digest,
        continues=continues,
        txn_handles=txn_handles,
    )
    # The meta section of a message-less record, minus its fixed part and the (empty) lengths.
    head = encode_append(entry)
    meta = memoryview(head)[FRAME_SIZE + APPEND_FIXED_SIZE :]
    if len(lengths) != 4 * n_messages:
        raise ValueError("lengths must hold n_messages u32 values")
    payload_len = sum(len(p) for p in payload)
    flags = APPEND_FIXED.unpack_from(head, FRAME_SIZE)[4]
    fixed = APPEND_FIXED.pack(position, timestamp_ms, n_messages, len(meta) + len(lengths), flags)
    crc = crc32(fixed, _SEED[Kind.APPEND])
    crc = crc32(meta, crc)
    crc = crc32(lengths, crc)
    for piece in payload:
        crc = crc32(piece, crc)
    body_len = len(fixed) + len(meta) + len(lengths) + payload_len
    frame = FRAME.pack(MAGIC, FORMAT_VERSION, Kind.APPEND, body_len, crc)
    return [frame, fixed, meta, lengths, *payload]


@dataclass(frozen=True, slots=True)
class FrameInfo:
    kind: int
    body_len: int
    crc: int

    @property
    def record_len(self) -> int:
        return FRAME_SIZE + self.body_len


def parse_frame(buf: bytes | bytearray | memoryview, off: int = 0) -> FrameInfo:
    """Parse and sanity-check the frame header at ``buf[off:]`` (needs FRAME_SIZE bytes)."""
    if len(buf) - off < FRAME_SIZE:
        raise CorruptRecord("partial frame header")
    magic, version, kind, body_len, crc = FRAME.unpack_from(buf, off)
    if magic != MAGIC:
        raise CorruptRecord("bad magic")
    if version != FORMAT_VERSION:
        raise CorruptRecord(f"unknown format version {version}")
    return FrameInfo(kind, body_len, crc)


def body_crc_ok(frame: FrameInfo, body: bytes | bytearray | memoryview) -> bool:
    seed = _SEED.get(frame.kind)
    if seed is None:
        seed = crc32(bytes([frame.kind]))
    return crc32(body, seed) == frame.crc


_NULLABLE = (str, type(None))
# The JSON type of every header field: a header that decodes to anything else is damaged, and must be
# quarantined here rather than fail later inside the engine (one bad header must not stop start-up).
_HEADER_TYPES: dict[str, tuple[type, ...]] = {
    "path": (str,),
    "content_type": (str,),
    "created_at_ms": (int,),
    "ttl_seconds": (int, type(None)),
    "expires_at": _NULLABLE,
    "fork_source_id": _NULLABLE,
    "fork_source_path": _NULLABLE,
    "fork_position": (int,),
    "fork_offset_requested": _NULLABLE,
    "fork_sub_offset": (int,),
    "append_time_floor_ms": (int,),
}


def decode_header(body: bytes | bytearray | memoryview) -> StreamHeader:
    try:
        data = json.loads(bytes(body))
        if not isinstance(data, dict):
            raise TypeError(f"a JSON object was expected, not {type(data).__name__}")
        for name, value in data.items():
            expected = _HEADER_TYPES.get(name)
            if expected is not None and (
                isinstance(value, bool) or not isinstance(value, expected)
            ):
                raise TypeError(f"field {name!r} has the wrong type: {value!r}")
        values = {k: v for k, v in data.items() if k in _HEADER_TYPES}
        content_type = values.get("content_type")
        if isinstance(content_type, str):
            # Most streams of a server share a few content types: one string each, not one per
            # stream (issue 17).
            values["content_type"] = sys.intern(content_type)
        return StreamHeader(**values)
    except (ValueError, TypeError) as exc:
        raise CorruptRecord(f"bad stream header: {exc}") from exc


def decode_soft_delete(body: bytes | bytearray | memoryview) -> SoftDelete:
    if len(body) != _SOFT_DELETE.size:
        raise CorruptRecord("bad soft-delete record")
    return SoftDelete(_SOFT_DELETE.unpack_from(body, 0)[0])


@dataclass(frozen=True, slots=True)
class AppendMeta:
    """Everything in an APPEND record except the message bytes. Offsets are relative to the body."""

    position: int
    timestamp_ms: int
    closes: bool
    producer: ProducerTuple | None
    stream_seq: str | None
    digest: bytes
    lengths: tuple[int, ...]
    payload_off: int  # where the concatenated messages start, relative to the body
    continues: bool = False  # FLAG_GROUP_CONTINUES: a record group goes on after this record
    txn_handles: tuple[CommittedHandle, ...] = ()

    @property
    def size(self) -> int:
        return sum(self.lengths)


def append_meta_len(buf: bytes | bytearray | memoryview, body_off: int) -> int:
    """Bytes from the body start up to the payload (fixed part + meta section)."""
    return APPEND_FIXED_SIZE + APPEND_FIXED.unpack_from(buf, body_off)[3]


def decode_append_meta(
    buf: bytes | bytearray | memoryview, body_off: int, body_len: int
) -> AppendMeta:
    """Decode the non-payload part of an APPEND body that starts at ``buf[body_off]``.

    ``buf`` must hold at least the fixed part and the meta section; ``body_len`` is the full body length
    from the frame and is used to check that the lengths add up.
    """
    try:
        position, timestamp_ms, n, meta_len, flags = APPEND_FIXED.unpack_from(buf, body_off)
        if flags & ~_KNOWN_FLAGS:
            raise CorruptRecord(f"unknown append flags {flags:#x}")
        p = body_off + APPEND_FIXED_SIZE
        meta_end = p + meta_len
        if meta_end > len(buf) or APPEND_FIXED_SIZE + meta_len > body_len:
            raise CorruptRecord("append meta past end of record")
        producer = None
        if flags & FLAG_PRODUCER:
            epoch, seq, id_len = _PRODUCER.unpack_from(buf, p)
            p += _PRODUCER.size
            producer = ProducerTuple(bytes(buf[p : p + id_len]).decode(), epoch, seq)
            p += id_len
        stream_seq = None
        if flags & FLAG_STREAM_SEQ:
            (seq_len,) = _U32.unpack_from(buf, p)
            p += 4
            stream_seq = bytes(buf[p : p + seq_len]).decode()
            p += seq_len
        txn_handles: tuple[CommittedHandle, ...] = ()
        if flags & FLAG_TXN:
            (count,) = _U32.unpack_from(buf, p)
            p += 4
            items = []
            for _ in range(count):
                expires_at_ms, name_len = _TXN_ITEM.unpack_from(buf, p)
                p += _TXN_ITEM.size
                items.append(CommittedHandle(bytes(buf[p : p + name_len]).decode(), expires_at_ms))
                p += name_len
            txn_handles = tuple(items)
        (digest_len,) = _U16.unpack_from(buf, p)
        p += 2
        digest = bytes(buf[p : p + digest_len])
        p += digest_len
        if p + 4 * n != meta_end:
            raise CorruptRecord("append meta length mismatch")
        lengths = struct.unpack_from(f"<{n}I", buf, p) if n else ()
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"bad append record: {exc}") from exc
    payload_off = APPEND_FIXED_SIZE + meta_len
    if payload_off + sum(lengths) != body_len:
        raise CorruptRecord("append payload length mismatch")
    return AppendMeta(
        position=position,
        timestamp_ms=timestamp_ms,
        closes=bool(flags & FLAG_CLOSES),
        producer=producer,
        stream_seq=stream_seq,
        digest=digest,
        lengths=lengths,
        payload_off=payload_off,
        continues=bool(flags & FLAG_GROUP_CONTINUES),
        txn_handles=txn_handles,
    )


def message_lengths(buf: bytes | bytearray | memoryview, body_off: int) -> tuple[int, ...]:
    """Only the per-message lengths of an APPEND body (the tail of its meta section)."""
    _, _, n, meta_len, _ = APPEND_FIXED.unpack_from(buf, body_off)
    if not n:
        return ()
    return struct.unpack_from(f"<{n}I", buf, body_off + APPEND_FIXED_SIZE + meta_len - 4 * n)


def decode_append(
    buf: bytes | bytearray | memoryview, body_off: int, body_len: int, *, copy: bool = True
) -> AppendEntry:
    """Decode a whole APPEND body. With ``copy=False`` messages are memoryviews into ``buf`` (recovery
    only needs their lengths, so replay avoids copying payload)."""
    meta = decode_append_meta(buf, body_off, body_len)
    view = memoryview(buf)
    p = body_off + meta.payload_off
    messages = []
    for length in meta.lengths:
        m = view[p : p + length]
        messages.append(bytes(m) if copy else m)
        p += length
    return AppendEntry(
        position=meta.position,
        messages=tuple(messages),  # type: ignore[arg-type]
        timestamp_ms=meta.timestamp_ms,
        closes=meta.closes,
        producer=meta.producer,
        stream_seq=meta.stream_seq,
        digest=meta.digest,
        continues=meta.continues,
        txn_handles=meta.txn_handles,
    )
