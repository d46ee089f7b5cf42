"""``POST {root}/__ds/x-durastream/lookups`` and ``.../reads``: many small ranges in one request
(extension ``multi-range``, docs/extensions.md section 10).

A Spark batch over 10,000 streams of a few messages each is 10,000 small ranges. One HTTP exchange per
range costs far more than the data (about a millisecond of CPU on each side here); these resources take
a list of ranges and answer them together:

- ``lookups``: limit lookups (section 3) of many ranges, answered as one JSON list in request order.
- ``reads``: bounded ``format=frames`` reads (sections 1-2) of many ranges, answered as one body: a JSON
  header saying, for each answered range in order, how many messages it contributed and where it stopped,
  then **one** frames body holding all those messages. The answer is bounded by the chunk size like any
  read; it covers a prefix of the ranges (the last possibly cut short), and the client asks again for the
  rest.

A range that fails (a stream deleted since the batch was planned, an ``end`` beyond the tail) does not fail
the others: its entry carries the error (status, code, message) that a single request would have got.

With ``--workers N`` the worker that receives a request asks the other shards for their ranges and
assembles the answer one process would give (``shards/multirange.py``): ``answer_reads`` is a shard's
part, and a part asked by another worker may carry a smaller budget (``part_budget``).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from itertools import chain, repeat
from operator import attrgetter, eq, itemgetter
from typing import TYPE_CHECKING, Annotated, Any, Final

import msgspec

from durastream_server.engine import contenttype, multiread
from durastream_server.engine.api import LimitRequest
from durastream_server.errors import BadRequest, Forbidden, MethodNotAllowed, ProtocolError
from durastream_server.http import frames, responses
from durastream_server.http.body import parse_json, read_body, read_json_body
from durastream_server.http.collections_hold import BULK
from durastream_server.http.parse import MAX_SAFE_INTEGER
from durastream_server.storage.records import MessageRun, MessageSlice

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.http.handlers import Request
    from durastream_server.shards.multirange import LocalLookups, MultiRangeFanOut

MAX_RANGES: Final = 10_000
LOOKUP_GROUP: Final = 256  # lookups answered together (their header scans share a thread trip)
CONTENT_TYPE: Final = "application/vnd.durastream.multi-frames"
MAGIC: Final = b"DSM1"
FORMATS: Final = ("frames", "frames-lines")
MAX_TEXT: Final = 4096  # characters of a range's path, offset or end
_LOOKUPS_SHAPE: Final = (
    'a JSON object {"lookups": [{"path": ..., "offset": ..., "end": ..., "max_messages": ..., '
    f'"max_bytes": ...}}, ...]}} with 1 to {MAX_RANGES} lookups'
)
_READS_SHAPE: Final = (
    'a JSON object {"ranges": [{"path": ..., "offset": ..., "end": ...}, ...], "format": "frames"} '
    f"with 1 to {MAX_RANGES} ranges"
)


async def serve_lookups(
    engine: Engine, request: Request, max_body_bytes: int, fan_out: MultiRangeFanOut | None = None
) -> dict[str, Any]:
    """Limit lookups of every listed range, each answered or failed on its own, in request order.
    With ``fan_out`` (``--workers N``) the other shards' lookups are answered by their workers."""
    require_post(request)
    document = await read_json_body(
        request.receive, request.headers, max_body_bytes, _LOOKUPS_SHAPE
    )
    items = _list(document, "lookups", _LOOKUPS_SHAPE, ("format",))
    lookups = [
        LimitRequest(
            path=_text(item, "path", index),
            offset=_text(item, "offset", index),
            end_offset=_text(item, "end", index, required=False),
            max_messages=_count(item, "max_messages", index),
            max_bytes=_count(item, "max_bytes", index),
        )
        for index, item in enumerate(items)
    ]
    if fan_out is not None and not fan_out.is_shard_part(request):
        return await fan_out.lookups(
            request, items, [lookup.path for lookup in lookups], _local_lookups(engine, request)
        )
    return {"results": await _lookups(engine, request, lookups)}


