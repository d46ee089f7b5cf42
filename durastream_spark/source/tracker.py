"""The driver's view of the selected streams, kept up to date at a cost that follows what changed.

A ``Tracker`` holds every selected stream's ``StreamState`` (tail, closure, content type) and refreshes
it once per trigger, saying which paths changed (``Refresh.changed``), so the planner looks at those and
leaves the other 99% of a 100,000-stream query alone.

- ``ChangeFeedTracker`` (durastream-server's ``changes`` extension, docs/extensions.md section 9): one
  request per refresh answers the selected streams that changed since the tracker's cursor (a few pages
  when many did). The first refresh, and any after the server lost the cursor (a restart), is a full
  snapshot. An explicit ``streams`` list is registered once as a selection and named by id. With
  ``wait_s``, the request waits on the server until a selected stream changes: an idle query sends
  about one request per ``wait_s`` and still hears of an append at once.
- ``PollingTracker`` (any other server): a full snapshot per refresh (one ``HEAD`` per stream, or the
  listing for a ``pattern``), compared with the last one. Asked to wait, it sleeps up to
  ``IDLE_POLL_SECONDS`` first, so an idle query polls a few times a second instead of continuously.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durastream_spark.errors import StreamNotFound
from durastream_spark.source.discovery import StreamCatalog, StreamState

if TYPE_CHECKING:
    from durastream_spark.protocol.client import StreamClient
    from durastream_spark.protocol.models import ChangePage

log = logging.getLogger(__name__)

IDLE_POLL_SECONDS = 0.5
_SELECTION_NOT_FOUND = "SELECTION_NOT_FOUND"


@dataclass(frozen=True)
class Refresh:
    """What a refresh found. ``changed``: paths whose state changed, appeared or disappeared; ``None``
    when the refresh was a full snapshot (anything may have changed)."""

    changed: frozenset[str] | None

    @property
    def full(self) -> bool:
        return self.changed is None


class Tracker:
    """Every selected stream that exists, by path (``states``), refreshed by ``refresh``."""

    def __init__(self) -> None:
        self.states: dict[str, StreamState] = {}
        self.version = 0  # bumped by every refresh that changed something

    def refresh(self, wait_s: float = 0.0) -> Refresh:
        raise NotImplementedError

    def _changed(self, refresh: Refresh) -> Refresh:
        if refresh.full or refresh.changed:
            self.version += 1
        return refresh


def canonical_path(path: str) -> str:
    """A connector path (decoded segments joined by '/') as the server writes paths: '%' escaped."""
    return path.replace("%", "%25")


class ChangeFeedTracker(Tracker):
    """Refreshes from the server's change feed (module docstring)."""

    def __init__(
        self,
        client: StreamClient,
        *,
        streams: Iterable[str] = (),
        pattern: str | None = None,
        exclude_prefix: str | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.pattern = pattern
        self.streams = tuple(streams)
        self.exclude_prefix = exclude_prefix
        # Explicit paths as the server spells them, and back (they differ only for paths with '%').
        self._to_client = {canonical_path(p): p for p in self.streams}
        self._prefix = _segment_prefix(self._to_client) if self.streams else None
        self._selection: str | None = None
        self.cursor: str | None = None

    def refresh(self, wait_s: float = 0.0) -> Refresh:
        if not self.streams and self.pattern is None:
            return Refresh(frozenset())  # an empty selection never changes
        page = self._ask(self.cursor, int(wait_s * 1000) if self.cursor else 0)
        reset = page.reset
        states: dict[str, StreamState] = {} if reset else self.states
        changed: set[str] = set()
        while True:
            for change in page.changes:
                path = self._selected(change.path)
                if path is None:
                    continue
                changed.add(path)
                if change.info is None:
                    states.pop(path, None)
                else:
                    info = change.info
                    states[path] = StreamState(
                        path, info.next_offset, info.closed, info.content_type
                    )
            self.cursor = page.cursor
            if not page.more:
                break
            page = self._ask(page.cursor, 0)
            if page.reset:  # the server lost the cursor between pages (a restart): start over
                self.cursor = None
                return self.refresh()
        if reset:
            log.info("change feed: a snapshot of %d stream(s)", len(states))
            self.states = states
            return self._changed(Refresh(None))
        return self._changed(Refresh(frozenset(changed)))

    def _selected(self, path: str) -> str | None:
        if self.streams:
            return self._to_client.get(path)
        if self.exclude_prefix and path.startswith(self.exclude_prefix):
            return None  # the source's own fallback pins are never data
        # The server filtered by the pattern already: matching 100,000 paths again here cost ~2 s of a
        # first snapshot's driver time (bench/fanout_bench.py).
        return path

    def _ask(self, since: str | None, wait_ms: int) -> ChangePage:
        if not self.streams:
            return self.client.changes(since, pattern=self.pattern, wait_ms=wait_ms)
        if self._selection is None:
            self._selection = self.client.register_selection(list(self._to_client))
        try:
            return self.client.changes(
                since, selection=self._selection, prefix=self._prefix or None, wait_ms=wait_ms
            )
        except StreamNotFound as error:
            if getattr(error, "code", None) != _SELECTION_NOT_FOUND:
                raise
            log.info(
                "the server forgot the selection of %d streams: registering it again",
                len(self.streams),
            )
            self._selection = self.client.register_selection(list(self._to_client))
            return self.client.changes(
                since, selection=self._selection, prefix=self._prefix or None, wait_ms=wait_ms
            )


class PollingTracker(Tracker):
    """Refreshes with a full snapshot each time (servers without the change feed)."""

    def __init__(self, catalog: StreamCatalog, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self.catalog = catalog
        self._sleep = sleep
        self._first = True

    def refresh(self, wait_s: float = 0.0) -> Refresh:
        if wait_s > 0 and not self._first:
            self._sleep(min(wait_s, IDLE_POLL_SECONDS))
        states = self.catalog.snapshot()
        if self._first:
            self._first = False
            self.states = states
            return self._changed(Refresh(None))
        old = self.states
        changed = {path for path, state in states.items() if old.get(path) != state}
        changed.update(path for path in old if path not in states)
        self.states = states
        return self._changed(Refresh(frozenset(changed)))


class FeedOrPolling(Tracker):
    """The change feed, falling back for good to polling when the feed's own endpoint is not there
    (its 404 is not ``SELECTION_NOT_FOUND``): a ``url`` that is not the stream root, or a proxy that
    forwards only stream paths. Polling then reads each stream as before, and its 404s say what is
    wrong with the ``url`` (``errors.stream_root_hint``)."""

    def __init__(self, feed: ChangeFeedTracker, catalog: StreamCatalog) -> None:
        super().__init__()
        self._feed = feed
        self._catalog = catalog
        self.active: Tracker = feed

    def refresh(self, wait_s: float = 0.0) -> Refresh:
        try:
            refresh = self.active.refresh(wait_s)
        except StreamNotFound as error:
            if (
                self.active is not self._feed
                or getattr(error, "code", None) == _SELECTION_NOT_FOUND
            ):
                raise
            log.info("the change feed is not reachable (%s): polling every stream instead", error)
            self.active = PollingTracker(self._catalog)
            refresh = self.active.refresh()
        self.states = self.active.states
        return self._changed(refresh)


def tracker_for(catalog: StreamCatalog) -> Tracker:
    """The cheapest tracker the server allows for the catalog's selection."""
    client = catalog.client
    if client.extensions().changes:
        feed = ChangeFeedTracker(
            client,
            streams=catalog.streams,
            pattern=catalog.pattern,
            exclude_prefix=catalog.exclude_prefix,
        )
        return FeedOrPolling(feed, catalog)
    return PollingTracker(catalog)


def _segment_prefix(paths: Iterable[str]) -> str:
    """The longest prefix of whole segments (ending in '/') that every path starts with, or ''."""
    ordered = sorted(paths)
    first, last = ordered[0], ordered[-1]
    n = 0
    for a, b in zip(first, last, strict=False):
        if a != b:
            break
        n += 1
    common = first[:n]
    return common[: common.rfind("/") + 1]
