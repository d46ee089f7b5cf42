"""Reading a request body with a hard size limit (hazard 25).

A declared ``Content-Length`` over the limit is refused before a single body byte is read. A chunked body is
read piece by piece and refused as soon as it crosses the limit; the rest is never buffered (uvicorn pauses
the socket once its small receive buffer is full, and the 413 closes the connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from durastream_server.errors import BadRequest, PayloadTooLarge
from durastream_server.subscriptions import jsonbody

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


INLINE_JSON_BYTES: Final = 64 * 1024  # larger JSON bodies are parsed off the event loop


class ClientDisconnected(Exception):
    """The client went away before sending its whole body; there is nobody to answer."""


def check_declared_length(headers: dict[str, str], limit: int) -> None:
    """Refuse a declared ``Content-Length`` over ``limit`` (or malformed) before any body byte is read.

    Also called by routes that never read a body (``/healthz``, ``/metrics``): an oversized request is
    refused the same way wherever it is sent, and the 413 closes the connection instead of leaving the
    unread body on it.
    """
    declared = headers.get("content-length")
    if declared is not None:
        text = declared.strip()
        if not text.isascii() or not text.isdigit() or len(text) > 19:
            raise BadRequest(f"invalid Content-Length {declared!r}")
        if int(text) > limit:
            raise PayloadTooLarge(
                f"request body of {int(text)} bytes exceeds the {limit}-byte limit"
            )


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    check_declared_length(headers, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1 and type(chunks[0]) is bytes:
        return chunks[0]
    return b"".join(chunks)  # also makes bytes of a bytearray piece (ASGI allows either)


async def read_json_body(receive: Receive, headers: dict[str, str], limit: int, shape: str) -> Any:
    """A JSON request body (at most ``limit`` bytes, nested at most 32 levels), parsed in a worker
    thread when it is larger than 64 KiB. A body that is not JSON is a 400 saying ``shape``."""
    return await parse_json(await read_body(receive, headers, limit), shape)


async def parse_json(body: bytes, shape: str) -> Any:
    """``body`` as JSON, parsed in a worker thread when it is larger than 64 KiB; 400 saying ``shape``."""
    if len(body) > INLINE_JSON_BYTES:
        return await asyncio.get_running_loop().run_in_executor(None, _parse_json, body, shape)
    return _parse_json(body, shape)


def _parse_json(body: bytes, shape: str) -> Any:
    try:
        return jsonbody.loads(body)
    except ValueError as exc:
        raise BadRequest(f"the body must be {shape}: {exc}") from None
