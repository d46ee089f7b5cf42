"""URL routing and the mapping from a request path to an engine stream path.

The engine stores a stream under one canonical text path. It must be injective over what clients can
address: ``/v1/stream/a/b`` (two segments) and ``/v1/stream/a%2Fb`` (one segment holding a slash) are
different streams, while ``%41`` and ``A`` are the same character and so the same stream (RFC 3986
section 6.2.2.2). The canonical form is therefore: split the *raw* path on literal ``/``, percent-decode
each segment to UTF-8, then re-escape only ``%`` and ``/`` inside a segment. Ordinary paths
(``events/abc``) come out unchanged, which is also the form subscription bodies use (section 6).

Segments that are empty, ``.`` or ``..`` (after decoding), or that contain NUL, are rejected: they are the
classic path-traversal and aliasing shapes (section 12.2), and no client needs them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from typing import Final
from urllib.parse import urlsplit

STREAM_ROOT: Final = "/v1/stream"
STREAM_PREFIX: Final = STREAM_ROOT + "/"
HEALTH_PATH: Final = "/healthz"
METRICS_PATH: Final = "/metrics"
RESERVED_SEGMENT: Final = "__ds"  # section 6: control APIs, routed before stream handling
MAX_PATH_BYTES: Final = 4096

_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
# A path that is its own canonical form: non-empty ASCII segments without '%' (nothing to decode or
# escape), NUL or '.' (so no '.' or '..' segment). Nearly every path is one (``events/s000123``); it is
# taken as it is, without the per-segment decoding (a bulk request checks thousands of them).
_PLAIN_PATH: Final = re.compile(rb"[^%/.\x00\x80-\xff]+(?:/[^%/.\x00\x80-\xff]+)*")


class InvalidPath(ValueError):
    """The request path cannot name a stream."""


class RouteKind(Enum):
    HEALTH = "health"
    METRICS = "metrics"
    STREAM = "stream"
    SUBSCRIPTIONS = "subscriptions"
    NOT_FOUND = "not_found"


@dataclass(frozen=True, slots=True)
class Route:
    kind: RouteKind
    # STREAM: canonical engine path. SUBSCRIPTIONS: the raw (still percent-encoded) rest after "__ds/".
    target: str = ""


@functools.lru_cache(maxsize=4096)  # a request per append: the hot streams' paths, decoded once
def route(raw_path: bytes) -> Route:
    """Classify a raw request path (no query). Raises ``InvalidPath`` for a malformed stream path."""
    if raw_path == HEALTH_PATH.encode():
        return Route(RouteKind.HEALTH)
    if raw_path == METRICS_PATH.encode():
        return Route(RouteKind.METRICS)
    prefix = STREAM_PREFIX.encode()
    if not raw_path.startswith(prefix):
        if raw_path == STREAM_ROOT.encode():
            raise InvalidPath("the stream path is empty")
        return Route(RouteKind.NOT_FOUND)
    rest = raw_path[len(prefix) :]
    first, _, remainder = rest.partition(b"/")
    if _decode_segment(first) == RESERVED_SEGMENT:
        return Route(RouteKind.SUBSCRIPTIONS, remainder.decode("latin-1"))
    return Route(RouteKind.STREAM, stream_path(rest))


def stream_path(raw: bytes) -> str:
    """Canonical engine path for a raw, root-relative, percent-encoded path."""
    if not raw:
        raise InvalidPath("the stream path is empty")
    if len(raw) > MAX_PATH_BYTES:
        raise InvalidPath(f"the stream path is longer than {MAX_PATH_BYTES} bytes")
    if _PLAIN_PATH.fullmatch(raw):
        return raw.decode("ascii")
    return _decoded_path(raw)


def _decoded_path(raw: bytes) -> str:
    """``stream_path`` segment by segment: decoded, checked, and ``%`` and ``/`` escaped again."""
    segments = []
    for raw_segment in raw.split(b"/"):
        segment = _decode_segment(raw_segment)
        if segment == "":
            raise InvalidPath("the stream path has an empty segment")
        if segment in (".", ".."):
            raise InvalidPath("the stream path has a '.' or '..' segment")
        if "\x00" in segment:
            raise InvalidPath("the stream path contains NUL")
        segments.append(segment.replace("%", "%25").replace("/", "%2F"))
    return "/".join(segments)


def forked_from_path(value: str) -> str:
    """Engine path named by a ``Stream-Forked-From`` header.

    Section 4.2 says the value is the path component of the source's URL (``/v1/stream/src``). A full URL
    is accepted too (its path is used), and so is a root-relative path (``src``), since both name the
    same stream unambiguously.
    """
    text = value.strip()
    if "://" in text:
        text = urlsplit(text).path
    if text.startswith("/"):
        if not text.startswith(STREAM_PREFIX):
            raise InvalidPath(f"Stream-Forked-From must be a path under {STREAM_PREFIX}")
        text = text[len(STREAM_PREFIX) :]
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        raw = text.encode("utf-8")
    return stream_path(raw)


def _decode_segment(raw: bytes) -> str:
    """Percent-decode one segment strictly: bad escapes and non-UTF-8 results are errors, not guesses."""
    if b"%" not in raw:
        decoded = raw
    else:
        out = bytearray()
        i = 0
        n = len(raw)
        while i < n:
            byte = raw[i]
            if byte == 0x25:  # '%'
                pair = raw[i + 1 : i + 3]
                if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                    raise InvalidPath("invalid percent-escape in the path")
                out.append(int(pair, 16))
                i += 3
            else:
                out.append(byte)
                i += 1
        decoded = bytes(out)
    try:
        return decoded.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidPath("the stream path is not valid UTF-8") from None
