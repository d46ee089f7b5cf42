"""The ASGI application: lifespan, routing, error mapping, one log line per request.

No web framework: the protocol is a handful of methods on one URL shape, and owning the ASGI loop keeps
every byte of every response (headers, SSE framing, backpressure) explicit. The app does not know how the
backend is built; ``open_backend`` (called at lifespan startup) returns it, so the HTTP layer never touches
a file and tests can start the app on any backend.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from durastream_server.config import ServerConfig
from durastream_server.errors import BadRequest, MethodNotAllowed, NotFound, ProtocolError
from durastream_server.http import cors, discovery, fastpath, paths, responses, subscriptions
from durastream_server.http.auth import Authorizer
from durastream_server.http.body import ClientDisconnected
from durastream_server.http.handlers import Request, StreamHandlers
from durastream_server.http.live import LiveReaders
from durastream_server.http.parse import header_map

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.storage.quarantine import QuarantinedStream

logger = logging.getLogger("durastream_server.http")

# /healthz lists at most this many quarantined streams (and counts them all): a damaged disk may
# quarantine thousands, and a health probe must stay small and cheap.
HEALTH_QUARANTINE_LIST = 100

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Backend(Protocol):
    """What the HTTP layer serves: an engine, optionally a subscription service, and a way to stop."""

    engine: Engine
    subscriptions: subscriptions.SubscriptionHandler | None

    async def close(self) -> None: ...


class _TrackedSend:
    """Remembers whether and how the response started, so errors after the headers are handled sanely."""

    def __init__(self, send: Send, extra_headers: list[tuple[bytes, bytes]]) -> None:
        self._send = send
        self._extra_headers = extra_headers  # per-request headers (CORS origin) on every response
        self.status: int | None = None
        self.finished = False

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            message["headers"] = [*message["headers"], *self._extra_headers]
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)


class DurastreamApp:
    def __init__(
        self, config: ServerConfig, open_backend: Callable[[], Awaitable[Backend]]
    ) -> None:
        self.config = config
        self._open_backend = open_backend
        self._backend: Backend | None = None
        self._live: LiveReaders | None = None
        self._streams: StreamHandlers | None = None
        self._extensions: discovery.ExtensionResources | None = None
        self.startup_error: BaseException | None = None
        self._cors = cors.CorsPolicy(config.cors_origins)
        self._auth = Authorizer(config.auth_tokens) if config.auth_tokens else None

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
                self._live = LiveReaders(backend.engine)
                self._streams = StreamHandlers(backend.engine, self._live, self.config)
                self._extensions = discovery.ExtensionResources(
                    backend.engine, self._live, self.config.max_body_bytes, self.config.chunk_bytes
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.begin_drain()
                try:
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
        started = time.perf_counter()
        headers = header_map(scope.get("headers", ()))
        extra_headers = self._cors.headers_for(headers.get("origin"))
        tracked = _TrackedSend(send, extra_headers)
        request = Request(
            method=scope["method"].upper(),
            raw_path=scope.get("raw_path") or scope["path"].encode("utf-8"),
            query_string=scope.get("query_string", b""),
            headers=headers,
            scheme=scope.get("scheme", "http"),
            server=scope.get("server"),
            receive=receive,
            send=tracked,
            # The long-poll fast path writes whole answers itself: it appends the same extra headers.
            responder=fastpath.responder(scope, extra_headers),
        )
        try:
            await self._dispatch(request)
        except ProtocolError as exc:
            await self._send_error(request, tracked, *responses.protocol_error_parts(exc))
        except ClientDisconnected:
            pass  # nobody is left to answer
        except Exception:
            logger.exception("internal error on %s %r", request.method, request.raw_path)
            await self._send_error(request, tracked, *responses.internal_error_parts())
        finally:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s %s%s -> %s in %.1f ms",
                    request.method,
                    request.raw_path.decode("latin-1"),
                    "?" + request.query_string.decode("latin-1") if request.query_string else "",
                    tracked.status,
                    (time.perf_counter() - started) * 1000,
                )

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
        if target.kind is paths.RouteKind.HEALTH:
            await self._health(request)
        elif target.kind is paths.RouteKind.STREAM:
            assert self._streams is not None
            await self._streams.handle(request, target.target)
        elif target.kind is paths.RouteKind.SUBSCRIPTIONS and discovery.owns(target.target):
            # Extension discovery, listing, changes: their own __ds namespace, before subscriptions.
            assert self._extensions is not None
            await self._extensions.handle(request, target.target)
        elif target.kind is paths.RouteKind.SUBSCRIPTIONS:
            service = self._backend.subscriptions if self._backend is not None else None
            await subscriptions.handle(service, request, target.target, self.config.max_body_bytes)
        else:
            raise NotFound(f"no resource at {request.raw_path.decode('latin-1')}")

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
        if request.method not in ("GET", "HEAD"):
            raise MethodNotAllowed("health checks are GET or HEAD", headers={"Allow": "GET, HEAD"})
        live = self._live
        draining = live is None or live.draining
        document: dict[str, Any] = {
            "status": "draining" if draining else "ok",
            "waiters": live.parked if live else 0,
        }
        if self._backend is not None:
            count, entries = self._backend.engine.quarantined(HEALTH_QUARANTINE_LIST)
            document["quarantined_count"] = count
            document["quarantined"] = self._quarantined(entries)
        body = json.dumps(document, ensure_ascii=False).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("Cache-Control", responses.CACHE_NO_STORE),
        ]
        await responses.send_response(
            request.send, 503 if draining else 200, headers, body, head=request.method == "HEAD"
        )
