"""The engine's requests and results: protocol operations as plain values, free of HTTP.

The HTTP layer parses headers into these (rejecting malformed syntax with ``BadRequest``); the engine
applies protocol semantics and raises typed ``errors.ProtocolError`` subclasses. Offsets cross this
boundary as tokens (``offsets.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import msgspec

from durastream_server.frozen import quick_init
from durastream_server.offsets import format_offset
from durastream_server.storage.records import MessageRun, MessageSlice, ProducerTuple

_T = TypeVar("_T")


@quick_init
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


@quick_init
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


@quick_init
@dataclass(frozen=True, slots=True)
class CreateResult:
    created: bool  # False: idempotent match of an existing stream (200)
    info: StreamInfo


@quick_init
@dataclass(frozen=True, slots=True)
class AppendRequest:
    path: str
    content_type: str | None
    body: bytes
    close: bool = False
    stream_seq: str | None = None
    producer: ProducerTuple | None = None
    # Durastream-Forgotten-Producer: refuse (docs/extensions.md, section 8).
    refuse_forgotten: bool = False
    # An inline keyed commit (docs/extensions.md section 11): deduplicated by this commit key, as a
    # keyed Durastream-Commit is, instead of by the body.
    key: str | None = None


@quick_init
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
    """One chunk of a read: whole JSON messages for JSON streams, else byte slices, in ``items`` (runs
    and slices, as storage returned them) and rendered once into ``body`` (a JSON array for JSON
    streams). ``count`` is how many messages (or byte slices) the chunk holds.

    ``messages``, ``positions`` and ``timestamps_ms`` expand every message into objects of its own:
    for tests and tools, never the serving path (a chunk can hold ~170k tiny messages).
    """

    info: StreamInfo
    start_offset: str  # resolved start (sentinels replaced)
    items: Sequence[MessageSlice | MessageRun]
    count: int
    body: bytes
    next_offset: str
    up_to_date: bool  # the chunk reaches the (durable) tail
    closed: bool  # stream closed AND this chunk reaches the final offset (EOF)
    json: bool  # JSON mode: ``body`` is a JSON array of the messages

    @property
    def messages(self) -> tuple[bytes, ...]:
        return tuple(_expand(self.items, lambda run, cut, data: data))

    @property
    def positions(self) -> tuple[str, ...]:
        return tuple(_expand(self.items, lambda run, cut, data: format_offset(run.position + cut)))

    @property
    def timestamps_ms(self) -> tuple[int, ...]:
        return tuple(_expand(self.items, lambda run, cut, data: run.timestamp_ms))


def _expand(
    items: Sequence[MessageSlice | MessageRun],
    pick: Callable[[MessageSlice | MessageRun, int, bytes], _T],
) -> Iterator[_T]:
    for item in items:
        if isinstance(item, MessageRun):
            cut = 0
            for length in item.lengths:
                yield pick(item, cut, item.data[cut : cut + length])
                cut += length
        else:
            yield pick(item, 0, item.data)


class StreamListing(msgspec.Struct, frozen=True, gc=False):
    """One live stream of a listing page. A msgspec ``Struct``, not a dataclass: the listing page puts
    these in its answer as they are (msgspec encodes one as the object ``{"path", "content_type",
    "next_offset", "closed"}`` in this field order, the bytes the page's dicts gave), and one costs a
    third of a dataclass to make: a page of 1,000 makes 1,000 (docs/benchmarks.md, fanout "Run 23")."""

    path: str
    content_type: str
    next_offset: str
    closed: bool


@dataclass(frozen=True, slots=True)
class StreamPage:
    """One page of a listing. ``next`` is the ``after`` of the following page (None: no more). A page
    may hold fewer streams than asked for, even none, and still have a ``next``: it stopped after
    examining as many paths as it was allowed to."""

    streams: list[StreamListing]
    next: str | None


@dataclass(frozen=True, slots=True)
class ChangePage:
    """One page of the change feed (``changes.py``): each changed path with its current state, or
    ``None`` for a path that no longer names a live stream. ``cursor`` is the ``since`` of the next
    page; ``more``: ask again at once; ``reset``: the pages until ``more`` is false are a full snapshot
    (the asked cursor could not be continued)."""

    changes: list[tuple[str, StreamListing | None]]
    cursor: str
    more: bool
    reset: bool


@dataclass(frozen=True, slots=True)
class MessagesResult:
    """One chunk of a whole-message read (message frames extension): each slice is one message with
    its own position and server append time; the rest means what it means in ``ReadResult``."""

    info: StreamInfo
    start_offset: str
    slices: Sequence[MessageSlice | MessageRun]  # a run: several whole messages of one record
    count: int  # messages in ``slices``
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


@dataclass(frozen=True, slots=True)
class TimeRequest:
    """A time lookup (extension): the first message at or after ``offset`` (and before ``end_offset``)
    whose append time is at or after ``at_ms`` (milliseconds since the Unix epoch)."""

    path: str
    offset: str  # "-1", "now" or a token
    at_ms: int
    end_offset: str | None = None


@dataclass(frozen=True, slots=True)
class TimeResult:
    start_offset: str
    end_offset: str  # the end of the searched range (the durable tail unless one was given)
    offset: str  # the message found, or ``end_offset`` when there is none
    found: bool
    tail_offset: str
    closed: bool
