"""Registered selections: explicit sets of stream paths that change-feed queries refer to by id
(extension ``changes``, docs/extensions.md section 9).

A reader of an explicit list of 100,000 streams must not send the list with every "what changed?"
question: that would cost the list's size per trigger. It registers the list once and names it by the
id. The id is derived from the set of paths (SHA-256 of the sorted, distinct paths joined by LF), so
registering the same set again returns the same id, and two queries reading the same streams share one
entry.

Selections are memory only, bounded in number of paths (all selections together) and forgotten after
``idle_seconds`` unused, least recently used first. A forgotten id (or any id after a restart) answers
404 ``SELECTION_NOT_FOUND``: the reader registers its list again and carries on with the same cursor.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

DEFAULT_MAX_PATHS: Final = 4_000_000
DEFAULT_IDLE_SECONDS: Final = 3600.0


@dataclass(eq=False)
class Selection:
    id: str
    paths: frozenset[str]
    prefix: str  # the longest common prefix of the paths, for a cheap first test
    last_used: float = field(default=0.0)

    def matches(self, path: str) -> bool:
        return path in self.paths


def prepare(
    paths: Iterable[str], keep: Callable[[str], bool] | None = None
) -> tuple[str, frozenset[str], str]:
    """The id, the set and the common prefix of ``paths`` (sorting: run it off the event loop). With
    ``keep`` (a worker of ``--workers N``: its shard's paths), the id is still that of every path, so
    each shard registers its part of one selection under the same id."""
    distinct = sorted(set(paths))
    digest = hashlib.sha256("\n".join(distinct).encode("utf-8")).hexdigest()[:32]
    if keep is not None:
        distinct = [path for path in distinct if keep(path)]
    prefix = _common_prefix(distinct[0], distinct[-1]) if distinct else ""
    return digest, frozenset(distinct), prefix


def _common_prefix(first: str, last: str) -> str:
    """Of a sorted list, the common prefix of all is the common prefix of its first and last."""
    n = 0
    for a, b in zip(first, last, strict=False):
        if a != b:
            break
        n += 1
    return first[:n]


class Selections:
    """The registered selections of this server run, least recently used first."""

    def __init__(
        self,
        *,
        max_paths: int = DEFAULT_MAX_PATHS,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_paths = max_paths
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._entries: OrderedDict[str, Selection] = OrderedDict()
        self._paths = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def paths(self) -> int:
        return self._paths

    def add(self, id: str, paths: frozenset[str], prefix: str) -> Selection:
        """Store a prepared selection (``prepare``); an existing id is only marked as used."""
        selection = self.get(id)
        if selection is None:
            selection = Selection(id, paths, prefix)
            self._entries[id] = selection
            self._paths += len(paths)
            selection.last_used = self._clock()
        self._evict(keep=selection)
        return selection

    def get(self, id: str) -> Selection | None:
        self._expire()
        selection = self._entries.get(id)
        if selection is not None:
            selection.last_used = self._clock()
            self._entries.move_to_end(id)
        return selection

    def _expire(self) -> None:
        cutoff = self._clock() - self.idle_seconds
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.last_used > cutoff:
                return
            self._drop(oldest)

    def _evict(self, keep: Selection) -> None:
        while self._paths > self.max_paths and len(self._entries) > 1:
            oldest = next(iter(self._entries.values()))
            if oldest is keep:
                return
            self._drop(oldest)

    def _drop(self, selection: Selection) -> None:
        del self._entries[selection.id]
        self._paths -= len(selection.paths)
