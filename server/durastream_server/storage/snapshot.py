"""Snapshots: the state and sparse index of a log up to a file offset, so start-up replays only the rest.

A snapshot is an optimization, never a source of truth: it is written atomically (tmp, fsync, rename,
fsync dir), checksummed, and ignored (full replay) when missing, damaged, for another log, or pointing
past the end of the files.

Taking one costs the event loop O(1) whatever the number of producers, committed handles or index
points (``capture``): the state's tables are frozen copy-on-write (``storage/table.py``) and the index
arrays only grow (``_heal`` replaces them whole), so their length is all it takes. Everything else is done
by ``encode_snapshot`` in a worker thread, piece by piece, so the loop gets the GIL back every switch
interval (one big ``json.dumps`` or ``b"".join`` would hold it throughout). ``ProducerState``s are
replaced, never mutated, and their digest buffers only grow past what a frozen state reads.

File: ``magic (8) | crc32 (u32) | length (u64) | payload``. Payload (``DSSNAP02``)::

    json_len u32 | json | producers | forgotten groups | committed handles | index arrays

``json`` holds the scalars and the byte length of each section; the sections are little-endian records:
producers ``id_len u16, id, epoch i64, last_seq i64, last_ms i64, digest_base i64, width u8, count u32,
count x width digest bytes``; forgotten groups ``len u16, group, epoch i64, last_ms i64``; committed handles
``len u16, name, expires_at_ms i64``; then the index's positions, offsets, ordinals and effective append
times (i64 x n each).
``DSSNAP01`` snapshots (producers in the JSON, with at most 64 digests each and no write times) are still
read: their producers are taken to have last written when the stream last did (they are forgotten no
sooner than they should be). A snapshot without ordinals or append times (written before they existed) is ignored like a
damaged one: the full replay rebuilds them.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

from durastream_server.storage.files import fsync_dir
from durastream_server.storage.index import SparseIndex
from durastream_server.storage.records import ProducerTuple
from durastream_server.storage.state import (
    DIGEST_BYTES,
    ForgottenGroup,
    ProducerState,
    StreamState,
)
from durastream_server.storage.table import Frozen, table_of

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "snapshot"
SNAPSHOT_TMP = "snapshot.tmp"
_MAGIC = b"DSSNAP02"
_MAGIC_V1 = b"DSSNAP01"
_HEAD = struct.Struct("<8sIQ")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_PRODUCER = struct.Struct("<qqqqBI")
_FORGOTTEN = struct.Struct("<qq")
_COMMITTED = struct.Struct("<q")
V = TypeVar("V")
_YIELD_EVERY = 1024  # records encoded between two explicit GIL hand-overs


@dataclass(frozen=True, slots=True)
class StateImage:
    """A stream's state as of one moment, taken on the loop in O(1) (``capture``)."""

    tail: int
    closed: bool
    closed_by: ProducerTuple | None
    last_stream_seq: str | None
    soft_deleted: bool
    last_timestamp_ms: int
    entries: int
    producers: Frozen[ProducerState]
    forgotten: Frozen[ForgottenGroup]
    txn_committed: Frozen[int]


@dataclass(frozen=True, slots=True)
class IndexImage:
    """The first ``count`` points of a sparse index (its arrays only ever grow)."""

    index: SparseIndex
    count: int
    messages: int
    last_time: int

    @classmethod
    def of(cls, index: SparseIndex) -> IndexImage:
        return cls(index, len(index), index.messages, index.last_time)


def capture(state: StreamState) -> StateImage:
    """The state as of now: its tables frozen (copy-on-write, storage/table.py), the rest copied."""
    return StateImage(
        tail=state.tail,
        closed=state.closed,
        closed_by=state.closed_by,
        last_stream_seq=state.last_stream_seq,
        soft_deleted=state.soft_deleted,
        last_timestamp_ms=state.last_timestamp_ms,
        entries=state.entries,
        producers=state.producers.freeze(),
        forgotten=state.forgotten.freeze(),
        txn_committed=state.txn_committed.freeze(),
    )


@dataclass(slots=True)
class Snapshot:
    log_id: str
    covered_end: int  # global file offset: every record before it is reflected in ``state``
    last_record: int  # global offset of the record that ends at ``covered_end`` (the anchor check)
    state: StreamState
    index: SparseIndex


def _native_i64(values: array) -> bytes:
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array("q", values)
    swapped.byteswap()
    return swapped.tobytes()


def _i64_array(data: memoryview) -> array:
    values = array("q")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def state_scalars(state: StateImage | StreamState) -> dict[str, Any]:
    """The JSON part of a snapshot's state (both formats)."""
    closed_by = state.closed_by
    return {
        "tail": state.tail,
        "closed": state.closed,
        "closed_by": None
        if closed_by is None
        else [closed_by.producer_id, closed_by.epoch, closed_by.seq],
        "last_stream_seq": state.last_stream_seq,
        "soft_deleted": state.soft_deleted,
        "last_timestamp_ms": state.last_timestamp_ms,
        "entries": state.entries,
    }


