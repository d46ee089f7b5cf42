"""The listing of a server with ``--workers N`` (decision 0009, "Fan-out"): every shard's page, merged.

Each worker holds only its shard's streams, and a listing (``__ds/x-durastream/streams``, extension
``listing``, docs/extensions.md section 4) must answer every stream of the server. The worker that
receives it computes its own page and asks every other worker for theirs with the same query, over the
Unix sockets the router already keeps open (``router.ShardRouter.fetch``); the asked worker recognises
the request as part of a fan-out by ``SHARD_PAGE_HEADER`` *and* by its arrival on that socket, so a
client cannot get one shard's page presented as the whole listing.

Merging: every page is sorted by path and a shard's ``next`` is the last path it examined. A shard that
stopped early (its page full, or its examine allowance spent) may hold more streams after its ``next``,
so the merged page stops at the smallest ``next`` of all (the *cutoff*): what lies beyond it is not yet
known for every shard. Within that, the first ``limit`` paths are answered; the next cursor is the last
path answered when the limit cut the page, else the cutoff. A cursor is a plain path, as with one
worker, so a page resumes in every shard from the same ``after`` and nothing is skipped or repeated.
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from durastream_server.errors import ShardUnavailable
from durastream_server.shards import internal

if TYPE_CHECKING:
    from durastream_server.http.handlers import Request
    from durastream_server.shards.router import ShardRouter

SHARD_PAGE_HEADER: Final = "x-durastream-shard-page"
# Request headers not carried to the other workers: one hop's (their connection frames itself) and
# ones the fan-out sets itself.
_NOT_CARRIED: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-connection",
        "content-length",
        SHARD_PAGE_HEADER,
        "x-durastream-follower",  # http/changes.FOLLOWER_HEADER: the server's own, never a client's
        internal.HEADER,  # the workers' credential: counts only from a worker, never relayed
    }
)


def merge_pages(pages: Sequence[dict[str, Any]], limit: int) -> dict[str, Any]:
    """One listing page from every shard's page of the same query (module docstring)."""
    cutoff = min((page["next"] for page in pages if page["next"] is not None), default=None)
    merged = heapq.merge(*(page["streams"] for page in pages), key=lambda entry: entry["path"])
    found: list[dict[str, Any]] = []
    for entry in merged:
        if cutoff is not None and entry["path"] > cutoff:
            return {"streams": found, "next": cutoff}
        if len(found) == limit:  # one more path is known: the page is cut by the limit
            return {"streams": found, "next": found[-1]["path"]}
        found.append(entry)
    return {"streams": found, "next": cutoff}


class ListingFanOut:
    """Asks the other workers for their page of a listing and merges it with this worker's."""

    def __init__(self, router: ShardRouter) -> None:
        self._router = router

    def is_shard_page(self, request: Request) -> bool:
        return is_shard_page(self._router, request)

    async def merged(self, request: Request, local: dict[str, Any], limit: int) -> dict[str, Any]:
        """The whole server's page: ``local`` (this shard's) and every other shard's, merged. Raises
        ``ShardUnavailable`` (503) when a worker does not answer: never a partial listing."""
        router = self._router
        head = request_head(request)
        others = [shard for shard in range(router.count) if shard != router.index]
        pages = await asyncio.gather(*(self._page(shard, head) for shard in others))
        return merge_pages([local, *pages], limit)

    async def _page(self, shard: int, head: bytes) -> dict[str, Any]:
        return json.loads(await fetch_part(self._router, shard, head, "the listing"))


async def fetch_part(router: ShardRouter, shard: int, head: bytes, what: str) -> bytes:
    """The body of ``shard``'s 200 answer to ``head`` (its part of ``what``); ``ShardUnavailable``
    (503, ``Retry-After``) when it does not answer or answers anything else: the same request passed
    this worker's checks and its token, so another answer from a peer is its failure, not the
    client's."""
    status, body = await router.fetch(shard, head)
    if status != 200:
        raise peer_failed(shard, status, what)
    return body


def peer_failed(shard: int, status: int, what: str) -> ShardUnavailable:
    """The 503 for a worker that answered ``status`` to its part of ``what`` (see ``fetch_part``)."""
    return ShardUnavailable(
        f"the worker of shard {shard} answered {status} to its part of {what}; retry shortly",
        headers={"Retry-After": "1"},
    )


def is_shard_page(router: ShardRouter, request: Request) -> bool:
    """Whether ``request`` is another worker asking for this shard's part alone (of a listing, a
    change page, a selection): the header, sent over the workers' Unix socket (a request from the
    public port with it is answered for the whole server)."""
    return SHARD_PAGE_HEADER in request.headers and router.from_worker(request.server)


def request_head(
    request: Request, query: bytes | None = None, *, method: bytes = b"GET", body: bytes = b""
) -> bytes:
    """The request sent to each other worker: ``method`` (a GET also for a client's HEAD: the part's
    body is needed), the client's path and headers (its token included: each worker checks it),
    ``query`` (default: the client's), marked as a shard's part of a fan-out, and ``body`` if any."""
    target = request.raw_path
    query = request.query_string if query is None else query
    if query:
        target += b"?" + query
    lines = [method + b" " + target + b" HTTP/1.1"]
    lines += [
        f"{name}: {value}".encode("latin-1")
        for name, value in request.headers.items()
        if name not in _NOT_CARRIED
    ]
    if "host" not in request.headers:
        lines.append(b"host: localhost")
    lines.append(f"{SHARD_PAGE_HEADER}: 1".encode())
    if body:
        lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
