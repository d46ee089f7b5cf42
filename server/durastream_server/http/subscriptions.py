"""Routing ``/v1/stream/__ds/...`` to the subscription service (sections 6-7) as plain values.

The service sees a ``SubscriptionHttpRequest`` and returns a ``SubscriptionHttpResponse``; it never sees
ASGI. The HTTP layer adds only what every response gets (security and CORS headers). When the service is
not available the reserved prefix still answers, with a JSON 404, and is never treated as a stream.

Bodies are small and read late. A control request's body is a few hundred bytes of JSON, so it is capped
at ``MAX_CONTROL_BODY_BYTES`` (413 naming the limit, before a byte is read when the length is declared),
whatever ``--max-body-bytes`` allows appends. And it is read only when the service asks for it, after it
has authenticated the caller: a request answered without its body (401, 404, ...) never costs the
server more than its headers, and its connection is closed rather than drained.
"""

from __future__ import annotations

from typing import Final, Protocol

from durastream_server.errors import NotFound, PayloadTooLarge
from durastream_server.http import responses
from durastream_server.http.body import ClientDisconnected, read_body
from durastream_server.http.handlers import Request
from durastream_server.subscriptions.http_types import (
    ClientGone,
    SubscriptionHttpRequest,
    SubscriptionHttpResponse,
)

# The largest subscription body: a configuration with about 2,000 explicit stream paths of 30 bytes.
# More explicit streams are added in further POST .../streams requests (links are additive).
MAX_CONTROL_BODY_BYTES: Final = 64 * 1024


class SubscriptionHandler(Protocol):
    async def handle(self, request: SubscriptionHttpRequest) -> SubscriptionHttpResponse: ...


class _LazyBody:
    """The request body, read (at most ``limit`` bytes) only when the service asks for it."""

    def __init__(self, request: Request, limit: int) -> None:
        self._request = request
        self._limit = limit
        self._body: bytes | None = None

    @property
    def consumed(self) -> bool:
        return self._body is not None

    async def read(self) -> bytes:
        if self._body is None:
            try:
                self._body = await read_body(
                    self._request.receive, self._request.headers, self._limit
                )
            except ClientDisconnected:
                raise ClientGone() from None
            except PayloadTooLarge as exc:
                raise PayloadTooLarge(
                    f"{exc.message} of subscription control requests (__ds); add many explicit "
                    "streams in several POST .../streams requests"
                ) from None
        return self._body


def _has_body(headers: dict[str, str]) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() != "0"


async def handle(
    service: SubscriptionHandler | None, request: Request, subpath: str, max_body_bytes: int
) -> None:
    if service is None:
        raise NotFound("subscriptions are not available on this server")
    body = _LazyBody(request, min(MAX_CONTROL_BODY_BYTES, max_body_bytes))
    try:
        answer = await service.handle(
            SubscriptionHttpRequest(
                method=request.method,
                subpath=subpath,
                query=request.query_string.decode("latin-1"),
                headers=dict(request.headers),
                read_body=body.read,
            )
        )
    except ClientGone:
        raise ClientDisconnected() from None
    headers = [
        (name, value) for name, value in answer.headers.items() if name.lower() != "content-length"
    ]
    if not any(name.lower() == "cache-control" for name, _ in headers):
        headers.append(("Cache-Control", responses.CACHE_NO_STORE))
    if not body.consumed and _has_body(request.headers):
        headers.append(("Connection", "close"))  # answered without it: don't read it now either
    await responses.send_response(
        request.send, answer.status, headers, answer.body, head=request.method == "HEAD"
    )
