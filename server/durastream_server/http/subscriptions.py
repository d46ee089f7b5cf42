"""Routing ``/v1/stream/__ds/...`` to the subscription service (sections 6-7) as plain values.

The service sees a ``SubscriptionHttpRequest`` and returns a ``SubscriptionHttpResponse``; it never sees
ASGI. The HTTP layer adds only what every response gets (security and CORS headers). When the service is
not available the reserved prefix still answers, with a JSON 404, and is never treated as a stream.
"""

from __future__ import annotations

from typing import Protocol

from durastream_server.errors import NotFound
from durastream_server.http import responses
from durastream_server.http.body import read_body
from durastream_server.http.handlers import Request
from durastream_server.http.paths import STREAM_ROOT
from durastream_server.subscriptions.http_types import (
    SubscriptionHttpRequest,
    SubscriptionHttpResponse,
)


class SubscriptionHandler(Protocol):
    async def handle(self, request: SubscriptionHttpRequest) -> SubscriptionHttpResponse: ...


async def handle(
    service: SubscriptionHandler | None, request: Request, subpath: str, max_body_bytes: int
) -> None:
    if service is None:
        raise NotFound("subscriptions are not available on this server")
    body = await read_body(request.receive, request.headers, max_body_bytes)
    answer = await service.handle(
        SubscriptionHttpRequest(
            method=request.method,
            subpath=subpath,
            query=request.query_string.decode("latin-1"),
            headers=dict(request.headers),
            body=body,
            stream_root_url=f"{request.scheme}://{request.authority}{STREAM_ROOT}",
        )
    )
    headers = [
        (name, value) for name, value in answer.headers.items() if name.lower() != "content-length"
    ]
    if not any(name.lower() == "cache-control" for name, _ in headers):
        headers.append(("Cache-Control", responses.CACHE_NO_STORE))
    await responses.send_response(
        request.send, answer.status, headers, answer.body, head=request.method == "HEAD"
    )