def _local_lookups(engine: Engine, request: Request) -> LocalLookups:
    """This worker's lookups of the items it owns (a fan-out's local part)."""

    async def local(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        lookups = [
            LimitRequest(
                path=item["path"],
                offset=item["offset"],
                end_offset=item.get("end"),
                max_messages=item.get("max_messages"),
                max_bytes=item.get("max_bytes"),
            )
            for item in items
        ]
        return await _lookups(engine, request, lookups)

    return local


async def _lookups(
    engine: Engine, request: Request, lookups: list[LimitRequest]
) -> list[dict[str, Any]]:
    async def answer(lookup: LimitRequest) -> dict[str, Any]:
        try:
            check_scope(request, lookup.path)
            found = await engine.lookup_limit(lookup)
        except ProtocolError as exc:
            return _error(exc)
        return {
            "start": found.start_offset,
            "end": found.end_offset,
            "messages": found.messages,
            "bytes": found.bytes,
            "tail": found.tail_offset,
            "closed": found.closed,
        }

    # A group at a time, together: the header scans of a group's idle streams then share one
    # worker-thread trip (storage/scans.py), and the loop holds a bounded number of lookups at once.
    results: list[dict[str, Any]] = []
    for first in range(0, len(lookups), LOOKUP_GROUP):
        group = lookups[first : first + LOOKUP_GROUP]
        results.extend(await asyncio.gather(*map(answer, group)))
    return results


async def serve_reads(
    engine: Engine,
    request: Request,
    max_body_bytes: int,
    chunk_bytes: int,
    fan_out: MultiRangeFanOut | None = None,
) -> None:
    """Bounded frames reads of a prefix of the listed ranges, within one chunk (module docstring).

    Read under the bulk requests' GC hold (``collections_hold.py``): the answer keeps every range's
    objects alive until it is sent (the planned reads, the records' bytes, the runs, the answers:
    a dozen objects a range, 2,000 ranges a request), so the default young threshold set off a
    collection every ~60 ranges, each one walking the survivors again: ~5 us of a range's ~20 us of
    server CPU in process (docs/benchmarks.md, Run 18)."""
    with BULK.held():
        await _serve_reads(engine, request, max_body_bytes, chunk_bytes, fan_out)


async def _serve_reads(
    engine: Engine,
    request: Request,
    max_body_bytes: int,
    chunk_bytes: int,
    fan_out: MultiRangeFanOut | None,
) -> None:
    require_post(request)
    body = await read_body(request.receive, request.headers, max_body_bytes)
    plain_body = _plain_reads(body)
    if plain_body is None:  # anything else, or an error: said as the general parse says it
        document = await parse_json(body, _READS_SHAPE)
        items = _list(document, "ranges", _READS_SHAPE, ("format",))
        fmt = document.get("format", "frames")
        if fmt not in FORMATS:
            raise BadRequest(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        ranges = _ranges(items)
    else:
        ranges, fmt = plain_body
    budget = chunk_bytes - frames.HEADER.size - 8  # the frames header and the final boundary
    if fan_out is not None:
        if not fan_out.is_shard_part(request):
            parts = await fan_out.reads(
                request, ranges, fmt, budget, functools.partial(answer_reads, engine, request)
            )
            await _send(request, *parts)
            return
        budget = fan_out.part_budget(request, budget)
    await _send(request, *await answer_reads(engine, request, ranges, fmt, budget))


async def answer_reads(
    engine: Engine, request: Request, ranges: list[tuple[str, str, str]], fmt: str, budget: int
) -> tuple[str, bytes]:
    """The answer to a reads request of ``ranges`` in ``fmt`` under ``budget``: its header's
    entries (one per answered range, joined by commas) and its frames body."""
    lines = fmt == "frames-lines"
    overhead = frames.PER_LINE_OVERHEAD if lines else frames.PER_MESSAGE_OVERHEAD

    def checked() -> Iterator[tuple[str, str, str] | ProtocolError]:
        """The ranges, each failed here if this request may not read it this way (lazily: the
        engine plans a bounded number at a time and stops where the budget does)."""
        for path, offset, end in ranges:
            try:
                check_scope(request, path)
                if lines and not contenttype.is_json(engine.head(path).content_type):
                    raise BadRequest(
                        f"format=frames-lines is only for JSON streams; '{path}' is not one"
                    )
            except ProtocolError as exc:
                yield exc
                continue
            yield path, offset, end

    # Nothing to check a range for (no scoped token, no frames-lines): the ranges as they are, not
    # a generator step each.
    plain = request.token is None and not lines
    if not lines:
        got = await engine.read_range_frames(
            ranges if plain else checked(), budget, overhead=overhead
        )
        header = _frames_header(ranges, got)
        body = await engine.offload(got.columns.messages, frames.encode_columns, got.columns)
        return header, body
    results = await engine.read_range_answers(checked(), budget, overhead=overhead)
    entries: list[str] = []
    pieces: list[MessageRun | MessageSlice] = []
    count = 0
    for (_, _, end), result in zip(ranges, results, strict=False):
        if isinstance(result, ProtocolError):
            entries.append(json.dumps(_error(result), separators=(",", ":")))
            continue
        pieces.extend(result.slices)
        count += result.count
        # The text json.dumps gives (an offset is the server's own token: digits and '_'), without
        # a dict per range and the encoder's walk of 10,000 of them.
        next_offset = result.next_offset
        entries.append(
            f'{{"messages":{result.count},"next_offset":"{next_offset}",'
            f'"end_reached":{"true" if next_offset == end else "false"}}}'
        )
    body = await engine.offload(count, functools.partial(frames.encode, lines=lines), pieces)
    return ",".join(entries), body


# A range's header entry as ``_entry`` writes it (the text json.dumps gives: an offset is the
# server's own token, digits and '_'), filled by ``str.format`` at C level for a whole answer.
_ENTRY: Final = '{{"messages":{},"next_offset":"{}","end_reached":{}}}'
_JSON_BOOL: Final = ("false", "true")
_COUNT: Final = '{"messages":'
_OFFSET: Final = ',"next_offset":"'
_REACHED: Final = ('","end_reached":false}', '","end_reached":true}')


def _frames_header(ranges: list[tuple[str, str, str]], got: multiread.FramesRead) -> str:
    """The header entries of a ``format=frames`` answer, in range order: each answered range's
    message count, next offset and whether it reached its end, or its error."""
    counts = got.counts
    offsets = got.offsets
    if -1 not in counts:  # no error: every entry by C-level passes, not a Python step each
        # Joined from its pieces (~0.3 us an entry, ``_ENTRY.format`` ~0.8 us: it parses the format).
        reached = map(_REACHED.__getitem__, map(eq, offsets, map(itemgetter(2), ranges)))
        pieces = zip(repeat(_COUNT), map(str, counts), repeat(_OFFSET), offsets, reached)
        return ",".join(map("".join, pieces))  # type: ignore[arg-type]
    entries: list[str] = []
    for (_, _, end), count, offset in zip(ranges, counts, offsets, strict=False):
        if isinstance(offset, ProtocolError):
            entries.append(json.dumps(_error(offset), separators=(",", ":")))
        else:
            entries.append(_ENTRY.format(count, offset, _JSON_BOOL[offset == end]))
    return ",".join(entries)


async def _send(request: Request, entries: str, body: bytes) -> None:
    """The answer: magic, the header's length, the header (the ranges' entries), padded so that
    the frames body starts 8-aligned, then the body."""
    header = ('{"ranges":[' + entries + "]}").encode()
    header += b" " * (-(len(MAGIC) + 4 + len(header)) % 8)
    prefix = MAGIC + len(header).to_bytes(4, "little") + header
    await responses.send_response(
        request.send,
        200,
        [("Content-Type", CONTENT_TYPE), ("Cache-Control", responses.CACHE_NO_STORE)],
        prefix + body,
    )


# A range's text as ``_text`` accepts it, checked by msgspec as it decodes (length in characters).
# NUL needs no check here: a plain body has no ``\u`` escape, and a raw NUL byte is not JSON.
_Text = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT)]


