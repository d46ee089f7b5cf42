"""The change feed: which streams changed since a cursor (extension ``changes``, docs/extensions.md
section 9).

A reader of many streams (the Spark source over ``sessions/*``) must learn which of them moved without
asking each one. The feed gives every change of a stream path (created, appended to durably, closed,
deleted) the next number of one server-wide sequence, and keeps, per path, only its latest number. "What
changed since ``C``" is then the paths whose latest number is above ``C``: a bisect into the numbers
plus the paths that changed, never a walk of every stream. The answer carries each path's *current*
state, so a path that changed a thousand times since ``C`` appears once.

Cursors are ``<epoch>:<seq>``. The epoch is minted at every start: sequence numbers are not persisted,
so a cursor from before a restart cannot be continued and the reader is told to start over (``reset``)
with a full snapshot, which the feed serves too (everything "since 0" of this epoch: every live path has
a number). Deleted paths stay as tombstones so that an incremental reader learns of the deletion; when
there are more than ``max_tombstones`` of them the oldest are dropped and ``horizon`` rises: a cursor
below the horizon may have missed a deletion, so it gets a reset as well.

Cost, all on the event loop: a change is an append to two parallel lists (numbers, paths) and a
bisect that blanks the path's previous place, plus one match per parked change waiter (few: one per
reading query); blanked places are compacted away once they outnumber the live ones, so a change is
O(log n) amortized with no tree node per path (a sorted map's delete and insert were a tenth of a new
stream's commit in a bulk request, issue 16, session h37). A page examines at most the ``examine``
entries after its cursor. The engine decides what a change is (``Engine._committed`` and the registry's path hook); this
module only numbers paths and answers pages.
"""

from __future__ import annotations

import asyncio
import bisect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from durastream_server.engine.waiters import wait_for_any
from durastream_server.timers import time_left

DEFAULT_MAX_TOMBSTONES: Final = 100_000
_EPOCH_BYTES: Final = 6

Match = Callable[[str], bool]


class InvalidCursor(ValueError):
    """A cursor that is not of the form ``<epoch>:<seq>``."""


@dataclass(frozen=True, slots=True)
class Cursor:
    epoch: str
    seq: int

    def __str__(self) -> str:
        return f"{self.epoch}:{self.seq}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        epoch, sep, seq = text.partition(":")
        if (
            not sep
            or not epoch
            or len(epoch) > 32
            or not epoch.isascii()
            or not epoch.isalnum()
            or not seq.isascii()
            or not seq.isdigit()
            or len(seq) > 16
        ):
            raise InvalidCursor(
                f"cursor must be '<epoch>:<seq>' as a previous answer returned it, got {text!r}"
            )
        return cls(epoch, int(seq))


@dataclass(frozen=True, slots=True)
class FeedPage:
    """Paths changed after the asked cursor, in change order, and where the next page starts.

    ``reset``: the asked cursor could not be continued (absent, another epoch, or below the horizon), so
    this page starts from the beginning and the pages until ``more`` is false are a full snapshot.
    """

    paths: list[str]
    cursor: Cursor
    more: bool
    reset: bool


class _Waiter:
    __slots__ = ("match", "future")

    def __init__(self, match: Match | None, future: asyncio.Future[None]) -> None:
        self.match = match
        self.future = future


