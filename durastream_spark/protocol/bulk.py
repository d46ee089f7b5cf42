"""The writes of many streams in a few requests: durastream-server's ``bulk-write`` extension
(docs/extensions.md section 11).

A sink task that routes rows to 2,000 streams would otherwise send, per stream, a ``HEAD`` (and a ``PUT``),
a stage, and the driver a commit: one HTTP exchange each, about a millisecond of CPU on both sides, which
made routing 40,000 rows to 2,000 streams 7.7x slower than to one stream. ``BulkWrites`` sends them in
bulk: ``ensure`` (exists with this content type, created if missing), ``stage``, ``commit`` and ``abort``,
each entry built exactly as its single request (``StreamClient.commit_request``, ``stage_headers``) and
answered on its own: per entry its result, or the typed error its single request would have raised.

Every entry is safe to repeat (stages and commits carry producer headers, ensure and abort are
idempotent), so a whole bulk request is retried like any idempotent request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from requests.structures import CaseInsensitiveDict

from durastream_spark.errors import (
    REQUEST_ID,
    MalformedResponse,
    RequestContext,
    error_from_response,
)
from durastream_spark.protocol import extensions as ext
from durastream_spark.protocol.body import RequestBody, wire_body
from durastream_spark.protocol.client import (
    ProducerLike,
    Reply,
    StreamClient,
    _handles,
    _producer,
    _producer_headers,
    stage_headers,
    stage_result,
)
from durastream_spark.protocol.models import AppendResult, Producer, StageResult

# DEBUG stamps of each bulk request's phases (built, answered, answers parsed): see sink/partition.py.
phases = logging.getLogger("durastream_spark.phases")

# Entries per bulk request. The server takes 10,000, but each entry is a durable write (about 1-5 ms
# of the server's wall time here for a staged commit, an fsync of its own), and a request must stay
# well within requestTimeoutMs (30 s): 4,000 staged commits in one request took 20 s on this machine.
MAX_ENTRIES = 1_000
# Parts per bulk request of multi-part commit entries (``commit_parts``): each is an append of its own
# on the server (~30-40 us of its CPU), so a request of 1,000 streams x 200 partitions stays bounded.
MAX_BULK_PARTS = 10_000
# Parts per multi-part entry: the server takes up to 1,000 (``Durastream-Commit-Parts``).
MAX_ENTRY_PARTS = 1_000
# Bodies per bulk request: well under the server's default --max-body-bytes (64 MiB); an entry larger
# than this travels alone.
MAX_BULK_BYTES = 8 * 1024 * 1024
MAGIC = b"DSR1"
PARTS_HEADER = "Durastream-Commit-Parts"
CONTENT_TYPE = "application/vnd.durastream.multi-request"
# Bulk requests of one call in flight at once (see _concurrently).
PARALLEL_REQUESTS = 4

_T = TypeVar("_T")


@dataclass(frozen=True)
class EnsuredStream:
    """A stream that exists (``created``: by this request): its content type, tail and closure."""

    path: str
    content_type: str
    next_offset: str
    closed: bool
    created: bool


@dataclass(frozen=True)
class StageEntry:
    path: str
    handle: str
    body: bytes | RequestBody
    producer: ProducerLike
    ttl_seconds: int | None = None


@dataclass(frozen=True)
class CommitEntry:
    """A commit of staged ``handles``, or with ``inline`` data instead (then ``key`` is required: an
    inline commit is deduplicated by its key, as a keyed commit of handles is)."""

    path: str
    handles: tuple[str, ...]
    producer: ProducerLike
    key: str | None = None
    inline: bytes | None = None


@dataclass(frozen=True)
class PartsEntry:
    """An inline commit of several parts of one stream (``bulk-write`` 2, ``Durastream-Commit-Parts``):
    part ``i`` is ``bodies[i]`` under producer ``(producer_prefix + suffixes[i], epoch, seq)``, keyed
    by ``key``; the server answers it per part, as if each were its own entry."""

    path: str
    producer_prefix: str
    epoch: int
    seq: int
    key: str
    suffixes: tuple[str, ...]
    bodies: tuple[bytes, ...]


class BulkWrites:
    """Bulk requests through one ``StreamClient`` (its connection, retries and request counts)."""

    def __init__(self, client: StreamClient, content_type: str) -> None:
        self._client = client
        self._content_type = content_type

    def supported(self) -> bool:
        return self._client.extensions().supports(ext.BULK_WRITE)

    def ensure(self, paths: Sequence[str], *, create: bool) -> list[EnsuredStream | Exception]:
        """Per path: the stream as it is (created first with this content type when missing and
        ``create``), or the error (``StreamNotFound``, ``ContentTypeMismatch`` from a racing create)."""
        client = self._client
        url = client.connection.url + ext.ENSURE_PATH

        def chunk(first: int) -> list[EnsuredStream | Exception]:
            out: list[EnsuredStream | Exception] = []
            part = paths[first : first + MAX_ENTRIES]
            body = json.dumps(
                {
                    "streams": [self._wire_path(p) for p in part],
                    "content_type": self._content_type,
                    "create": create,
                },
                separators=(",", ":"),
            ).encode()
            context = RequestContext("POST", url)
            headers = {"Content-Type": "application/json"}
            reply = client._checked(
                "POST", url, context, headers, body=body, ok=(200,), read_only=True
            )
            for path, result in zip(part, self._results(reply, context, len(part)), strict=True):
                where = RequestContext("PUT", client.stream_url(path), stream=path)
                error = self._error(where, result, reply.header(REQUEST_ID))
                if error is not None:
                    out.append(error)
                    continue
                try:
                    out.append(
                        EnsuredStream(
                            path,
                            str(result["content_type"]),
                            str(result["next_offset"]),
                            bool(result["closed"]),
                            bool(result["created"]),
                        )
                    )
                except KeyError as exc:
                    raise MalformedResponse(f"{context.describe()}: missing {exc}") from None
            return out

        return _concurrently(
            [lambda first=first: chunk(first) for first in range(0, len(paths), MAX_ENTRIES)]
        )

    def stage(self, entries: Sequence[StageEntry]) -> list[StageResult | Exception]:
        requests = []
        for entry in entries:
            (handle,) = _handles(entry.handle)
            producer = _producer(entry.producer)
            headers = stage_headers(handle, self._content_type, producer, entry.ttl_seconds)
            requests.append((entry.path, headers, wire_body(entry.body)))

        def result(index: int, reply: Reply) -> StageResult:
            entry = entries[index]
            return stage_result(reply, entry.handle, _producer(entry.producer))

        return self._send(ext.STAGES_PATH, requests, result)

    def commit(self, entries: Sequence[CommitEntry]) -> list[AppendResult | Exception]:
        """Keyed (or plain) commits, each as ``StreamClient.commit`` sends it; per entry its result
        (``duplicate`` for a 204) or its typed error (``DuplicatePayloadMismatch``, ...)."""
        requests = []
        for entry in entries:
            producer = _producer(entry.producer)
            assert producer is not None
            if entry.inline is not None:
                if entry.key is None or not entry.inline:
                    raise ValueError("an inline commit needs a key and a non-empty body")
                headers = {"Content-Type": self._content_type, "Durastream-Commit-Key": entry.key}
                headers.update(_producer_headers(producer, refuse_forgotten=True))
                requests.append((entry.path, headers, entry.inline))
                continue
            headers, body = self._client.commit_request(entry.handles, producer, key=entry.key)
            requests.append((entry.path, headers, body))

        def result(index: int, reply: Reply) -> AppendResult:
            return StreamClient._append_result(reply, _producer(entries[index].producer))

        return self._send(ext.COMMITS_PATH, requests, result, plain_ok=True)

    def supports_parts(self) -> bool:
        """Whether the server takes inline commits of several parts in one entry (bulk-write 2)."""
        return self._client.extensions().supports(ext.BULK_WRITE, ext.BULK_WRITE_PARTS)

    def commit_parts(
        self, entries: Sequence[PartsEntry]
    ) -> list[list[AppendResult | Exception] | Exception]:
        """One entry per stream, holding its parts (``PartsEntry``); per entry the per-part results
        (``duplicate`` for a 204) or typed errors in the order of its parts, or one error for the
        whole entry (a refused entry: nothing of it was applied)."""
        requests = []
        shared: dict[tuple[str, int, int], dict[str, str]] = {}
        for entry in entries:
            if not entry.bodies or len(entry.bodies) != len(entry.suffixes):
                raise ValueError("a parts entry needs one non-empty body per suffix")
            tuple_ = (entry.producer_prefix, entry.epoch, entry.seq)
            base = shared.get(tuple_)
            if base is None:  # the batch's entries share all headers but the parts list
                base = shared[tuple_] = {
                    "Content-Type": self._content_type,
                    "Durastream-Commit-Key": entry.key,
                    **_producer_headers(_producer(tuple_), refuse_forgotten=True),
                }
            headers = dict(base)
            headers[PARTS_HEADER] = ",".join(
                [
                    f"{suffix}:{len(body)}"
                    for suffix, body in zip(entry.suffixes, entry.bodies, strict=True)
                ]
            )
            requests.append((entry.path, headers, b"".join(entry.bodies)))

        def result(index: int, answer: dict[str, Any], request_id: str | None) -> Any:
            entry = entries[index]
            parts = answer.get("parts")
            if not isinstance(parts, list) or len(parts) != len(entry.suffixes):
                raise MalformedResponse(
                    f"POST {ext.COMMITS_PATH} for '{entry.path}': expected {len(entry.suffixes)} "
                    "part answers"
                )
            out: list[AppendResult | Exception] = []
            for suffix, part in zip(entry.suffixes, parts, strict=True):
                plain = _plain_ok(part)
                if plain is not None:  # the usual case, read straight from the answer
                    out.append(plain)
                    continue
                producer = (entry.producer_prefix + suffix, entry.epoch, entry.seq)
                if isinstance(part, dict) and "error" not in part:  # no context needed
                    # Not checked again per part: only its presence matters to the result.
                    out.append(StreamClient._append_result(_reply(None, part), Producer(*producer)))
                    continue
                where = RequestContext(
                    "POST",
                    self._client.stream_url(entry.path),
                    stream=entry.path,
                    producer=producer,
                )
                error = self._error(where, part, request_id)
                out.append(error or StreamClient._append_result(_reply(where, part), None))
            return out

        weights = [len(entry.suffixes) for entry in entries]
        return self._send(ext.COMMITS_PATH, requests, None, answer_of=result, parts=weights)

    def abort(self, entries: Sequence[tuple[str, Sequence[str]]]) -> list[None | Exception]:
        requests = []
        for path, handles in entries:
            headers, body = self._client._handle_list("Durastream-Abort", _handles(handles))
            requests.append((path, headers, body))
        return self._send(ext.COMMITS_PATH, requests, lambda index, reply: None)

    # ---- internals ---------------------------------------------------------------------------------------

    def _wire_path(self, path: str) -> str:
        """The path as in the stream's URL (root-relative, percent-encoded): the server decodes it so."""
        return self._client.stream_url(path)[len(self._client.connection.url) + 1 :]

    def _send(
        self,
        resource: str,
        requests: list[tuple[str, dict[str, str], bytes | RequestBody]],
        result: Any,
        answer_of: Callable[[int, dict[str, Any], str | None], Any] | None = None,
        parts: list[int] | None = None,
        plain_ok: bool = False,
    ) -> list:
        """``plain_ok``: an entry's usual commit answer is read by ``_plain_ok`` (commits only: for
        them it is what ``result`` makes of it)."""
        client = self._client
        url = client.connection.url + resource

        def chunk(first: int, last: int) -> list[Any]:
            out: list[Any] = []
            part = requests[first:last]
            header = json.dumps(
                {
                    "requests": [
                        {"path": self._wire_path(p), "headers": h, "bytes": len(b)}
                        for p, h, b in part
                    ]
                },
                separators=(",", ":"),
            ).encode()
            pieces: list[Any] = [MAGIC, len(header).to_bytes(4, "little"), header]
            for _, _, entry_body in part:
                pieces.extend(entry_body if isinstance(entry_body, RequestBody) else (entry_body,))
            # One buffer, not a piece per entry: ``requests`` sends each piece with its own
            # ``sendall``, and 1,000 small inline parts were 1,000 system calls (~8% of the driver's
            # commit CPU); the copy of at most MAX_BULK_BYTES (plus one large entry) is cheaper.
            body = b"".join(pieces)
            context = RequestContext("POST", url, body_bytes=len(body))
            headers = {"Content-Type": CONTENT_TYPE}
            phases.debug("bulk %s %d built", resource, first)
            reply = client._checked(
                "POST", url, context, headers, body=body, ok=(200,), read_only=True
            )
            phases.debug("bulk %s %d answered", resource, first)
            request_id = reply.header(REQUEST_ID)
            for index, (entry, answer) in enumerate(
                zip(part, self._results(reply, context, len(part)), strict=True), first
            ):
                if plain_ok:
                    plain = _plain_ok(answer)
                    if plain is not None:
                        out.append(plain)
                        continue
                path, entry_headers, _ = entry
                if answer_of is not None and isinstance(answer, dict) and "error" not in answer:
                    out.append(answer_of(index, answer, request_id))
                    continue
                where = RequestContext(
                    "POST",
                    client.stream_url(path),
                    stream=path,
                    producer=_producer_of(entry_headers),
                )
                error = self._error(where, answer, request_id)
                if error is not None:
                    out.append(error)
                    continue
                out.append(result(index, _reply(context, answer)))
            phases.debug("bulk %s %d parsed", resource, first)
            return out

        return _concurrently(
            [
                lambda first=first, last=last: chunk(first, last)
                for first, last in _chunks([len(body) for _, _, body in requests], parts)
            ]
        )

    @staticmethod
    def _results(reply: Reply, context: RequestContext, count: int) -> list[dict[str, Any]]:
        try:
            results = json.loads(reply.body)["results"]
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedResponse(f"{context.describe()}: not a bulk answer: {exc!r}") from None
        if not isinstance(results, list) or len(results) != count:
            raise MalformedResponse(f"{context.describe()}: expected {count} results")
        return results

    def _error(
        self, where: RequestContext, result: Any, request_id: str | None
    ) -> Exception | None:
        """The typed error of a refused entry; it names the bulk request's id (the server logs the bulk
        request, answered 200, not each entry), so the error can still be found in the server's log."""
        if not isinstance(result, dict):
            raise MalformedResponse(f"{where.describe()}: a bulk result is not an object")
        error = result.get("error")
        if error is None:
            return None
        headers = CaseInsensitiveDict(result.get("headers") or {})
        headers["Content-Type"] = "application/json"  # the error body below, as a single request's
        if request_id and REQUEST_ID not in headers:
            headers[REQUEST_ID] = request_id
        return error_from_response(
            where,
            int(result.get("status", 500)),
            headers,
            json.dumps({"error": error}).encode(),
            root=self._client.connection.url,
        )


