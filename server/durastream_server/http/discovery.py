"""``{root}/__ds/x-durastream/...``: extension discovery and stream listing (``docs/extensions.md``,
"Advertisement" and section 4).

These live under the reserved ``__ds`` segment (so no stream path can shadow them) in an ``x-durastream``
namespace that the subscription APIs never use; the app routes them here before the subscription
dispatch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl

from durastream_server import extensions
from durastream_server.errors import InvalidParameter, MethodNotAllowed, NotFound
from durastream_server.http import responses
from durastream_server.http.parse import MAX_QUERY_FIELDS
from durastream_server.subscriptions.glob import InvalidPattern, compile_pattern

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.http.handlers import Request

NAMESPACE: Final = "x-durastream"
DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 10000
# Paths a page may examine beyond its limit before it answers with what it found and a ``next``:
# bounds the cost of a pattern that matches few streams (docs/extensions.md section 4).
EXAMINE_ALLOWANCE: Final = 1000


def owns(subpath: str) -> bool:
    """True for a ``__ds`` sub-path (raw, after ``__ds/``) in this server's extension namespace."""
    return subpath == NAMESPACE or subpath.startswith(NAMESPACE + "/")


async def handle(engine: Engine, request: Request, subpath: str) -> None:
    if request.method not in ("GET", "HEAD"):
        raise MethodNotAllowed(
            f"{request.method} is not supported here; use GET", headers={"Allow": "GET, HEAD"}
        )
    name = subpath[len(NAMESPACE) + 1 :]
    if name == "extensions":
        document: dict[str, Any] = extensions.discovery_document()
    elif name == "streams":
        document = _listing(engine, request.query_string)
    else:
        raise NotFound(
            f"no extension resource {subpath!r}; known: {NAMESPACE}/extensions, {NAMESPACE}/streams"
        )
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    headers = [("Content-Type", "application/json"), ("Cache-Control", responses.CACHE_NO_STORE)]
    await responses.send_response(request.send, 200, headers, body, head=request.method == "HEAD")


def listing_query(query_string: bytes) -> dict[str, str]:
    """The listing's query parameters; ``InvalidParameter`` names what is wrong. (The auth check reads
    ``prefix`` and ``pattern`` through this too, so both see the same parameters.)"""
    try:
        pairs = parse_qsl(
            query_string.decode("latin-1"),
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_QUERY_FIELDS,
        )
    except UnicodeDecodeError:
        raise InvalidParameter("query parameters must be UTF-8 after percent-decoding") from None
    except ValueError:
        raise InvalidParameter(f"at most {MAX_QUERY_FIELDS} query parameters") from None
    values: dict[str, str] = {}
    for key, value in pairs:
        if key in values and key in ("prefix", "pattern", "after", "limit"):
            raise InvalidParameter(f"{key} given more than once")
        values[key] = value
    return values


def _listing(engine: Engine, query_string: bytes) -> dict[str, Any]:
    """One page of live streams, sorted by path; ``next`` is the ``after`` of the following page.

    The page reads a range of the engine's sorted paths: ``prefix`` and the pattern's literal prefix
    (``events/*`` -> ``events/``) bound it, and at most ``limit + EXAMINE_ALLOWANCE`` paths of it are
    examined. So a page costs O(log n + limit) whatever the pattern: one that matches nothing answers
    an empty page with a ``next`` instead of walking every stream.
    """
    values = listing_query(query_string)
    prefix = values.get("prefix", "")
    match = None
    if "pattern" in values:
        try:
            pattern = compile_pattern(values["pattern"])
        except InvalidPattern as exc:
            raise InvalidParameter(
                f"pattern {values['pattern']!r} is not a valid glob: {exc} "
                "('*' matches one path segment, '**' any number of segments)"
            ) from None
        match = pattern.matches
        narrower = _narrower(prefix, pattern.literal_prefix())
        if narrower is None:  # no path can start with both
            return {"streams": [], "next": None}
        prefix = narrower
    after = values.get("after")
    limit = _limit(values.get("limit"))
    page = engine.list_page(
        prefix, match=match, after=after, limit=limit, examine=limit + EXAMINE_ALLOWANCE
    )
    return {
        "streams": [
            {
                "path": item.path,
                "content_type": item.content_type,
                "next_offset": item.next_offset,
                "closed": item.closed,
            }
            for item in page.streams
        ],
        "next": page.next,
    }


def _narrower(a: str, b: str) -> str | None:
    """The longer of two prefixes if one extends the other, else None (they select nothing)."""
    if a.startswith(b):
        return a
    if b.startswith(a):
        return b
    return None


def _limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIMIT
    if not text.isascii() or not text.isdigit() or text.startswith("0") or len(text) > 5:
        raise InvalidParameter(f"limit must be an integer from 1 to {MAX_LIMIT}, got {text!r}")
    limit = int(text)
    if limit > MAX_LIMIT:
        raise InvalidParameter(f"limit must be an integer from 1 to {MAX_LIMIT}, got {text!r}")
    return limit
