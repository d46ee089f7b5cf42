"""The ASGI app driven in-process with stub backends, for behaviour a real engine cannot be made to show on
demand: an unexpected internal exception (500, server keeps serving), a build without the subscription
service (``__ds`` answers a JSON 404, never a stream), and the exact value handed to the subscription
service. Everything else is tested against a real server process.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from durastream_server.config import ServerConfig
from durastream_server.engine.api import StreamInfo
from durastream_server.errors import NotFound
from durastream_server.http.app import DurastreamApp
from durastream_server.subscriptions.http_types import (
    SubscriptionHttpRequest,
    SubscriptionHttpResponse,
)


class _ExplodingEngine:
    """Reads blow up with a non-protocol error; HEAD works; unknown streams are NotFound."""

    recovering = False  # every stream recovered (engine/recovery.py)

    async def read(self, request: Any) -> Any:
        raise RuntimeError("disk on fire: /secret/path")

    def head(self, path: str) -> StreamInfo:
        if path != "ok":
            raise NotFound(f"no stream {path}")
        return StreamInfo(
            "ok", "sid", "text/plain", "0000000000000000_0000000000000000", False, None, None
        )

    async def wait(self, path: str, offset: str, timeout: float) -> bool:
        return False


class _RecordingSubscriptions:
    def __init__(self) -> None:
        self.requests: list[SubscriptionHttpRequest] = []
        self.bodies: list[bytes] = []

    async def handle(self, request: SubscriptionHttpRequest) -> SubscriptionHttpResponse:
        self.requests.append(request)
        self.bodies.append(await request.read_body())
        return SubscriptionHttpResponse(
            status=201, headers={"Content-Type": "application/json"}, body=b'{"ok":true}'
        )


class _Backend:
    def __init__(self, engine: Any, subscriptions: Any) -> None:
        self.engine = engine
        self.subscriptions = subscriptions
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def _call(
    app: DurastreamApp,
    method: str,
    raw_path: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
    *,
    query: bytes = b"",
) -> tuple[int, dict[str, str], bytes]:
    scope = {
        "type": "http",
        "method": method,
        "path": raw_path.decode("latin-1"),
        "raw_path": raw_path,
        "query_string": query,
        "headers": headers,
        "scheme": "http",
        "server": ("127.0.0.1", 9),
    }
    inbox = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if inbox:
            return inbox.pop(0)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    assert start["type"] == "http.response.start"
    response_headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], response_headers, b"".join(m.get("body", b"") for m in sent[1:])


async def _started(backend: _Backend) -> DurastreamApp:
    async def open_backend() -> _Backend:
        return backend

    app = DurastreamApp(ServerConfig(), open_backend)  # type: ignore[arg-type]
    messages = [{"type": "lifespan.startup"}]
    replies: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else await asyncio.Future()

    async def send(message: dict) -> None:
        replies.append(message)

    task = asyncio.ensure_future(app({"type": "lifespan"}, receive, send))
    while not replies:
        await asyncio.sleep(0)
    assert replies == [{"type": "lifespan.startup.complete"}]
    task.cancel()
    return app


def test_unexpected_error_is_a_generic_500_and_the_app_keeps_serving() -> None:
    async def scenario() -> None:
        app = await _started(_Backend(_ExplodingEngine(), None))
        status, headers, body = await _call(app, "GET", b"/v1/stream/ok", [])
        assert status == 500
        assert json.loads(body) == {
            "error": {"code": "INTERNAL", "message": "internal server error"}
        }
        assert b"secret" not in body and b"fire" not in body  # no internal detail leaks
        assert headers["x-content-type-options"] == "nosniff"
        status, headers, body = await _call(app, "HEAD", b"/v1/stream/ok", [])
        assert status == 200 and body == b""
        status, _, body = await _call(app, "HEAD", b"/v1/stream/missing", [])
        assert status == 404 and body == b""  # HEAD errors carry no body

    asyncio.run(scenario())


def test_reserved_prefix_without_subscription_service_is_a_json_404() -> None:
    async def scenario() -> None:
        app = await _started(_Backend(_ExplodingEngine(), None))
        status, headers, body = await _call(
            app, "PUT", b"/v1/stream/__ds/subscriptions/s1", [], b"{}"
        )
        assert status == 404
        assert headers["content-type"] == "application/json"
        assert json.loads(body)["error"]["code"] == "NOT_FOUND"

    asyncio.run(scenario())


def test_subscription_requests_are_handed_over_as_plain_values() -> None:
    async def scenario() -> None:
        service = _RecordingSubscriptions()
        app = await _started(_Backend(_ExplodingEngine(), service))
        status, headers, body = await _call(
            app,
            "POST",
            b"/v1/stream/__ds/subscriptions/sub-1/streams/events%2Fx",
            [
                (b"Host", b"example.test:4437"),
                (b"Content-Type", b"application/json"),
                (b"Origin", b"http://localhost:5173"),
            ],
            b'{"streams":["a"]}',
        )
        assert (status, body) == (201, b'{"ok":true}')
        assert (
            headers["access-control-allow-origin"] == "http://localhost:5173"
        )  # loopback: allowed
        (request,) = service.requests
        assert request.method == "POST"
        assert request.subpath == "subscriptions/sub-1/streams/events%2Fx"
        assert request.headers["content-type"] == "application/json"
        assert service.bodies == [b'{"streams":["a"]}']
        assert "connection" not in headers  # the body was read: the connection may be reused

    asyncio.run(scenario())
