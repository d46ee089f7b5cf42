"""The engine's requests and results: protocol operations as plain values, free of HTTP.

The HTTP layer parses headers into these (rejecting malformed syntax with ``BadRequest``); the engine
applies protocol semantics and raises typed ``errors.ProtocolError`` subclasses. Offsets cross this
boundary as tokens (``offsets.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from durastream_server.storage.records import MessageRun, MessageSlice, ProducerTuple


@dataclass(frozen=True, slots=True)
class CreateRequest:
    path: str
    content_type: str | None  # raw header value; None when absent
    body: bytes = b""
    ttl_seconds: int | None = None  # already syntax-checked
    expires_at: datetime | None = None  # already parsed (timezone-aware)
    closed: bool = False
    forked_from: str | None = None  # stream path (root-relative) of the source
    fork_offset: str | None = None  # raw token; None means "source tail"
    fork_sub_offset: int | None = None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What HEAD (and create) report about a stream."""

    path: str
    storage_id: str  # incarnation id; goes into ETags
    content_type: str
    next_offset: str
    closed: bool
    ttl_seconds: int | None
    expires_at: str | None  # RFC 3339


@dataclass(frozen=True, slots=True)
class CreateResult:
    created: bool  # False: idempotent match of an existing stream (200)
    info: StreamInfo


@dataclass(frozen=True, slots=True)
class AppendRequest:
    path: str
    content_type: str | None
    body: bytes
    close: bool = False
    stream_seq: str | None = None
    producer: ProducerTuple | None = None
    # Durastream-Forgotten-Producer: refuse (docs/extensions.md, section 7).
    refuse_forgotten: bool = False


@dataclass(frozen=True, slots=True)
class AppendResult:
    next_offset: str
    closed: bool
    duplicate: bool = False  # producer duplicate / idempotent close: 204
    producer_epoch: int | None = None
    producer_seq: int | None = None  # highest accepted seq for (stream, producer, epoch)
    # A producer duplicate: whether its digest was compared with the accepted request's (section 6).
    verified: bool = False


@dataclass(frozen=True, slots=True)
class ReadRequest:
    path: str
    offset: str  # "-1", "now" or a token
    max_bytes: int
    end_offset: str | None = None  # bounded reads (extension); None = tail


@dataclass(frozen=True, slots=True)
class ReadResult:
    """One chunk of a read. ``messages`` are whole JSON messages for JSON streams, else byte slices."""

    info: StreamInfo
    start_offset: str  # resolved start (sentinels replaced)
    messages: tuple[bytes, ...]
    positions: tuple[str, ...]  # offset of each element of ``messages``
    timestamps_ms: tuple[int, ...]
    next_offset: str
    up_to_date: bool  # the chunk reaches the (durable) tail
    closed: bool  # stream closed AND this chunk reaches the final offset (EOF)
    json: bool  # JSON mode: the HTTP layer wraps ``messages`` in a JSON array


@dataclass(frozen=True, slots=True)
class StreamListing:
    path: str
    content_type: str
    next_offset: str
    closed: bool


@dataclass(frozen=True, slots=True)
class MessagesResult:
    """One chunk of a whole-message read (message frames extension): each slice is one message with
    its own position and server append time; the rest means what it means in ``ReadResult``."""

    info: StreamInfo
    start_offset: str
    slices: Sequence[MessageSlice | MessageRun]  # a run: several whole messages of one record
    next_offset: str
    up_to_date: bool
    closed: bool
    json: bool


@dataclass(frozen=True, slots=True)
class LimitRequest:
    """A limit lookup (extension): how far from ``offset`` the budgets reach. ``None``: no limit."""

    path: str
    offset: str  # "-1", "now" or a token
    end_offset: str | None = None
    max_messages: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class LimitResult:
    start_offset: str
    end_offset: str  # the furthest message boundary within the limits
    messages: int  # messages in [start, end)
    bytes: int  # payload bytes in [start, end)
    tail_offset: str
    closed: bool
