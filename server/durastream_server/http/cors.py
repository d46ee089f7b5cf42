"""CORS for browser clients: every response allows any origin and exposes every protocol header.

A header missing from ``Access-Control-Expose-Headers`` is invisible to cross-origin JavaScript, and for
``Stream-SSE-Data-Encoding`` that silently turns base64 text into "data" (hazard 15). So the list below is
every response header the protocol (and this server) defines, and preflights allow every request header a
client may send, including ``If-None-Match`` (hazard 41).
"""

from __future__ import annotations

from typing import Final

EXPOSED_HEADERS: Final = (
    "Stream-Next-Offset",
    "Stream-Cursor",
    "Stream-Up-To-Date",
    "Stream-Closed",
    "Stream-SSE-Data-Encoding",
    "Stream-TTL",
    "Stream-Expires-At",
    "Producer-Epoch",
    "Producer-Seq",
    "Producer-Expected-Seq",
    "Producer-Received-Seq",
    "ETag",
    "Location",
    "Content-Type",
    "Content-Length",
    "Cache-Control",
    "Retry-After",
    "Durastream-Extensions",  # extensions (docs/extensions.md): advertisement and bounded reads
    "Durastream-End-Reached",
    "Durastream-Txn-Messages",  # staged appends
    "Durastream-Txn-Bytes",
    "Durastream-Txn-Expires-At",
)

ALLOWED_REQUEST_HEADERS: Final = (
    "Content-Type",
    "Authorization",
    "If-None-Match",
    "Stream-Seq",
    "Stream-TTL",
    "Stream-Expires-At",
    "Stream-Closed",
    "Stream-Forked-From",
    "Stream-Fork-Offset",
    "Stream-Fork-Sub-Offset",
    "Producer-Id",
    "Producer-Epoch",
    "Producer-Seq",
    "Durastream-Txn",  # staged appends
    "Durastream-Txn-TTL",
    "Durastream-Commit",
    "Durastream-Abort",
)

ALLOWED_METHODS: Final = ("GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS")
PREFLIGHT_MAX_AGE_SECONDS: Final = 86400

_EXPOSE_VALUE: Final = ", ".join(EXPOSED_HEADERS)


def response_headers() -> list[tuple[str, str]]:
    """CORS headers carried by every response, errors included."""
    return [
        ("Access-Control-Allow-Origin", "*"),
        ("Access-Control-Expose-Headers", _EXPOSE_VALUE),
    ]


def preflight_headers() -> list[tuple[str, str]]:
    """Headers answering an ``OPTIONS`` preflight."""
    return [
        ("Access-Control-Allow-Methods", ", ".join(ALLOWED_METHODS)),
        ("Access-Control-Allow-Headers", ", ".join(ALLOWED_REQUEST_HEADERS)),
        ("Access-Control-Max-Age", str(PREFLIGHT_MAX_AGE_SECONDS)),
    ]
