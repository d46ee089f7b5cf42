"""``POST {root}/__ds/x-durastream/ensure``, ``.../stages`` and ``.../commits``: the writes of many streams
in one request (extension ``bulk-write``, docs/extensions.md section 11).

A Spark batch that routes its rows to 2,000 streams made, per task and stream, a ``HEAD`` (and a ``PUT``
for a new stream), a stage, and on the driver a commit: about 14,000 HTTP exchanges for 40,000 small rows,
each costing about a millisecond of server CPU, where the same rows to one stream took a handful. These
resources carry those requests in bulk; each entry is still the request it stands for:

- ``ensure``: "this stream exists with this content type (create it if missing), is it open?" for many
  paths: the ``HEAD``-then-``PUT`` a writer does before writing, in one JSON request.
- ``stages`` and ``commits``: staged-append requests (section 5) of many streams in one body. Each entry
  carries the path and the headers of its single request, and its body; it is parsed by ``txn.py`` and
  answered by ``txn.answer`` exactly as that single request would be (status and headers, or the error),
  so every rule of section 5 (producer dedup, commit keys, handle fences) holds per entry unchanged.
  ``stages`` takes only stages, ``commits`` commits and aborts, and *inline* commits: a commit key with
  the data as the body and no handles, appended as one record and deduplicated by the key exactly as a
  keyed commit is (so a writer whose part is one small request stages nothing: no staging file, and the
  append goes into the shared commit rounds of ``storage/committer.py``).

Entries run concurrently, started in request order: an ``ensure``'s new streams and a ``commits`` request's
inline commits are all handed to the engine in one pass over the body (each a future: ``create_nowait``,
``append_nowait``) and awaited together, so their per-entry cost is the engine's work alone and a request's
appends share the commit rounds; stages and commits of handles run at most ``CONCURRENCY`` at a time.
Their order is not an order of application, so a body must not hold two requests where one depends on the
other (two stages of one handle, a stage and the commit of its handle). One entry failing does not fail
the others.

Body of ``stages``/``commits`` (``application/vnd.durastream.multi-request``)::

    offset  size  field
    0       4     magic "DSR1"
    4       4     u32 little-endian: H, the header's length
    8       H     header: JSON {"requests": [{"path": ..., "headers": {...}, "bytes": n}, ...]}
    8 + H   ...   the entries' bodies, concatenated in order (entry i's is its "bytes" long)
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeVar

import msgspec

from durastream_server.engine import contenttype
from durastream_server.engine.api import (
    AppendRequest,
    AppendResult,
    CreateResult,
    StreamInfo,
)
from durastream_server.engine.txnapi import (
    HANDLE_RE,
    HANDLE_SYNTAX,
    AbortRequest,
    CommitRequest,
    StageRequest,
)
from durastream_server.errors import BadRequest, NotFound, ProtocolError
from durastream_server.http import parse, paths, txn
from durastream_server.http.body import parse_json, read_body, read_json_body
from durastream_server.http.collections_hold import BULK
from durastream_server.http.handlers import StreamHandlers
from durastream_server.http.multirange import check_scope, require_post
from durastream_server.storage.records import ProducerTuple

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.http.handlers import Request

MAX_ENTRIES: Final = 10_000
CONCURRENCY: Final = 64
MAGIC: Final = b"DSR1"
CONTENT_TYPE: Final = "application/vnd.durastream.multi-request"
_ENSURE_SHAPE: Final = (
    'a JSON object {"streams": [<path>, ...], "content_type": "...", "create": true} with 1 to '
    f"{MAX_ENTRIES} paths"
)
_REQUESTS_SHAPE: Final = (
    f'"DSR1", a u32 header length, a JSON header {{"requests": [{{"path": ..., "headers": {{...}}, '
    f'"bytes": n}}, ...]}} with 1 to {MAX_ENTRIES} requests, then their bodies'
)

_T = TypeVar("_T")
_ENCODER: Final = msgspec.json.Encoder()
RESOURCES: Final = frozenset({"ensure", "stages", "commits"})


class EnsureBody(NamedTuple):
    """An ``ensure`` request's body, its shape checked (``read_ensure``); ``streams`` as sent."""

    streams: list[Any]
    content_type: str
    create: bool

    def encode(self) -> bytes:
        """This body as JSON (a shard's part of it, under ``--workers N``: shards/bulkwrite.py)."""
        return _ENCODER.encode(
            {"streams": self.streams, "content_type": self.content_type, "create": self.create}
        )


