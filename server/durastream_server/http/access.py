"""The access log (``--access-log``): one line per answered request, on the ``durastream_server.access``
logger at INFO. Without ``--access-log`` the same line is written at DEBUG (``--log-level DEBUG``).

A line holds the request id, method, path and query as sent (escaped by the log formatter, so a
``%0A`` in a path cannot start a forged line), status, duration, and the request and response body sizes.
Never a header (so never a token) and never a body. A query parameter whose name suggests a secret
(``token``, ``secret``, ``password``, ``auth``, ``key``, ``sig``) has its value replaced by ``REDACTED``:
the protocol puts no secret in a query, but a client might.
"""

from __future__ import annotations

import logging
from typing import Final

logger = logging.getLogger("durastream_server.access")

_SECRET_HINTS: Final = ("token", "secret", "password", "auth", "key", "sig")
REDACTED: Final = "REDACTED"


def redact_query(query: str) -> str:
    """``query`` with the values of secret-looking parameters replaced."""
    if not query:
        return query
    parts = []
    for part in query.split("&"):
        name, equals, _ = part.partition("=")
        if equals and any(hint in name.lower() for hint in _SECRET_HINTS):
            part = f"{name}={REDACTED}"
        parts.append(part)
    return "&".join(parts)


def enabled(level: int) -> bool:
    """Would a line at ``level`` be written? (Checked before the line's fields are gathered.)"""
    return logger.isEnabledFor(level)


def log_request(
    *,
    level: int,
    request_id: str,
    method: str,
    raw_path: bytes,
    query_string: bytes,
    route: str,
    status: int,
    seconds: float,
    bytes_in: int,
    bytes_out: int,
) -> None:
    path = raw_path.decode("latin-1")
    query = redact_query(query_string.decode("latin-1"))
    duration_ms = round(seconds * 1000, 3)
    logger.log(
        level,
        "%s %s%s -> %d in %.1f ms (in %d B, out %d B) [%s]",
        method,
        path,
        "?" + query if query else "",
        status,
        duration_ms,
        bytes_in,
        bytes_out,
        request_id,
        extra={
            "event": "request",
            "request_id": request_id,
            "fields": {
                "method": method,
                "path": path,
                "query": query,
                "route": route,
                "status": status,
                "duration_ms": duration_ms,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
            },
        },
    )
