"""``StreamClient``: the Durable Streams protocol (and durastream's extensions) over ``requests``.

One method per protocol operation, each one HTTP exchange (plus retries), each returning a frozen result or
raising a typed error from ``errors.py``. What the client guarantees, so that the source and sink can rely on
it:

- **Nothing is swallowed.** Every status other than the documented successes raises; a 204 from a producer
  append is reported as ``duplicate=True`` (delivered exactly once), never confused with a failure.
- **Nothing is repeated that could apply twice** (``retry.py``): plain appends are sent once.
- **Nothing is read that is not there** (hazard 41): HEAD, 204 and 304 responses are never read for a body.
- **Nothing is silently unbounded.** Operations that need an extension (``end=``, ``format=frames``,
  ``lookup=limit``, listing, staged appends) check the server's advertisement first and raise
  ``ExtensionNotSupported`` before sending: a base-protocol server ignores unknown query parameters and would
  answer with more data than asked for, or treat a stage as a visible append.
- Query parameters are sorted by name (spec 10.1) so identical reads produce identical, cacheable URLs.
- No redirects are followed: they could carry the user's headers to another host.

The client holds no session and no socket: it is cheap to create and picklable (injected clocks do not survive
pickling; an unpickled client uses the real ones). Connections come from ``session.get_session``, one pool per
worker process.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import requests
import urllib3

from durastream_spark.errors import (
    REQUEST_ID,
    BadRequest,
    ConflictError,
    ContentTypeMismatch,
    DuplicatePayloadMismatch,
    DurastreamError,
    ExtensionNotSupported,
    MalformedResponse,
    RequestContext,
    TxnNotFound,
    UnverifiedDuplicate,
    error_from_response,
    parse_error_body,
)
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol import extensions as ext
from durastream_spark.protocol.auth import request_headers
from durastream_spark.protocol.body import RequestBody, wire_body
from durastream_spark.protocol.extensions import NO_EXTENSIONS, Extensions
from durastream_spark.protocol.models import (
    FRAMES,
    FRAMES_LINES,
    RAW,
    READ_FORMATS,
    AppendResult,
    ChangePage,
    CreateResult,
    LimitLookup,
    MultiReadChunk,
    Producer,
    RangeAnswer,
    ReadChunk,
    StageResult,
    StreamChange,
    StreamColumns,
    StreamInfo,
    StreamMeta,
    TimeLookup,
    normalize_content_type,
)
from durastream_spark.protocol.retry import Retrier, request_is_idempotent
from durastream_spark.protocol.session import get_session

log = logging.getLogger(__name__)

FRAMES_CONTENT_TYPE = "application/vnd.durastream.frames"
MULTI_FRAMES_CONTENT_TYPE = "application/vnd.durastream.multi-frames"
MAX_PRODUCER_INT = 2**53 - 1
_HANDLE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_NO_BODY_STATUSES = frozenset({204, 304})

ProducerLike = Producer | tuple[str, int, int]


@dataclass(frozen=True)
class Reply:
    """One HTTP response, body already read (or deliberately not read)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def flag(self, name: str) -> bool:
        """Protocol booleans: present with value ``true`` (case-insensitive), anything else is false."""
        return (self.headers.get(name) or "").strip().lower() == "true"


def _producer(value: ProducerLike | None) -> Producer | None:
    if value is None:
        return None
    producer = Producer(*value)
    if not isinstance(producer.id, str) or not producer.id or not producer.id.isprintable():
        raise ValueError(f"producer id must be a non-empty printable string, got {producer.id!r}")
    for name, number in (("epoch", producer.epoch), ("seq", producer.seq)):
        if isinstance(number, bool) or not isinstance(number, int):
            raise ValueError(f"producer {name} must be an int, got {number!r}")
        if not 0 <= number <= MAX_PRODUCER_INT:
            raise ValueError(f"producer {name} must be in [0, 2**53-1], got {number}")
    return producer


def _producer_headers(
    producer: Producer | None, *, refuse_forgotten: bool = False
) -> dict[str, str]:
    if producer is None:
        return {}
    headers = {
        "Producer-Id": producer.id,
        "Producer-Epoch": str(producer.epoch),
        "Producer-Seq": str(producer.seq),
    }
    if refuse_forgotten:
        # docs/extensions.md section 8: a request that may repeat a forgotten producer's is refused
        # (409 PRODUCER_FORGOTTEN) instead of taken for new data. Other servers ignore the header.
        headers["Durastream-Forgotten-Producer"] = "refuse"
    return headers


def _digest_verified(reply: Reply) -> bool | None:
    value = (reply.header("Durastream-Digest") or "").strip().lower()
    return {"match": True, "unknown": False}.get(value)


def _handles(handles: str | Sequence[str]) -> list[str]:
    listed = [handles] if isinstance(handles, str) else list(handles)
    if not listed:
        raise ValueError("at least one transaction handle is required")
    for handle in listed:
        if not isinstance(handle, str) or not _HANDLE.match(handle):
            raise ValueError(
                f"transaction handles are 1-200 chars of [A-Za-z0-9._:-], got {handle!r}"
            )
    return listed


def stage_headers(
    handle: str, content_type: str, producer: Producer | None, ttl_seconds: int | None
) -> dict[str, str]:
    """The headers of a stage request (also an entry of a bulk stage, ``protocol/bulk.py``)."""
    headers = {"Durastream-Txn": handle, "Content-Type": content_type}
    headers.update(_producer_headers(producer))
    if ttl_seconds is not None:
        headers["Durastream-Txn-TTL"] = str(int(ttl_seconds))
    return headers


def stage_result(reply: Reply, handle: str, producer: Producer | None) -> StageResult:
    return StageResult(
        handle=handle,
        messages=_int_header(reply, "Durastream-Txn-Messages"),
        bytes=_int_header(reply, "Durastream-Txn-Bytes"),
        duplicate=producer is not None and reply.status == 204,
        expires_at=reply.header("Durastream-Txn-Expires-At"),
    )