class _AnswerHeaders(dict):
    """An entry's answered headers, looked up case-insensitively as HTTP headers are. A plain dict of
    lower-cased names: a routed batch's commit answers 20,000 parts, and requests'
    ``CaseInsensitiveDict`` (built, then read six times per part) was about a third of its parsing."""

    def __init__(self, headers: dict[str, Any]) -> None:
        super().__init__((str(name).lower(), value) for name, value in headers.items())

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> Any:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


# The headers of a new keyed commit's answer from durastream-server (``append_answer``), as it spells
# them: an answer with no others is read by ``_plain_ok`` without the general path's objects.
_PLAIN_HEADERS = frozenset(
    {"Stream-Next-Offset", "Cache-Control", "Producer-Epoch", "Producer-Seq"}
)


def _plain_ok(answer: Any) -> AppendResult | None:
    """A part's answer when it is the usual one, a 200 (new data, applied: not a duplicate) with only
    ``_PLAIN_HEADERS`` and numeric producer headers: its ``AppendResult`` read straight from the
    answer's dict, equal to what ``StreamClient._append_result(_reply(...))`` makes of it. ``None``
    for anything else (an error, a 204, other headers or spellings): the general path reads those.

    Why: a routed batch's commit answers ~20,000 parts, nearly all of them this way; the general path
    (an ``_AnswerHeaders``, a ``Reply``, a ``Producer`` and six case-insensitive lookups a part) was
    most of the driver's answer parsing, which runs while the server still works on other requests."""
    if type(answer) is not dict or answer.get("status") != 200 or "error" in answer:
        return None
    headers = answer.get("headers")
    if type(headers) is not dict or not _PLAIN_HEADERS.issuperset(headers):
        return None
    offset = headers.get("Stream-Next-Offset")
    epoch = headers.get("Producer-Epoch")
    seq = headers.get("Producer-Seq")
    if (
        type(offset) is not str
        or (epoch is not None and (type(epoch) is not str or not epoch.isdecimal()))
        or (seq is not None and (type(seq) is not str or not seq.isdecimal()))
    ):
        return None
    return AppendResult(
        status=200,
        next_offset=offset,
        duplicate=False,
        closed=False,
        producer_epoch=None if epoch is None else int(epoch),
        producer_seq=None if seq is None else int(seq),
        txn_messages=None,
        txn_bytes=None,
        digest_verified=None,
    )