# A bulk request split by shard (``--workers N``, shards/bulkwrite.py): this worker's part of an
# ensure, a stages or a commits request, answered here; the others' are sent to their workers.
EnsureFanOut = Callable[
    ["Request", EnsureBody, Callable[[EnsureBody], Awaitable[list[dict[str, Any]]]]],
    Awaitable[list[dict[str, Any]]],
]
Entry = tuple[str, dict[str, str], bytes]
RequestsFanOut = Callable[
    ["Request", list[Entry], Callable[[list[Entry]], Awaitable[list[dict[str, Any]]]]],
    Awaitable[list[dict[str, Any]]],
]


async def serve_ensure(
    engine: Engine, request: Request, max_body_bytes: int, fan_out: EnsureFanOut | None = None
) -> dict[str, Any]:
    """Per path: the stream's content type, tail and closure, creating it first when missing (and
    ``create`` is true) with ``content_type``, as ``PUT`` would. With ``fan_out`` (``--workers N``),
    each path in its shard's worker."""
    with BULK.held():  # fewer young collections while its entries' objects live (collections_hold)
        body = await read_ensure(request, max_body_bytes)

        async def here(part: EnsureBody) -> list[dict[str, Any]]:
            return await ensure_streams(engine, request, part)

        if fan_out is None:
            return {"results": await here(body)}
        return {"results": await fan_out(request, body, here)}


def ensure_path(request: Request, raw: Any, index: int) -> str:
    """Entry ``index`` of an ``ensure``: its canonical path, in the token's scope (else the error
    naming the entry, answered at that entry)."""
    path = _path(raw, f"streams[{index}]")
    check_scope(request, path)
    return path


async def read_ensure(request: Request, max_body_bytes: int) -> EnsureBody:
    """An ``ensure`` request's body; ``BadRequest`` naming what is wrong with its shape."""
    require_post(request)
    document = await read_json_body(request.receive, request.headers, max_body_bytes, _ENSURE_SHAPE)
    if not isinstance(document, dict) or not {"streams", "content_type"} <= set(document) <= {
        "streams",
        "content_type",
        "create",
    }:
        raise BadRequest(f"the body must be {_ENSURE_SHAPE}")
    listed, content_type, create = (
        document["streams"],
        document["content_type"],
        document.get("create", True),
    )
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_ENTRIES:
        raise BadRequest(f"'streams' must be a list of 1 to {MAX_ENTRIES} paths")
    if not isinstance(content_type, str) or not content_type.strip():
        raise BadRequest(f"'content_type' must be a non-empty string, got {content_type!r}")
    refusal = contenttype.invalid_for_create(content_type, "'content_type'", header=False)
    if refusal is not None:
        raise BadRequest(refusal)
    if not isinstance(create, bool):
        raise BadRequest(f"'create' must be true or false, got {create!r}")
    return EnsureBody(listed, content_type, create)


async def ensure_streams(
    engine: Engine, request: Request, body: EnsureBody
) -> list[dict[str, Any]]:
    """Every entry's answer to ``body``, in order (its streams created here: this worker's)."""
    listed, content_type, create = body
    # One pass: an existing stream is answered at once (a look-up, nothing awaited); the new ones
    # are created as one batch (``create_batch_nowait``: one task, one commit-round wait and one
    # future for all of them; no task, lock or future per stream), awaited below.
    results: list[dict[str, Any]] = [{}] * len(listed)
    creating: list[int] = []
    new_paths: list[str] = []
    for index, raw in enumerate(listed):
        try:
            path = ensure_path(request, raw, index)
            try:
                # None: a new path, without an error built per entry
                info = engine.head_if_any(path)
            except NotFound:  # expired: the create replaces it
                info = None
            if info is None and not create:
                info = engine.head(path)  # head's 404, message and all
        except ProtocolError as exc:
            results[index] = error_answer(exc)
            continue
        if info is None:
            creating.append(index)
            new_paths.append(path)
        else:
            results[index] = _ensured(info, created=False)
    if creating:
        # Shielded: a client going away must not cancel the batch half-way (its streams would be
        # durable but unregistered); it finishes and nobody reads the answers.
        outcomes = await asyncio.shield(engine.create_batch_nowait(new_paths, content_type))
        for index, outcome in zip(creating, outcomes, strict=True):
            if isinstance(outcome, CreateResult):
                results[index] = _ensured(outcome.info, created=outcome.created)
            elif isinstance(outcome, ProtocolError):
                results[index] = error_answer(outcome)
            else:
                raise outcome  # the request's 500, as before
    return results


