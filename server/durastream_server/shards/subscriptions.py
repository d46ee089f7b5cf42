"""Subscriptions (spec sections 6-7) with ``--workers N`` (decision 0009, "What is left" 2).

A subscription is **owned by one worker**, ``shard_of(subscription id)``: every request about it
(create, read, delete, membership, callback, claim, ack, release) is forwarded there like a stream's
request (``router.ShardRouter.owner_elsewhere``), and the owner runs the one-process service
(``subscriptions/service.py``) unchanged: one state machine per subscription, transitions synchronous
on one loop (no locks), generation, lease, retry schedule and every cursor persisted in the owner's
shard directory before an answer or a wake. Chosen over a part per shard because a subscription's
generation, wake id and lease are one counter and one holder across all of its streams: split by shard
they would need a consensus between workers for every wake.

What the owner does not have locally, this module gives it:

* **The other shards' streams** (``PeerFeeds``): one follower per other shard reads that shard's own
  change feed (``__ds/x-durastream/changes``, marked as a shard's part, over the Unix sockets) and parks
  on it (``wait``), feeding every change to the service as its own engine's observer would (created,
  appended, deleted). A reset (the peer restarted: its feed's epoch changed) is a full snapshot of the
  peer: paths new to the owner are streams created meanwhile (linked from the start, as a match found by
  an append), paths the snapshot lacks were deleted meanwhile. Until every other shard's first snapshot
  is in, and whenever a peer does not answer, the owner answers subscription requests 503
  ``SHARD_UNAVAILABLE`` + ``Retry-After`` (never a description or a backfill missing a shard's streams);
  delivery of what it knows goes on.
* **Wake streams of another shard** (``PeerWakeWriter``): a pull-wake's events are appended through the
  owning worker's socket, as a client's append would be.
* **One signing key** for the whole server (``keys_dir``): the keyring lives in ``<data-dir>/
  subscription-keys/``, created by the parent before it starts the workers, so ``__ds/jwks.json`` from
  any worker lists the key any owner signs with.

With ``--auth-token`` the followers' pages, the backfill's listings and the wake events present the
workers' own credential (``internal.py``; ``ShardRouter.credential_line``), accepted only over the
workers' Unix sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol
from urllib.parse import quote, unquote

from durastream_server.errors import NotFound, ProtocolError, ShardUnavailable
from durastream_server.http import discovery, paths
from durastream_server.http.changes import DEFAULT_LIMIT, FOLLOWER_HEADER
from durastream_server.shards.fanout import SHARD_PAGE_HEADER, peer_failed
from durastream_server.shards.layout import shard_of
from durastream_server.subscriptions.pullwake import WakeStreamWriter, encode_events, wake_events

if TYPE_CHECKING:
    from durastream_server.shards.router import ShardRouter
    from durastream_server.subscriptions.state import Wake

log = logging.getLogger(__name__)

KEYS_DIR: Final = "subscription-keys"
_CHANGES: Final = (paths.STREAM_PREFIX + "__ds/x-durastream/changes").encode()
_LISTING: Final = (paths.STREAM_PREFIX + "__ds/x-durastream/streams").encode()
_LISTING_LIMIT: Final = discovery.MAX_LIMIT  # the largest listing page: fewest round trips
_PAGE_LIMIT: Final = DEFAULT_LIMIT  # a change page as the feed sizes it by default
_WAIT_MS: Final = 20_000
_RETRY_SECONDS: Final = 0.2
# Pages with changes a follower asks for at most, a second, after a burst of ``_BURST_PAGES``: under a
# steady load of appends a peer answers each follower ~20 pages a second (each carrying every change
# since the last), not one per commit round, which bounds the followers' cost to the peers' CPU; a
# few changes in a row (a client's create, then its subscription's claim) are not delayed.
_PAGES_PER_SECOND: Final = 20.0
_BURST_PAGES: Final = 5.0


def subscription_owner(target: str, count: int) -> int | None:
    """The shard owning the subscription that a ``__ds/`` ``target`` names (``subscriptions/<id>...``),
    None for anything else (``jwks.json``, the extensions' resources)."""
    parts = target.split("/", 2)
    if len(parts) < 2 or parts[0] != "subscriptions" or not parts[1]:
        return None
    return shard_of(unquote(parts[1]), count)


def keys_dir(shard_data_dir: Path) -> Path:
    """The server's one keyring directory, from a worker's shard directory (``<root>/shards/<k>``)."""
    return shard_data_dir.parent.parent / KEYS_DIR


def prepare_keys(root: Path) -> None:
    """Create the server's webhook signing keyring before any worker starts (blocking), so no two
    workers race to create two keys."""
    from durastream_server.subscriptions.signing import WebhookSigner

    directory = root / KEYS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    WebhookSigner.load_or_create(directory)


class PeerSink(Protocol):
    """What the followers tell the subscription service (``SubscriptionService``'s peer hooks)."""

    def peer_changed(self, path: str, next_offset: str | None) -> None: ...

    def peer_snapshot(self, shard: int, live: set[str]) -> None: ...

    def peers_synced(self) -> None: ...


class PeerFeeds:
    """Follows every other shard's change feed for the owner's subscriptions (module docstring)."""

    def __init__(
        self, router: ShardRouter, *, wait_ms: int = _WAIT_MS, rate: float = _PAGES_PER_SECOND
    ) -> None:
        self._router = router
        self._wait_ms = wait_ms
        self._rate = rate
        self._others = [k for k in range(router.count) if k != router.index]
        self._synced: set[int] = set()
        self._ever_synced = False
        self._content_types: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def index(self) -> int:
        return self._router.index

    @property
    def count(self) -> int:
        return self._router.count

    def start(self, sink: PeerSink) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(shard, sink)) for shard in self._others]
        if not self._others:
            sink.peers_synced()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def check_ready(self) -> None:
        """Raise 503 unless every other shard's streams are known now."""
        missing = [shard for shard in self._others if shard not in self._synced]
        if missing:
            raise ShardUnavailable(
                f"the worker of shard {missing[0]} is not answering (or its streams are still being "
                "read) and subscriptions span every shard; retry shortly",
                headers={"Retry-After": "1"},
            )

    def content_type(self, path: str) -> str | None:
        """The content type of another shard's stream, as its change feed last said."""
        return self._content_types.get(path)

    def holder(self, path: str) -> int:
        """The shard holding the stream at ``path`` (a fork: its source's, ``forks.py``)."""
        return self._router.shard_holding(path)

    def credential_line(self) -> bytes:
        """The header line presenting the workers' credential (``router.credential_line``)."""
        return self._router.credential_line()

    async def fetch(self, shard: int, head: bytes) -> tuple[int, bytes]:
        return await self._router.fetch(shard, head)

    async def tails_now(self, prefix: str | None, explicit: list[str]) -> list[tuple[str, str]]:
        """The current tails of the other shards' streams under ``prefix`` (None: none) and of the
        ``explicit`` paths that exist there, asked of their workers now (their listing), not as the
        followers last heard: a link made at creation starts at the stream's tail as one process's
        would, not up to a follower's round trip (and pacing) behind it. 503 if a worker does not
        answer."""
        found: list[tuple[str, str]] = []
        for shard in self._others:
            if prefix is not None:
                found += await self._listed(shard, prefix, _LISTING_LIMIT, whole=True)
        for path in explicit:
            shard = self.holder(path)
            if shard != self.index:
                found += [item for item in await self._listed(shard, path, 1) if item[0] == path]
        return found

    async def _listed(
        self, shard: int, prefix: str, limit: int, *, whole: bool = False
    ) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        after: str | None = None
        while True:
            query = f"prefix={quote(prefix, safe='')}&limit={limit}"
            if after is not None:
                query += f"&after={quote(after, safe='')}"
            head = (
                b"GET " + _LISTING + b"?" + query.encode("ascii") + b" HTTP/1.1\r\n"
                b"host: localhost\r\n"
                + SHARD_PAGE_HEADER.encode()
                + b": 1\r\n"
                + self._router.credential_line()
                + b"\r\n"
            )
            status, body = await self._router.fetch(shard, head)
            if status != 200:
                raise peer_failed(shard, status, "a subscription's backfill")
            page = json.loads(body)
            found += [(item["path"], item["next_offset"]) for item in page["streams"]]
            after = page["next"]
            if not whole or after is None:
                return found

    async def _follow(self, shard: int, sink: PeerSink) -> None:
        cursor: str | None = None
        snapshot: set[str] | None = None
        bucket = _Pacer(self._rate, _BURST_PAGES)
        while True:
            try:
                page = await self._page(shard, cursor)
            except (
                Exception
            ) as exc:  # a peer down, restarting, or answering nonsense: read it again
                if shard in self._synced:
                    log.warning("subscriptions: lost the change feed of shard %d (%s)", shard, exc)
                self._synced.discard(shard)
                cursor, snapshot = None, None
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            if page["reset"]:
                snapshot = set()
            for change in page["changes"]:
                path = change["path"]
                if change.get("deleted"):
                    self._content_types.pop(path, None)
                    _guarded(sink.peer_changed, path, None)
                    continue
                self._content_types[path] = change["content_type"]
                if snapshot is not None:
                    snapshot.add(path)
                _guarded(sink.peer_changed, path, change["next_offset"])
            cursor = page["cursor"]
            if page["changes"] and not page["more"]:
                await bucket.take()
            if snapshot is not None and not page["more"]:
                _guarded(sink.peer_snapshot, shard, snapshot)
                snapshot = None
                self._synced.add(shard)
                if not self._ever_synced and len(self._synced) == len(self._others):
                    self._ever_synced = True
                    sink.peers_synced()

    async def _page(self, shard: int, cursor: str | None) -> dict:  # type: ignore[type-arg]
        query = f"limit={_PAGE_LIMIT}"
        if cursor is not None:
            query += f"&since={quote(cursor, safe='')}&wait={self._wait_ms}"
        head = (
            b"GET " + _CHANGES + b"?" + query.encode("ascii") + b" HTTP/1.1\r\n"
            b"host: localhost\r\n"
            + SHARD_PAGE_HEADER.encode()
            + b": 1\r\n"
            + FOLLOWER_HEADER.encode()
            + b": 1\r\n"
            + self._router.credential_line()
            + b"\r\n"
        )
        status, body = await self._router.fetch(shard, head, once=True)
        if status != 200:
            raise ShardUnavailable(f"shard {shard} answered {status} to its change feed")
        page = json.loads(body)
        if not isinstance(page, dict):
            raise ValueError("a change page is a JSON object")
        return page