def _read_body(response: requests.Response) -> bytes:
    """The whole body in one read.

    ``response.content`` reads in 10 KiB pieces and joins them, which costs about twice the CPU of one read
    for the 1 MiB chunks a source task reads. The urllib3 errors are mapped to the exceptions
    ``response.content`` raises, so that ``retry.py`` classifies a broken body exactly as before.
    """
    try:
        return response.raw.read(decode_content=True)
    except urllib3.exceptions.SSLError as exc:
        raise requests.exceptions.SSLError(exc, response=response) from exc
    except urllib3.exceptions.ProtocolError as exc:  # includes IncompleteRead (a truncated body)
        raise requests.exceptions.ChunkedEncodingError(exc, response=response) from exc
    except urllib3.exceptions.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc, response=response) from exc
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc, response=response) from exc


def query_string(params: Mapping[str, object | None]) -> str:
    """``?a=1&b=2`` with keys sorted lexicographically (spec 10.1) and values percent-encoded."""
    items = sorted(
        ((key, value) for key, value in params.items() if value is not None), key=lambda kv: kv[0]
    )
    if not items:
        return ""
    return "?" + "&".join(
        f"{quote(key, safe='')}={quote(str(value), safe='')}" for key, value in items
    )


def _int_header(reply: Reply, name: str) -> int | None:
    value = reply.header(name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


class RequestCounts:
    """Requests a client sent (answered, whatever the status) and the retries among their attempts.
    Thread-safe: a task's writer sends from a pool of threads."""

    __slots__ = ("_lock", "requests", "retries")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.retries = 0

    def add(self, attempts: int) -> None:
        with self._lock:
            self.requests += 1
            self.retries += attempts - 1

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.requests, self.retries


MAX_RANGES = 10_000  # ranges per multi-range request (docs/extensions.md section 10)


@dataclass(frozen=True)
class RangeLookup:
    """One range of a multi-range limit lookup (``None``: no limit / up to the tail)."""

    path: str
    offset: str
    end: str | None = None
    max_messages: int | None = None
    max_bytes: int | None = None

    def as_json(self) -> dict[str, object]:
        fields = {
            "path": self.path,
            "offset": self.offset,
            "end": self.end,
            "max_messages": self.max_messages,
            "max_bytes": self.max_bytes,
        }
        return {key: value for key, value in fields.items() if value is not None}


def _stream_infos(entries: list[Any]) -> list[StreamInfo]:
    return [_stream_info(entry) for entry in entries]


def _stream_columns(entries: list[Any]) -> StreamColumns:
    """A listing page's entries as columns, each value as ``_stream_info`` makes it."""
    return StreamColumns(
        list(map(str, [entry["path"] for entry in entries])),
        list(map(str, [entry["content_type"] for entry in entries])),
        list(map(str, [entry["next_offset"] for entry in entries])),
        list(map(bool, [entry["closed"] for entry in entries])),
    )


_Page = TypeVar("_Page")


def _stream_info(entry: Mapping[str, Any]) -> StreamInfo:
    return StreamInfo(
        str(entry["path"]),
        str(entry["content_type"]),
        str(entry["next_offset"]),
        bool(entry["closed"]),
    )


def _range_error(context: RequestContext, entry: Any, reply: Reply) -> Exception | None:
    """The typed error a single request would have raised, for a failed entry of a multi-range answer.

    It keeps the ``X-Request-Id`` of the multi-range ``reply`` that carried it: that is the request the
    server logged, so the connector's error can be matched to the server's log line."""
    if not isinstance(entry, Mapping):
        return MalformedResponse(
            f"{context.describe()}: a multi-range entry is not an object{_request_id_note(reply)}"
        )
    error = entry.get("error")
    if error is None:
        return None
    if not isinstance(error, Mapping) or not isinstance(error.get("status"), int):
        return MalformedResponse(
            f"{context.describe()}: malformed error entry {error!r}{_request_id_note(reply)}"
        )
    headers = {"Content-Type": "application/json"}
    request_id = reply.header(REQUEST_ID)
    if request_id:
        headers[REQUEST_ID] = request_id
    if isinstance(error.get("tail"), str):
        headers["Stream-Next-Offset"] = error["tail"]
    body = json.dumps({"error": {"code": error.get("code"), "message": error.get("message")}})
    return error_from_response(context, int(error["status"]), headers, body.encode())


def _request_id_note(reply: Reply) -> str:
    """`` [request id X]`` for messages about an answer that is not an error status (malformed, unexpected),
    so they too can be matched to the server's log line."""
    request_id = reply.header(REQUEST_ID)
    return f" [request id {request_id}]" if request_id else ""


def _limit_lookup(document: Mapping[str, Any], context: RequestContext) -> LimitLookup:
    try:
        return LimitLookup(
            start=str(document["start"]),
            end=str(document["end"]),
            messages=int(document["messages"]),
            bytes=int(document["bytes"]),
            tail=str(document["tail"]),
            closed=bool(document["closed"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedResponse(
            f"{context.describe()}: malformed limit lookup answer: missing or bad field {exc}"
        ) from None


def _multi_read(
    reply: Reply,
    context: RequestContext,
    ranges: Sequence[tuple[str, str, str]],
    stream_url: Callable[[str], str],
) -> MultiReadChunk:
    """Check and split a multi-range read answer (layout in docs/extensions.md section 10)."""
    body = reply.body
    if normalize_content_type(reply.header("Content-Type")) != MULTI_FRAMES_CONTENT_TYPE:
        raise MalformedResponse(f"{context.describe()}: not a multi-frames answer")
    if len(body) < 8 or body[:4] != b"DSM1":
        raise MalformedResponse(f"{context.describe()}: multi-frames body without its header")
    length = int.from_bytes(body[4:8], "little")
    frames_at = 8 + length
    if frames_at > len(body) or frames_at % 8:
        raise MalformedResponse(f"{context.describe()}: bad multi-frames header length {length}")
    try:
        entries = json.loads(body[8:frames_at])["ranges"]
    except (ValueError, KeyError, TypeError) as exc:
        raise MalformedResponse(f"{context.describe()}: bad multi-frames header: {exc}") from None
    if not isinstance(entries, list) or not 1 <= len(entries) <= len(ranges):
        raise MalformedResponse(f"{context.describe()}: the answer covers no range, or too many")

    def where(path: str, start: str, end: str) -> RequestContext:
        return RequestContext("GET", stream_url(path), stream=path, offset=start, end=end)

    answers: list[RangeAnswer] = []
    for index, ((path, start, end), entry) in enumerate(zip(ranges, entries, strict=False)):
        # The context (its URL quoted) only for an error or a refusal: built for each of the 2,000
        # entries of an answer, it was most of the ~20 ms the reading thread spent on one.
        if type(entry) is not dict or "error" in entry:
            error = _range_error(where(path, start, end), entry, reply)
            if error is not None:
                if isinstance(error, MalformedResponse):
                    raise error
                answers.append(RangeAnswer(0, None, False, error))
                continue
        try:
            messages, next_offset = int(entry["messages"]), str(entry["next_offset"])
            reached = bool(entry["end_reached"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedResponse(
                f"{where(path, start, end).describe()}: bad multi-frames entry: {exc}"
            ) from None
        if next_offset > end or reached != (next_offset == end):
            raise MalformedResponse(
                f"{where(path, start, end).describe()}: a read bounded by end {end} stopped at {next_offset} "
                f"(end reached: {reached}). Refusing the data."
            )
        if not reached and index != len(entries) - 1:
            raise MalformedResponse(
                f"{where(path, start, end).describe()}: only the last range may be cut short"
            )
        answers.append(RangeAnswer(messages, next_offset, reached))
    return MultiReadChunk(tuple(answers), body, frames_at)


class StreamClient:
    """Protocol client for one server (``connection.url`` is the stream root). Thread-safe."""

    def __init__(
        self,
        connection: ConnectionOptions,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        extensions: Extensions | None = None,
    ) -> None:
        self.connection = connection
        self._retrier = Retrier(
            connection.retry, sleep=sleep, clock=clock, wall_clock=wall_clock, rng=rng
        )
        # Known in advance when the driver already asked (Spark tasks get it with their partition), so
        # that a task does not spend a discovery request before its first read.
        self._extensions: Extensions | None = extensions
        # Logical requests answered and the retries they took: a task's figures travel in its commit
        # message, the driver's are measured around a commit (sink/commit.py).
        self.counts = RequestCounts()

    def __getstate__(self) -> dict[str, Any]:
        return {"connection": self.connection, "extensions": self._extensions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["connection"])  # type: ignore[misc]
        self._extensions = state["extensions"]

    def __repr__(self) -> str:
        return f"StreamClient({self.connection.url!r})"

    # ---- addressing -------------------------------------------------------------------------------------

    def stream_url(self, path: str) -> str:
        """Absolute URL of the stream at ``path`` (relative to the root; segments percent-encoded)."""
        if not isinstance(path, str):
            raise TypeError(f"stream path must be a str, got {type(path).__name__}")
        clean = path.strip("/")
        segments = clean.split("/")
        if not clean or any(segment in ("", ".", "..") for segment in segments):
            raise ValueError(
                f"invalid stream path {path!r}: it needs non-empty segments other than '.' and '..'"
            )
        return f"{self.connection.url}/{quote(clean, safe='/')}"

    # ---- extensions -------------------------------------------------------------------------------------

    def extensions(self) -> Extensions:
        """What the server advertises. Taken from the ``Durastream-Extensions`` header of any response seen;
        before the first one, from the discovery endpoint (404 or no header: no extensions)."""
        if self._extensions is not None:
            return self._extensions
        url = self.connection.url + ext.DISCOVERY_PATH
        context = RequestContext("GET", url)
        reply, attempts, _ = self._send("GET", url, context, {})
        if self._extensions is not None:  # the header was on the reply
            return self._extensions
        found = NO_EXTENSIONS
        if reply.status == 200:
            try:
                found = Extensions.from_document(json.loads(reply.body))
            except ValueError:
                found = NO_EXTENSIONS
        elif reply.status not in (400, 404, 405):
            raise self._error(context, reply, attempts)
        log.info(
            "%s advertises protocol extensions: %s", self.connection.url, found.versions or "none"
        )
        self._extensions = found
        return found

    def _require(self, name: str, purpose: str, *, version: int = 1) -> None:
        if not self.extensions().supports(name, version):
            raise ExtensionNotSupported(name, self.connection.url, purpose, version=version)

    # ---- metadata ---------------------------------------------------------------------------------------

    def head(self, path: str) -> StreamMeta:
        url = self.stream_url(path)
        context = RequestContext("HEAD", url, stream=path)
        reply = self._checked("HEAD", url, context, {}, ok=(200,))
        return StreamMeta(
            path=path,
            content_type=reply.header("Content-Type") or "application/octet-stream",
            next_offset=self._required_header(reply, "Stream-Next-Offset", context),
            closed=reply.flag("Stream-Closed"),
            ttl_seconds=_int_header(reply, "Stream-TTL"),
            expires_at=reply.header("Stream-Expires-At"),
            extensions=self._extensions or NO_EXTENSIONS,
        )

    def create(
        self,
        path: str,
        content_type: str = "application/json",
        *,
        ttl_seconds: int | None = None,
        expires_at: str | None = None,
        closed: bool = False,
        body: bytes | None = None,
        forked_from: str | None = None,
        fork_offset: str | None = None,
    ) -> CreateResult:
        """Create the stream, or confirm it exists with this configuration (PUT is idempotent).

        An existing stream with another content type raises ``ContentTypeMismatch`` naming both types.
        ``forked_from`` (a root-relative stream path) and ``fork_offset`` (an offset the server returned)
        create a fork (spec 4.2): it holds the source's data before ``fork_offset``, whatever is appended
        to the source later. Pass the source's content type: servers compare it when the fork exists.
        """
        url = self.stream_url(path)
        headers = {"Content-Type": content_type}
        if forked_from is not None:
            headers["Stream-Forked-From"] = urlsplit(self.stream_url(forked_from)).path
        if fork_offset is not None:
            if forked_from is None:
                raise ValueError("fork_offset needs forked_from")
            headers["Stream-Fork-Offset"] = fork_offset
        if ttl_seconds is not None:
            headers["Stream-TTL"] = str(int(ttl_seconds))
        if expires_at is not None:
            headers["Stream-Expires-At"] = expires_at
        if closed:
            headers["Stream-Closed"] = "true"
        context = RequestContext(
            "PUT", url, stream=path, content_type=content_type, body_bytes=len(body or b"")
        )
        try:
            reply = self._checked("PUT", url, context, headers, body=body, ok=(200, 201))
        except ConflictError as error:
            raise self._explain_create_conflict(path, content_type, error) from error
        return CreateResult(
            path=path,
            created=reply.status == 201,
            content_type=reply.header("Content-Type") or content_type,
            next_offset=reply.header("Stream-Next-Offset"),
            closed=reply.flag("Stream-Closed"),
        )

    def _explain_create_conflict(
        self, path: str, requested: str, error: ConflictError
    ) -> DurastreamError:
        try:
            existing = self.head(path).content_type
        except DurastreamError:
            return error
        if normalize_content_type(existing) == normalize_content_type(requested):
            return error
        mismatch = ContentTypeMismatch(
            f"Stream '{path}' already exists with content type '{existing}', but '{requested}' was "
            "requested. Write with the stream's content type, or use another stream.",
            context=RequestContext(
                "PUT", self.stream_url(path), stream=path, content_type=requested
            ),
            status=error.status,
            code=error.code,
            headers=error.headers,
            server_message=error.server_message,
            attempts=error.attempts,
        )
        mismatch.requested = requested
        mismatch.existing = existing
        return mismatch

    def delete(self, path: str) -> None:
        url = self.stream_url(path)
        self._checked("DELETE", url, RequestContext("DELETE", url, stream=path), {}, ok=(200, 204))

    # ---- writes -----------------------------------------------------------------------------------------

    def append(
        self,
        path: str,
        body: bytes | RequestBody,
        content_type: str,
        *,
        producer: ProducerLike | None = None,
        close: bool = False,
        stream_seq: str | None = None,
        require_verified: bool = False,
        refuse_forgotten: bool = True,
    ) -> AppendResult:
        """POST ``body``. With ``producer=(id, epoch, seq)`` it is retried safely and a 204 is a duplicate
        (delivered). Without, it is sent once (hazard 11). ``close=True`` closes the stream atomically.

        Producer requests ask the server to refuse (``ProducerForgottenError``) rather than accept a
        request that may repeat one of a producer it has forgotten (``refuse_forgotten=False``: a
        forgotten producer is new, the protocol's rule; for ids whose groups do not count epochs alike). ``require_verified``: a duplicate
        the server says it could not compare (``Durastream-Digest: unknown``, from servers with
        ``payload-digest`` >= 2) raises ``UnverifiedDuplicate`` (docs/extensions.md, sections 6 and 7).

        For JSON streams ``body`` is what the protocol expects: one JSON value, or an array whose elements
        become messages (the caller frames it).
        """
        body = wire_body(body)
        if not body and not close:
            raise ValueError(
                "an append needs a non-empty body (an empty body is only valid with close=True)"
            )
        checked = _producer(producer)
        headers = _producer_headers(checked, refuse_forgotten=refuse_forgotten)
        if body:
            headers["Content-Type"] = content_type
        if close:
            headers["Stream-Closed"] = "true"
        if stream_seq is not None:
            if not stream_seq or any(ch in stream_seq for ch in "\r\n"):
                raise ValueError(f"invalid Stream-Seq {stream_seq!r}")
            headers["Stream-Seq"] = stream_seq
        url = self.stream_url(path)
        context = RequestContext(
            "POST",
            url,
            stream=path,
            producer=tuple(checked) if checked else None,  # type: ignore[arg-type]
            content_type=content_type,
            body_bytes=len(body),
        )
        reply = self._checked("POST", url, context, headers, body=body, ok=(200, 204))
        result = self._append_result(reply, checked)
        if require_verified and result.duplicate and result.digest_verified is False:
            raise UnverifiedDuplicate(
                f"{context.describe()}: the server already applied producer '{checked.id}' (epoch "
                f"{checked.epoch}, seq {checked.seq}) but no longer remembers what that request "
                "contained, so it cannot confirm this one is the same (a retry or replay older than "
                "the digests it keeps). Nothing of this request was written. See docs/guarantees.md, "
                "'When the server has forgotten a producer'.",
                context=context,
                status=reply.status,
                code=None,
                headers={},
                server_message=None,
            )
        return result

    def close(self, path: str, *, producer: ProducerLike | None = None) -> AppendResult:
        """Close the stream (idempotent). With a producer, the close takes part in its sequencing."""
        return self.append(path, b"", "", producer=producer, close=True)

    @staticmethod
    def _append_result(reply: Reply, producer: Producer | None) -> AppendResult:
        return AppendResult(
            status=reply.status,
            next_offset=reply.header("Stream-Next-Offset"),
            duplicate=producer is not None and reply.status == 204,
            closed=reply.flag("Stream-Closed"),
            producer_epoch=_int_header(reply, "Producer-Epoch"),
            producer_seq=_int_header(reply, "Producer-Seq"),
            txn_messages=_int_header(reply, "Durastream-Txn-Messages"),
            txn_bytes=_int_header(reply, "Durastream-Txn-Bytes"),
            digest_verified=_digest_verified(reply),
        )

    # ---- staged (transactional) appends -----------------------------------------------------------------

    def stage(
        self,
        path: str,
        handle: str,
        body: bytes | RequestBody,
        content_type: str,
        *,
        producer: ProducerLike | None = None,
        ttl_seconds: int | None = None,
    ) -> StageResult:
        """Stage ``body`` under ``handle``: invisible to readers until ``commit``. With a producer (whose
        sequence is the handle's own) the request is retried safely; without, it is sent once."""
        self._require(ext.STAGED_APPEND, "stage data invisibly before a commit")
        body = wire_body(body)
        if not body:
            raise ValueError("a stage request needs a non-empty body")
        (handle,) = _handles(handle)
        checked = _producer(producer)
        headers = stage_headers(handle, content_type, checked, ttl_seconds)
        url = self.stream_url(path)
        context = RequestContext(
            "POST",
            url,
            stream=path,
            producer=tuple(checked) if checked else None,  # type: ignore[arg-type]
            content_type=content_type,
            body_bytes=len(body),
        )
        reply = self._checked("POST", url, context, headers, body=body, ok=(200, 204))
        return stage_result(reply, handle, checked)

    def commit(
        self,
        path: str,
        handles: str | Sequence[str],
        producer: ProducerLike,
        *,
        close: bool = False,
        stream_seq: str | None = None,
        key: str | None = None,
    ) -> AppendResult:
        """Make the handles' staged data part of the stream, atomically, in the listed order. A producer
        request like any append: a repeat is a 204 duplicate, a stale epoch 403, a gap 409.

        ``key`` (``Durastream-Commit-Key``, staged-append version 2): the tuple is deduplicated by the
        key instead of the handle list, so a commit re-made with other handles is a 204, and a tuple
        used by anything else is 409 ``DuplicatePayloadMismatch``.
        """
        self._require(ext.STAGED_APPEND, "commit staged data")
        checked = _producer(producer)
        if checked is None:
            raise ValueError("commit needs producer=(id, epoch, seq)")
        headers, body = self.commit_request(handles, checked, close, stream_seq, key)
        url = self.stream_url(path)
        context = RequestContext("POST", url, stream=path, producer=tuple(checked))  # type: ignore[arg-type]
        reply = self._checked("POST", url, context, headers, body=body, ok=(200, 204))
        return self._append_result(reply, checked)

    def commit_request(
        self,
        handles: str | Sequence[str],
        producer: Producer,
        close: bool = False,
        stream_seq: str | None = None,
        key: str | None = None,
    ) -> tuple[dict[str, str], bytes]:
        """The headers and body of a commit (also an entry of a bulk commit, ``protocol/bulk.py``)."""
        headers, body = self._handle_list("Durastream-Commit", _handles(handles))
        headers.update(_producer_headers(producer, refuse_forgotten=True))
        if key is not None:
            (key,) = _handles(key)  # the same syntax as a handle name
            self._require(
                ext.STAGED_APPEND, "commit under a key", version=ext.STAGED_APPEND_LISTS_AND_KEYS
            )
            headers["Durastream-Commit-Key"] = key
        if close:
            headers["Stream-Closed"] = "true"
        if stream_seq is not None:
            headers["Stream-Seq"] = stream_seq
        return headers, body

    def committed_under_key(self, path: str, producer: ProducerLike, key: str) -> bool:
        """Whether ``producer``'s tuple was used by a commit with ``key`` (True) or by anything else, or
        by nothing (False). Changes nothing: a keyed commit naming a handle nobody staged is sent, and
        the server checks the tuple before the handles (204: that commit; 409: something else; 404
        ``TxnNotFound``: the tuple is unused). A server without commit keys does not answer 204.

        It does not require the extension advertisement: it is asked after a 409
        ``DUPLICATE_PAYLOAD_MISMATCH``, which only a server with payload digests sends, even where a
        proxy hides the advertisement.
        """
        checked = _producer(producer)
        if checked is None:
            raise ValueError("committed_under_key needs producer=(id, epoch, seq)")
        (key,) = _handles(key)
        headers = {
            "Durastream-Commit": f"probe-{uuid.uuid4().hex}",  # never staged by anyone
            "Durastream-Commit-Key": key,
            **_producer_headers(checked),
        }
        url = self.stream_url(path)
        context = RequestContext("POST", url, stream=path, producer=tuple(checked))  # type: ignore[arg-type]
        reply, attempts, idempotent = self._send("POST", url, context, headers, b"")
        if reply.status == 204:
            return True
        error = self._error(context, reply, attempts, idempotent)
        if isinstance(error, DuplicatePayloadMismatch | TxnNotFound | BadRequest):
            return False  # another request has the tuple; nobody has it; commits unknown here
        raise error

    def abort(self, path: str, handles: str | Sequence[str]) -> None:
        """Discard staged handles (idempotent)."""
        self._require(ext.STAGED_APPEND, "abort staged data")
        listed = _handles(handles)
        url = self.stream_url(path)
        headers, body = self._handle_list("Durastream-Abort", listed)
        context = RequestContext("POST", url, stream=path)
        self._checked("POST", url, context, headers, body=body, ok=(200, 204))

    def _handle_list(self, header: str, handles: list[str]) -> tuple[dict[str, str], bytes]:
        """The handles in the body (``<header>: @body``) where the server takes that, which has no size
        limit short of 10,000 handles; else in the header, which the server's header limit caps (32
        KiB by default: about 1,000 handles)."""
        listed = ",".join(handles)
        if self.extensions().supports(ext.STAGED_APPEND, ext.STAGED_APPEND_LISTS_AND_KEYS):
            return {header: "@body"}, listed.encode("ascii")
        return {header: listed}, b""

    # ---- reads ------------------------------------------------------------------------------------------

    def read(self, path: str, offset: str, end: str | None = None, format: str = RAW) -> ReadChunk:
        """One catch-up GET from ``offset`` (``-1`` = start), at most one server chunk.

        ``end`` bounds the read to ``[offset, end)`` (bounded-read extension): replay-deterministic whatever
        is appended later. ``format`` ``frames``/``frames-lines`` returns whole messages with their positions
        and timestamps (message-frames extension; decode with ``frames.decode_frames``).
        """
        if format not in READ_FORMATS:
            raise ValueError(f"format must be one of {READ_FORMATS}, got {format!r}")
        if end is not None:
            self._require(ext.BOUNDED_READ, f"read stream '{path}' up to end offset {end} exactly")
        if format in (FRAMES, FRAMES_LINES):
            self._require(ext.MESSAGE_FRAMES, f"read stream '{path}' as {format}")
        base = self.stream_url(path)
        params: dict[str, object | None] = {"offset": offset, "end": end}
        if format != RAW:
            params["format"] = format
        context = RequestContext("GET", base, stream=path, offset=offset, end=end)
        reply = self._checked("GET", base + query_string(params), context, {}, ok=(200,))
        next_offset = self._required_header(reply, "Stream-Next-Offset", context)
        content_type = reply.header("Content-Type") or ""
        if format != RAW and normalize_content_type(content_type) != FRAMES_CONTENT_TYPE:
            raise MalformedResponse(
                f"{context.describe()}: asked for format={format} but the server answered "
                f"Content-Type '{content_type}'."
            )
        if end is not None and next_offset > end:
            raise MalformedResponse(
                f"{context.describe()}: a read bounded by end {end} returned next offset {next_offset}, "
                "past the end. The server does not honour bounded reads; refusing the data."
            )
        end_reached = end is not None and (
            reply.flag("Durastream-End-Reached") or next_offset == end
        )
        return ReadChunk(
            path=path,
            offset=offset,
            end=end,
            format=format,
            body=reply.body,
            next_offset=next_offset,
            up_to_date=reply.flag("Stream-Up-To-Date"),
            closed=reply.flag("Stream-Closed"),
            end_reached=end_reached,
            content_type=content_type,
            etag=reply.header("ETag"),
        )

    def iter_range(
        self, path: str, start: str, end: str | None, format: str = RAW
    ) -> Iterator[ReadChunk]:
        """Every chunk of ``[start, end)``; with ``end=None``, until the stream is up to date (a moving
        target: not replay-deterministic). Raises if the server stops making progress."""
        offset = start
        while True:
            chunk = self.read(path, offset, end, format)
            yield chunk
            if end is not None and chunk.end_reached:
                return
            if end is None and (chunk.up_to_date or chunk.closed):
                return
            if chunk.closed:
                raise MalformedResponse(
                    f"stream '{path}' is closed at {chunk.next_offset}, before the requested end {end}"
                )
            if chunk.next_offset == offset:
                raise MalformedResponse(
                    f"GET stream '{path}' from offset {offset}: the server returned no progress "
                    "(same next offset, not up to date, end not reached)"
                )
            offset = chunk.next_offset

    def lookup_limit(
        self,
        path: str,
        start: str,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        end: str | None = None,
    ) -> LimitLookup:
        """The furthest message boundary ``X >= start`` with ``[start, X)`` inside the limits (no data)."""
        self._require(ext.LIMIT_LOOKUP, f"find a message boundary in stream '{path}' by limits")
        for name, value in (("max_messages", max_messages), ("max_bytes", max_bytes)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        document, context = self._lookup(
            path,
            {
                "offset": start,
                "lookup": "limit",
                "max_messages": max_messages,
                "max_bytes": max_bytes,
                "end": end,
            },
        )
        return _limit_lookup(document, context)

    def lookup_time(
        self, path: str, timestamp_ms: int, *, start: str = "-1", end: str | None = None
    ) -> TimeLookup:
        """The first message in ``[start, end)`` (``end``: the tail) whose server append time is at or
        after ``timestamp_ms`` (no data; an instant before 1970 is sent as 0, which every message is at
        or after)."""
        self._require(ext.TIME_LOOKUP, f"find the first message of stream '{path}' at an instant")
        if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int):
            raise ValueError(f"timestamp_ms must be an int, got {timestamp_ms!r}")
        document, context = self._lookup(
            path,
            {"offset": start, "lookup": "time", "timestamp": max(0, timestamp_ms), "end": end},
        )
        try:
            return TimeLookup(
                timestamp=int(document["timestamp"]),
                start=str(document["start"]),
                end=str(document["end"]),
                offset=str(document["offset"]),
                found=bool(document["found"]),
                tail=str(document["tail"]),
                closed=bool(document["closed"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedResponse(
                f"{context.describe()}: malformed time lookup answer: missing or bad field {exc}"
            ) from None

    def _lookup(self, path: str, params: dict[str, object | None]) -> tuple[Any, RequestContext]:
        """One lookup GET (limit or time): the JSON answer and the request's context."""
        base = self.stream_url(path)
        start, end = params.get("offset"), params.get("end")
        context = RequestContext(
            "GET",
            base,
            stream=path,
            offset=None if start is None else str(start),
            end=None if end is None else str(end),
        )
        reply = self._checked("GET", base + query_string(params), context, {}, ok=(200,))
        return self._json(reply, context), context

    def list_streams(
        self, prefix: str | None = None, pattern: str | None = None, *, page_size: int = 1000
    ) -> Iterator[StreamInfo]:
        """Live streams under ``prefix`` / matching ``pattern`` (``*`` one segment, ``**`` any), by path.

        The next page is fetched (on one helper thread) while the caller consumes the current one: a
        listing of many pages costs about its round trips or its processing, whichever is longer, not
        their sum."""
        for infos in self._listing_pages(prefix, pattern, page_size, _stream_infos):
            yield from infos

    def list_stream_columns(
        self, prefix: str | None = None, pattern: str | None = None, *, page_size: int = 1000
    ) -> StreamColumns:
        """``list_streams`` as columns (the same streams, values and order): a batch read of 10,000
        streams wants their paths, tails and content types side by side, and a column is a C-level
        pass over the page's entries where a ``StreamInfo`` an entry is a Python call each."""
        whole = StreamColumns([], [], [], [])
        for page in self._listing_pages(prefix, pattern, page_size, _stream_columns):
            for column, part in zip(whole, page, strict=True):
                column.extend(part)
        return whole

    def _listing_pages(
        self,
        prefix: str | None,
        pattern: str | None,
        page_size: int,
        parse: Callable[[list[Any]], _Page],
    ) -> Iterator[_Page]:
        """The listing's pages, each parsed by ``parse`` from its ``streams`` entries; the next one
        fetched while the caller takes this one."""
        self._require(ext.LISTING, "list streams")
        if not 1 <= page_size <= 10_000:
            raise ValueError(f"page_size must be in [1, 10000], got {page_size}")
        base = self.connection.url + ext.LISTING_PATH

        def page(after: str | None) -> tuple[_Page, str | None]:
            params = {"prefix": prefix, "pattern": pattern, "after": after, "limit": page_size}
            context = RequestContext("GET", base)
            reply = self._checked("GET", base + query_string(params), context, {}, ok=(200,))
            document = self._json(reply, context)
            try:
                parsed = parse(document["streams"])
                following = document.get("next")
            except (KeyError, TypeError, AttributeError) as exc:
                raise MalformedResponse(f"malformed stream listing: {exc!r}") from None
            if following is not None and following == after:
                raise MalformedResponse(f"stream listing did not advance past {after!r}")
            return parsed, None if following is None else str(following)

        parsed, following = page(None)
        if following is None:  # one page: no helper thread
            yield parsed
            return
        with ThreadPoolExecutor(1, thread_name_prefix="durastream-listing") as ahead:
            while following is not None:
                fetching = ahead.submit(page, following)
                try:
                    yield parsed
                except GeneratorExit:  # the caller stopped early: drop the page in flight
                    fetching.cancel()
                    raise
                parsed, following = fetching.result()
            yield parsed

    # ---- protocol section 6: subscriptions, as a stream listing -----------------------------------------

    def subscriptions_supported(self) -> bool:
        """Whether the server has the protocol's reserved subscription API (section 6): a GET of an
        unknown subscription answers 404 with the JSON code ``SUBSCRIPTION_NOT_FOUND``. A server without
        it treats the path as a stream (404 with another body): nothing is created by asking."""
        url = f"{self.connection.url}/__ds/subscriptions/durastream-probe-{uuid.uuid4().hex}"
        reply, attempts, _ = self._send("GET", url, RequestContext("GET", url), {})
        if reply.status != 404:
            if reply.status >= 500:
                raise self._error(RequestContext("GET", url), reply, attempts)
            return False
        code, _ = parse_error_body(reply.header("Content-Type"), reply.body)
        return code == "SUBSCRIPTION_NOT_FOUND"

    def subscription_streams(self, pattern: str, wake_stream: str) -> list[str]:
        """The paths of the streams that match ``pattern`` now, from a short-lived pull-wake subscription:
        creating one links every existing matching stream (section 6.2, "eagerly backfill"); it is
        read and deleted at once. ``wake_stream`` is only named (no wake is claimed, none is needed)."""
        url = f"{self.connection.url}/__ds/subscriptions/durastream-spark-list-{uuid.uuid4().hex}"
        body = json.dumps(
            {
                "type": "pull-wake",
                "pattern": pattern,
                "wake_stream": wake_stream,
                "description": "durastream-spark: stream discovery, deleted right away",
            }
        ).encode()
        context = RequestContext("PUT", url)
        headers = {"Content-Type": "application/json"}
        self._checked("PUT", url, context, headers, body=body, ok=(200, 201))
        try:
            reply = self._checked("GET", url, RequestContext("GET", url), {}, ok=(200,))
            document = self._json(reply, context)
        finally:
            self._send("DELETE", url, RequestContext("DELETE", url), {})
        try:
            return [str(entry["path"]) for entry in document["streams"]]
        except (KeyError, TypeError) as exc:
            raise MalformedResponse(f"malformed subscription document: {exc!r}") from None

    # ---- many streams at once (extensions changes and multi-range) --------------------------------------

    def changes(
        self,
        since: str | None = None,
        *,
        pattern: str | None = None,
        prefix: str | None = None,
        selection: str | None = None,
        limit: int = 10_000,
        wait_ms: int = 0,
    ) -> ChangePage:
        """One page of the change feed: the selected streams that changed after cursor ``since`` (a
        snapshot without it), each with its state now; ``wait_ms`` lets the server hold an empty answer
        until one changes. A 404 ``SELECTION_NOT_FOUND`` means: register the selection again."""
        self._require(ext.CHANGES, "ask which streams changed")
        base = self.connection.url + ext.CHANGES_PATH
        params = {
            "since": since,
            "pattern": pattern,
            "prefix": prefix,
            "selection": selection,
            "limit": limit,
            "wait": wait_ms or None,
        }
        context = RequestContext("GET", base)
        reply = self._checked(
            "GET", base + query_string(params), context, {}, ok=(200,), server_wait_s=wait_ms / 1000
        )
        document = self._json(reply, context)
        try:
            changes = tuple(
                StreamChange(str(entry["path"]), None)
                if entry.get("deleted")
                else StreamChange(str(entry["path"]), _stream_info(entry))
                for entry in document["changes"]
            )
            return ChangePage(
                changes, str(document["cursor"]), bool(document["more"]), bool(document["reset"])
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise MalformedResponse(
                f"{context.describe()}: malformed change page: {exc!r}"
            ) from None

    def register_selection(self, paths: Sequence[str]) -> str:
        """Register an explicit list of streams for change queries; returns its id."""
        self._require(ext.CHANGES, "register the streams to watch")
        url = self.connection.url + ext.SELECTIONS_PATH
        context = RequestContext("POST", url)
        body = json.dumps({"streams": list(paths)}, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        # Registering the same set again returns the same id: safe to repeat.
        reply = self._checked("POST", url, context, headers, body=body, ok=(200,), read_only=True)
        try:
            return str(self._json(reply, context)["selection"])
        except (KeyError, TypeError) as exc:
            raise MalformedResponse(f"{context.describe()}: malformed answer: {exc!r}") from None

    def lookup_ranges(self, lookups: Sequence[RangeLookup]) -> list[LimitLookup | Exception]:
        """Limit lookups of many ranges, ``MAX_RANGES`` per request: per range its answer, or the typed
        error its single lookup would have raised (``StreamNotFound``, ``EndBeyondTail``, ...)."""
        self._require(ext.MULTI_RANGE, "look up many ranges at once")
        url = self.connection.url + ext.LOOKUPS_PATH
        out: list[LimitLookup | Exception] = []
        for first in range(0, len(lookups), MAX_RANGES):
            part = lookups[first : first + MAX_RANGES]
            body = json.dumps(
                {"lookups": [lookup.as_json() for lookup in part]}, separators=(",", ":")
            ).encode()
            context = RequestContext("POST", url)
            reply = self._checked(
                "POST",
                url,
                context,
                {"Content-Type": "application/json"},
                body=body,
                ok=(200,),
                read_only=True,
            )
            document = self._json(reply, context)
            results = document.get("results") if isinstance(document, dict) else None
            if not isinstance(results, list) or len(results) != len(part):
                raise MalformedResponse(f"{context.describe()}: expected {len(part)} results")
            for lookup, result in zip(part, results, strict=True):
                where = RequestContext(
                    "GET",
                    self.stream_url(lookup.path),
                    stream=lookup.path,
                    offset=lookup.offset,
                    end=lookup.end,
                )
                out.append(_range_error(where, result, reply) or _limit_lookup(result, where))
        return out

    def read_ranges(
        self, ranges: Sequence[tuple[str, str, str]], format: str = FRAMES
    ) -> MultiReadChunk:
        """Bounded frames reads of ``(path, start, end)`` ranges in one request. The answer covers a
        prefix of them (the last possibly cut short): see ``MultiReadChunk``; ask again for the rest."""
        self._require(ext.MULTI_RANGE, "read many ranges at once")
        if format not in (FRAMES, FRAMES_LINES):
            raise ValueError(f"format must be {FRAMES} or {FRAMES_LINES}, got {format!r}")
        if not 1 <= len(ranges) <= MAX_RANGES:
            raise ValueError(f"1 to {MAX_RANGES} ranges per request, got {len(ranges)}")
        url = self.connection.url + ext.READS_PATH
        body = json.dumps(
            {
                "ranges": [{"path": p, "offset": start, "end": end} for p, start, end in ranges],
                "format": format,
            },
            separators=(",", ":"),
        ).encode()
        context = RequestContext("POST", url)
        reply = self._checked(
            "POST",
            url,
            context,
            {"Content-Type": "application/json"},
            body=body,
            ok=(200,),
            read_only=True,
        )
        return _multi_read(reply, context, ranges, self.stream_url)

    # ---- plumbing ---------------------------------------------------------------------------------------

    def _exchange(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | RequestBody | None,
        server_wait_s: float = 0.0,
    ) -> Reply:
        session = get_session(self.connection)
        timeout = self.connection.request_timeout_s
        response = session.request(
            method,
            url,
            data=body,
            headers=headers,
            # A request the server may hold (a change-feed wait) gets that long on top of the timeout.
            timeout=(timeout, timeout + server_wait_s),
            # Per request, not only on the session: requests lets REQUESTS_CA_BUNDLE override a session's
            # verify setting, which would silently replace the tls.caBundle option.
            verify=self.connection.verify,
            allow_redirects=False,
            stream=True,
        )
        try:
            if method == "HEAD" or response.status_code in _NO_BODY_STATUSES:
                # These responses have no body whatever Content-Length says (hazard 41): http.client knows
                # that, so draining reads nothing from the socket and returns the connection to the pool.
                response.raw.drain_conn()
                response.raw.release_conn()
                content = b""
            else:
                content = _read_body(response)  # whole body; then the connection is released
        except BaseException:
            response.close()
            raise
        return Reply(response.status_code, response.headers, content)

    def _send(
        self,
        method: str,
        url: str,
        context: RequestContext,
        headers: dict[str, str],
        body: bytes | RequestBody | None = None,
        server_wait_s: float = 0.0,
        read_only: bool = False,
    ) -> tuple[Reply, int, bool]:
        """One logical request under the retry policy: ``(reply, attempts, idempotent)``, any status."""
        all_headers = request_headers(self.connection)
        all_headers.update(headers)
        # Decided from the protocol headers of this request alone: the user's headers cannot make a plain
        # append look idempotent (options refuse Producer-* and Stream-* headers).
        # ``read_only``: a POST that only asks (multi-range, selections), safe to repeat like a GET.
        idempotent = read_only or request_is_idempotent(method, headers, len(body or b""))

        def send() -> Reply:
            return self._exchange(method, url, all_headers, body, server_wait_s)

        reply, attempts = self._retrier.call(send, idempotent=idempotent, context=context)
        self.counts.add(attempts)
        advertised = reply.header(ext.HEADER)
        if advertised is not None:
            self._extensions = Extensions.parse(advertised)
        return reply, attempts, idempotent

    def _checked(
        self,
        method: str,
        url: str,
        context: RequestContext,
        headers: dict[str, str],
        *,
        ok: tuple[int, ...],
        body: bytes | RequestBody | None = None,
        server_wait_s: float = 0.0,
        read_only: bool = False,
    ) -> Reply:
        """``_send``, raising the typed error unless the status is one of ``ok``."""
        reply, attempts, idempotent = self._send(
            method, url, context, headers, body, server_wait_s, read_only
        )
        if reply.status not in ok:
            raise self._error(context, reply, attempts, idempotent)
        return reply

    def _error(
        self, context: RequestContext, reply: Reply, attempts: int = 1, idempotent: bool = True
    ) -> DurastreamError:
        if reply.status < 300 or reply.status == 304:
            return MalformedResponse(
                f"{context.describe()}: unexpected status {reply.status} for this operation."
                f"{_request_id_note(reply)}"
            )
        return error_from_response(
            context,
            reply.status,
            reply.headers,
            reply.body,
            attempts=attempts,
            idempotent=idempotent,
            root=self.connection.url,
        )

    @staticmethod
    def _required_header(reply: Reply, name: str, context: RequestContext) -> str:
        value = reply.header(name)
        if value is None or not value.strip():
            raise MalformedResponse(f"{context.describe()}: the response lacks the {name} header.")
        return value.strip()

    @staticmethod
    def _json(reply: Reply, context: RequestContext) -> Any:
        try:
            return json.loads(reply.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedResponse(
                f"{context.describe()}: the answer is not JSON: {exc}{_request_id_note(reply)}"
            ) from None