def _ensured(info: StreamInfo, *, created: bool) -> dict[str, Any]:
    """An ``ensure`` entry's answer: the stream as a ``HEAD`` reports it."""
    return {
        "content_type": info.content_type,
        "next_offset": info.next_offset,
        "closed": info.closed,
        "created": created,
    }


_STAGES: Final = (StageRequest,)
_A_STAGE: Final = "a stage"


async def serve_stages(
    engine: Engine, request: Request, max_body_bytes: int, fan_out: RequestsFanOut | None = None
) -> dict[str, Any]:
    """Stages (``Durastream-Txn``) of many streams; each answered as its own request. With
    ``fan_out`` (``--workers N``), each entry in its stream's shard's worker, where its handle is."""
    return await _serve_txn(engine, request, max_body_bytes, _STAGES, _A_STAGE, fan_out)


def stage_entry(request: Request, entry: Entry, index: int) -> str:
    """Entry ``index`` of a ``stages`` request checked as its serving checks it: its canonical path,
    or the error naming the entry, answered at that entry."""
    raw_path, headers, entry_body = entry
    path = _path(raw_path, f"requests[{index}].path")
    check_scope(request, path)
    if not isinstance(txn.parse_request(path, headers, entry_body), StageRequest):
        raise BadRequest(f"requests[{index}] must be {_A_STAGE} here")
    return path


_COMMITS: Final = (CommitRequest, AbortRequest)
_A_COMMIT: Final = "a commit or an abort"


async def serve_commits(
    engine: Engine, request: Request, max_body_bytes: int, fan_out: RequestsFanOut | None = None
) -> dict[str, Any]:
    """Commits and aborts (``Durastream-Commit``/``-Abort``) of many streams; each answered as its own
    request: one durable record group per stream, as a single commit makes. With ``fan_out``
    (``--workers N``), each entry in its stream's shard's worker."""
    return await _serve_txn(engine, request, max_body_bytes, _COMMITS, _A_COMMIT, fan_out)


def commit_entry(
    request: Request, entry: Entry, index: int, shared: SharedAppendHeaders
) -> tuple[str, AppendRequest | txn.TxnRequest]:
    """Entry ``index`` of a ``commits`` request checked as its serving checks it: its canonical
    path and its parsed request (an inline commit's append, else the commit or abort), or the error
    naming the entry, answered at that entry."""
    raw_path, headers, entry_body = entry
    path = _path(raw_path, f"requests[{index}].path")
    check_scope(request, path)
    if _is_inline_commit(headers):
        if PARTS in headers:  # a stream's parts of several producers: checked as the serving does
            return path, shared.inline_parts(path, headers, entry_body, index)[0]
        return path, shared.inline_commit(path, headers, entry_body, index)
    parsed = txn.parse_request(path, headers, entry_body)
    if not isinstance(parsed, _COMMITS):
        raise BadRequest(f"requests[{index}] must be {_A_COMMIT} here")
    return path, parsed


async def read_requests(request: Request, max_body_bytes: int) -> list[Entry]:
    """The entries of a ``stages``/``commits`` request; ``BadRequest`` naming what is wrong."""
    require_post(request)
    body = await read_body(request.receive, request.headers, max_body_bytes)
    return await _requests(body)


