"""Read-side extensions on ``GET {stream}``: bounded reads (``end``), message frames (``format``), limit
lookups (``lookup=limit``) and time lookups (``lookup=time``), see ``docs/extensions.md`` sections 1-3
and 7.

They are separate from the base read path on purpose: a request without any of these parameters never
gets here (``parse`` answers ``None`` after a cheap byte scan of the query), so the base protocol, and
its conformance, cannot be changed by them. All of them are catch-up reads; combining them with
``live`` is a 400.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from durastream_server.engine import contenttype
from durastream_server.engine.api import LimitRequest, ReadRequest, TimeRequest
from durastream_server.errors import InvalidParameter
from durastream_server.http import frames, responses
from durastream_server.http.etag import if_none_match, make_etag
from durastream_server.http.parse import MAX_SAFE_INTEGER, ReadParams, query_pairs
from durastream_server.http.responses import Headers
from durastream_server.offsets import NOW

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.http.handlers import Request

END_REACHED_HEADER: Final = "Durastream-End-Reached"
FORMATS: Final = ("frames", "frames-lines")
LOOKUPS: Final = ("limit", "time")
_NAMES: Final = ("end", "format", "lookup", "max_messages", "max_bytes", "timestamp")
# Any query that could name an extension parameter contains one of these (``%`` for encoded names).
_HINTS: Final = (b"end", b"format", b"lookup", b"max_", b"timestamp", b"%")
_CANONICAL_UINT: Final = re.compile(r"\A(?:0|[1-9][0-9]*)\Z")


@dataclass(frozen=True, slots=True)
class ReadExtensions:
    end: str | None  # raw token; the engine judges it against the stream
    format: str | None  # one of FORMATS
    lookup: str | None  # one of LOOKUPS
    max_messages: int | None
    max_bytes: int | None
    timestamp: int | None = None  # lookup=time: milliseconds since the Unix epoch


def parse(query_string: bytes, live: str | None) -> ReadExtensions | None:
    """The extension parameters of a read, or None when there are none (the base read path)."""
    if not any(hint in query_string for hint in _HINTS):
        return None
    try:
        pairs = query_pairs(query_string)
    except ValueError:
        return None  # the base parser has already answered "too many query parameters"
    values: dict[str, list[str]] = {}
    for key, value in pairs:
        if key in _NAMES:
            values.setdefault(key, []).append(value)
    if not values:
        return None
    for name, given in values.items():
        if len(given) > 1:
            raise InvalidParameter(f"{name} given more than once")
    if live is not None:
        names = ", ".join(sorted(values))
        raise InvalidParameter(
            f"{names} cannot be combined with live={live}: bounded reads, message frames and limit "
            "lookups are catch-up reads (omit live)"
        )
    fmt = _one(values, "format")
    if fmt is not None and fmt not in FORMATS:
        raise InvalidParameter(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    lookup = _one(values, "lookup")
    if lookup is not None and lookup not in LOOKUPS:
        raise InvalidParameter(f"lookup must be one of {', '.join(LOOKUPS)}, got {lookup!r}")
    if lookup is not None and fmt is not None:
        raise InvalidParameter(f"lookup={lookup} returns no data, so it takes no format parameter")
    max_messages = _count(values, "max_messages")
    max_bytes = _count(values, "max_bytes")
    if lookup != "limit" and (max_messages is not None or max_bytes is not None):
        name = "max_messages" if max_messages is not None else "max_bytes"
        raise InvalidParameter(f"{name} is only valid with lookup=limit")
    timestamp = _count(values, "timestamp")
    if lookup == "time" and timestamp is None:
        raise InvalidParameter(
            "lookup=time needs timestamp=<milliseconds since the Unix epoch>, e.g. "
            "timestamp=1700000000000"
        )
    if lookup != "time" and timestamp is not None:
        raise InvalidParameter("timestamp is only valid with lookup=time")
    return ReadExtensions(
        end=_one(values, "end"),
        format=fmt,
        lookup=lookup,
        max_messages=max_messages,
        max_bytes=max_bytes,
        timestamp=timestamp,
    )


def _one(values: dict[str, list[str]], name: str) -> str | None:
    given = values.get(name)
    return given[0] if given else None


def _count(values: dict[str, list[str]], name: str) -> int | None:
    text = _one(values, name)
    if text is None:
        return None
    if not _CANONICAL_UINT.match(text) or len(text) > 16 or int(text) > MAX_SAFE_INTEGER:
        raise InvalidParameter(
            f"{name} must be a non-negative decimal integer <= 2^53-1 without sign or leading "
            f"zeros, got {text!r}"
        )
    return int(text)


async def serve(
    engine: Engine,
    chunk_bytes: int,
    request: Request,
    path: str,
    params: ReadParams,
    ext: ReadExtensions,
) -> int:
    """Answer the request; returns how many messages the answer carries (``/metrics``)."""
    if ext.lookup == "limit":
        await _limit_lookup(engine, request, path, params, ext)
    elif ext.lookup == "time":
        await _time_lookup(engine, request, path, params, ext)
    elif ext.format is not None:
        return await _frames(engine, chunk_bytes, request, path, params, ext)
    else:
        return await _bounded(engine, chunk_bytes, request, path, params, ext)
    return 0


async def _bounded(
    engine: Engine,
    chunk_bytes: int,
    request: Request,
    path: str,
    params: ReadParams,
    ext: ReadExtensions,
) -> int:
    result = await engine.read(
        ReadRequest(path=path, offset=params.offset, max_bytes=chunk_bytes, end_offset=ext.end)
    )
    await _send_chunk(
        request,
        params,
        ext,
        content_type=result.info.content_type,
        storage_id=result.info.storage_id,
        start_offset=result.start_offset,
        next_offset=result.next_offset,
        up_to_date=result.up_to_date,
        closed=result.closed,
        body=result.body,  # the base read's body (a JSON array for JSON)
    )
    return result.count


async def _frames(
    engine: Engine,
    chunk_bytes: int,
    request: Request,
    path: str,
    params: ReadParams,
    ext: ReadExtensions,
) -> int:
    lines = ext.format == "frames-lines"
    if lines and not contenttype.is_json(engine.head(path).content_type):
        raise InvalidParameter(
            "format=frames-lines is only for JSON streams (its values are NDJSON lines); "
            "use format=frames for other content types"
        )
    overhead = frames.PER_LINE_OVERHEAD if lines else frames.PER_MESSAGE_OVERHEAD
    fixed = frames.HEADER.size + 8  # the header and the final value boundary
    result = await engine.read_messages(
        ReadRequest(
            path=path,
            offset=params.offset,
            max_bytes=max(1, chunk_bytes - fixed),
            end_offset=ext.end,
        ),
        overhead=overhead,
    )
    # Per-message work (C-level, but ~170k messages in a chunk of tiny ones): off the loop if large.
    body = await engine.offload(
        result.count, functools.partial(frames.encode, lines=lines), result.slices
    )
    await _send_chunk(
        request,
        params,
        ext,
        content_type=frames.CONTENT_TYPE,
        storage_id=result.info.storage_id,
        start_offset=result.start_offset,
        next_offset=result.next_offset,
        up_to_date=result.up_to_date,
        closed=result.closed,
        body=body,
    )
    return result.count


async def _send_chunk(
    request: Request,
    params: ReadParams,
    ext: ReadExtensions,
    *,
    content_type: str,
    storage_id: str,
    start_offset: str,
    next_offset: str,
    up_to_date: bool,
    closed: bool,
    body: bytes,
) -> None:
    """A 200 catch-up answer with the base headers, plus ``Durastream-End-Reached`` for bounded
    reads; the ETag names the ``end`` and ``format`` asked for (section 10.1 still applies)."""
    headers: Headers = [("Content-Type", content_type), ("Stream-Next-Offset", next_offset)]
    if up_to_date:
        headers.append(("Stream-Up-To-Date", "true"))
    if closed:
        headers.append(("Stream-Closed", "true"))
    if ext.end is not None and next_offset == ext.end:
        headers.append((END_REACHED_HEADER, "true"))
    if params.offset == NOW:
        headers.append(("Cache-Control", responses.CACHE_NO_STORE))
    else:
        variant = ":".join(
            part
            for part in (
                f"e={ext.end}" if ext.end is not None else "",
                f"f={ext.format}" if ext.format is not None else "",
            )
            if part
        )
        etag = make_etag(storage_id, start_offset, next_offset, closed, variant)
        headers.append(("ETag", etag))
        headers.append(("Cache-Control", responses.CACHE_CATCH_UP))
        if if_none_match(request.headers.get("if-none-match"), etag):
            await responses.send_response(request.send, 304, headers)
            return
    await responses.send_response(request.send, 200, headers, body)


async def _limit_lookup(
    engine: Engine, request: Request, path: str, params: ReadParams, ext: ReadExtensions
) -> None:
    result = await engine.lookup_limit(
        LimitRequest(
            path=path,
            offset=params.offset,
            end_offset=ext.end,
            max_messages=ext.max_messages,
            max_bytes=ext.max_bytes,
        )
    )
    await _send_lookup(
        request,
        {
            "start": result.start_offset,
            "end": result.end_offset,
            "messages": result.messages,
            "bytes": result.bytes,
            "tail": result.tail_offset,
            "closed": result.closed,
        },
    )


async def _time_lookup(
    engine: Engine, request: Request, path: str, params: ReadParams, ext: ReadExtensions
) -> None:
    assert ext.timestamp is not None
    result = await engine.lookup_time(
        TimeRequest(path=path, offset=params.offset, at_ms=ext.timestamp, end_offset=ext.end)
    )
    await _send_lookup(
        request,
        {
            "timestamp": ext.timestamp,
            "start": result.start_offset,
            "end": result.end_offset,
            "offset": result.offset,
            "found": result.found,
            "tail": result.tail_offset,
            "closed": result.closed,
        },
    )


async def _send_lookup(request: Request, document: dict[str, object]) -> None:
    body = json.dumps(document, separators=(",", ":")).encode()
    headers: Headers = [
        ("Content-Type", "application/json"),
        ("Cache-Control", responses.CACHE_NO_STORE),  # the answer depends on the moving tail
    ]
    await responses.send_response(request.send, 200, headers, body)
