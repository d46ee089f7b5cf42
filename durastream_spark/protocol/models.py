"""Plain results of protocol operations. Frozen dataclasses: safe to share between threads and to pickle."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from durastream_spark.protocol.extensions import Extensions

RAW = "raw"
FRAMES = "frames"
FRAMES_LINES = "frames-lines"
READ_FORMATS = (RAW, FRAMES, FRAMES_LINES)

START_OFFSET = "-1"  # the protocol's sentinel for "the beginning of the stream"
TAIL_OFFSET = "now"  # the protocol's sentinel for "the current tail"


def byte_span(start: str, end: str) -> int | None:
    """The payload bytes of ``[start, end)`` from the two offsets, on a server advertising
    ``byte-positions`` (docs/extensions.md section 12): ``-1`` is position 0, a token
    ``GGGGGGGGGGGGGGGG_PPPPPPPPPPPPPPPP`` is position ``P``. ``None`` when they do not say (the caller asks
    the server instead of guessing): not tokens, different generations (positions of two generations are
    not comparable), or ``end`` before ``start``."""
    first, last = _token_parts(start), _token_parts(end)
    if first is None or last is None:
        return None
    if start != START_OFFSET and first[0] != last[0]:
        return None
    size = last[1] - first[1]
    return size if size >= 0 else None


def _token_parts(offset: str) -> tuple[str, int] | None:
    """``(generation, position)`` of a token, ``("", 0)`` for ``-1``, ``None`` for anything else."""
    if offset == START_OFFSET:
        return "", 0
    token = _TOKEN.fullmatch(offset)
    if token is None:
        return None
    return token[1], int(token[2])


# A token: 16 ASCII digits of generation, ``_``, 16 of position. One C match per offset (a batch over
# 10,000 streams reads 20,000 of them while it plans).
_TOKEN = re.compile(r"([0-9]{16})_([0-9]{16})")


def normalize_content_type(value: str | None) -> str:
    """Media type without parameters, lower-cased: how the protocol compares content types."""
    if not value:
        return ""
    return value.split(";", 1)[0].strip().lower()


def is_json_content_type(value: str | None) -> bool:
    """JSON mode is exactly ``application/json`` (not ``+json`` types; hazard 40)."""
    return normalize_content_type(value) == "application/json"


class Producer(NamedTuple):
    """An idempotent producer tuple. ``seq`` counts requests, not messages (spec 5.2.1)."""

    id: str
    epoch: int
    seq: int


@dataclass(frozen=True)
class StreamMeta:
    """What ``HEAD`` says about a stream."""

    path: str
    content_type: str
    next_offset: str
    closed: bool
    ttl_seconds: int | None
    expires_at: str | None
    extensions: Extensions

    @property
    def is_json(self) -> bool:
        return is_json_content_type(self.content_type)


@dataclass(frozen=True)
class CreateResult:
    """``created`` is false for an idempotent re-create (200): the stream already existed, same config."""

    path: str
    created: bool
    content_type: str
    next_offset: str | None
    closed: bool


@dataclass(frozen=True)
class AppendResult:
    """An accepted append or close. Raised errors cover every other outcome, so this always means delivered.

    ``duplicate`` is true for a producer request answered 204: the server already had this exact
    (id, epoch, seq), so the data is in the stream exactly once. ``next_offset`` is the tail after the request
    (for a duplicate, the current tail).
    """

    status: int
    next_offset: str | None
    duplicate: bool
    closed: bool
    producer_epoch: int | None = None
    producer_seq: int | None = None
    txn_messages: int | None = None  # a commit: how many staged messages became visible
    txn_bytes: int | None = None
    # A duplicate: True if the server compared this request with the one it applied (they are equal),
    # False if it could not (``Durastream-Digest: unknown``), None if it did not say.
    digest_verified: bool | None = None

    @property
    def delivered(self) -> bool:
        return True


@dataclass(frozen=True)
class ReadChunk:
    """One catch-up read response.

    - ``body``: the bytes as sent (a JSON array, raw bytes, or a frames body for ``format=frames*``).
    - ``next_offset``: where the next read starts.
    - ``up_to_date``: the chunk reached the tail as of the response (not EOF: more may be appended).
    - ``closed``: the stream is closed and this chunk reaches its final offset (EOF).
    - ``end_reached``: a bounded read reached its ``end`` (``next_offset == end``).
    """

    path: str
    offset: str
    end: str | None
    format: str
    body: bytes = field(repr=False)  # may be megabytes: keep it out of logs and tracebacks
    next_offset: str
    up_to_date: bool
    closed: bool
    end_reached: bool
    content_type: str
    etag: str | None = None


@dataclass(frozen=True)
class LimitLookup:
    """``lookup=limit``: the furthest message boundary ``end`` with ``[start, end)`` inside the limits."""

    start: str
    end: str
    messages: int
    bytes: int
    tail: str
    closed: bool


@dataclass(frozen=True)
class TimeLookup:
    """``lookup=time``: the first message in ``[start, end)`` whose append time is at or after
    ``timestamp`` (``offset``), or ``found=False`` and ``offset == end``."""

    timestamp: int
    start: str
    end: str
    offset: str
    found: bool
    tail: str
    closed: bool


class StreamInfo(NamedTuple):
    """One live stream from the listing extension. A tuple: a listing of 10,000 streams makes 10,000."""

    path: str
    content_type: str
    next_offset: str
    closed: bool


class StreamColumns(NamedTuple):
    """Live streams from the listing extension as aligned columns (``StreamInfo``'s fields, in its
    order): a batch read of 10,000 streams plans from columns, not a tuple a stream."""

    paths: list[str]
    content_types: list[str]
    next_offsets: list[str]
    closed: list[bool]


@dataclass(frozen=True)
class StageResult:
    """The handle's totals after a stage request (staged data is invisible until committed)."""

    handle: str
    messages: int | None
    bytes: int | None
    duplicate: bool
    expires_at: str | None = None  # RFC 3339: when the server reclaims the handle unless committed


@dataclass(frozen=True)
class StreamChange:
    """One entry of the change feed: the stream's state now, or ``info=None`` when it is gone."""

    path: str
    info: StreamInfo | None


@dataclass(frozen=True)
class ChangePage:
    """One page of the change feed (extension ``changes``). ``cursor`` is the next page's ``since``;
    ``more``: ask again at once; ``reset``: this page and those up to ``more=False`` are a full
    snapshot of the selection (forget what you knew)."""

    changes: tuple[StreamChange, ...]
    cursor: str
    more: bool
    reset: bool


@dataclass(frozen=True)
class RangeAnswer:
    """How one range of a multi-range read was answered: ``messages`` of it are in the frames body
    (after those of the ranges before it), and it stopped at ``next_offset``; or it failed (``error``)."""

    messages: int
    next_offset: str | None
    end_reached: bool
    error: Exception | None = None


@dataclass(frozen=True)
class MultiReadChunk:
    """A multi-range read answer: per answered range (a prefix of those asked), and the one frames body
    holding their messages (``body[frames_at:]``, 8-byte aligned within ``body``)."""

    ranges: tuple[RangeAnswer, ...]
    body: bytes = field(repr=False)
    frames_at: int
