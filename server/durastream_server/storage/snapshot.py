"""Snapshots: the state and sparse index of a log up to a file offset, so start-up replays only the rest.

A snapshot is an optimization, never a source of truth: it is written atomically (tmp, fsync, rename,
fsync dir), checksummed, and ignored (full replay) when missing, damaged, for another log, or pointing
past the end of the files.

File: ``magic (8) | crc32 (u32) | length (u64) | payload`` where payload is
``json_len (u32) | json | index positions | offsets | ordinals | effective append times`` (each i64 x n).
A snapshot without ordinals or append times (written before they existed) is ignored like a damaged
one: the full replay rebuilds them.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from typing import Any

from durastream_server.storage.files import fsync_dir
from durastream_server.storage.index import SparseIndex
from durastream_server.storage.records import ProducerTuple
from durastream_server.storage.state import ProducerState, StreamState

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "snapshot"
SNAPSHOT_TMP = "snapshot.tmp"
_MAGIC = b"DSSNAP01"
_HEAD = struct.Struct("<8sIQ")
_U32 = struct.Struct("<I")


def state_to_dict(state: StreamState) -> dict[str, Any]:
    """A deep, JSON-ready copy of ``state`` (taken on the loop, so later appends cannot leak in)."""
    closed_by = state.closed_by
    return {
        "tail": state.tail,
        "closed": state.closed,
        "closed_by": None
        if closed_by is None
        else [closed_by.producer_id, closed_by.epoch, closed_by.seq],
        "last_stream_seq": state.last_stream_seq,
        "producers": {
            pid: [p.epoch, p.last_seq, [[seq, d.hex()] for seq, d in p.digests.items()]]
            for pid, p in state.producers.items()
        },
        "soft_deleted": state.soft_deleted,
        "last_timestamp_ms": state.last_timestamp_ms,
        "entries": state.entries,
        "txn_committed": list(state.txn_committed.items()),
    }


def state_from_dict(data: dict[str, Any]) -> StreamState:
    closed_by = data["closed_by"]
    return StreamState(
        tail=int(data["tail"]),
        closed=bool(data["closed"]),
        closed_by=None if closed_by is None else ProducerTuple(*closed_by),
        last_stream_seq=data["last_stream_seq"],
        producers={
            pid: ProducerState(
                epoch=epoch,
                last_seq=last_seq,
                digests={int(seq): bytes.fromhex(d) for seq, d in digests},
            )
            for pid, (epoch, last_seq, digests) in data["producers"].items()
        },
        soft_deleted=bool(data["soft_deleted"]),
        last_timestamp_ms=int(data["last_timestamp_ms"]),
        entries=int(data["entries"]),
        txn_committed={str(name): int(expires) for name, expires in data.get("txn_committed", ())},
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


def encode_snapshot(
    log_id: str, covered_end: int, last_record: int, state: dict[str, Any], index: SparseIndex
) -> bytes:
    meta = json.dumps(
        {
            "log_id": log_id,
            "covered_end": covered_end,
            "last_record": last_record,
            "state": state,
            "index_interval": index.interval,
            "index_count": len(index),
            "index_messages": index.messages,
            "index_last_time": index.last_time,
        },
        separators=(",", ":"),
    ).encode()
    payload = b"".join(
        (
            _U32.pack(len(meta)),
            meta,
            _native_i64(index.positions),
            _native_i64(index.offsets),
            _native_i64(index.ordinals),
            _native_i64(index.times),
        )
    )
    return _HEAD.pack(_MAGIC, zlib.crc32(payload), len(payload)) + payload


def decode_snapshot(data: bytes) -> Snapshot:
    """Parse a snapshot file; raises ValueError if it is damaged."""
    if len(data) < _HEAD.size:
        raise ValueError("snapshot too short")
    magic, crc, length = _HEAD.unpack_from(data, 0)
    payload = memoryview(data)[_HEAD.size :]
    if magic != _MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
        raise ValueError("snapshot checksum or header mismatch")
    (meta_len,) = _U32.unpack_from(payload, 0)
    meta = json.loads(bytes(payload[4 : 4 + meta_len]))
    count = int(meta["index_count"])
    if "index_messages" not in meta:
        raise ValueError("snapshot predates message ordinals")
    if "index_last_time" not in meta:
        raise ValueError("snapshot predates indexed append times")
    rest = payload[4 + meta_len :]
    if len(rest) != 32 * count:
        raise ValueError("snapshot index size mismatch")
    positions, offsets, ordinals, times = (
        _i64_array(rest[8 * count * i : 8 * count * (i + 1)]) for i in range(4)
    )
    return Snapshot(
        log_id=str(meta["log_id"]),
        covered_end=int(meta["covered_end"]),
        last_record=int(meta["last_record"]),
        state=state_from_dict(meta["state"]),
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


def write_snapshot(directory: str, data: bytes, *, sync: bool) -> None:
    """Replace ``<directory>/snapshot`` atomically."""
    tmp = os.path.join(directory, SNAPSHOT_TMP)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
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
    except (ValueError, KeyError, TypeError) as exc:
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
