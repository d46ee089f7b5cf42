"""``{root}/__ds/x-durastream/...``: extension discovery, stream listing, the change feed and
multi-range requests (``docs/extensions.md``, "Advertisement", sections 4, 8 and 9; the last two are
``changes.py`` and ``multirange.py``).

These live under the reserved ``__ds`` segment (so no stream path can shadow them) in an ``x-durastream``
namespace that the subscription APIs never use; the app routes them here before the subscription
dispatch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import msgspec

from durastream_server import extensions
from durastream_server.errors import MethodNotAllowed, NotFound
from durastream_server.http import bulk, changes, multirange, responses
from durastream_server.http.query import bounded_int, glob_parameter, query_values

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.http.handlers import Request
    from durastream_server.http.live import LiveReaders
    from durastream_server.shards.bulkwrite import BulkFanOut
    from durastream_server.shards.changefeed import ChangesFanOut
    from durastream_server.shards.fanout import ListingFanOut
    from durastream_server.shards.multirange import MultiRangeFanOut

NAMESPACE: Final = "x-durastream"
DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 10000
# Paths a page may examine beyond its limit before it answers with what it found and a ``next``:
# bounds the cost of a pattern that matches few streams (docs/extensions.md section 4).
EXAMINE_ALLOWANCE: Final = 1000
RESOURCES: Final = (
    "extensions",
    "streams",
    "changes",
    "selections",
    "lookups",
    "reads",
    "ensure",
    "stages",
    "commits",
)
# Resources that write (bulk-write, ``bulk.py``): a read-only token is refused; each listed stream is
# checked against a prefixed token's prefix on its own.
WRITES: Final = frozenset({"ensure", "stages", "commits"})
# Resources that answer stream paths and tails: a token limited to a prefix must stay inside it with
# ``prefix=`` or ``pattern=`` (http/auth.py).
SCOPED_BY_QUERY: Final = frozenset({"streams", "changes"})


def owns(subpath: str) -> bool:
    """True for a ``__ds`` sub-path (raw, after ``__ds/``) in this server's extension namespace."""
    return subpath == NAMESPACE or subpath.startswith(NAMESPACE + "/")


