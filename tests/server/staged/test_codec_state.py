"""The record-group flags and committed-handle meta in the codec, the group fold, and their snapshot."""

from __future__ import annotations

import pytest

from durastream_server.storage import codec
from durastream_server.storage.records import (
    AppendEntry,
    CommittedHandle,
    GroupCommit,
    ProducerTuple,
)
from durastream_server.storage.state import StreamState, apply_entry
from tests.server.storage.snapshots import legacy_v1_state, snapshot_round_trip


def _decode(frame: bytes) -> AppendEntry:
    info = codec.parse_frame(frame)
    assert codec.body_crc_ok(info, memoryview(frame)[codec.FRAME_SIZE :])
    return codec.decode_append(frame, codec.FRAME_SIZE, info.body_len)


def test_group_flags_and_committed_handles_round_trip() -> None:
    middle = AppendEntry(position=10, messages=(b"a", b"bc"), timestamp_ms=5, continues=True)
    last = AppendEntry(
        position=13,
        messages=(b"d",),
        timestamp_ms=5,
        closes=True,
        producer=ProducerTuple("p", 2, 9),
        stream_seq="s1",
        digest=b"digest",
        txn_handles=(CommittedHandle("h-1", 123), CommittedHandle("job:2.x", 456)),
    )
    assert _decode(codec.encode_append(middle)) == middle
    assert _decode(codec.encode_append(last)) == last
    plain = AppendEntry(position=0, messages=(b"x",), timestamp_ms=1)
    decoded = _decode(codec.encode_append(plain))
    assert not decoded.continues and decoded.txn_handles == ()


def test_unknown_flags_are_still_refused() -> None:
    frame = bytearray(codec.encode_append(AppendEntry(position=0, messages=(), timestamp_ms=1)))
    flags_at = codec.FRAME_SIZE + codec.APPEND_FIXED_SIZE - 1
    frame[flags_at] |= 0x80
    with pytest.raises(codec.CorruptRecord, match="unknown append flags"):
        codec.decode_append_meta(frame, codec.FRAME_SIZE, len(frame) - codec.FRAME_SIZE)


def test_group_folds_as_one_entry_and_snapshots_its_handles() -> None:
    state = StreamState(tail=0)
    apply_entry(state, AppendEntry(position=0, messages=(b"ab",), timestamp_ms=1))
    group = GroupCommit(
        position=2,
        size=100,
        n_messages=7,
        timestamp_ms=50,
        producer=ProducerTuple("c", 4, 0),
        digest=b"d" * 24,
        txn_handles=(CommittedHandle("h1", 1000), CommittedHandle("h2", 2000)),
    )
    apply_entry(state, group)
    assert (state.tail, state.entries, state.last_timestamp_ms) == (102, 2, 50)
    assert state.producers["c"].digest(0) == b"d" * 24
    assert state.txn_committed == {"h1": 1000, "h2": 2000}
    restored = snapshot_round_trip(state)
    assert restored.txn_committed == state.txn_committed
    assert restored.producers == state.producers
    # A snapshot written before staged appends existed has no committed names.
    assert legacy_v1_state(state, txn_committed=False).txn_committed == {}


def test_expired_committed_names_are_pruned_as_the_table_grows() -> None:
    state = StreamState(tail=0)
    for i in range(200):
        handles = (CommittedHandle(f"h{i}", 1000 + i),)
        apply_entry(
            state,
            GroupCommit(position=i, size=1, n_messages=1, timestamp_ms=1100, txn_handles=handles),
        )
    # Names whose expiry (1000 + i) is at or before a later commit's time (1100) were dropped; every
    # unexpired one is still there.
    assert all(f"h{i}" in state.txn_committed for i in range(101, 200))
    assert len(state.txn_committed) < 200
