"""Request headers and query strings -> engine requests, rejecting malformed syntax with ``BadRequest``.

The engine judges protocol *semantics* (does the content type match, is the epoch stale); this module judges
*syntax* only, strictly and in one place, so a malformed value can never reach the engine and be
reinterpreted there (``+3600`` is not a TTL, ``1e3`` is not an epoch, ``0_5`` is not an offset).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal
from urllib.parse import parse_qsl

from durastream_server.engine import contenttype, expiry
from durastream_server.engine.api import AppendRequest, CreateRequest
from durastream_server.errors import BadRequest
from durastream_server.http.paths import InvalidPath, forked_from_path
from durastream_server.offsets import InvalidOffset, parse_offset, parse_position
from durastream_server.storage.records import ProducerTuple

MAX_SAFE_INTEGER: Final = 2**53 - 1  # section 5.2.1: producer integers stay exact in JavaScript
# A TTL bound keeps expiry arithmetic (datetime + timedelta) far from overflow; ~3170 years.
MAX_TTL_SECONDS: Final = 10**11
MAX_PRODUCER_ID_BYTES: Final = 1024
MAX_QUERY_FIELDS: Final = 64

_CANONICAL_UINT: Final = re.compile(
    r"\A(?:0|[1-9][0-9]*)\Z"
)  # no sign, no leading zeros, no '.', no 'e'
_RFC3339: Final = re.compile(
    r"\A([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)

LiveMode = Literal["long-poll", "sse"]
_LIVE_MODES: Final = ("long-poll", "sse")


def header_map(raw_headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lower-cased names; repeated fields combined with ", " as RFC 9110 section 5.3 allows.

    Values are decoded as Latin-1, which maps every byte to one code point, so byte-wise order (needed
    for ``Stream-Seq``, section 5.2) is preserved exactly.
    """
    if not isinstance(raw_headers, (list, tuple)):
        raw_headers = list(raw_headers)
    # Every request comes through here: one comprehension when no name repeats (nearly always), the
    # combining loop below only when one does (the comprehension then lost a value: fewer keys).
    fast = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw_headers}
    if len(fast) == len(raw_headers):
        return fast
    headers: dict[str, str] = {}
    for raw_name, raw_value in raw_headers:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def stream_closed(headers: dict[str, str]) -> bool:
    """Section 4.1: present only when exactly ``true`` (case-insensitive); anything else is absent."""
    return headers.get("stream-closed", "").strip().lower() == "true"


def content_type(headers: dict[str, str]) -> str | None:
    value = headers.get("content-type", "").strip()
    return value or None


