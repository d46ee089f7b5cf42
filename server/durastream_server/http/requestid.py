"""Request ids: one per request, returned in ``X-Request-Id`` and written in every log line of the
request, so a client's log line (the connector names it in its errors) can be matched to the server's.

A client may send its own ``X-Request-Id`` (a proxy's, or the caller's trace id): it is kept if it is
1 to 64 characters of ``A-Z a-z 0-9 . _ : -`` starting with a letter or digit; anything else (too long,
spaces, a list of several values, control characters) is replaced by a fresh id, so a header of a
client's choosing can never forge a log line or bloat every line of it. Fresh ids are a random per-process
prefix and a counter (``5f3a9c1e-2b``): unique across restarts with overwhelming probability, and a
string format plus an integer increment per request, nothing more.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

HEADER: Final = "x-request-id"
MAX_LENGTH: Final = 64
_ACCEPTED: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,63}\Z")


def acceptable(value: str) -> bool:
    """Is ``value`` an incoming request id the server keeps as it is?"""
    return _ACCEPTED.match(value) is not None


class RequestIds:
    """Hands out request ids: the client's when acceptable, else a fresh one."""

    __slots__ = ("_prefix", "_count")

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(4)
        self._count = 0

    def take(self, incoming: str | None) -> str:
        if incoming is not None and _ACCEPTED.match(incoming) is not None:
            return incoming
        self._count += 1
        return f"{self._prefix}-{self._count:x}"