class ExtensionResources:
    """The resources under ``{root}/__ds/x-durastream/``; built once per server, like the handlers."""

    def __init__(
        self,
        engine: Engine,
        live: LiveReaders,
        max_body_bytes: int,
        chunk_bytes: int,
        *,
        fan_out: ListingFanOut | None = None,
        changes_fan_out: ChangesFanOut | None = None,
        bulk_fan_out: BulkFanOut | None = None,
        multirange_fan_out: MultiRangeFanOut | None = None,
        withheld: frozenset[str] = frozenset(),
    ) -> None:
        self._engine = engine
        self._live = live
        self._max_body_bytes = max_body_bytes
        self._chunk_bytes = chunk_bytes
        # --workers N > 1: the listing merges every shard's page (shards/fanout.py), the change feed
        # and selections span every shard (shards/changefeed.py), and the extension document leaves
        # out what the workers do not serve, as the header does.
        self._fan_out = fan_out
        self._changes_fan_out = changes_fan_out
        self._bulk_fan = bulk_fan_out  # bulk-write, split by shard (shards/bulkwrite.py)
        self._multirange_fan_out = multirange_fan_out  # reads and lookups: shards/multirange.py
        self._withheld = withheld

    async def handle(self, request: Request, subpath: str) -> None:
        name = subpath[len(NAMESPACE) + 1 :]
        document: dict[str, Any]
        if name == "reads":
            await multirange.serve_reads(
                self._engine,
                request,
                self._max_body_bytes,
                self._chunk_bytes,
                self._multirange_fan_out,
            )
            return
        if name == "selections":
            document = await self._selections(request)
        elif name == "lookups":
            document = await multirange.serve_lookups(
                self._engine, request, self._max_body_bytes, self._multirange_fan_out
            )
        elif name == "ensure":
            bulk_fan = self._bulk_fan_out(request)
            document = await bulk.serve_ensure(
                self._engine, request, self._max_body_bytes, bulk_fan and bulk_fan.ensure
            )
        elif name == "stages":
            bulk_fan = self._bulk_fan_out(request)
            document = await bulk.serve_stages(
                self._engine, request, self._max_body_bytes, bulk_fan and bulk_fan.stages
            )
        elif name == "commits":
            bulk_fan = self._bulk_fan_out(request)
            document = await bulk.serve_commits(
                self._engine, request, self._max_body_bytes, bulk_fan and bulk_fan.commits
            )
        elif name not in ("extensions", "streams", "changes"):
            raise NotFound(
                f"no extension resource {subpath!r}; known: "
                + ", ".join(f"{NAMESPACE}/{known}" for known in RESOURCES)
            )
        elif request.method not in ("GET", "HEAD"):
            raise MethodNotAllowed(
                f"{request.method} is not supported here; use GET", headers={"Allow": "GET, HEAD"}
            )
        elif name == "extensions":
            document = extensions.discovery_document(self._withheld)
        elif name == "streams":
            document = await self._listing(request)
        else:
            values = query_values(request.query_string, changes.PARAMETERS)
            fan = self._changes_fan_out
            if fan is None or fan.is_shard_part(request):
                follower = fan is not None and changes.FOLLOWER_HEADER in request.headers
                document = await changes.serve_changes(
                    self._engine, self._live, request, values, counted=not follower
                )
            else:
                document = await fan.page(request, values)
        body = (
            bulk.answer_body(document)
            if name in bulk.RESOURCES or name == "streams"
            else json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
        )
        headers = [
            ("Content-Type", "application/json"),
            ("Cache-Control", responses.CACHE_NO_STORE),
        ]
        await responses.send_response(
            request.send, 200, headers, body, head=request.method == "HEAD"
        )

    def _bulk_fan_out(self, request: Request) -> BulkFanOut | None:
        """With ``--workers`` N > 1, a bulk request's entries go to their shards' workers (unless
        this is another worker sending this shard its part: served here alone)."""
        fan = self._bulk_fan
        return None if fan is None or fan.is_shard_part(request) else fan

    async def _selections(self, request: Request) -> dict[str, Any]:
        """Register a selection: with one worker here; else this shard's part here and the others'
        in their workers (unless another worker asks for this shard's part alone)."""
        fan = self._changes_fan_out
        if fan is None:
            return await changes.serve_selections(self._engine, request, self._max_body_bytes)
        elsewhere = None
        if not fan.is_shard_part(request):

            async def elsewhere(body: bytes) -> int:
                return await fan.register_elsewhere(request, body)

        return await changes.serve_selections(
            self._engine, request, self._max_body_bytes, keep=fan.keep, elsewhere=elsewhere
        )

    async def _listing(self, request: Request) -> dict[str, Any]:
        """This server's page: this shard's alone with one worker (or when another worker asks for
        its part), else every shard's, merged."""
        document, limit = _listing(self._engine, request.query_string)
        fan_out = self._fan_out
        if fan_out is None or fan_out.is_shard_page(request):
            return document
        # The merge reads entries as dicts (the other workers' pages are parsed JSON).
        document["streams"] = [msgspec.structs.asdict(entry) for entry in document["streams"]]
        return await fan_out.merged(request, document, limit)


def listing_query(query_string: bytes) -> dict[str, str]:
    """The listing's query parameters; ``InvalidParameter`` names what is wrong. (The auth check reads
    ``prefix`` and ``pattern`` of listings and change queries through this too.)"""
    return query_values(query_string, ("prefix", "pattern", "after", "limit"))


def _listing(engine: Engine, query_string: bytes) -> tuple[dict[str, Any], int]:
    """One page of live streams, sorted by path; ``next`` is the ``after`` of the following page; and
    the page's limit.

    The page reads a range of the engine's sorted paths: ``prefix`` and the pattern's literal prefix
    (``events/*`` -> ``events/``) bound it, and at most ``limit + EXAMINE_ALLOWANCE`` paths of it are
    examined. So a page costs O(log n + limit) whatever the pattern: one that matches nothing answers
    an empty page with a ``next`` instead of walking every stream.
    """
    values = listing_query(query_string)
    prefix = values.get("prefix", "")
    match = None
    pattern = glob_parameter(values)
    if pattern is not None:
        match = pattern.matches
        narrower = _narrower(prefix, pattern.literal_prefix())
        limit = bounded_int(values, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        if narrower is None:  # no path can start with both
            return {"streams": [], "next": None}, limit
        prefix = narrower
    after = values.get("after")
    limit = bounded_int(values, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    page = engine.list_page(
        prefix, match=match, after=after, limit=limit, examine=limit + EXAMINE_ALLOWANCE
    )
    # The engine's ``StreamListing`` entries go into the answer as they are: msgspec encodes each as
    # the object ``{"path", "content_type", "next_offset", "closed"}`` (``bulk.answer_body``), with no
    # dict made per stream (docs/benchmarks.md, fanout "Run 23").
    return {"streams": page.streams, "next": page.next}, limit


def _narrower(a: str, b: str) -> str | None:
    """The longer of two prefixes if one extends the other, else None (they select nothing)."""
    if a.startswith(b):
        return a
    if b.startswith(a):
        return b
    return None