class PeerWakeWriter(WakeStreamWriter):
    """Pull-wake events: appended here for this shard's wake streams, else through the owner's socket."""

    def __init__(
        self, local: WakeStreamWriter, feeds: PeerFeeds, clock: Callable[[], float]
    ) -> None:
        self._local = local
        self._feeds = feeds
        self._clock = clock

    async def announce(self, subscription_id: str, wake_stream: str, wake: Wake) -> None:
        owner = self._feeds.holder(wake_stream)
        if owner == self._feeds.index:
            await self._local.announce(subscription_id, wake_stream, wake)
            return
        content_type = self._feeds.content_type(wake_stream)
        if content_type is None:
            raise NotFound(f"wake stream {wake_stream!r} does not exist")
        body = encode_events(wake_events(subscription_id, wake, self._clock()), content_type)
        target = (paths.STREAM_PREFIX + quote(wake_stream, safe="/")).encode()
        head = (
            b"POST "
            + target
            + b" HTTP/1.1\r\nhost: localhost\r\n"
            + f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n".encode("latin-1")
            + self._feeds.credential_line()
            + b"\r\n"
            + body
        )
        status, answer = await self._feeds.fetch(owner, head)
        if status >= 300:
            raise ProtocolError(
                f"appending to wake stream {wake_stream!r} in shard {owner} answered {status}: "
                f"{answer[:200]!r}"
            )


class _Pacer:
    """A token bucket: ``burst`` pages at once, then ``rate`` a second."""

    def __init__(self, rate: float, burst: float) -> None:
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._at = time.monotonic()

    async def take(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            await asyncio.sleep((1.0 - self._tokens) / self._rate)
            self._tokens = 1.0
            self._at = time.monotonic()
        self._tokens -= 1.0


def _guarded(hook: Callable[..., None], *args: object) -> None:
    """Call a service hook; its failure (logged) must not stop the follower, as an engine observer's
    must not fail the stream write (``service._Observer``)."""
    try:
        hook(*args)
    except Exception:
        log.exception("subscriptions: handling a change of another shard failed (%r)", args[0])
