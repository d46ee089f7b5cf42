"""The ASGI application: lifespan, routing, error mapping, request ids, metrics, the access log.

No web framework: the protocol is a handful of methods on one URL shape, and owning the ASGI loop keeps
every byte of every response (headers, SSE framing, backpressure) explicit. The app does not know how the
backend is built; ``open_backend`` (called at lifespan startup) returns it, so the HTTP layer never touches
a file and tests can start the app on any backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from durastream_server import extensions
from durastream_server.config import ServerConfig
from durastream_server.errors import (
    BadRequest,
    MethodNotAllowed,
    NotFound,
    PlacedElsewhere,
    ProtocolError,
)
from durastream_server.http import (
    access,
    cors,
    discovery,
    fastpath,
    paths,
    requestid,
    responses,
    subscriptions,
    txn,
)
from durastream_server.http.auth import Authorizer
from durastream_server.http.body import ClientDisconnected, check_declared_length
from durastream_server.http.handlers import Request, StreamHandlers
from durastream_server.http.live import LiveReaders
from durastream_server.http.parse import header_map
from durastream_server.logformat import REQUEST_ID
from durastream_server.metrics.counters import ServerMetrics
from durastream_server.metrics.exposition import CONTENT_TYPE as METRICS_CONTENT_TYPE
from durastream_server.metrics.exposition import Exporter
from durastream_server.metrics.shards import merged_exposition
from durastream_server.shards.bulkwrite import BulkFanOut
from durastream_server.shards.changefeed import ChangesFanOut
from durastream_server.shards.fanout import ListingFanOut, is_shard_page
from durastream_server.shards.multirange import MultiRangeFanOut
from durastream_server.shards.overview import ask_the_others, whole_health

if TYPE_CHECKING:
    from durastream_server.engine.census import Census
    from durastream_server.engine.engine import Engine
    from durastream_server.shards.router import ShardRouter
    from durastream_server.storage.quarantine import QuarantinedStream

logger = logging.getLogger("durastream_server.http")

# /healthz lists at most this many quarantined streams (and counts them all): a damaged disk may
# quarantine thousands, and a health probe must stay small and cheap.
HEALTH_QUARANTINE_LIST = 100
# The status recorded for a request whose client left before any answer (nginx's convention).
CLIENT_CLOSED = 499

# Appends and creates with a declared body up to this size may be served without the ASGI round trips
# (``direct``).
DIRECT_MAX_BODY = 16 * 1024
_STREAM_PREFIX = paths.STREAM_PREFIX.encode()
# Request headers that make a POST something other than a plain small append (a PUT with them is
# declined too: it is rare, and the ordinary path decides what it means).
_NOT_DIRECT = frozenset(
    name.encode()
    for name in ("transfer-encoding", "expect", txn.TXN, txn.COMMIT, txn.ABORT, txn.TTL)
)

# Headers of staged-append requests (they may name handles of many streams).
_TXN = (txn.TXN, txn.COMMIT, txn.ABORT, txn.TTL)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Backend(Protocol):
    """What the HTTP layer serves: an engine, optionally a subscription service, and a way to stop."""

    engine: Engine
    subscriptions: subscriptions.SubscriptionHandler | None

    async def close(self) -> None: ...


class _TrackedSend:
    """Remembers whether and how the response started, so errors after the headers are handled sanely,
    and counts the body bytes sent (metrics and the access log)."""

    __slots__ = ("_send", "_extra_headers", "_request_id", "status", "finished", "body_bytes")

    def __init__(
        self, send: Send, extra_headers: list[tuple[bytes, bytes]], request_id: bytes
    ) -> None:
        self._send = send
        self._extra_headers = extra_headers  # per-request headers (CORS origin) on every response
        self._request_id = request_id  # the x-request-id value, last header of every response
        self.status: int | None = None
        self.finished = False
        self.body_bytes = 0

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            message["headers"] = [
                *message["headers"],
                *self._extra_headers,
                (b"x-request-id", self._request_id),
            ]
        elif message["type"] == "http.response.body":
            self.body_bytes += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.finished = True
        await self._send(message)


class _DirectAnswer:
    """How a direct request's engine result becomes its answer, and the engine future's done
    callback that writes it: ``lines(subject, result)``, the pre-encoded wire lines the responder
    writes (None: the ordinary send), and ``parts(subject, result)``, the status and headers that
    send takes (``StreamHandlers``' pieces of the request's kind; ``subject``: the append, or the
    create's request). One object per request, where two partials, a tuple and a closure were."""

    __slots__ = ("_app", "_request", "_tracked", "_started", "_lines", "_parts", "_subject")

    def __init__(
        self,
        app: DurastreamApp,
        request: Request,
        tracked: _TrackedSend,
        started: float,
        lines: Callable[[Any, Any], tuple[int, bytes] | None],
        parts: Callable[[Any, Any], tuple[int, responses.Headers]],
        subject: Any,
    ) -> None:
        self._app = app
        self._request = request
        self._tracked = tracked
        self._started = started
        self._lines = lines
        self._parts = parts
        self._subject = subject

    def lines(self, result: Any) -> tuple[int, bytes] | None:
        return self._lines(self._subject, result)

    def parts(self, result: Any) -> tuple[int, responses.Headers]:
        return self._parts(self._subject, result)

    def __call__(self, done: asyncio.Future[Any]) -> None:
        self._app._direct_answer(self._request, self._tracked, self, done, self._started)


class DurastreamApp:
    def __init__(
        self,
        config: ServerConfig,
        open_backend: Callable[[], Awaitable[Backend]],
        metrics: ServerMetrics | None = None,
        router: ShardRouter | None = None,
    ) -> None:
        self.config = config
        # With --workers N > 1: which worker owns which stream (shards/router.py); None: one process.
        self._router = router
        self._open_backend = open_backend
        self._backend: Backend | None = None
        self._live: LiveReaders | None = None
        self._streams: StreamHandlers | None = None
        self._exporter: Exporter | None = None
        self._extensions: discovery.ExtensionResources | None = None
        self.startup_error: BaseException | None = None
        self._cors = cors.CorsPolicy(config.cors_origins)
        self._auth = (
            Authorizer(config.auth_tokens, router.internal_token if router is not None else None)
            if config.auth_tokens
            else None
        )
        # Counted on every request; the storage layer adds its own figures when the server passes
        # the same object to the data directory (server.py).
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self._request_ids = requestid.RequestIds()
        self._access_log = config.access_log
        self._direct_max = min(DIRECT_MAX_BODY, config.max_body_bytes)
        # Answers of direct requests sent the ordinary way (a task each, referenced until done).
        self._tasks: set[asyncio.Task[None]] = set()
        self.direct_answers = 0  # answered by ``direct`` in one write (observability, tests)

    # -- lifecycle ------------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Shutdown has begun: release parked long-polls (they answer 204) and end SSE connections."""
        if self._live is not None:
            self._live.drain()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    backend = await self._open_backend()
                except Exception as exc:  # reported by the CLI; uvicorn logs the message
                    self.startup_error = exc
                    await send(
                        {
                            "type": "lifespan.startup.failed",
                            "message": f"{type(exc).__name__}: {exc}",
                        }
                    )
                    return
                self._backend = backend
                self._live = LiveReaders(backend.engine, self.metrics)
                self._streams = StreamHandlers(
                    backend.engine, self._live, self.config, self.metrics
                )
                self._exporter = Exporter(self.metrics, self._census)
                self._extensions = self._extension_resources(backend.engine)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.begin_drain()
                try:
                    if self._router is not None:
                        await self._router.close()
                    if self._backend is not None:
                        await self._backend.close()
                except Exception as exc:
                    logger.exception("error while closing the backend")
                    await send({"type": "lifespan.shutdown.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- requests -------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not part of the protocol (uvicorn runs with ws="none")
        if self._router is not None:
            router = self._router
            if router.placement_query(scope):  # a worker asking where a fork lives (forks.py)
                await router.answer_placement(scope, send)
                return
            owner = router.owner_for(scope)
            if owner is None and (fork := router.fork_source(scope)) and self._may(scope, receive):
                try:  # a fork of another shard's stream is created in that shard (forks.py)
                    owner = await router.fork_destination(*fork)
                except ProtocolError as exc:
                    await router.refuse(scope, send, exc)
                    return
            if owner is not None:  # another worker's stream: it answers (counted and logged there)
                await router.forward(owner, scope, receive, send)
                return
            router.as_received(scope)
        started = time.perf_counter()
        headers = header_map(scope.get("headers", ()))
        request_id = self._request_ids.take(headers.get(requestid.HEADER))
        context = REQUEST_ID.set(request_id)
        encoded_id = request_id.encode("ascii")
        extra_headers = self._cors.headers_for(headers.get("origin"))
        tracked = _TrackedSend(send, extra_headers, encoded_id)
        # The long-poll fast path writes whole answers itself: it appends the same extra headers.
        responder = fastpath.responder(scope, extra_headers, _request_id_line(encoded_id))
        request = _request(scope, headers, receive, tracked, responder, request_id)
        forwarded = False  # counted and logged by the worker that answers it, as any forward
        try:
            await self._dispatch(request)
        except PlacedElsewhere as moved:
            if self._router is None or tracked.status is not None:
                await self._send_error(request, tracked, *responses.protocol_error_parts(moved))
            else:  # a fork was placed there while this create waited (shards/forks.py)
                forwarded = True
                await self._router.forward(moved.shard, scope, _replayed(moved.body), send)
        except ProtocolError as exc:
            await self._send_error(request, tracked, *responses.protocol_error_parts(exc))
        except ClientDisconnected:
            pass  # nobody is left to answer
        except Exception:
            logger.exception("internal error on %s %r", request.method, request.raw_path)
            await self._send_error(request, tracked, *responses.internal_error_parts())
        finally:
            if not forwarded:
                self._finished(request, tracked, time.perf_counter() - started)
            REQUEST_ID.reset(context)

    def _contended(self, path: str) -> bool:
        """Whether a create of ``path`` would wait for its lock or is placed in another shard
        (``Engine.create_contended``): left to the ordinary path, which can forward it."""
        return self._backend is not None and self._backend.engine.create_contended(path)

    def _may(self, scope: Scope, receive: Receive) -> bool:
        """Whether ``scope``'s token allows it (no tokens: yes); a request refused is answered by the
        ordinary path, which refuses it the same way."""
        if self._auth is None:
            return True
        request = _request(scope, header_map(scope["headers"]), receive, _no_send, None, "")
        try:
            self._auth.authorize(request, paths.route(request.raw_path))
        except (ProtocolError, paths.InvalidPath):
            return False
        return True

    def _finished(self, request: Request, tracked: _TrackedSend, seconds: float) -> None:
        """Count the request (``/metrics``) and write its access-log line."""
        status = tracked.status
        sent = tracked.body_bytes
        if status is None:
            fast = request.responder.sent if request.responder is not None else None
            if fast is not None:  # answered by the long-poll fast path (http/fastpath.py)
                status, sent = fast.status, fast.body_bytes
            else:
                status = CLIENT_CLOSED
        metrics = self.metrics
        metrics.finished(request.route, status, seconds)
        metrics.request_bytes += request.body_bytes
        metrics.response_bytes += sent
        level = logging.INFO if self._access_log else logging.DEBUG
        if access.enabled(level):
            access.log_request(
                level=level,
                request_id=request.request_id,
                method=request.method,
                raw_path=request.raw_path,
                query_string=request.query_string,
                route=request.route,
                status=status,
                seconds=seconds,
                bytes_in=request.body_bytes,
                bytes_out=sent,
            )

    # -- direct requests (http/fastpath.py): small appends and creates without the ASGI round trips ------

    def direct_candidate(self, scope: Scope) -> bool:
        """A plain append or a create of a stream, keep-alive, with a declared body of at most
        ``DIRECT_MAX_BODY`` bytes (so that the body checks of ``read_body`` cannot fail; a create may
        also declare none: no body), nothing that asks for more (``Expect``, chunked framing,
        staged-append headers)."""
        method = scope["method"]
        if (method != "POST" and method != "PUT") or self._streams is None:
            return False
        if self._backend is not None and self._backend.engine.recovering:
            return False  # the ordinary path recovers the stream first
        if not scope["raw_path"].startswith(_STREAM_PREFIX):
            return False
        if self._router is not None and not self._router.direct_allowed(method, scope):
            return False  # forwarded to its owner, or a fork checked, by the ordinary path
        length = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length is not None:
                    return False
                length = value
            elif name in _NOT_DIRECT:
                return False
        if length is None:
            return method == "PUT"
        return length.isdigit() and len(length) <= 9 and int(length) <= self._direct_max

    def direct(
        self, scope: Scope, body: bytes, responder: fastpath.RawResponder, send: Send
    ) -> bool:
        """Serve a ``direct_candidate`` whose body is complete: the same parsing, checks, engine call
        and answer as ``__call__`` would make, answered through ``responder`` in one write. Anything
        refused before the engine started on it is declined (False) and so answered by the ordinary
        path, which refuses it the same way; errors after that are answered here, through ``send``."""
        started = time.perf_counter()
        if self._router is not None:
            self._router.as_received(scope)
        headers = header_map(scope["headers"])
        raw_path = scope["raw_path"]
        try:
            target = paths.route(raw_path)
        except paths.InvalidPath:
            return False
        if target.kind is not paths.RouteKind.STREAM:
            return False
        extra_headers = self._cors.headers_for(headers.get("origin"))
        request_id = self._request_ids.take(headers.get(requestid.HEADER))
        encoded_id = request_id.encode("ascii")
        tracked = _TrackedSend(send, extra_headers, encoded_id)
        responder.extra_headers = extra_headers
        responder.request_id_line = _request_id_line(encoded_id)
        request = _request(scope, headers, _consumed, tracked, responder, request_id)
        request.body_bytes = len(body)
        streams = self._streams
        assert streams is not None
        answer: _DirectAnswer
        context = REQUEST_ID.set(request_id)  # the engine's log lines, and the answer's (a copy)
        try:
            if self._auth is not None:
                self._auth.authorize(request, target)
            if request.method == "PUT":
                if self._router is not None and self._contended(target.target):
                    return False  # the ordinary path forwards it if a fork is placed there
                request.route = "create"
                future: asyncio.Future[Any] = streams.create_now(request, target.target, body)
                answer = _DirectAnswer(
                    self,
                    request,
                    tracked,
                    started,
                    streams.create_answer_lines,
                    streams.create_answer,
                    request,
                )
            else:
                request.route = txn.route_class(headers)  # "append": no staged requests come here
                append, future = streams.append_now(request, target.target, body)
                answer = _DirectAnswer(
                    self,
                    request,
                    tracked,
                    started,
                    streams.append_answer_lines,
                    streams.append_answer,
                    append,
                )
        except ProtocolError as exc:
            # Its traceback holds the frames it came through, and one of them the engine's failed
            # future, which holds the error: a reference cycle per declined request, unless dropped.
            exc.__traceback__ = None
            return False
        finally:
            REQUEST_ID.reset(context)
        future.add_done_callback(answer)
        return True

    def _direct_answer(
        self,
        request: Request,
        tracked: _TrackedSend,
        answer: _DirectAnswer,
        done: asyncio.Future[Any],
        started: float,
    ) -> None:
        assert self._streams is not None and request.responder is not None
        refused = None if done.cancelled() else done.exception()
        if isinstance(refused, ProtocolError):
            # Read, not re-raised: raising it here would add this frame, which holds ``done``, which
            # holds the error, to the error's traceback: a reference cycle per refused request.
            error = self._send_error(request, tracked, *responses.protocol_error_parts(refused))
            self._spawn(self._then_finished(error, request, tracked, started))
            return
        try:
            if done.cancelled():  # only when the loop is torn down: the outcome is unknown
                raise RuntimeError("the request was cancelled before its commit was known")
            result = done.result()
            wire = answer.lines(result)
        except ProtocolError as exc:
            error = self._send_error(request, tracked, *responses.protocol_error_parts(exc))
            self._spawn(self._then_finished(error, request, tracked, started))
            return
        except Exception:  # never leave the request unanswered (no task of uvicorn's would notice)
            logger.exception("internal error on %s %r", request.method, request.raw_path)
            error = self._send_error(request, tracked, *responses.internal_error_parts())
            self._spawn(self._then_finished(error, request, tracked, started))
            return
        if wire is not None and request.responder.send_lines(*wire):
            self.direct_answers += 1
            self._finished(request, tracked, time.perf_counter() - started)
        else:  # the connection needs more than these bytes (closing, paused): the ordinary send
            sent = responses.send_response(tracked, *answer.parts(result))
            self._spawn(self._then_finished(sent, request, tracked, started))

    async def _then_finished(
        self,
        answer: Coroutine[Any, Any, None],
        request: Request,
        tracked: _TrackedSend,
        started: float,
    ) -> None:
        """Send a direct request's answer the ordinary way, then count and log it like any other."""
        try:
            await answer
        finally:
            self._finished(request, tracked, time.perf_counter() - started)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_error(
        self,
        request: Request,
        tracked: _TrackedSend,
        status: int,
        headers: responses.Headers,
        body: bytes,
    ) -> None:
        if tracked.status is None:
            await responses.send_response(
                tracked, status, headers, body, head=request.method == "HEAD"
            )
        elif not tracked.finished:
            # Headers are out; the only honest move left is to end the body.
            await tracked({"type": "http.response.body", "body": b"", "more_body": False})

    async def _dispatch(self, request: Request) -> None:
        try:
            target = paths.route(request.raw_path)
        except paths.InvalidPath as exc:
            if self._auth is not None:
                self._auth.authorize(request, None)  # no token, no details about the path
            raise BadRequest(str(exc)) from None
        if request.method == "OPTIONS" and target.kind is not paths.RouteKind.NOT_FOUND:
            await responses.send_response(request.send, 204, cors.preflight_headers())
            return
        if self._auth is not None:
            request.token = self._auth.authorize(request, target)  # 401 / 403: http/auth.py
        if self._router is not None:
            self._router.refuse_unsupported(request.method, target, request.headers)
        # Every route refuses a declared body over the limit before anything else, also those that
        # never read a body (GET, HEAD, DELETE, /healthz): their answer must not depend on whether it
        # was sent before the connection's guard saw the body pass the limit.
        check_declared_length(request.headers, self.config.max_body_bytes)
        answered_while_recovering = (paths.RouteKind.HEALTH, paths.RouteKind.METRICS)
        if target.kind not in answered_while_recovering and (
            self._backend is not None and self._backend.engine.recovering
        ):
            await self._recovered_for(request, target)
        if target.kind is paths.RouteKind.HEALTH:
            request.route = "health"
            await self._health(request)
        elif target.kind is paths.RouteKind.METRICS:
            request.route = "metrics"
            await self._metrics(request)
        elif target.kind is paths.RouteKind.STREAM:
            assert self._streams is not None
            await self._streams.handle(request, target.target)
        elif target.kind is paths.RouteKind.SUBSCRIPTIONS and discovery.owns(target.target):
            # Extension discovery, listing, changes: their own __ds namespace, before subscriptions.
            assert self._extensions is not None
            request.route = "discovery"
            await self._extensions.handle(request, target.target)
        elif target.kind is paths.RouteKind.SUBSCRIPTIONS:
            request.route = "subscriptions"
            service = self._backend.subscriptions if self._backend is not None else None
            await subscriptions.handle(service, request, target.target, self.config.max_body_bytes)
        else:
            raise NotFound(f"no resource at {request.raw_path.decode('latin-1')}")

    async def _recovered_for(self, request: Request, target: paths.Route) -> None:
        """While streams are still recovering after a start (``engine/recovery.py``): wait until
        what ``request`` touches is. A request on one stream waits for that stream (and a fork
        create for its source too); staged-append requests, listings, the change feed and
        subscriptions look at many streams and wait for all of them."""
        assert self._backend is not None
        engine = self._backend.engine
        headers = request.headers
        if target.kind is not paths.RouteKind.STREAM or any(name in headers for name in _TXN):
            await engine.recovered()
            return
        await engine.prepare(target.target)
        source = headers.get("stream-forked-from") if request.method == "PUT" else None
        if source is not None:
            # A malformed source: the create refuses it as it always does.
            with contextlib.suppress(paths.InvalidPath):
                await engine.prepare(paths.forked_from_path(source))

    def _extension_resources(self, engine: Engine) -> discovery.ExtensionResources:
        """The ``__ds/x-durastream`` resources; with ``--workers`` N > 1, the listing fanned out to
        every shard, the change feed and selections likewise (shards/changefeed.py), and the
        extension document without what the workers do not serve."""
        router = self._router
        return discovery.ExtensionResources(
            engine,
            self._live,
            self.config.max_body_bytes,
            self.config.chunk_bytes,
            fan_out=None if router is None else ListingFanOut(router),
            changes_fan_out=None if router is None else ChangesFanOut(router, engine, self._live),
            bulk_fan_out=None if router is None else BulkFanOut(router),
            multirange_fan_out=None if router is None else MultiRangeFanOut(router),
            withheld=frozenset() if router is None else extensions.NOT_WITH_WORKERS,
        )

    async def _census(self) -> Census:
        """What the backend holds, for a scrape (asked then: not every backend offers it)."""
        assert self._backend is not None
        return await self._backend.engine.census()

    async def _metrics(self, request: Request) -> None:
        """``GET /metrics``: the Prometheus text format (``metrics/exposition.py``); with
        ``--workers N``, every shard's (``metrics/shards.py``)."""
        if request.method not in ("GET", "HEAD"):
            raise MethodNotAllowed("metrics are read with GET", headers={"Allow": "GET, HEAD"})
        if self._exporter is None:
            raise NotFound("the server is not serving yet")
        body = await self._exporter.render()
        router = self._router
        if router is not None and router.count > 1 and not is_shard_page(router, request):
            # --workers N: every shard's series, labelled (metrics/shards.py); 200 even when a
            # worker does not answer (its series absent, durastream_shard_up 0)
            answers = await ask_the_others(router, request)
            expositions = {
                k: None if a is None or a[0] != 200 else a[1] for k, a in answers.items()
            }
            body = merged_exposition({router.index: body, **expositions})
        headers = [
            ("Content-Type", METRICS_CONTENT_TYPE),
            ("Cache-Control", responses.CACHE_NO_STORE),
        ]
        await responses.send_response(
            request.send, 200, headers, body, head=request.method == "HEAD"
        )

    def _quarantined(self, entries: list[QuarantinedStream]) -> list[dict[str, Any]]:
        """Quarantined streams for ``/healthz`` (the first ``HEALTH_QUARANTINE_LIST``; the count is
        exact). A server that serves everything else stays healthy (200), so that an orchestrator
        does not restart it in a loop over one damaged directory. The health check needs no token,
        so with tokens configured the stream paths are left out (the start-up log and
        ``quarantine/<name>.json`` have them)."""
        show_paths = self._auth is None
        return [
            {
                "id": entry.id,
                "path": entry.path if show_paths else None,
                "reason": entry.reason,
                "location": entry.location,
            }
            for entry in entries
        ]

    async def _health(self, request: Request) -> None:
        """``GET /healthz``: this worker's health (one process: the server's); with ``--workers N``,
        the whole server's, every other worker asked for its own (``shards/overview.py``)."""
        if request.method not in ("GET", "HEAD"):
            raise MethodNotAllowed("health checks are GET or HEAD", headers={"Allow": "GET, HEAD"})
        document = self._own_health()
        status = 200 if document["status"] == "ok" else 503
        router = self._router
        if router is not None and router.count > 1 and not is_shard_page(router, request):
            answers = await ask_the_others(router, request)
            status, document = whole_health(router.index, document, answers, HEALTH_QUARANTINE_LIST)
        body = json.dumps(document, ensure_ascii=False).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("Cache-Control", responses.CACHE_NO_STORE),
        ]
        await responses.send_response(
            request.send, status, headers, body, head=request.method == "HEAD"
        )

    def _own_health(self) -> dict[str, Any]:
        """This process's health document (``status`` ``ok``, or ``draining`` while it shuts down)."""
        live = self._live
        draining = live is None or live.draining
        document: dict[str, Any] = {
            "status": "draining" if draining else "ok",
            "waiters": live.parked if live else 0,
        }
        if self._backend is not None:
            engine = self._backend.engine
            # Serving while streams still recover (engine/recovery.py): how many are left.
            document["recovering"] = engine.recovering
            document["streams_pending"] = engine.streams_pending
            document["packed_streams"], document["packs_bytes"] = engine.packs
            count, entries = engine.quarantined(HEALTH_QUARANTINE_LIST)
            document["quarantined_count"] = count
            document["quarantined"] = self._quarantined(entries)
        if self._router is not None:  # --workers N: which worker answered, and its counters
            document["shard"] = self._router.describe()
        return document


def _request(
    scope: Scope,
    headers: dict[str, str],
    receive: Receive,
    send: Send,
    responder: fastpath.RawResponder | None,
    request_id: str,
) -> Request:
    return Request(
        method=scope["method"].upper(),
        raw_path=scope.get("raw_path") or scope["path"].encode("utf-8"),
        query_string=scope.get("query_string", b""),
        headers=headers,
        scheme=scope.get("scheme", "http"),
        server=scope.get("server"),
        receive=receive,
        send=send,
        responder=responder,
        request_id=request_id,
    )


def _request_id_line(encoded_id: bytes) -> bytes:
    """The ``x-request-id`` header as a wire line (what the fast paths write after the head)."""
    return b"x-request-id: " + encoded_id + b"\r\n"


async def _no_send(message: MutableMapping[str, Any]) -> None:
    raise AssertionError("an authorization check sends nothing")


def _replayed(body: bytes) -> Receive:
    """A ``receive`` giving ``body`` (already read) again, whole: a create forwarded after it was
    read (``PlacedElsewhere``)."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> MutableMapping[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    return receive


async def _consumed() -> MutableMapping[str, Any]:
    """The ``receive`` of a direct request: its body was handed over whole."""
    return {"type": "http.disconnect"}
