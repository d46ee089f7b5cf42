"""The state a stream's log implies, and the single fold that derives it.

``apply_entry`` is used both for live appends and for recovery, so the state a server rebuilds after a
crash is, by construction, the state it had acknowledged before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durastream_server.storage.records import (
    AppendEntry,
    CommittedHandle,
    GroupCommit,
    ProducerTuple,
)

# How many recent (seq -> digest) pairs each producer keeps, for duplicate payload checks.
RECENT_DIGESTS = 64


@dataclass(slots=True)
class ProducerState:
    epoch: int
    last_seq: int
    # seq -> digest of the accepted request, for the most recent RECENT_DIGESTS seqs of this epoch.
    digests: dict[int, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class StreamState:
    """Everything needed to validate the next append. Rebuilt from the log on start-up."""

    tail: int  # logical position after the last message
    closed: bool = False
    closed_by: ProducerTuple | None = None
    last_stream_seq: str | None = None
    producers: dict[str, ProducerState] = field(default_factory=dict)
    soft_deleted: bool = False
    last_timestamp_ms: int = 0
    entries: int = 0  # number of AppendEntry records applied (a record group counts once)
    # Staged-append handles committed into this stream -> when their names may be forgotten (their
    # expiry). Rebuilt by the fold, so a staging file left behind by a crash between a commit and its
    # cleanup is recognised at start-up (docs/decisions/0003-staged-appends.md).
    txn_committed: dict[str, int] = field(default_factory=dict)
    txn_pruned_size: int = 0  # size of ``txn_committed`` after its last pruning (not persisted)


def apply_entry(state: StreamState, entry: AppendEntry | GroupCommit) -> None:
    """Fold one committed append (or one complete record group) into the state. The engine validated
    it; this only records it."""
    if entry.position != state.tail:
        raise ValueError(f"entry at {entry.position} does not follow tail {state.tail}")
    state.tail = entry.end
    state.entries += 1
    state.last_timestamp_ms = max(state.last_timestamp_ms, entry.timestamp_ms)
    if entry.stream_seq is not None:
        state.last_stream_seq = entry.stream_seq
    producer = entry.producer
    if producer is not None:
        current = state.producers.get(producer.producer_id)
        if current is None or producer.epoch != current.epoch:
            current = ProducerState(epoch=producer.epoch, last_seq=producer.seq)
            state.producers[producer.producer_id] = current
        current.last_seq = producer.seq
        current.digests[producer.seq] = entry.digest
        if len(current.digests) > RECENT_DIGESTS:
            for old in sorted(current.digests)[: len(current.digests) - RECENT_DIGESTS]:
                del current.digests[old]
    if entry.closes:
        state.closed = True
        state.closed_by = producer
    if entry.txn_handles:
        note_committed(state, entry.txn_handles, entry.timestamp_ms)


def note_committed(
    state: StreamState, handles: tuple[CommittedHandle, ...], timestamp_ms: int
) -> None:
    """Remember committed handle names; forget expired ones whenever the table has doubled (amortized
    O(1) per name). Keeping an expired name a little longer is harmless: an expired handle can never be
    committed anyway."""
    committed = state.txn_committed
    for handle in handles:
        committed[handle.name] = handle.expires_at_ms
    if len(committed) > max(64, 2 * state.txn_pruned_size):
        for name in [n for n, expires in committed.items() if expires <= timestamp_ms]:
            del committed[name]
        state.txn_pruned_size = len(committed)
