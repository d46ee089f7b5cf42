"""The state a stream's log implies, and the single fold that derives it.

``apply_entry`` is used both for live appends and for recovery, so the state a server rebuilds after a
crash is, by construction, the state it had acknowledged before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durastream_server.storage.records import AppendEntry, ProducerTuple

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
    entries: int = 0  # number of AppendEntry records applied


def apply_entry(state: StreamState, entry: AppendEntry) -> None:
    """Fold one committed append into the state. The engine validated it; this only records it."""
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