def comparable_state(state: StreamState) -> dict[str, Any]:
    """Everything a snapshot keeps of ``state``, as plain values: ``durastream-server check`` compares a
    snapshot replayed to the log's end with a full replay of the log."""
    return {
        **state_scalars(state),
        "producers": dict(state.producers.items()),
        "forgotten": dict(state.forgotten.items()),
        "txn_committed": dict(state.txn_committed.items()),
    }


def _items(frozen: Frozen[V]) -> Iterator[tuple[str, V]]:
    return chain.from_iterable(part.items() for part in frozen)


def _producers_section(producers: Frozen[ProducerState]) -> bytearray:
    # Appended piece by piece (not one ``b"".join`` of a list): the GIL is given back between them.
    out = bytearray()
    for n, (pid, p) in enumerate(_items(producers), start=1):
        if n % _YIELD_EVERY == 0:
            time.sleep(0)  # hand the GIL to the event loop now, not at the next switch interval
        name = pid.encode()
        digests = p.digest_bytes()
        out += _U16.pack(len(name))
        out += name
        out += _PRODUCER.pack(
            p.epoch, p.last_seq, p.last_ms, p.digest_base, p.width, len(digests) // p.width
        )
        out += digests
    return out


def _named_section(items: Iterable[tuple[str, tuple[int, ...]]], fixed: struct.Struct) -> bytearray:
    out = bytearray()
    for n, (name, values) in enumerate(items, start=1):
        if n % _YIELD_EVERY == 0:
            time.sleep(0)
        encoded = name.encode()
        out += _U16.pack(len(encoded))
        out += encoded
        out += fixed.pack(*values)
    return out


def snapshot_pieces(
    log_id: str, covered_end: int, last_record: int, state: StateImage, index: IndexImage
) -> list[bytes | bytearray]:
    """The snapshot file's bytes, as the pieces to write one after the other (the header first; never
    joined: a copy of a large snapshot would hold the GIL). Runs in a worker thread (module docstring)."""
    producers = _producers_section(state.producers)
    forgotten = _named_section(_items(state.forgotten), _FORGOTTEN)
    committed = _named_section(((n, (e,)) for n, e in _items(state.txn_committed)), _COMMITTED)
    count = index.count
    meta = json.dumps(
        {
            "log_id": log_id,
            "covered_end": covered_end,
            "last_record": last_record,
            "state": state_scalars(state),
            "sections": [len(producers), len(forgotten), len(committed)],
            "index_interval": index.index.interval,
            "index_count": count,
            "index_messages": index.messages,
            "index_last_time": index.last_time,
        },
        separators=(",", ":"),
    ).encode()
    sparse = index.index
    payload = [
        _U32.pack(len(meta)),
        meta,
        producers,
        forgotten,
        committed,
        _native_i64(sparse.positions[:count]),
        _native_i64(sparse.offsets[:count]),
        _native_i64(sparse.ordinals[:count]),
        _native_i64(sparse.times[:count]),
    ]
    crc = 0
    for piece in payload:
        crc = zlib.crc32(piece, crc)  # releases the GIL for large pieces
    return [_HEAD.pack(_MAGIC, crc, sum(map(len, payload))), *payload]


def encode_snapshot(
    log_id: str, covered_end: int, last_record: int, state: StateImage, index: IndexImage
) -> bytes:
    """``snapshot_pieces`` joined: the whole file."""
    return b"".join(snapshot_pieces(log_id, covered_end, last_record, state, index))


def _read_producer(data: memoryview, pid: str, at: int) -> tuple[ProducerState, int]:
    epoch, last_seq, last_ms, base, width, n = _PRODUCER.unpack_from(data, at)
    at += _PRODUCER.size
    if width not in (DIGEST_BYTES, 8) or base + n != last_seq + 1:
        raise ValueError(f"snapshot: bad digests of producer {pid!r}")
    digests = bytes(data[at : at + n * width])
    return ProducerState(epoch, last_seq, last_ms, base, digests, width), at + n * width


def _fixed_reader(fixed: struct.Struct) -> Callable[[memoryview, str, int], tuple[Any, int]]:
    return lambda data, _, at: (fixed.unpack_from(data, at), at + fixed.size)


def _read_named(
    data: memoryview, read: Callable[[memoryview, str, int], tuple[Any, int]]
) -> dict[str, Any]:
    """A section of ``len u16, name, value`` records; ``read`` parses one value at an offset."""
    items: dict[str, Any] = {}
    at = 0
    while at < len(data):
        (size,) = _U16.unpack_from(data, at)
        at += 2
        name = bytes(data[at : at + size]).decode()
        items[name], at = read(data, name, at + size)
    if at != len(data):
        raise ValueError("snapshot: section overruns")
    return items