class ChangeFeed:
    """Numbers path changes and answers "what changed since this cursor" (see the module docstring)."""

    def __init__(self, *, max_tombstones: int = DEFAULT_MAX_TOMBSTONES, epoch: str | None = None):
        self.epoch = epoch or os.urandom(_EPOCH_BYTES).hex()
        self.seq = 0
        self.horizon = 0  # cursors below this may have missed a dropped tombstone
        self.max_tombstones = max_tombstones
        # Each path at its latest seq, in seq order: ``_seqs`` ascending, ``_paths`` the path at the
        # same place, or None where that path has changed again since (blanked, compacted later).
        self._seqs: list[int] = []
        self._paths: list[str | None] = []
        self._blank = 0  # Nones in ``_paths``
        self._seq_of: dict[str, int] = {}
        # Paths whose latest change was a deletion, oldest first (a dict keeps insertion order, and a
        # path deleted again is re-inserted): the oldest tombstones are dropped without a search.
        self._dead: dict[str, None] = {}
        self._waiters: set[_Waiter] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._seq_of)

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.epoch, self.seq)

    @property
    def tombstones(self) -> int:
        return len(self._dead)

    # ---- recording ---------------------------------------------------------------------------------

    def touch(self, path: str, *, live: bool = True) -> None:
        """``path`` changed (``live=False``: it no longer exists). Wakes waiters whose selection holds
        it."""
        self.seq += 1
        previous = self._seq_of.get(path)
        if previous is not None:
            self._forget(previous)
        self._seqs.append(self.seq)
        self._paths.append(path)
        self._seq_of[path] = self.seq
        self._dead.pop(path, None)
        if not live:
            self._dead[path] = None
            if len(self._dead) > self.max_tombstones:
                self._drop_tombstones()
        if self._waiters:
            self._wake(path)

    def touch_all(self, paths: Iterable[str]) -> None:
        """Number every path (start-up: each live stream gets a place, so "since 0" lists it)."""
        for path in paths:
            self.touch(path)

    def _forget(self, seq: int) -> None:
        """Blank the place of ``seq`` (its path changed again, or its tombstone is dropped); compact
        once blanks outnumber live places (and a floor, so small feeds do not compact often)."""
        seqs = self._seqs
        at = bisect.bisect_left(seqs, seq)
        self._paths[at] = None
        self._blank += 1
        if self._blank > max(1024, len(seqs) - self._blank):
            keep = [i for i, p in enumerate(self._paths) if p is not None]
            self._seqs = [seqs[i] for i in keep]
            self._paths = [self._paths[i] for i in keep]
            self._blank = 0

    def _drop_tombstones(self) -> None:
        """Forget the oldest tombstones, down to half the limit; a cursor before them gets a reset."""
        highest = self.horizon
        while len(self._dead) > self.max_tombstones // 2:
            path = next(iter(self._dead))
            del self._dead[path]
            seq = self._seq_of.pop(path)
            self._forget(seq)
            highest = max(highest, seq)
        self.horizon = highest

    def _wake(self, path: str) -> None:
        woken = [w for w in self._waiters if w.match is None or w.match(path)]
        for waiter in woken:
            self._waiters.discard(waiter)
            if not waiter.future.done():
                waiter.future.set_result(None)

    # ---- reading -----------------------------------------------------------------------------------

    def usable(self, since: Cursor | None) -> bool:
        """Whether ``since`` can be continued incrementally (same epoch, not below the horizon)."""
        return (
            since is not None
            and since.epoch == self.epoch
            and self.horizon <= since.seq <= self.seq
        )

    def page(
        self, since: Cursor | None, match: Match | None, *, limit: int, examine: int
    ) -> FeedPage:
        """Up to ``limit`` changed paths that ``match`` holds, examining at most ``examine`` entries
        after ``since`` (a reset starts from the beginning). ``cursor`` is where the next page starts:
        past every entry examined, so entries the selection does not hold are never examined twice."""
        reset = not self.usable(since)
        start = 0 if reset else since.seq  # type: ignore[union-attr]
        found: list[str] = []
        examined = 0
        last = start
        seqs, paths = self._seqs, self._paths
        for at in range(bisect.bisect_right(seqs, start), len(seqs)):
            path = paths[at]
            if path is None:
                continue  # changed again later: listed at its latest place
            if len(found) >= limit or examined >= examine:
                return FeedPage(found, Cursor(self.epoch, last), True, reset)
            examined += 1
            last = seqs[at]
            if reset and path in self._dead:
                continue  # a snapshot lists what exists
            if match is None or match(path):
                found.append(path)
        return FeedPage(found, self.cursor, False, reset)

    def has_changes(self, since: Cursor, match: Match | None, *, examine: int) -> bool:
        """Whether a page after ``since`` would hold a path (or could not tell within ``examine``)."""
        page = self.page(since, match, limit=1, examine=examine)
        return bool(page.paths) or page.more or page.reset

    async def wait(
        self,
        since: Cursor,
        match: Match | None,
        timeout: float,
        release: Iterable[asyncio.Future[Any]] = (),
        *,
        examine: int,
    ) -> bool:
        """Wait until a path ``match`` holds changes after ``since``; False on timeout or release."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        release = tuple(release)
        while not self.has_changes(since, match, examine=examine):
            remaining = time_left(deadline, loop.time())  # < 1 ms left is expired: no re-arm spin
            if not remaining or self._closed or any(f.done() for f in release):
                return False
            waiter = _Waiter(match, loop.create_future())
            self._waiters.add(waiter)
            try:
                await wait_for_any(waiter.future, remaining, release)
            finally:
                self._waiters.discard(waiter)
        return True

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def shutdown(self) -> None:
        """Release every waiter (the server is stopping): they answer as at a timeout."""
        self._closed = True
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_result(None)
        self._waiters.clear()
