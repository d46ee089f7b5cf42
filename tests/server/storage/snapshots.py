"""Snapshot helpers for tests: a round trip through the current format, and the ``DSSNAP01`` format of
earlier versions (producers in the JSON, with at most 64 digests and no write times)."""

from __future__ import annotations

import json
import struct
import zlib

from durastream_server.storage.index import SparseIndex
from durastream_server.storage.snapshot import (
    IndexImage,
    capture,
    decode_snapshot,
    encode_snapshot,
    state_scalars,
)
from durastream_server.storage.state import StreamState


def snapshot_round_trip(state: StreamState) -> StreamState:
    """``state`` written to a snapshot and read back."""
    data = encode_snapshot("log", 0, 0, capture(state), IndexImage.of(SparseIndex(64)))
    return decode_snapshot(data).state


def legacy_v1_bytes(state: StreamState, *, txn_committed: bool = True) -> bytes:
    """What an earlier version wrote for ``state`` (and an empty index)."""
    legacy = {
        **state_scalars(state),
        "producers": {
            pid: [
                p.epoch,
                p.last_seq,
                [
                    [seq, d.hex()]
                    for seq in range(max(p.digest_base, p.last_seq - 63), p.last_seq + 1)
                    if (d := p.digest(seq)) is not None
                ],
            ]
            for pid, p in state.producers.items()
        },
    }
    if txn_committed:
        legacy["txn_committed"] = list(state.txn_committed.items())
    meta = json.dumps(
        {
            "log_id": "log",
            "covered_end": 0,
            "last_record": 0,
            "state": legacy,
            "index_interval": 64,
            "index_count": 0,
            "index_messages": 0,
            "index_last_time": 0,  # DSSNAP01 of the versions with time lookups (earlier ones are replayed)
        }
    ).encode()
    payload = struct.pack("<I", len(meta)) + meta
    return struct.pack("<8sIQ", b"DSSNAP01", zlib.crc32(payload), len(payload)) + payload


def legacy_v1_state(state: StreamState, *, txn_committed: bool = True) -> StreamState:
    return decode_snapshot(legacy_v1_bytes(state, txn_committed=txn_committed)).state
