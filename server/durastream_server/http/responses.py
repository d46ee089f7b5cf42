"""Building and sending responses: common security headers, JSON error bodies, the ASGI send calls.

Every response (success, error, preflight, health) goes out through ``send_response`` or
``start_streaming``, so the browser security headers of section 12.7 and the CORS headers are on all of
them by construction, not by each handler remembering to add them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final

from durastream_server import extensions
from durastream_server.errors import ProtocolError
from durastream_server.http import cors

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Headers = list[tuple[str, str]]

CACHE_NO_STORE: Final = "no-store"
CACHE_CATCH_UP: Final = "public, max-age=60, stale-while-revalidate=300"  # section 10.1
CACHE_SSE: Final = "no-cache"  # section 5.8 and the conformance suite: keep proxies from buffering

# Stored content is inert: a browser never sniffs a type, and a stream of text/html (or an SVG) that is
# opened as a page runs no script and gets a unique origin, so it cannot act as this server's origin.
_SECURITY: Final = (
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "sandbox"),
    ("Cross-Origin-Resource-Policy", "cross-origin"),
)


def base_headers(withheld: frozenset[str] = frozenset()) -> Headers:
    # The extension advertisement rides on every response (errors, 204s, SSE, preflights) by design.
    return [*_SECURITY, *cors.response_headers(), extensions.advertisement(withheld)]


_NAMES: dict[str, bytes] = {}  # header name -> its encoded, lower-cased form (a few dozen names)


def _encode(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    # Latin-1 round-trips every byte a request header could have carried (values echo request data).
    names = _NAMES
    encoded = []
    for name, value in headers:
        raw = names.get(name)
        if raw is None:
            raw = name.lower().encode("latin-1")
            if len(names) < 256:
                names[name] = raw
        encoded.append((raw, value.encode("latin-1", "replace")))
    return encoded


_BASE_ENCODED = tuple(_encode(base_headers()))  # the same on every response: encode once


def withhold_extensions(names: frozenset[str]) -> None:
    """Stop advertising ``names`` on every response of this process: a worker of ``--workers N`` > 1
    answers the extensions spanning streams 501 (shards/router.py), and a client that saw them
    advertised would not fall back. Called once at start-up, before any answer is encoded (the direct
    path's header lines, ``handlers._answer_base``, are built from this on the first answer)."""
    global _BASE_ENCODED
    _BASE_ENCODED = tuple(_encode(base_headers(names)))


def response_headers(
    status: int, headers: Iterable[tuple[str, str]], body: bytes, *, head: bool = False
) -> list[tuple[bytes, bytes]]:
    """The encoded header list of a complete response: what ``send_response`` hands to the server, and
    what the long-poll fast path (``http/fastpath.py``) writes itself, so the two cannot differ."""
    encoded = [*_BASE_ENCODED, *_encode(headers)]
    if not head and status not in (204, 304):
        encoded.append((b"content-length", str(len(body)).encode()))
    return encoded


async def send_response(
    send: Send,
    status: int,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    head: bool = False,
) -> None:
    """Send a complete response. ``head`` drops the body (and its length) as HEAD requires."""
    encoded = response_headers(status, headers, body, head=head)
    await send({"type": "http.response.start", "status": status, "headers": encoded})
    await send({"type": "http.response.body", "body": b"" if head else body})


async def start_streaming(send: Send, status: int, headers: Iterable[tuple[str, str]]) -> None:
    """Send headers for a body of unknown length (chunked), e.g. SSE."""
    encoded = [*_BASE_ENCODED, *_encode(headers)]
    await send({"type": "http.response.start", "status": status, "headers": encoded})


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}, ensure_ascii=False).encode()


def protocol_error_parts(exc: ProtocolError) -> tuple[int, Headers, bytes]:
    """Status, headers and JSON body for a typed protocol error. Mapping is by type only (hazard 38)."""
    headers: Headers = [("Content-Type", "application/json"), ("Cache-Control", CACHE_NO_STORE)]
    headers.extend(exc.headers.items())
    if exc.closes_connection:
        headers.append(("Connection", "close"))
    return exc.status, headers, error_body(exc.code, exc.message)


def internal_error_parts() -> tuple[int, Headers, bytes]:
    headers: Headers = [("Content-Type", "application/json"), ("Cache-Control", CACHE_NO_STORE)]
    return 500, headers, error_body("INTERNAL", "internal server error")
