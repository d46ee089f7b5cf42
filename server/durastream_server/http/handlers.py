"""Stream operations over HTTP (section 5): PUT create, POST append/close, GET read (catch-up, long-poll,
SSE), HEAD metadata, DELETE.

Each handler parses the request into an engine request (``parse.py``), awaits the engine, and renders the
result. Engine errors are typed ``ProtocolError``s and propagate to the app, which maps them by type.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durastream_server.auth import AuthToken
from durastream_server.config import ServerConfig
from durastream_server.engine.api import (
    AppendRequest,
    AppendResult,
    CreateResult,
    ReadRequest,
    ReadResult,
)
from durastream_server.errors import MethodNotAllowed, ProtocolError
from durastream_server.http import fastpath, parse, read_extensions, responses, sse, txn
from durastream_server.http.body import Receive, read_body
from durastream_server.http.cursor import next_cursor
from durastream_server.http.etag import if_none_match, make_etag
from durastream_server.http.fastpath import RawResponder
from durastream_server.http.live import ANSWERED, Disconnect, LiveReaders, WakeAnswer
from durastream_server.http.responses import Headers, Send
from durastream_server.metrics.counters import ServerMetrics
from durastream_server.offsets import NOW
from durastream_server.timers import expired, time_left

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine

logger = logging.getLogger(__name__)

STREAM_METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS")


@dataclass(slots=True)
class Request:
    """What a handler needs from an ASGI HTTP scope, parsed once."""

    method: str
    raw_path: bytes
    query_string: bytes
    headers: dict[str, str]
    scheme: str
    server: tuple[str, int] | None
    receive: Receive
    send: Send
    # Writes a prepared answer straight to the connection (long-poll wake-ups, http/fastpath.py).
    responder: RawResponder | None = None
    request_id: str = ""  # http/requestid.py; in X-Request-Id and every log line of the request
    route: str = "other"  # the route class its handler sets (metrics/counters.py: ROUTES)
    body_bytes: int = 0  # request body bytes read (metrics, access log)
    # The bearer token that authorized the request (None without --auth-token or on open endpoints).
    token: AuthToken | None = None

    @property
    def authority(self) -> str:
        host = self.headers.get("host", "").strip()
        if host:
            return host
        if self.server is not None:
            name, port = self.server
            return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
        return "localhost"

    def absolute_url(self) -> str:
        return f"{self.scheme}://{self.authority}{self.raw_path.decode('latin-1')}"


# Pieces of an append's answer on the wire (``StreamHandlers.append_answer_lines``).
_NO_STORE = b"\r\ncache-control: " + responses.CACHE_NO_STORE.encode() + b"\r\n"
_CLOSED_LINE = b"stream-closed: true\r\n"
_DIGEST_MATCH = b"%s: match\r\n" % parse.DIGEST_HEADER.lower().encode()
_DIGEST_UNKNOWN = b"%s: unknown\r\n" % parse.DIGEST_HEADER.lower().encode()


@functools.cache
def _answer_base() -> bytes | None:
    """The header lines every answer starts with (``responses.response_headers``), encoded once."""
    if fastpath.HttpToolsProtocol is None:
        return None
    return fastpath.header_lines(responses.response_headers(204, (), b""))


def _raise_if_refused(future: asyncio.Future[Any]) -> None:
    """Raise the ``ProtocolError`` of an engine future that failed before anything was done."""
    if future.done() and not future.cancelled():
        exc = future.exception()
        if isinstance(exc, ProtocolError):
            raise exc


class StreamHandlers:
    def __init__(
        self,
        engine: Engine,
        live: LiveReaders,
        config: ServerConfig,
        metrics: ServerMetrics | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._live = live
        self._config = config
        self._metrics = metrics if metrics is not None else ServerMetrics()
        self._clock = clock

    async def handle(self, request: Request, path: str) -> None:
        method = request.method
        if method == "GET":
            await self._get(request, path)
        elif method == "HEAD":
            await self._head(request, path)
        elif method == "POST":
            await self._post(request, path)
        elif method == "PUT":
            await self._put(request, path)
        elif method == "DELETE":
            await self._delete(request, path)
        else:
            raise MethodNotAllowed(
                f"{method} is not supported on streams",
                headers={"Allow": ", ".join(STREAM_METHODS)},
            )

    # -- writes ---------------------------------------------------------------------------------------

    async def _put(self, request: Request, path: str) -> None:
        request.route = "create"
        body = await read_body(request.receive, request.headers, self._config.max_body_bytes)
        request.body_bytes = len(body)
        result = await self._engine.create(parse.create_request(path, request.headers, body))
        await responses.send_response(request.send, *self.create_answer(request, result))

    def create_now(self, request: Request, path: str, body: bytes) -> asyncio.Future[CreateResult]:
        """``_put`` of a create whose body is already here, without a coroutine (the app's direct
        path): the engine's future of its result. Raises the ``ProtocolError`` the ordinary path would
        answer when it is refused before anything was done (``append_now``)."""
        future = self._engine.create_nowait(parse.create_request(path, request.headers, body))
        _raise_if_refused(future)
        return future

    @staticmethod
    def create_answer(request: Request, result: CreateResult) -> tuple[int, Headers]:
        """Status and headers of a create's answer (it has no body)."""
        info = result.info
        headers: Headers = [
            ("Content-Type", info.content_type),
            ("Stream-Next-Offset", info.next_offset),
            ("Cache-Control", responses.CACHE_NO_STORE),
        ]
        if info.closed:
            headers.append(("Stream-Closed", "true"))
        if result.created:
            headers.append(("Location", request.absolute_url()))
        return 201 if result.created else 200, headers

    @staticmethod
    def create_answer_lines(request: Request, result: CreateResult) -> tuple[int, bytes] | None:
        """``create_answer`` as the wire lines the direct path writes (``fastpath.prepare_lines``):
        byte for byte what ``fastpath.prepare`` makes of ``responses.response_headers`` of it, built
        from pre-encoded pieces (as ``append_answer_lines``); the two values that echo the request
        (Content-Type, the Location's host and path) are checked as uvicorn checks them. None
        without the fast path or where uvicorn would refuse a header (the ordinary send then
        answers)."""
        base = _answer_base()
        if base is None:
            return None
        info = result.info
        content_type = info.content_type.encode("latin-1", "replace")
        if not fastpath.header_value_ok(content_type):
            return None
        parts = [
            base,
            b"content-type: ",
            content_type,
            b"\r\nstream-next-offset: ",
            info.next_offset.encode("latin-1"),
            _NO_STORE,
        ]
        if info.closed:
            parts.append(_CLOSED_LINE)
        if result.created:
            location = request.absolute_url().encode("latin-1", "replace")
            if not fastpath.header_value_ok(location):
                return None
            parts += (b"location: ", location, b"\r\n")
        parts.append(b"content-length: 0\r\n")
        return (201 if result.created else 200), b"".join(parts)

    async def _post(self, request: Request, path: str) -> None:
        request.route = txn.route_class(request.headers)  # append, stage, commit or abort
        body = await read_body(request.receive, request.headers, self._config.max_body_bytes)
        request.body_bytes = len(body)
        if txn.is_txn(request.headers):  # staged appends: stage / commit / abort (extensions.md 5)
            staged = txn.parse_request(path, request.headers, body)
            await txn.serve(self._engine, request.send, staged)
            return
        append = parse.append_request(path, request.headers, body)
        result = await self._engine.append(append)
        await responses.send_response(request.send, *self.append_answer(append, result))

    def append_now(
        self, request: Request, path: str, body: bytes
    ) -> tuple[AppendRequest, asyncio.Future[AppendResult]]:
        """``_post`` of a plain append whose body is already here, without a coroutine (the app's
        direct path, ``fastpath.py``): the request and the engine's future of its result. Raises the
        ``ProtocolError`` the ordinary path would answer when it is refused before anything was done
        (the caller then leaves the request to that path)."""
        append = parse.append_request(path, request.headers, body)
        future = self._engine.append_nowait(append)
        _raise_if_refused(future)
        return append, future

    @staticmethod
    def append_answer(append: AppendRequest, result: AppendResult) -> tuple[int, Headers]:
        """Status and headers of an append's answer (it has no body)."""
        headers: Headers = [
            ("Stream-Next-Offset", result.next_offset),
            ("Cache-Control", responses.CACHE_NO_STORE),
        ]
        if result.closed:
            headers.append(("Stream-Closed", "true"))
        if append.producer is not None:
            epoch = (
                result.producer_epoch
                if result.producer_epoch is not None
                else append.producer.epoch
            )
            seq = result.producer_seq if result.producer_seq is not None else append.producer.seq
            headers.append(("Producer-Epoch", str(epoch)))
            headers.append(("Producer-Seq", str(seq)))
            if result.duplicate:
                headers.append(parse.digest_header(result.verified))
        # Section 5.2.1: new data from a producer is 200; plain appends, close-only requests and
        # duplicates are 204.
        status = (
            200 if append.producer is not None and append.body and not result.duplicate else 204
        )
        return status, headers

    @staticmethod
    def append_answer_lines(
        append: AppendRequest, result: AppendResult
    ) -> tuple[int, bytes] | None:
        """``append_answer`` as the wire lines the direct path writes (``fastpath.prepare_lines``):
        byte for byte what ``fastpath.prepare`` makes of ``responses.response_headers`` of it, built
        from pre-encoded pieces instead of encoding, checking and joining every pair per answer. None
        without the fast path."""
        base = _answer_base()
        if base is None:
            return None
        producer = append.producer
        parts = [base, b"stream-next-offset: ", result.next_offset.encode("latin-1"), _NO_STORE]
        if result.closed:
            parts.append(_CLOSED_LINE)
        status = 204
        if producer is not None:
            epoch = result.producer_epoch if result.producer_epoch is not None else producer.epoch
            seq = result.producer_seq if result.producer_seq is not None else producer.seq
            parts.append(b"producer-epoch: %d\r\nproducer-seq: %d\r\n" % (epoch, seq))
            if result.duplicate:
                parts.append(_DIGEST_MATCH if result.verified else _DIGEST_UNKNOWN)
            elif append.body:
                status = 200
                parts.append(b"content-length: 0\r\n")
        return status, b"".join(parts)

    async def _delete(self, request: Request, path: str) -> None:
        request.route = "delete"
        await self._engine.delete(path)
        headers: Headers = [("Cache-Control", responses.CACHE_NO_STORE)]
        await responses.send_response(request.send, 204, headers)

    # -- metadata -------------------------------------------------------------------------------------

    async def _head(self, request: Request, path: str) -> None:
        request.route = "head"
        info = self._engine.head(path)
        headers: Headers = [
            ("Content-Type", info.content_type),
            ("Stream-Next-Offset", info.next_offset),
            ("Cache-Control", responses.CACHE_NO_STORE),  # section 5.5: never cache the tail
        ]
        if info.ttl_seconds is not None:
            headers.append(("Stream-TTL", str(info.ttl_seconds)))
        if info.expires_at is not None:
            headers.append(("Stream-Expires-At", info.expires_at))
        if info.closed:
            headers.append(("Stream-Closed", "true"))
        await responses.send_response(request.send, 200, headers, head=True)

    # -- reads ----------------------------------------------------------------------------------------

    async def _read(self, path: str, offset: str) -> ReadResult:
        return await self._engine.read(
            ReadRequest(path=path, offset=offset, max_bytes=self._config.chunk_bytes)
        )

    def _cursor(self, params: parse.ReadParams) -> str:
        return next_cursor(params.cursor, clock=self._clock)

    async def _get(self, request: Request, path: str) -> None:
        request.route = "read"
        params = parse.read_params(request.query_string)
        extensions = read_extensions.parse(request.query_string, params.live)
        if extensions is not None:  # end= / format= / lookup= (docs/extensions.md)
            self._metrics.messages_read += await read_extensions.serve(
                self._engine, self._config.chunk_bytes, request, path, params, extensions
            )
            return
        if params.live == "sse":
            request.route = "sse"
            await self._sse(request, path, params)
        elif params.live == "long-poll":
            request.route = "long_poll"
            await self._long_poll(request, path, params)
        else:
            result = await self._read(path, params.offset)
            self._metrics.messages_read += result.count
            await self._send_read(request, result, params, cursor=None)

    async def _send_read(
        self, request: Request, result: ReadResult, params: parse.ReadParams, cursor: str | None
    ) -> None:
        """A 200 read response (catch-up, or a long-poll that found data)."""
        await responses.send_response(
            request.send, *self._read_parts(request, result, params, cursor)
        )

    def _read_parts(
        self, request: Request, result: ReadResult, params: parse.ReadParams, cursor: str | None
    ) -> tuple[int, Headers, bytes]:
        """Status, headers and body of a read response (200, or 304 for a matching If-None-Match)."""
        headers: Headers = [
            ("Content-Type", result.info.content_type),
            ("Stream-Next-Offset", result.next_offset),
        ]
        if result.up_to_date:
            headers.append(("Stream-Up-To-Date", "true"))
        if result.closed:
            headers.append(("Stream-Closed", "true"))
        elif cursor is not None:
            headers.append(("Stream-Cursor", cursor))
        if params.offset == NOW:
            # Section 8: the tail moves, so neither cache it nor tag it.
            headers.append(("Cache-Control", responses.CACHE_NO_STORE))
        else:
            etag = make_etag(
                result.info.storage_id, result.start_offset, result.next_offset, result.closed
            )
            headers.append(("ETag", etag))
            headers.append(("Cache-Control", responses.CACHE_CATCH_UP))
            if if_none_match(request.headers.get("if-none-match"), etag):
                return 304, headers, b""
        return 200, headers, result.body

    async def _long_poll(self, request: Request, path: str, params: parse.ReadParams) -> None:
        """Section 5.7: answer at once when there is data (or EOF); else wait up to the timeout."""
        metrics = self._metrics
        metrics.open_long_polls += 1
        try:
            await self._long_poll_open(request, path, params)
        finally:
            metrics.open_long_polls -= 1

    async def _long_poll_open(self, request: Request, path: str, params: parse.ReadParams) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.long_poll_timeout
        result = await self._read(path, params.offset)
        disconnect: Disconnect | None = None
        try:
            while not result.count and not result.closed:
                remaining = time_left(deadline, loop.time())  # < 1 ms left: answer now (timers.py)
                woken: ReadResult | object | None = None
                if remaining:
                    disconnect = disconnect or Disconnect(request.receive)
                    # Parked with every long-poll at this offset; when data comes, the group reads
                    # once and answers all (live.py), writing straight to the connection if allowed.
                    woken = await self._live.wait_read(
                        path,
                        result.next_offset,
                        remaining,
                        disconnect,
                        self._read,
                        self._wake_answer(request, params),
                    )
                if woken is ANSWERED:
                    return  # and counted by the wake group
                if not isinstance(woken, ReadResult):
                    # Timeout, or released by shutdown / hang-up: answer as a timeout.
                    await self._send_no_content(request, result.next_offset, params, closed=False)
                    return
                result = woken
        finally:
            if disconnect is not None:
                await disconnect.close()
        self._metrics.messages_read += result.count
        await responses.send_response(request.send, *self._long_poll_parts(request, params, result))

    def _long_poll_parts(
        self, request: Request, params: parse.ReadParams, result: ReadResult
    ) -> tuple[int, Headers, bytes]:
        """The answer of a long-poll that found data or the stream's end."""
        if result.count:
            # Data that arrived together with the close carries Stream-Closed (hazard 16).
            return self._read_parts(request, result, params, cursor=self._cursor(params))
        return self._no_content_parts(result.next_offset, params, closed=True)

    def _wake_answer(self, request: Request, params: parse.ReadParams) -> WakeAnswer:
        """How a parked long-poll is answered when woken. Requests alike in everything the answer
        depends on (path, query, headers) share one answer, built once. A conditional request
        (If-None-Match) is answered the ordinary way."""
        responder = request.responder if "if-none-match" not in request.headers else None
        key = (request.raw_path, request.query_string, *request.headers.items())
        return WakeAnswer(key, functools.partial(self._long_poll_parts, request, params), responder)

    async def _send_no_content(
        self, request: Request, next_offset: str, params: parse.ReadParams, *, closed: bool
    ) -> None:
        await responses.send_response(
            request.send, *self._no_content_parts(next_offset, params, closed=closed)
        )

    def _no_content_parts(
        self, next_offset: str, params: parse.ReadParams, *, closed: bool
    ) -> tuple[int, Headers, bytes]:
        headers: Headers = [
            ("Stream-Next-Offset", next_offset),
            ("Stream-Up-To-Date", "true"),
            ("Cache-Control", responses.CACHE_NO_STORE),  # section 10.1: don't cache 204s
        ]
        if closed:
            headers.append(("Stream-Closed", "true"))
        else:
            headers.append(("Stream-Cursor", self._cursor(params)))
        return 204, headers, b""

    async def _sse(self, request: Request, path: str, params: parse.ReadParams) -> None:
        """Section 5.8. The first read happens before the headers, so a missing stream is a real 404."""
        result = await self._read(path, params.offset)
        base64_encoded = params.sse_base64 or not sse.is_text_type(result.info.content_type)
        headers: Headers = [
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", responses.CACHE_SSE),
        ]
        if base64_encoded:
            headers.append((sse.ENCODING_HEADER, "base64"))
        await responses.start_streaming(request.send, 200, headers)
        disconnect = Disconnect(request.receive)
        self._metrics.open_sse += 1
        try:
            await self._sse_events(request, path, params, result, base64_encoded, disconnect)
        except ProtocolError as exc:
            # E.g. the stream was deleted mid-connection: end the response; a reconnect gets the status.
            logger.debug("SSE on %s ended by %s: %s", path, type(exc).__name__, exc.message)
        finally:
            self._metrics.open_sse -= 1
            await disconnect.close()
            await request.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _sse_events(
        self,
        request: Request,
        path: str,
        params: parse.ReadParams,
        result: ReadResult,
        base64_encoded: bool,
        disconnect: Disconnect,
    ) -> None:
        loop = asyncio.get_running_loop()
        # Section 10.2: end the connection about every minute so CDNs can collapse reconnects.
        deadline = loop.time() + self._config.sse_reconnect_seconds
        keepalive = self._config.long_poll_timeout
        sent_control = False

        async def emit(chunk: bytes) -> None:
            # Awaiting send applies the transport's backpressure to this reader alone.
            await request.send({"type": "http.response.body", "body": chunk, "more_body": True})

        while True:
            if disconnect.happened:
                return  # sends would be dropped; stop reading on behalf of nobody
            if result.count:
                self._metrics.messages_read += result.count
                event = sse.data_event(result.body, base64_encoded=base64_encoded)
                event += sse.control_event(
                    result.next_offset,
                    cursor=self._cursor(params),
                    up_to_date=result.up_to_date,
                    closed=result.closed,
                )
                await emit(event)
                sent_control = True
                if result.closed:
                    return
                if not result.up_to_date:
                    if expired(deadline, loop.time()):
                        return  # the client resumes from the last control event's offset
                    result = await self._read(path, result.next_offset)
                    continue
            elif result.closed:
                await emit(
                    sse.control_event(result.next_offset, cursor=None, up_to_date=True, closed=True)
                )
                return
            elif not sent_control:
                await emit(
                    sse.control_event(
                        result.next_offset,
                        cursor=self._cursor(params),
                        up_to_date=True,
                        closed=False,
                    )
                )
                sent_control = True

            offset = result.next_offset
            while True:
                # Less than a clock tick left is the end (timers.py): re-waiting for the rest would
                # spin (and could send a keep-alive control event per pass) until uvloop's clock ticks.
                remaining = time_left(deadline, loop.time())
                if not remaining or disconnect.happened:
                    return
                woke = await self._live.wait(path, offset, min(remaining, keepalive), disconnect)
                if woke is None:
                    return
                if woke:
                    break
                if not expired(deadline, loop.time()):
                    await emit(
                        sse.control_event(
                            offset, cursor=self._cursor(params), up_to_date=True, closed=False
                        )
                    )
            result = await self._read(path, offset)
