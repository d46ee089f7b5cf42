"""What the log records, as plain values. The on-disk encoding of these lives in ``codec.py``.

A stream's log is a sequence of records. The first is always a ``StreamHeader``; then come ``AppendEntry``
records (data, closure, or both) and at most one ``SoftDelete``. Everything that guards exactly-once (the
producer tuple, ``Stream-Seq``, closure and the tuple that closed the stream) travels *inside* the same
record as the data it belongs to, so no crash can separate an append from its dedup state (hazards 19, 32).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProducerTuple:
    """(Producer-Id, Producer-Epoch, Producer-Seq) of one append request."""

    producer_id: str
    epoch: int
    seq: int


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


@dataclass(frozen=True, slots=True)
class AppendEntry:
    """One committed append request: zero or more messages, optionally closing the stream.

    ``position`` is the logical position of the first message. For JSON streams each element of
    ``messages`` is one message (its canonical JSON bytes); for other content types an append is a single
    message holding the raw body. A close-only request has no messages and ``closes=True``.
    """

    position: int
    messages: tuple[bytes, ...]
    timestamp_ms: int
    closes: bool = False
    producer: ProducerTuple | None = None
    stream_seq: str | None = None
    digest: bytes = (
        b""  # digest of the request payload, to tell a true duplicate from a reused tuple
    )

    @property
    def size(self) -> int:
        """Logical bytes this entry adds to the stream."""
        return sum(len(m) for m in self.messages)

    @property
    def end(self) -> int:
        return self.position + self.size


@dataclass(frozen=True, slots=True)
class SoftDelete:
    """The stream was deleted while forks still read from it (section 5.4)."""

    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class MessageSlice:
    """A message (or, for byte streams, part of one) returned by a read."""

    position: int  # logical position of ``data[0]``
    data: bytes
    timestamp_ms: int
    whole: bool = True  # False when a byte-stream read starts or ends inside a stored message
