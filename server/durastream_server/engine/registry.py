"""Which incarnation a path names, and who still reads from whom.

Fork reference counts are *derived*, never stored (hazard 31): the forks of an incarnation are the live
incarnations whose header names it as ``fork_source_id``, plus fork creations still in flight (a
``hold``). A rejected fork never registers, so it cannot leak a reference (hazard 21), and a crash can
never leave a count that disagrees with the logs on disk.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from sortedcontainers import SortedList

from durastream_server.engine import contenttype, expiry
from durastream_server.engine.waiters import WaitSet
from durastream_server.storage.log import StreamLog
from durastream_server.storage.records import StreamHeader

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Incarnation:
    """One stream incarnation (one storage id) as the engine tracks it."""

    log: StreamLog
    lifetime: expiry.Lifetime
    last_access: float  # clock() of the last read or write, for a sliding TTL
    soft_deleted: bool = False
    removed: bool = False  # hard-deleted (or being deleted): no longer reachable
    active_waits: int = 0  # long-polls/SSE parked on it: they count as access (hazard 26)
    # Made by the first wait (``waitset``): most streams never have a reader parked (issue 17).
    waiters: WaitSet | None = None
    json: bool = False
    essence: str = ""  # media type essence of the stream's content type (append compares it)
    hard_deadline: float | None = None  # Expires-At as epoch seconds, parsed once

    def waitset(self) -> WaitSet:
        waiters = self.waiters
        if waiters is None:
            waiters = self.waiters = WaitSet()
        return waiters

    @property
    def id(self) -> str:
        return self.log.id

    @property
    def header(self) -> StreamHeader:
        return self.log.header

    @property
    def path(self) -> str:
        return self.log.header.path

    @property
    def source_id(self) -> str | None:
        return self.log.header.fork_source_id

    def expired(self, now: float) -> bool:
        if self.hard_deadline is not None:
            return now >= self.hard_deadline
        ttl = self.lifetime.ttl_seconds
        if ttl is None or self.active_waits:
            return False
        return now >= self.last_access + ttl

    @classmethod
    def of(cls, log: StreamLog, now: float) -> Incarnation:
        header = log.header
        if header.ttl_seconds is None and header.expires_at is None:
            lifetime = expiry.FOREVER  # shared: most streams never expire (issue 17)
        else:
            lifetime = expiry.Lifetime(header.ttl_seconds, header.expires_at)
        return cls(
            log=log,
            lifetime=lifetime,
            last_access=now,
            soft_deleted=log.state.soft_deleted,
            json=contenttype.is_json(header.content_type),
            essence=sys.intern(contenttype.essence(header.content_type)),
            hard_deadline=expiry.deadline(lifetime, now) if header.expires_at is not None else None,
        )


class Registry:
    """Path -> current incarnation, id -> incarnation, and the derived fork graph.

    ``paths`` holds the keys of ``by_path`` in code point order, for listings: a page is a bisect plus
    the paths it examines, never a sort of every path. A create or delete costs O(log n) there.
    ``expiring`` holds the current incarnations with a TTL or an Expires-At, so the expiry sweep
    looks at those only (a scan of 100,000 streams took 48 ms of the loop, four times a second).
    """

    def __init__(self) -> None:
        # Called with (path, live) whenever the incarnation a path names changes: the change feed
        # (changes.py) numbers it. Set by the engine once the registry is built.
        self.on_path: Callable[..., None] | None = None
        self.by_path: dict[str, Incarnation] = {}
        self.paths: SortedList = SortedList()
        self.expiring: set[Incarnation] = set()
        self.by_id: dict[str, Incarnation] = {}
        self._forks: dict[str, set[str]] = {}  # source id -> ids of incarnations forked from it
        self._pending: Counter[str] = Counter()  # source id -> fork creations in flight

    def add(self, inc: Incarnation, *, current: bool) -> None:
        # The header read once (``path``, ``id`` and ``source_id`` are properties through the log:
        # a create paid six of them here).
        log = inc.log
        header = log.header
        path = header.path
        self.by_id[log.id] = inc
        if current:
            replaced = self.by_path.get(path)
            if replaced is None:
                self.paths.add(path)
            else:
                self.expiring.discard(replaced)
            self.by_path[path] = inc
            if inc.lifetime.expires:
                self.expiring.add(inc)
            if self.on_path is not None:
                self.on_path(path, live=not inc.soft_deleted)
        source = header.fork_source_id
        if source is not None:
            self._forks.setdefault(source, set()).add(log.id)

    def remove(self, inc: Incarnation) -> None:
        """Forget a hard-deleted incarnation. Synchronous, so no request can see it half-removed."""
        inc.removed = True
        self.by_id.pop(inc.id, None)
        if self.by_path.get(inc.path) is inc:
            del self.by_path[inc.path]
            self.paths.remove(inc.path)
            self.expiring.discard(inc)
            if self.on_path is not None:
                self.on_path(inc.path, live=False)
        if inc.source_id is not None:
            forks = self._forks.get(inc.source_id)
            if forks is not None:
                forks.discard(inc.id)
                if not forks:
                    del self._forks[inc.source_id]

    def source_of(self, inc: Incarnation) -> Incarnation | None:
        return self.by_id.get(inc.source_id) if inc.source_id is not None else None

    def refcount(self, inc: Incarnation) -> int:
        """Live forks reading from ``inc`` plus fork creations in flight."""
        return len(self._forks.get(inc.id, ())) + self._pending[inc.id]

    @contextmanager
    def hold(self, source: Incarnation) -> Iterator[None]:
        """Count an in-flight fork creation as a reference, so the source is not hard-deleted while
        the fork's directory is being written (the fork's header is not registered yet)."""
        self._pending[source.id] += 1
        try:
            yield
        finally:
            self._pending[source.id] -= 1
            if self._pending[source.id] <= 0:
                del self._pending[source.id]

    def orphans(self) -> list[Incarnation]:
        """Soft-deleted incarnations no fork reads any more (a cascade a crash interrupted)."""
        return [inc for inc in self.by_id.values() if inc.soft_deleted and self.refcount(inc) == 0]


def build(logs: dict[str, StreamLog], now: float) -> tuple[Registry, list[tuple[StreamLog, str]]]:
    """Rebuild the registry from the recovered logs (``Registry.adopt``)."""
    registry = Registry()
    unusable = adopt(registry, logs.values(), now)
    return registry, unusable


def adopt(registry: Registry, logs: Iterable[StreamLog], now: float) -> list[tuple[StreamLog, str]]:
    """Register recovered logs: at start-up all of them, or one recovery unit at a time
    (``storage/pending.py``: every incarnation of a path, with its forks and sources, comes in the same
    call). One incarnation per path is current: the live one (a soft-deleted path blocks re-creation,
    so normally there is exactly one); others are kept only for the forks that still read from them.

    Returns the logs whose header the engine cannot use (e.g. an Expires-At that does not parse), with
    the reason, for the caller to quarantine: they are left out, and every other stream is served.
    """
    unusable: list[tuple[StreamLog, str]] = []
    by_path: dict[str, list[Incarnation]] = {}
    for log in logs:
        try:
            inc = Incarnation.of(log, now)
        except Exception as exc:  # anything: one bad header must not stop the server (hazard 32)
            unusable.append((log, f"stream header cannot be used: {exc!r}"))
            continue
        by_path.setdefault(log.header.path, []).append(inc)
    for path, incs in by_path.items():
        incs.sort(key=lambda inc: (not inc.soft_deleted, inc.header.created_at_ms))
        current = incs[-1]
        live = [inc for inc in incs if not inc.soft_deleted]
        if len(live) > 1:
            logger.warning(
                "path %r has %d live incarnations; serving the newest (%s)",
                path,
                len(live),
                current.id,
            )
        for inc in incs:
            registry.add(inc, current=inc is current)
    return unusable


class KeyedLocks:
    """One asyncio lock per key, created on demand and dropped when unused."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # Keys taken by ``claim``: the future their ``hold``s wait for (made when the first one does).
        self._claims: dict[str, asyncio.Future[None] | None] = {}

    def claim(self, key: str) -> bool:
        """Take ``key`` at once, without a coroutine, when nobody holds or waits for it (False
        otherwise): for a holder that is a chain of callbacks rather than a task (the engine's
        create without a task, ``Engine.create_nowait``). ``hold`` of a claimed key waits until
        ``release`` of the claim; no new claim is made while a ``hold`` waits or holds."""
        if key in self._locks or key in self._claims:
            return False
        self._claims[key] = None
        return True

    def release(self, key: str) -> None:
        """End ``claim`` of ``key``: the ``hold``s that waited for it go on."""
        waited = self._claims.pop(key)
        if waited is not None and not waited.done():
            waited.set_result(None)

    async def _claimed(self, key: str) -> None:
        """Wait until ``key`` is not claimed (a ``hold`` that found it so)."""
        while key in self._claims:
            waited = self._claims[key]
            if waited is None:
                waited = self._claims[key] = asyncio.get_running_loop().create_future()
            # Shielded: a cancelled waiter must not cancel the future the others wait for.
            await asyncio.shield(waited)

    def hold(self, key: str) -> _Held:
        """``async with locks.hold(key)``: the key's lock, held for the block. A plain context object,
        not an ``asynccontextmanager``: every create takes one, and the generator machinery made an
        uncontended hold cost 5.5 us instead of 2 (micro-benchmark on this VM)."""
        return _Held(self, key)

    @asynccontextmanager
    async def hold_all(self, keys: Iterable[str], *, yield_every: int = 0) -> AsyncIterator[None]:
        """``hold`` every key at once, taken in sorted order (so holders of overlapping sets cannot
        deadlock). One context for thousands of keys (a staged commit names up to 10,000 handles):
        an uncontended lock is taken without yielding, and ``yield_every`` > 0 lets the event loop run
        after that many keys, so a long list does not hold the loop for its whole length."""
        entered: list[str] = []
        acquired: list[asyncio.Lock] = []
        try:
            for count, key in enumerate(sorted(set(keys)), 1):
                lock = self._enter(key)
                entered.append(key)
                if key in self._claims:
                    await self._claimed(key)
                await lock.acquire()
                acquired.append(lock)
                if yield_every and count % yield_every == 0:
                    await asyncio.sleep(0)
            yield
        finally:
            for lock in acquired:
                lock.release()
            for key in entered:
                self._leave(key)

    def held(self, key: str) -> bool:
        """True while someone holds, waits for or has claimed (``claim``) ``key``."""
        return key in self._locks or key in self._claims

    def _enter(self, key: str) -> asyncio.Lock:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        return lock

    def _leave(self, key: str) -> None:
        lock, users = self._locks[key]
        if users <= 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)


class _Held:
    """One ``KeyedLocks.hold``: enters the key's lock on ``async with``, leaves it after."""

    __slots__ = ("_locks", "_key", "_lock")

    def __init__(self, locks: KeyedLocks, key: str) -> None:
        self._locks = locks
        self._key = key
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        lock = self._locks._enter(self._key)
        try:
            if self._key in self._locks._claims:
                await self._locks._claimed(self._key)
            await lock.acquire()
        except BaseException:
            self._locks._leave(self._key)
            raise
        self._lock = lock

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._lock is not None
        self._lock.release()
        self._locks._leave(self._key)