def _legacy_producers(data: dict[str, Any], last_ms: int) -> dict[str, ProducerState]:
    """``DSSNAP01``: ``pid -> [epoch, last_seq, [[seq, digest hex], ...]]`` (recent seqs only)."""
    producers = {}
    for pid, (epoch, last_seq, listed) in data.items():
        known = {int(seq): bytes.fromhex(d) for seq, d in listed}
        base = min((seq for seq in known if seq <= last_seq), default=last_seq + 1)
        digests = b"".join(
            d if len(d := known.get(seq, b"")) == DIGEST_BYTES else bytes(DIGEST_BYTES)
            for seq in range(base, last_seq + 1)
        )
        producers[pid] = ProducerState(epoch, last_seq, last_ms, base, digests)
    return producers


def _state(data: dict[str, Any]) -> StreamState:
    closed_by = data["closed_by"]
    return StreamState(
        tail=int(data["tail"]),
        closed=bool(data["closed"]),
        closed_by=None if closed_by is None else ProducerTuple(*closed_by),
        last_stream_seq=data["last_stream_seq"],
        soft_deleted=bool(data["soft_deleted"]),
        last_timestamp_ms=int(data["last_timestamp_ms"]),
        entries=int(data["entries"]),
    )


def decode_snapshot(data: bytes) -> Snapshot:
    """Parse a snapshot file; raises ValueError if it is damaged."""
    if len(data) < _HEAD.size:
        raise ValueError("snapshot too short")
    magic, crc, length = _HEAD.unpack_from(data, 0)
    payload = memoryview(data)[_HEAD.size :]
    if magic not in (_MAGIC, _MAGIC_V1) or length != len(payload) or zlib.crc32(payload) != crc:
        raise ValueError("snapshot checksum or header mismatch")
    (meta_len,) = _U32.unpack_from(payload, 0)
    meta = json.loads(bytes(payload[4 : 4 + meta_len]))
    count = int(meta["index_count"])
    if "index_messages" not in meta:
        raise ValueError("snapshot predates message ordinals")
    if "index_last_time" not in meta:
        raise ValueError("snapshot predates indexed append times")
    rest = payload[4 + meta_len :]
    state = _state(meta["state"])
    if magic == _MAGIC:
        sizes = [int(size) for size in meta["sections"]]
        sections = []
        for size in sizes:
            sections.append(rest[:size])
            rest = rest[size:]
        state.producers = table_of(_read_named(sections[0], _read_producer))
        forgotten = _read_named(sections[1], _fixed_reader(_FORGOTTEN))
        state.forgotten = table_of({n: ForgottenGroup(*values) for n, values in forgotten.items()})
        committed = _read_named(sections[2], _fixed_reader(_COMMITTED))
        state.txn_committed = table_of({n: expires for n, (expires,) in committed.items()})
    else:
        legacy = meta["state"]
        state.producers = table_of(_legacy_producers(legacy["producers"], state.last_timestamp_ms))
        state.txn_committed = table_of(
            {str(name): int(expires) for name, expires in legacy.get("txn_committed", ())}
        )
    if len(rest) != 32 * count:
        raise ValueError("snapshot index size mismatch")
    positions, offsets, ordinals, times = (
        _i64_array(rest[8 * count * i : 8 * count * (i + 1)]) for i in range(4)
    )
    return Snapshot(
        log_id=str(meta["log_id"]),
        covered_end=int(meta["covered_end"]),
        last_record=int(meta["last_record"]),
        state=state,
        index=SparseIndex(
            int(meta["index_interval"]),
            positions,
            offsets,
            ordinals,
            messages=int(meta["index_messages"]),
            times=times,
            last_time=int(meta["index_last_time"]),
        ),
    )


def write_snapshot(directory: str, pieces: Sequence[bytes | bytearray], *, sync: bool) -> None:
    """Replace ``<directory>/snapshot`` atomically with ``pieces``, written in order."""
    tmp = os.path.join(directory, SNAPSHOT_TMP)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        for piece in pieces:
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, SNAPSHOT_NAME))
    if sync:
        fsync_dir(directory)


def load_snapshot(directory: str, log_id: str) -> Snapshot | None:
    """The stream's snapshot, or None if there is none or it cannot be trusted (logged)."""
    path = os.path.join(directory, SNAPSHOT_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("stream %s: cannot read snapshot (%s); replaying the whole log", log_id, exc)
        return None
    try:
        snap = decode_snapshot(data)
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        log.warning(
            "stream %s: ignoring damaged snapshot (%s); replaying the whole log", log_id, exc
        )
        return None
    if snap.log_id != log_id:
        log.warning(
            "stream %s: snapshot belongs to %s; replaying the whole log", log_id, snap.log_id
        )
        return None
    return snap
