"""The state a stream's log implies, and the single fold that derives it.

``apply_entry`` is used both for live appends and for recovery, so the state a server rebuilds after a
crash is, by construction, the state it had acknowledged before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from durastream_server.storage.records import (
    AppendEntry,
    CommittedHandle,
    GroupCommit,
    ProducerTuple,
)
from durastream_server.storage.table import EMPTY, CowTable, empty

# Producer request digests (``engine/producers.py`` computes them; the fold only stores them).
DIGEST_BYTES = 24
# A producer keeps the digests of at least this many of its most recent seqs of its current epoch (at
# most twice as many, trimmed in bulk): a retry or replay of any of them is checked against what was
# accepted; an older duplicate can no longer be checked, and its answer says so (docs/extensions.md,
# section 6). 4096 requests is 4 GiB per producer and batch at the Spark sink's ordered-mode request size
# (1 MiB); 96 KiB of memory per producer at most.
EPOCH_DIGESTS = 4096
# A quiet producer (``compact_producer``) keeps this many bytes of each digest: enough to tell a replay
# that differs from the accepted request (a false match is a 2^-64 chance), a third of the memory.
QUIET_DIGEST_BYTES = 8
_UNKNOWN = bytes(DIGEST_BYTES)
_PAD = bytes(DIGEST_BYTES - QUIET_DIGEST_BYTES)  # a short digest back in a full-width window


class ProducerState:
    """What the stream remembers of one producer: its epoch, its last seq, when it last wrote (the
    entry's timestamp, in ms), and digests of the seqs ``[digest_base, last_seq]`` of the current epoch,
    ``width`` bytes each (all-zero: not known, e.g. written by an earlier version with another hash;
    in a full-width window, a short digest kept while the producer was quiet is zero-padded).

    Never changed after it is made: the fold puts a new one in place for every accepted request, so a
    snapshot can freeze the producer table on the loop and serialise it in a worker thread while
    appends go on (storage/snapshot.py). ``digests`` may be shared with the state that follows it and grow at
    its end (never change before it): readers use only the first ``width * count`` bytes.
    """

    __slots__ = ("epoch", "last_seq", "last_ms", "digest_base", "digests", "width")

    def __init__(
        self,
        epoch: int,
        last_seq: int,
        last_ms: int = 0,
        digest_base: int | None = None,
        digests: bytes | bytearray = b"",
        width: int = DIGEST_BYTES,
    ) -> None:
        self.epoch = epoch
        self.last_seq = last_seq
        self.last_ms = last_ms
        self.digest_base = last_seq + 1 if digest_base is None else digest_base
        self.digests = digests
        self.width = width

    @property
    def digest_count(self) -> int:
        return self.last_seq + 1 - self.digest_base

    @property
    def quiet(self) -> bool:
        """Compacted by ``compact_producer``: short digests, no more growth in place."""
        return self.width != DIGEST_BYTES

    def digest(self, seq: int) -> bytes | None:
        """The (possibly shortened) digest of the accepted request with ``seq`` in the current epoch, or
        None if it is not known."""
        if not self.digest_base <= seq <= self.last_seq:
            return None
        width = self.width
        start = (seq - self.digest_base) * width
        found = bytes(self.digests[start : start + width])
        if found == bytes(width):
            return None
        if width == DIGEST_BYTES and found.endswith(_PAD):
            return found[:QUIET_DIGEST_BYTES]  # kept short while the producer was quiet
        return found

    def digest_bytes(self) -> bytes:
        """Every remembered digest, ``width`` bytes each (what a snapshot stores)."""
        return bytes(self.digests[: self.digest_count * self.width])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerState):
            return NotImplemented
        return (
            self.epoch,
            self.last_seq,
            self.last_ms,
            self.digest_base,
            self.width,
            self.digest_bytes(),
        ) == (
            other.epoch,
            other.last_seq,
            other.last_ms,
            other.digest_base,
            other.width,
            other.digest_bytes(),
        )

    def __repr__(self) -> str:
        return (
            f"ProducerState(epoch={self.epoch}, last_seq={self.last_seq}, last_ms={self.last_ms}, "
            f"digests=[{self.digest_base}..{self.last_seq}] x {self.width})"
        )


class ForgottenGroup(NamedTuple):
    """What a stream keeps of the producers of one group it forgot (``forget_producer``): the highest
    epoch any of them had and the latest time any of them wrote."""

    epoch: int
    last_ms: int


def producer_group(producer_id: str) -> str:
    """The group a producer id belongs to: the id up to its last ``-`` (the whole id if it has none).

    Forgotten producers are remembered per group, as one epoch (docs/extensions.md, section 8). The
    Spark sink's ids are ``<prefix>-<query>-<partition>``: one group per query, whose epochs are batch
    ids, so a new partition's first write at a later batch is told apart from a replay."""
    group, dash, _ = producer_id.rpartition("-")
    return group if dash else producer_id


@dataclass(slots=True)
class StreamState:
    """Everything needed to validate the next append. Rebuilt from the log on start-up."""

    tail: int  # logical position after the last message
    closed: bool = False
    closed_by: ProducerTuple | None = None
    last_stream_seq: str | None = None
    # Tables a snapshot takes in O(1) (storage/table.py). Each is the shared read-only ``EMPTY`` until
    # its first entry: write through ``producers_of`` / ``forgotten_of`` / ``committed_of``.
    producers: CowTable[ProducerState] = field(default_factory=empty)
    soft_deleted: bool = False
    last_timestamp_ms: int = 0
    entries: int = 0  # number of AppendEntry records applied (a record group counts once)
    # Staged-append handles committed into this stream -> when their names may be forgotten (their
    # expiry). Rebuilt by the fold, so a staging file left behind by a crash between a commit and its
    # cleanup is recognised at start-up (docs/decisions/0003-staged-appends.md).
    txn_committed: CowTable[int] = field(default_factory=empty)
    txn_pruned_size: int = 0  # size of ``txn_committed`` after its last pruning (not persisted)
    # Groups of producers that were forgotten after being idle (``forget_producer``), persisted in
    # snapshots (docs/decisions/0005-producer-state.md).
    forgotten: CowTable[ForgottenGroup] = field(default_factory=empty)
    # When the producer sweep next has something to do here (engine/producer_sweep.py; not persisted:
    # 0 means "look now", which is what a state rebuilt from disk needs).
    producers_due_ms: int = 0


def producers_of(state: StreamState) -> CowTable[ProducerState]:
    """``state.producers``, made writable (its own table in place of the shared empty one)."""
    table = state.producers
    if table is EMPTY:
        table = state.producers = CowTable()
    return table


def forgotten_of(state: StreamState) -> CowTable[ForgottenGroup]:
    """``state.forgotten``, made writable."""
    table = state.forgotten
    if table is EMPTY:
        table = state.forgotten = CowTable()
    return table


def committed_of(state: StreamState) -> CowTable[int]:
    """``state.txn_committed``, made writable."""
    table = state.txn_committed
    if table is EMPTY:
        table = state.txn_committed = CowTable()
    return table


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
        producers = producers_of(state)
        producers[producer.producer_id] = _next_producer_state(
            producers.get(producer.producer_id), producer, entry
        )
    if entry.closes:
        state.closed = True
        state.closed_by = producer
    if entry.txn_handles:
        note_committed(state, entry.txn_handles, entry.timestamp_ms)


def _next_producer_state(
    current: ProducerState | None, producer: ProducerTuple, entry: AppendEntry | GroupCommit
) -> ProducerState:
    """The producer's state once ``entry`` is accepted. Digests of the current epoch are appended to one
    bytearray in place (shared with ``current``, which only reads its own prefix); a new epoch or a full
    window starts a new one, so no state a snapshot holds ever changes."""
    digest = entry.digest if len(entry.digest) == DIGEST_BYTES else _UNKNOWN
    seq = producer.seq
    if current is None or current.epoch != producer.epoch or seq != current.last_seq + 1:
        return ProducerState(producer.epoch, seq, entry.timestamp_ms, seq, bytearray(digest))
    count = current.digest_count
    digests = current.digests
    if current.quiet:
        # Quiet no more: its short digests go back into the window, zero-padded (``digest`` reads a
        # padded one as short), so replays of its earlier seqs are still checked.
        width = current.width
        digests = bytearray().join(
            digests[i : i + width] + _PAD for i in range(0, count * width, width)
        )
    elif not isinstance(digests, bytearray) or len(digests) != count * DIGEST_BYTES:
        digests = bytearray(current.digest_bytes())  # restored from a snapshot: not ours to grow
    base = current.digest_base
    if count >= 2 * EPOCH_DIGESTS:  # trim in bulk: amortized O(1) per request
        keep = EPOCH_DIGESTS - 1
        digests = bytearray(digests[(count - keep) * DIGEST_BYTES :])
        base = seq - keep
    digests += digest
    return ProducerState(producer.epoch, seq, entry.timestamp_ms, base, digests)


def compact_producer(state: StreamState, producer_id: str) -> None:
    """The producer has been quiet: keep its epoch, last seq and a short prefix of each digest."""
    current = state.producers.get(producer_id)
    if current is None or current.quiet:
        return
    width = QUIET_DIGEST_BYTES
    full = current.digest_bytes()
    if len(full) == DIGEST_BYTES:  # the usual case (one request per epoch: the sink's commits)
        short = full[:width]
    else:
        short = b"".join(full[i : i + width] for i in range(0, len(full), DIGEST_BYTES))
    state.producers[producer_id] = ProducerState(
        current.epoch, current.last_seq, current.last_ms, current.digest_base, short, width
    )


def forget_producer(state: StreamState, producer_id: str) -> None:
    """The producer has been idle too long: drop its state, and remember of it only its group's
    highest epoch and latest write (so a request that may repeat one of its can be told apart)."""
    current = state.producers.pop(producer_id, None)
    if current is None:
        return
    group = producer_group(producer_id)
    forgotten = forgotten_of(state)
    known = forgotten.get(group)
    if known is None:
        forgotten[group] = ForgottenGroup(current.epoch, current.last_ms)
    else:
        forgotten[group] = ForgottenGroup(
            max(known.epoch, current.epoch), max(known.last_ms, current.last_ms)
        )


def note_committed(
    state: StreamState, handles: tuple[CommittedHandle, ...], timestamp_ms: int
) -> None:
    """Remember committed handle names; forget expired ones whenever the table has doubled (amortized
    O(1) per name). Keeping an expired name a little longer is harmless: an expired handle can never be
    committed anyway."""
    committed = committed_of(state)
    for handle in handles:
        committed[handle.name] = handle.expires_at_ms
    if len(committed) > max(64, 2 * state.txn_pruned_size):
        for name in [n for n, expires in committed.items() if expires <= timestamp_ms]:
            del committed[name]
        state.txn_pruned_size = len(committed)