def ttl_seconds(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not _CANONICAL_UINT.match(text) or len(text) > 12 or int(text) > MAX_TTL_SECONDS:
        raise BadRequest(
            f"Stream-TTL must be a non-negative decimal integer without sign or leading zeros "
            f"(at most {MAX_TTL_SECONDS}), got {value!r}"
        )
    return int(text)


def expires_at(value: str | None) -> datetime | None:
    """An RFC 3339 timestamp with an explicit offset whose UTC instant lies in ``expiry.RANGE``.

    Parsed portably (Python 3.10's ``fromisoformat`` knows neither ``Z`` nor arbitrary fraction lengths,
    so both are normalised first). Anything else, including ``9999-12-31T23:59:59-23:59`` (year 10000
    in UTC), is 400 naming the header, the value and the accepted range.
    """
    if value is None:
        return None
    match = _RFC3339.match(value.strip())
    try:
        if match is None:
            raise ValueError("not an RFC 3339 date-time with a time zone")
        date, time, fraction, offset = match.groups()
        micros = f".{(fraction or '')[:6].ljust(6, '0')}" if fraction else ""
        zone = "+00:00" if offset in ("Z", "z") else offset
        moment = datetime.fromisoformat(f"{date}T{time}{micros}{zone}")
        expiry.in_utc(moment)
    except ValueError:
        raise BadRequest(
            f"Stream-Expires-At must be an RFC 3339 date-time with a time zone (e.g. "
            f"2030-01-31T12:00:00Z) from {expiry.RANGE}, got {value!r}"
        ) from None
    return moment


def _safe_int(name: str, value: str) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 16 or int(text) > MAX_SAFE_INTEGER:
        raise BadRequest(f"{name} must be a non-negative integer <= 2^53-1, got {value!r}")
    return int(text)


def producer(headers: dict[str, str]) -> ProducerTuple | None:
    """Section 5.2.1: all three producer headers or none; a non-empty id; safe integers."""
    raw_id = headers.get("producer-id")
    raw_epoch = headers.get("producer-epoch")
    raw_seq = headers.get("producer-seq")
    if raw_id is None or raw_epoch is None or raw_seq is None:
        if raw_id is None and raw_epoch is None and raw_seq is None:
            return None
        names = ("producer-id", "producer-epoch", "producer-seq")
        missing = ", ".join(name.title() for name in names if name not in headers)
        raise BadRequest(
            f"Producer-Id, Producer-Epoch and Producer-Seq go together; missing {missing}"
        )
    producer_id = raw_id.strip()
    if not producer_id:
        raise BadRequest("Producer-Id must not be empty")
    # An ASCII id has one byte per character: no encoding needed to measure it.
    size = len(producer_id) if producer_id.isascii() else len(producer_id.encode("latin-1"))
    if size > MAX_PRODUCER_ID_BYTES:
        raise BadRequest(f"Producer-Id is longer than {MAX_PRODUCER_ID_BYTES} bytes")
    epoch = _safe_int("Producer-Epoch", raw_epoch)
    seq = _safe_int("Producer-Seq", raw_seq)
    return ProducerTuple(producer_id=producer_id, epoch=epoch, seq=seq)


def create_request(path: str, headers: dict[str, str], body: bytes) -> CreateRequest:
    ttl = ttl_seconds(headers.get("stream-ttl"))
    expiry = expires_at(headers.get("stream-expires-at"))
    if ttl is not None and expiry is not None:
        raise BadRequest("Stream-TTL and Stream-Expires-At are mutually exclusive")
    forked_from = headers.get("stream-forked-from")
    fork_offset = headers.get("stream-fork-offset")
    sub_offset_text = headers.get("stream-fork-sub-offset")
    source: str | None = None
    sub_offset: int | None = None
    if forked_from is None:
        if fork_offset is not None or sub_offset_text is not None:
            raise BadRequest(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset require Stream-Forked-From"
            )
    else:
        try:
            source = forked_from_path(forked_from)
        except InvalidPath as exc:
            raise BadRequest(f"invalid Stream-Forked-From: {exc}") from None
        if fork_offset is not None:
            fork_offset = fork_offset.strip()
            try:
                parse_position(fork_offset)
            except InvalidOffset:
                raise BadRequest(f"invalid Stream-Fork-Offset {fork_offset!r}") from None
        if sub_offset_text is not None:
            text = sub_offset_text.strip()
            if not _CANONICAL_UINT.match(text) or len(text) > 16 or int(text) > MAX_SAFE_INTEGER:
                raise BadRequest(f"invalid Stream-Fork-Sub-Offset {sub_offset_text!r}")
            sub_offset = int(text)
    requested_type = content_type(headers)
    refusal = contenttype.invalid_for_create(requested_type)
    if refusal is not None:
        raise BadRequest(refusal)
    return CreateRequest(
        path=path,
        content_type=requested_type,
        body=body,
        ttl_seconds=ttl,
        expires_at=expiry,
        closed=stream_closed(headers),
        forked_from=source,
        fork_offset=fork_offset,
        fork_sub_offset=sub_offset,
    )


FORGOTTEN_PRODUCER: Final = "durastream-forgotten-producer"
DIGEST_HEADER: Final = "Durastream-Digest"


def refuse_forgotten(headers: dict[str, str], producer: ProducerTuple | None) -> bool:
    """``Durastream-Forgotten-Producer: refuse`` (docs/extensions.md, section 8): only with producer
    headers, only that value."""
    value = headers.get(FORGOTTEN_PRODUCER)
    if value is None:
        return False
    if value.strip().lower() != "refuse":
        raise BadRequest(f"Durastream-Forgotten-Producer accepts only 'refuse', got {value!r}")
    if producer is None:
        raise BadRequest(
            "Durastream-Forgotten-Producer needs the producer headers (Producer-Id, Producer-Epoch, "
            "Producer-Seq)"
        )
    return True


def digest_header(verified: bool) -> tuple[str, str]:
    """On a producer duplicate (204): whether the request was compared with the accepted one."""
    return DIGEST_HEADER, "match" if verified else "unknown"


def append_request(
    path: str, headers: dict[str, str], body: bytes, key: str | None = None
) -> AppendRequest:
    """An append (or, with ``key``, a bulk inline commit: its key is judged by the caller)."""
    close = stream_closed(headers)
    ctype = content_type(headers)
    if not body:
        if not close:
            raise BadRequest(
                "an append needs a body (an empty body is only valid with Stream-Closed)"
            )
        ctype = None  # section 5.2: an empty close-only body is never judged by its Content-Type
    elif ctype is None:
        raise BadRequest("Content-Type is required when appending a body")
    appender = producer(headers)
    return AppendRequest(
        path=path,
        content_type=ctype,
        body=body,
        close=close,
        stream_seq=headers.get("stream-seq"),
        producer=appender,
        refuse_forgotten=refuse_forgotten(headers, appender),
        key=key,
    )


def query_pairs(query_string: bytes) -> list[tuple[str, str]]:
    """A read's query as ``(name, value)`` pairs (blank values kept, invalid UTF-8 replaced); raises
    ``ValueError`` beyond ``MAX_QUERY_FIELDS`` fields."""
    return parse_qsl(
        query_string.decode("latin-1"),
        keep_blank_values=True,
        encoding="utf-8",
        errors="replace",
        max_num_fields=MAX_QUERY_FIELDS,
    )


@dataclass(frozen=True, slots=True)
class ReadParams:
    offset: str  # "-1", "now" or a canonical token
    live: LiveMode | None
    cursor: str | None
    sse_base64: bool  # extension: the client asked for base64 SSE data events on any stream


def read_params(query_string: bytes) -> ReadParams:
    """Sections 5.6-5.8 and 8: one non-empty ``offset`` (required for live modes), a known ``live``."""
    try:
        pairs = query_pairs(query_string)
    except ValueError:
        raise BadRequest("too many query parameters") from None
    values: dict[str, list[str]] = {}
    for key, value in pairs:
        values.setdefault(key, []).append(value)

    offsets = values.get("offset", [])
    if len(offsets) > 1:
        raise BadRequest("offset given more than once")
    lives = values.get("live", [])
    if len(lives) > 1:
        raise BadRequest("live given more than once")
    live = lives[0] if lives else None
    if live is not None and live not in _LIVE_MODES:
        raise BadRequest(f"live must be one of {', '.join(_LIVE_MODES)}, got {live!r}")
    if not offsets:
        if live is not None:
            raise BadRequest("live reads require an offset")
        offset = "-1"
    else:
        offset = offsets[0]
        try:
            parse_offset(offset)
        except InvalidOffset:
            raise BadRequest(f"malformed offset {offset!r}") from None
    cursors = values.get("cursor", [])
    encodings = values.get("sse_encoding", [])
    return ReadParams(
        offset=offset,
        live=live,  # type: ignore[arg-type]
        cursor=cursors[-1] if cursors else None,
        sse_base64=bool(encodings) and encodings[-1].lower() == "base64",
    )