def _reply(context: RequestContext | None, answer: dict[str, Any]) -> Reply:
    """An entry's (or a part's) answer as the reply of its single request (status and headers)."""
    try:
        status = int(answer["status"])
        answered = _AnswerHeaders(answer.get("headers") or {})
    except (KeyError, TypeError, ValueError) as exc:
        where = context.describe() if context is not None else f"POST {ext.COMMITS_PATH}"
        raise MalformedResponse(f"{where}: bad entry {exc!r}") from None
    return Reply(status, answered, b"")


def _concurrently(calls: list[Callable[[], list[_T]]]) -> list[_T]:
    """The results of ``calls`` (one bulk request each), concatenated in order; up to
    ``PARALLEL_REQUESTS`` in flight. The entries of a bulk call are independent of each other (no
    order among them: a body may hold any of them), so its requests may overlap: the server applies one
    request's entries while the next is on its way, and their appends share commit rounds (a batch
    routed to 2,000 streams commits 4,000 parts: 4 requests, which waited for each other)."""
    if len(calls) <= 1:
        return [item for call in calls for item in call()]
    with ThreadPoolExecutor(
        max_workers=min(PARALLEL_REQUESTS, len(calls)), thread_name_prefix="durastream-bulk"
    ) as pool:
        futures = [pool.submit(call) for call in calls]
        return [item for future in futures for item in future.result()]


def _chunks(sizes: list[int], parts: list[int] | None = None) -> list[tuple[int, int]]:
    """``[first, last)`` index ranges of at most ``MAX_ENTRIES`` entries, ``MAX_BULK_BYTES`` bodies
    and (with ``parts``, the parts of each multi-part entry) ``MAX_BULK_PARTS`` parts."""
    out: list[tuple[int, int]] = []
    first, total, counted = 0, 0, 0
    for index, size in enumerate(sizes):
        weight = parts[index] if parts is not None else 1
        if index > first and (
            index - first == MAX_ENTRIES
            or total + size > MAX_BULK_BYTES
            or counted + weight > MAX_BULK_PARTS
        ):
            out.append((first, index))
            first, total, counted = index, 0, 0
        total += size
        counted += weight
    if first < len(sizes):
        out.append((first, len(sizes)))
    return out


def _producer_of(headers: dict[str, str]) -> tuple[str, int, int] | None:
    """The producer tuple of an entry's headers (for its error messages)."""
    if "Producer-Id" not in headers:
        return None
    return headers["Producer-Id"], int(headers["Producer-Epoch"]), int(headers["Producer-Seq"])
