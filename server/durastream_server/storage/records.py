"""What the log records, as plain values. The on-disk encoding of these lives in ``codec.py``.

A stream's log is a sequence of records. The first is always a ``StreamHeader``; then come ``AppendEntry``
records (data, closure, or both) and at most one ``SoftDelete``. Everything that guards exactly-once (the
producer tuple, ``Stream-Seq``, closure and the tuple that closed the stream) travels *inside* the same
record as the data it belongs to, so no crash can separate an append from its dedup state (hazards 19, 32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, NamedTuple

from durastream_server.frozen import quick_init

# What one message costs beyond its bytes wherever bytes are budgeted (read chunks, the in-memory tail,
# staged handles): each message has objects, lengths and metadata of its own, so a budget that counted
# payload alone would let a stream of 1-byte messages put millions of them into one read or request.
# 24 bytes is what a message's metadata takes in a frames response (position, time, boundary).
MESSAGE_OVERHEAD: Final = 24


@quick_init  # one per producer request (issue 17)
@dataclass(frozen=True, slots=True)
class ProducerTuple:
    """(Producer-Id, Producer-Epoch, Producer-Seq) of one append request."""

    producer_id: str
    epoch: int
    seq: int


class CommittedHandle(NamedTuple):
    """A staged-append handle a commit made visible, and until when its name must be remembered
    (its expiry: until then a leftover staging file of it must never look committable)."""

    name: str
    expires_at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class StreamHeader:
    """Immutable configuration of one stream incarnation; the first record of its log."""

    path: str
    content_type: str  # normalized: lower-case media type, parameters kept as sent after ';'
    created_at_ms: int
    ttl_seconds: int | None = None
    expires_at: str | None = None  # RFC 3339 text, normalized by the engine
    # Forks: the source incarnation's storage id and path, and the logical position where this
    # stream's own data begins (everything before it is read from the source).
    fork_source_id: str | None = None
    fork_source_path: str | None = None
    fork_position: int = 0
    # The fork request as sent, for idempotent re-create matching (section 4.2).
    fork_offset_requested: str | None = None
    fork_sub_offset: int = 0
    # No message of this incarnation gets an earlier append time: a fork starts at the latest append
    # time of its source, so append times never go backwards along a fork chain (time lookups).
    append_time_floor_ms: int = 0


@quick_init
@quick_init  # one per append request: ~1 us less than the dataclass's own (issue 17, h52)
@dataclass(frozen=True, slots=True)
class AppendEntry:
    """One committed append request: zero or more messages, optionally closing the stream.

    ``position`` is the logical position of the first message. For JSON streams each element of
    ``messages`` is one message (its canonical JSON bytes); for other content types an append is a single
    message holding the raw body. A close-only request has no messages and ``closes=True``.
    """

    position: int
    # bytes; for staged entries, which are only written out, bytes-like views into the request body.
    messages: tuple[bytes, ...]
    timestamp_ms: int
    closes: bool = False
    producer: ProducerTuple | None = None
    stream_seq: str | None = None
    digest: bytes = (
        b""  # digest of the request payload, to tell a true duplicate from a reused tuple
    )
    # Record groups (a staged-append commit written as several records): every record of a group
    # but the last has ``continues``; the last one carries the producer tuple, Stream-Seq, closure,
    # digest and the committed handles. Recovery applies a group whole or not at all.
    continues: bool = False
    txn_handles: tuple[CommittedHandle, ...] = ()
    # Logical bytes this entry adds to the stream: summed once here, since an append's size is asked for
    # several times on the event loop and costs a pass over its (up to --max-messages-per-request)
    # messages each time.
    size: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _set_append_size(self, sum(map(len, self.messages)))

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def cost(self) -> int:
        """What this entry counts against a byte budget: its bytes plus the per-message overhead."""
        return self.size + MESSAGE_OVERHEAD * len(self.messages)


# ``size``'s slot, set directly (``object.__setattr__`` looks it up and checks it per call).
_set_append_size = AppendEntry.__dict__["size"].__set__


@dataclass(frozen=True, slots=True)
class StagedSource:
    """Where a commit copies one handle's messages from: the APPEND records of a staging file in
    ``[start, end)`` (file offsets), holding ``n_messages`` messages and ``size`` payload bytes."""

    path: str
    start: int
    end: int
    n_messages: int
    size: int
    # The file is a run of log records from offset 0 (header record included), so the commit may move
    # it into the log as a segment instead of copying it (False for the legacy staging layout).
    movable: bool = False


@dataclass(frozen=True, slots=True)
class GroupCommit:
    """A staged-append commit: the messages of ``sources``, in order, become ``[position, end)`` of
    the stream as ONE record group (docs/decisions/0003-staged-appends.md).

    The state fold (``state.apply_entry``) treats it like one append whose guard fields (producer,
    Stream-Seq, closure, digest) are those of the group's last record. Recovery folds a complete group
    through the same function, with ``sources`` empty.
    """

    position: int
    size: int
    n_messages: int
    timestamp_ms: int
    sources: tuple[StagedSource, ...] = ()
    closes: bool = False
    producer: ProducerTuple | None = None
    stream_seq: str | None = None
    digest: bytes = b""
    txn_handles: tuple[CommittedHandle, ...] = ()

    @property
    def end(self) -> int:
        return self.position + self.size


@dataclass(frozen=True, slots=True)
class SoftDelete:
    """The stream was deleted while forks still read from it (section 5.4)."""

    timestamp_ms: int


@dataclass(slots=True)
class MessageSlice:
    """A message (or, for byte streams, part of one) returned by a read.

    Not frozen, unlike the records around it: reads build one per message on their hot path, and a
    frozen dataclass's ``__init__`` (``object.__setattr__`` per field) cost 3x as much (516 against
    153 ns, a tenth of a frames read's server time). Treat it as read-only all the same.
    """

    position: int  # logical position of ``data[0]``
    data: bytes
    timestamp_ms: int
    whole: bool = True  # False when a byte-stream read starts or ends inside a stored message

    @property
    def end(self) -> int:
        return self.position + len(self.data)


@dataclass(slots=True)
class MessageRun:
    """Consecutive whole messages of one stored record, as one buffer: what a whole-message read returns
    for a record it returns entirely, when its caller asked for runs (message frames, the hot path of
    the Spark source). Building a ``MessageSlice`` per message was most of a frames read's server time;
    a run costs one slice per record, and a frames body can carry its buffer as it is.

    Message ``i`` is ``data[sum(lengths[:i]) : sum(lengths[:i + 1])]`` at ``position + sum(lengths[:i])``;
    all share ``timestamp_ms``.
    """

    position: int
    data: bytes
    lengths: tuple[int, ...]
    timestamp_ms: int

    @property
    def end(self) -> int:
        return self.position + len(self.data)

    def head(self, count: int) -> MessageRun:
        """The first ``count`` messages (0 < count <= len(lengths))."""
        lengths = self.lengths[:count]
        return MessageRun(self.position, self.data[: sum(lengths)], lengths, self.timestamp_ms)