async def _serve_txn(
    engine: Engine,
    request: Request,
    max_body_bytes: int,
    kinds: tuple[type, ...],
    what: str,
    fan_out: RequestsFanOut | None,
) -> dict[str, Any]:
    with BULK.held():  # fewer young collections while its entries' objects live (collections_hold)
        entries = await read_requests(request, max_body_bytes)

        async def here(part: list[Entry]) -> list[dict[str, Any]]:
            return await txn_entries(engine, request, part, kinds, what)

        if fan_out is None:
            return {"results": await here(entries)}
        return {"results": await fan_out(request, entries, here)}


async def txn_entries(
    engine: Engine, request: Request, entries: list[Entry], kinds: tuple[type, ...], what: str
) -> list[dict[str, Any]]:
    """Every entry's answer, in order (each served here: this worker's streams)."""
    results: list[dict[str, Any]] = [{}] * len(entries)
    others: list[tuple[int, tuple[str, dict[str, str], bytes]]] = []
    inline: list[tuple[int, AppendRequest]] = []
    # Entries of several parts (``Durastream-Commit-Parts``): index -> how many of ``inline`` are theirs
    multi: dict[int, int] = {}
    takes_inline = CommitRequest in kinds
    shared = SharedAppendHeaders()
    # One pass: the inline commits (the routed sink's entries, one per part) are parsed here and
    # handed to the engine together (``append_batch``: each checked and staged as
    # ``append_nowait`` would, the whole request's appends staged before the commit thread's next
    # round, which takes them together), and the request waits on one future for all of them: no
    # task, coroutine, future or done callback per entry (docs/benchmarks.md, "Run 5" and "Run 9").
    for index, entry in enumerate(entries):
        raw_path, headers, entry_body = entry
        if not (takes_inline and _is_inline_commit(headers)):
            others.append((index, entry))
            continue
        try:
            path = _path(raw_path, f"requests[{index}].path")
            check_scope(request, path)
            if PARTS in headers:
                appends = shared.inline_parts(path, headers, entry_body, index)
                multi[index] = len(appends)
                inline.extend((index, append) for append in appends)
                continue
            append = shared.inline_commit(path, headers, entry_body, index)
        except ProtocolError as exc:
            results[index] = error_answer(exc)
            continue
        inline.append((index, append))

    async def run(item: tuple[int, tuple[str, dict[str, str], bytes]]) -> dict[str, Any]:
        index, (raw_path, headers, entry_body) = item
        path = _path(raw_path, f"requests[{index}].path")
        check_scope(request, path)
        parsed = txn.parse_request(path, headers, entry_body)
        if not isinstance(parsed, kinds):
            raise BadRequest(f"requests[{index}] must be {what} here")
        status, answer = await txn.answer(engine, parsed)
        return {"status": status, "headers": dict(answer)}

    if others:
        for (index, _), result in zip(others, await _each(others, run), strict=True):
            results[index] = result
    if inline:
        # Staged before the first await: a client going away cancels only this wait; the appends
        # become durable either way.
        batch = engine.append_batch([append for _, append in inline])
        await batch.all_done
        for index in multi:
            results[index] = {"status": 200, "parts": []}
        for (index, append), outcome in zip(inline, batch.outcomes, strict=True):
            if isinstance(outcome, AppendResult):
                status, answer = StreamHandlers.append_answer(append, outcome)
                answered = {"status": status, "headers": dict(answer)}
            elif isinstance(outcome, ProtocolError):
                answered = error_answer(outcome)
            else:
                raise outcome  # as ``_each`` lets it through: the request's 500
            if index in multi:
                results[index]["parts"].append(answered)
            else:
                results[index] = answered
    return results