class _RangeItem(msgspec.Struct, forbid_unknown_fields=True):
    path: _Text
    offset: _Text
    end: _Text


class _ReadsBody(msgspec.Struct, forbid_unknown_fields=True):
    ranges: list[_RangeItem]
    format: str = "frames"


_READS_BODY: Final = msgspec.json.Decoder(_ReadsBody)


def _plain_reads(body: bytes) -> tuple[list[tuple[str, str, str]], str] | None:
    """The ranges and format of a reads body that is exactly the documented shape, every range a
    valid one (``_ranges``' checks), decoded by msgspec against that shape: ~1.0 us a range, where
    ``jsonbody.loads`` (in a worker thread past 64 KiB), ``_list`` and ``_ranges`` took ~1.9 us
    (2,000 ranges, in process). None for any other body (an unknown key, a missing field, a bad text, a ``\\u`` escape,
    not JSON, not UTF-8, ...): the general parse then accepts it or says what is wrong, as it
    always did. A body of this shape nests 3 levels, within ``jsonbody``'s limit. The texts are
    checked by the decoder (``_Text``), not by ``_valid_texts`` after it: 0.63 -> 0.42 us a range
    (docs/benchmarks.md, fanout "Run 23")."""
    if b"\\u" in body:  # an escape may be an unpaired surrogate: ``jsonbody.loads`` refuses it
        return None
    try:
        document = _READS_BODY.decode(body)
    except (msgspec.MsgspecError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    items = document.ranges
    if not 1 <= len(items) <= MAX_RANGES or document.format not in FORMATS:
        return None
    return list(map(_FIELDS, items)), document.format


_FIELDS: Final = attrgetter("path", "offset", "end")


def _valid_texts(ranges: list[tuple[str, str, str]]) -> bool:
    """Every text of ``ranges`` a string of 1 to 4096 characters without NUL (``_text``'s checks)
    by C-level passes over all of them."""
    texts = list(chain.from_iterable(ranges))
    return (
        bool(ranges)
        and set(map(type, texts)) == {str}
        and min(map(len, texts)) > 0
        and max(map(len, texts)) <= MAX_TEXT
        and "\x00" not in "".join(texts)
    )


def _ranges(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Each item's ``(path, offset, end)``, all validated as ``_text`` validates one (its error for
    the first bad one). 10,000 ranges are checked at once with C-level calls (~3 us a range as three
    ``_text`` calls each)."""
    try:
        ranges = [(item["path"], item["offset"], item["end"]) for item in items]
    except KeyError:
        ranges = []
    if _valid_texts(ranges):
        return ranges
    return [
        (_text(item, "path", index), _text(item, "offset", index), _text(item, "end", index))
        for index, item in enumerate(items)
    ]


def _error(exc: ProtocolError) -> dict[str, Any]:
    error: dict[str, Any] = {"status": exc.status, "code": exc.code, "message": exc.message}
    tail = exc.headers.get("Stream-Next-Offset")
    if tail is not None:
        error["tail"] = tail
    return {"error": error}


def check_scope(request: Request, path: str) -> None:
    """A token limited to a prefix reads only streams under it (http/auth.py)."""
    token = request.token
    if token is not None and not token.covers(path):
        raise Forbidden(
            f"this token is limited to streams under '{token.prefix}/'; '{path}' is not"
        )


def require_post(request: Request) -> None:
    if request.method != "POST":
        raise MethodNotAllowed("send the ranges with POST", headers={"Allow": "POST"})


def _list(document: Any, key: str, shape: str, optional: tuple[str, ...]) -> list[dict[str, Any]]:
    if not isinstance(document, dict) or not {key} <= set(document) <= {key, *optional}:
        raise BadRequest(f"the body must be {shape}")
    items = document[key]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_RANGES:
        raise BadRequest(f"'{key}' must be a list of 1 to {MAX_RANGES} entries")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"{key}[{index}] must be a JSON object, got {str(item)[:100]}")
    return items


def _text(item: dict[str, Any], name: str, index: int, *, required: bool = True) -> Any:
    value = item.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > MAX_TEXT:
        got = "it is missing" if name not in item else f"got {repr(value)[:100]}"
        raise BadRequest(
            f"entry {index}: '{name}' must be a non-empty string of at most 4096 characters without "
            f"NUL (a stream path or an offset the server returned); {got}"
        )
    return value


def _count(item: dict[str, Any], name: str, index: int) -> int | None:
    value = item.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise BadRequest(
            f"entry {index}: '{name}' must be an integer from 0 to 2^53-1, got {str(value)[:100]}"
        )
    return value
