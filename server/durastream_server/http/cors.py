"""CORS for browser clients: which origins may read responses, and which protocol headers they may see.

Origins: by default only loopback origins (``http(s)://localhost``, ``127.x.y.z``, ``[::1]``, any port) are
allowed, so a page on some other site cannot read a local server from a developer's browser.
``--cors-origin`` replaces the default with a list (``https://app.example``, ``loopback`` for the default
set, or ``*`` for any origin). An allowed origin is echoed in ``Access-Control-Allow-Origin`` with
``Vary: Origin``; with ``*`` every response carries ``Access-Control-Allow-Origin: *``. Credentials mode is
never enabled (no ``Access-Control-Allow-Credentials``): bearer tokens are sent explicitly by the page, and
cookies play no part in this server. Preflights (``OPTIONS``) are answered 204 for any origin; a browser
still refuses the real request unless the origin is allowed.

A header missing from ``Access-Control-Expose-Headers`` is invisible to cross-origin JavaScript, and for
``Stream-SSE-Data-Encoding`` that silently turns base64 text into "data" (hazard 15). So the list below is
every response header the protocol (and this server) defines, and preflights allow every request header a
client may send, including ``If-None-Match`` (hazard 41) and ``Authorization``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from durastream_server.http.hosts import LOOPBACK_HOST

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
    "Durastream-Digest",  # producer duplicates and forgotten producers (extensions.md 6, 7)
    "Durastream-Forgotten-Epoch",
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
    "Durastream-Commit-Key",
    "Durastream-Abort",
    "Durastream-Forgotten-Producer",
)

ALLOWED_METHODS: Final = ("GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS")
PREFLIGHT_MAX_AGE_SECONDS: Final = 86400

_EXPOSE_VALUE: Final = ", ".join(EXPOSED_HEADERS)


ANY: Final = "*"
LOOPBACK: Final = "loopback"
ORIGIN_SYNTAX: Final = (
    "an origin such as https://app.example or http://localhost:3000 (scheme, host and optional port; "
    "no path), 'loopback' for every loopback origin, or '*' for any origin"
)

_LOOPBACK_ORIGIN: Final = re.compile(rf"https?://{LOOPBACK_HOST}(?::\d{{1,5}})?", re.IGNORECASE)
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def normalize_origin(text: str) -> str:
    """A configured origin in the form browsers send (lower-case, no default port); ``ValueError`` if not one."""
    value = text.strip()
    if value in (ANY, LOOPBACK):
        return value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r} is not {ORIGIN_SYNTAX}") from None
    scheme = parts.scheme.lower()
    if (
        scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise ValueError(f"{text!r} is not {ORIGIN_SYNTAX}")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        host = f"{host}:{port}"
    return f"{scheme}://{host}"


def response_headers() -> list[tuple[str, str]]:
    """CORS headers carried by every response, errors included (the origin part is per request)."""
    return [("Access-Control-Expose-Headers", _EXPOSE_VALUE)]


def preflight_headers() -> list[tuple[str, str]]:
    """Headers answering an ``OPTIONS`` preflight."""
    return [
        ("Access-Control-Allow-Methods", ", ".join(ALLOWED_METHODS)),
        ("Access-Control-Allow-Headers", ", ".join(ALLOWED_REQUEST_HEADERS)),
        ("Access-Control-Max-Age", str(PREFLIGHT_MAX_AGE_SECONDS)),
    ]


EncodedHeaders = list[tuple[bytes, bytes]]

_ALLOW_ANY: Final[EncodedHeaders] = [(b"access-control-allow-origin", b"*")]
_VARY: Final = (b"vary", b"Origin")


class CorsPolicy:
    """Decides, per request, the ``Access-Control-Allow-Origin`` (and ``Vary``) headers of the response."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        entries = {normalize_origin(o) for o in origins} or {LOOPBACK}
        self.any = ANY in entries
        self.loopback = LOOPBACK in entries
        self.exact = frozenset(entries - {ANY, LOOPBACK})

    def allows(self, origin: str) -> bool:
        if self.any:
            return True
        if self.loopback and _LOOPBACK_ORIGIN.fullmatch(origin):
            return True
        if not self.exact:
            return False
        try:
            return normalize_origin(origin) in self.exact
        except ValueError:
            return False

    def headers_for(self, origin: str | None) -> EncodedHeaders:
        """Encoded headers to add to the response of a request carrying ``Origin: origin`` (or none)."""
        if self.any:
            return _ALLOW_ANY
        if origin is not None and self.allows(origin.strip()):
            return [(b"access-control-allow-origin", origin.strip().encode("latin-1")), _VARY]
        return [_VARY]  # caches must not hand one origin's answer to another