async def _each(
    items: list[_T], run: Callable[[_T], Awaitable[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``run`` every item, at most ``CONCURRENCY`` at a time, started in order; an item whose run
    raises a protocol error is answered with that error (``{"status", "headers", "error"}``).

    ``CONCURRENCY`` workers take the items in turn: a request of 1,000 entries makes 64 tasks, not
    1,000 tasks waiting on a semaphore (a bulk ensure's per-entry cost is mostly such bookkeeping)."""
    results: list[dict[str, Any]] = [{}] * len(items)
    queue = iter(enumerate(items))

    async def worker() -> None:
        for index, item in queue:
            try:
                results[index] = await run(item)
            except ProtocolError as exc:
                results[index] = error_answer(exc)

    workers = min(CONCURRENCY, len(items))
    if workers == 1:
        await worker()
    else:
        await asyncio.gather(*(worker() for _ in range(workers)))
    return results


PARTS: Final = "durastream-commit-parts"
_PARTS_SENT: Final = "Durastream-Commit-Parts"  # as clients spell it (others take the general path)
MAX_PARTS: Final = 1_000
_PART_SUFFIX: Final = re.compile(r"[A-Za-z0-9._~-]{0,64}")
_PARTS_SYNTAX: Final = (
    "a comma-separated list of <suffix>:<bytes> (1 to 1000 parts; a suffix of up to 64 of "
    "A-Z a-z 0-9 . _ ~ -, each once; bytes a positive integer; the bytes adding up to the body)"
)


def _is_inline_commit(headers: dict[str, str]) -> bool:
    """A commit key without ``Durastream-Commit`` (nor a stage or abort): the data is the body."""
    # Spelled out, not ``any`` over a generator: asked once per entry of every ``commits`` request.
    return (
        txn.KEY in headers
        and txn.TXN not in headers
        and txn.COMMIT not in headers
        and txn.ABORT not in headers
    )


class SharedAppendHeaders:
    """The inline commits of one ``commits`` request, their headers judged once per distinct set.

    A routed sink's request carries one inline commit per (partition, stream), and every entry of a
    partition has the same headers (content type, producer tuple, commit key): only the path and the
    body differ. Judging those headers once per set, not once per entry, takes the request's parse
    of an entry from ~10 to ~4 us (docs/benchmarks.md, sink "Run 12"). Only sets that were accepted
    are kept: an entry whose headers are refused is judged in full, so its error (which names its
    index) is exactly the one ``_inline_commit`` gives."""

    __slots__ = ("_accepted",)

    def __init__(self) -> None:
        self._accepted: dict[tuple[tuple[str, str], ...], AppendRequest] = {}

    def inline_commit(
        self, path: str, headers: dict[str, str], body: bytes, index: int
    ) -> AppendRequest:
        """``_inline_commit(path, headers, body, index)``, its header checks done once per set."""
        key = tuple(headers.items())
        template = self._accepted.get(key)
        if template is None or not body:
            append = _inline_commit(path, headers, body, index)
            self._accepted[key] = append
            return append
        # Every check but the body's (above) is of the headers alone: the set's first entry passed
        # them, so this one does too; it differs only by its path and body.
        return AppendRequest(
            path,
            template.content_type,
            body,
            template.close,
            template.stream_seq,
            template.producer,
            template.refuse_forgotten,
            template.key,
        )

    def inline_parts(
        self, path: str, headers: dict[str, str], body: bytes, index: int
    ) -> list[AppendRequest]:
        """An inline commit of several parts of one stream (``Durastream-Commit-Parts``, bulk-write
        2): one append per part, each under its own producer (``Producer-Id`` + the part's suffix,
        the shared epoch and seq) with its slice of the body, judged and deduplicated exactly as the
        same part sent as an entry of its own. The header checks are done once per set of the other
        headers, as for single-part entries; the parts cost one entry's path, scope and parse."""
        listed = _parts(headers[PARTS], len(body), index)
        shared = {name: value for name, value in headers.items() if name != PARTS}
        first_size = listed[0][1]
        # The set's template (its first entry's append) when these headers were accepted before:
        # no append built and dropped per entry, only each part's own.
        template = self._accepted.get(tuple(shared.items()))
        if template is None:
            template = self.inline_commit(path, shared, body[:first_size], index)
        assert template.producer is not None  # inline_commit requires the producer headers
        base = template.producer
        base_id, epoch, seq = base.producer_id, base.epoch, base.seq
        # The id's latin-1 bytes are one per character (unencodable ones become one "?"), and a
        # suffix is ASCII (``_parts``): the length is the characters'.
        room = parse.MAX_PRODUCER_ID_BYTES - len(base_id)
        content_type, close, stream_seq = template.content_type, template.close, template.stream_seq
        refuse, key = template.refuse_forgotten, template.key
        appends: list[AppendRequest] = []
        at = 0
        for suffix, size in listed:
            if len(suffix) > room:
                raise BadRequest(
                    f"requests[{index}]: Producer-Id with the part suffix {suffix!r} is longer "
                    f"than {parse.MAX_PRODUCER_ID_BYTES} bytes"
                )
            appends.append(
                AppendRequest(
                    path,
                    content_type,
                    body[at : at + size],
                    close,
                    stream_seq,
                    ProducerTuple(base_id + suffix, epoch, seq),
                    refuse,
                    key,
                )
            )
            at += size
        return appends


def _parts(value: str, body_bytes: int, index: int) -> list[tuple[str, int]]:
    """``Durastream-Commit-Parts`` as ``(suffix, bytes)`` pairs; ``BadRequest`` naming the entry,
    the header, the value and what is accepted."""
    pairs: list[tuple[str, int]] = []
    seen: set[str] = set()
    total = 0
    items = value.split(",")
    for item in items:
        suffix, sep, size_text = item.strip().rpartition(":")
        size_text = size_text.strip()
        if (
            not sep
            or not _PART_SUFFIX.fullmatch(suffix)
            or suffix in seen
            or not (size_text.isascii() and size_text.isdigit())
            or len(size_text) > 12
            or int(size_text) == 0
        ):
            raise BadRequest(
                f"requests[{index}]: Durastream-Commit-Parts must be {_PARTS_SYNTAX}, got "
                f"{value[:200]!r} (at {item.strip()[:80]!r})"
            )
        seen.add(suffix)
        size = int(size_text)
        pairs.append((suffix, size))
        total += size
    if not 1 <= len(pairs) <= MAX_PARTS or total != body_bytes:
        raise BadRequest(
            f"requests[{index}]: Durastream-Commit-Parts must be {_PARTS_SYNTAX}; it lists "
            f"{len(pairs)} parts of {total} bytes for a body of {body_bytes} bytes"
        )
    return pairs


def _inline_commit(path: str, headers: dict[str, str], body: bytes, index: int) -> AppendRequest:
    """An inline keyed commit: the body appended as one record under the producer tuple, deduplicated
    by the commit key as a keyed ``Durastream-Commit`` is (a writer that staged nothing, because all it
    had was one small request, commits its data directly; docs/extensions.md section 11)."""
    if not body:
        raise BadRequest(
            f"requests[{index}]: an inline commit (Durastream-Commit-Key) needs a body"
        )
    key = headers[txn.KEY].strip()
    append = parse.append_request(path, headers, body, key)  # judged before the key (as ever)
    if append.producer is None:
        raise BadRequest(
            f"requests[{index}]: an inline commit (Durastream-Commit-Key) requires the producer "
            "headers Producer-Id, Producer-Epoch and Producer-Seq (it is deduplicated by them)"
        )
    if not HANDLE_RE.match(key):
        raise BadRequest(f"Durastream-Commit-Key must be {HANDLE_SYNTAX}, got {headers[txn.KEY]!r}")
    return append


def error_answer(exc: ProtocolError) -> dict[str, Any]:
    """An entry's answer that is an error: as its single request's (status, headers, error)."""
    return {
        "status": exc.status,
        "headers": dict(exc.headers),
        "error": {"code": exc.code, "message": exc.message},
    }


def _path(raw: Any, where: str) -> str:
    """The canonical path of a root-relative, percent-encoded path (as in a stream URL)."""
    if not isinstance(raw, str) or not raw:
        raise BadRequest(
            f"{where} must be a non-empty string (a stream path), got {str(raw)[:100]!r}"
        )
    try:
        path = paths.stream_path(raw.strip("/").encode("utf-8"))
    except paths.InvalidPath as exc:
        raise BadRequest(f"{where} is not a stream path: {exc} (got {raw[:100]!r})") from None
    if path.split("/", 1)[0] == paths.RESERVED_SEGMENT:
        raise BadRequest(f"{where}: '{paths.RESERVED_SEGMENT}' is reserved, not a stream path")
    return path


async def _requests(body: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """The entries of a ``DSR1`` body: ``(path, lower-cased headers, body)``; ``BadRequest`` naming
    what is wrong with the framing."""
    if len(body) < 8 or body[:4] != MAGIC:
        raise BadRequest(f"the body must be {_REQUESTS_SHAPE}")
    size = int.from_bytes(body[4:8], "little")
    if 8 + size > len(body):
        raise BadRequest(f"the header length {size} runs past the body ({len(body)} bytes)")
    document = await parse_json(body[8 : 8 + size], _REQUESTS_SHAPE)
    if not isinstance(document, dict) or set(document) != {"requests"}:
        raise BadRequest(f"the body must be {_REQUESTS_SHAPE}")
    listed = document["requests"]
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_ENTRIES:
        raise BadRequest(f"'requests' must be a list of 1 to {MAX_ENTRIES} entries")
    entries: list[tuple[str, dict[str, str], bytes]] = []
    # Entries with the same headers (a routed sink's partition: all of its entries) share one
    # checked, lower-cased dict; only checked ones are kept. Nobody changes an entry's headers.
    checked: dict[tuple[tuple[Any, Any], ...], dict[str, str]] = {}
    view = memoryview(body)
    at = 8 + size
    for index, item in enumerate(listed):
        if not (
            isinstance(item, dict)
            and "path" in item
            and "headers" in item
            and len(item) == 2 + ("bytes" in item)  # no other field
        ):
            raise BadRequest(
                f'requests[{index}] must be an object {{"path": ..., "headers": {{...}}, "bytes": n}}'
            )
        headers = item["headers"]
        lowered = _checked_headers(headers, checked)
        if lowered is None:
            raise BadRequest(f"requests[{index}].headers must map header names to strings")
        length = item.get("bytes", 0)
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise BadRequest(
                f"requests[{index}].bytes must be a non-negative integer, got {length!r}"
            )
        if at + length > len(body):
            raise BadRequest(
                f"requests[{index}].bytes ({length}) runs past the end of the body; the bodies "
                "together must be exactly what follows the header"
            )
        entries.append((item["path"], lowered, bytes(view[at : at + length])))
        at += length
    if at != len(body):
        raise BadRequest(
            f"{len(body) - at} bytes follow the last entry's body; the bodies together must be "
            "exactly what follows the header"
        )
    return entries


def _checked_headers(
    headers: Any, checked: dict[tuple[tuple[Any, Any], ...], dict[str, str]]
) -> dict[str, str] | None:
    """An entry's headers with lower-cased names, or None if they are not a JSON object of strings;
    the same dict for headers equal to ones already ``checked`` (a look-up instead of a check)."""
    if not isinstance(headers, dict):
        return None
    # A multi-part entry's parts list differs per entry; the rest is its batch's shared set: look
    # that up, and add the list to a copy (the decoded dict is this entry's own).
    parts = headers.pop(_PARTS_SENT, None)
    if parts is not None:
        shared = _checked_headers(headers, checked)
        if shared is None or not isinstance(parts, str):
            return None
        return {**shared, PARTS: parts}
    key = tuple(headers.items())
    try:
        lowered = checked.get(key)
    except TypeError:  # a value that cannot be hashed (a list, an object): not a string either
        return None
    if lowered is None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in key):
            return None
        lowered = checked[key] = {name.lower(): value for name, value in key}
    return lowered


def answer_body(document: dict[str, Any]) -> bytes:
    """A bulk answer's JSON body: msgspec's encoder, the same bytes as ``json.dumps`` with
    ``separators=(",", ":")`` and ``ensure_ascii=False`` for these documents (strings, integers,
    booleans, ``None``), in a fifteenth of the time: ~1.1 us less per entry, 10,000 entries an
    answer (docs/benchmarks.md, sink "Run 12")."""
    return _ENCODER.encode(document)


def encode_requests(entries: list[tuple[str, dict[str, str], bytes]]) -> bytes:
    """A ``DSR1`` body: a shard's part of a ``commits`` request (shards/bulkwrite.py), tests and
    benchmarks (the connector has its own writer)."""
    header = _ENCODER.encode(
        {"requests": [{"path": p, "headers": h, "bytes": len(b)} for p, h, b in entries]}
    )
    return MAGIC + len(header).to_bytes(4, "little") + header + b"".join(b for _, _, b in entries)
