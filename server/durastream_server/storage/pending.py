"""Streams not recovered yet, grouped into the units recovery must handle together.

A server that recovers in the background (``engine/recovery.py``) serves a request for a path only once
that path's streams are recovered. "That path's streams" is more than one directory when forks are
involved: a fork reads its source's log, and deleting a source asks how many forks still read it (the
fork graph is derived from the headers of every incarnation, never stored: hazard 31). So the unit of
recovery is a connected group: every incarnation of a path, and every incarnation linked to one of them
as fork source or fork, transitively. Most units are one directory.

Built at start-up from ``streams/``'s listing and the catalog (``catalog.py``); a directory without a
catalog entry (an unreadable header) is its own unit. Start-up does a few dictionary operations per
stream here and nothing more (a unit is named by its first storage id; only units of several streams
get a list), since at 100,000 streams every microsecond per stream is a tenth of a second of waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

from durastream_server.storage.catalog import Entry


@dataclass(slots=True)
class Pending:
    """The units still to recover, and which unit each path's streams belong to.

    ``order``: storage ids in recovery order; a unit is named by its first id (its *key*).
    ``groups``: key -> every id of the unit, for units of more than one stream only.
    ``by_path``: path -> key of the unit holding that path's incarnations.
    ``taken``: key -> the recovery under way (or done) of that unit.
    """

    order: list[str] = field(default_factory=list)
    groups: dict[str, list[str]] = field(default_factory=dict)
    members: set[str] = field(default_factory=set)  # ids of groups that are not their key
    by_path: dict[str, str] = field(default_factory=dict)
    hints: dict[str, Entry] = field(default_factory=dict)  # storage id -> what the catalog says
    taken: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    streams: int = 0  # storage ids not recovered yet

    def __len__(self) -> int:
        return self.streams

    def unit_of(self, path: str) -> str | None:
        return self.by_path.get(path)

    def ids(self, key: str) -> list[str]:
        return self.groups.get(key) or [key]

    def unit_keys(self) -> Iterator[str]:
        """Every unit's key, in recovery order."""
        members = self.members
        return (i for i in self.order if i not in members)

    def recovered(self, key: str) -> None:
        """The unit ``key`` is recovered (or quarantined) and registered."""
        ids = self.ids(key)
        self.streams -= len(ids)
        for storage_id in ids:
            entry = self.hints.pop(storage_id, None)
            if entry is not None and self.by_path.get(entry.path) == key:
                del self.by_path[entry.path]

    def clear(self) -> None:
        """Everything is recovered: drop the bookkeeping (100,000 ids' worth)."""
        self.order, self.groups, self.members, self.taken = [], {}, set(), {}
        self.by_path, self.hints, self.streams = {}, {}, 0


def plan(ids: list[str], hints: dict[str, Entry]) -> Pending:
    """Group ``ids`` (the directories in ``streams/``, in recovery order) into units, by the ``hints``
    (storage id -> path and fork source)."""
    present = set(ids)
    by_path: dict[str, str] = {}
    linked: list[str] = []  # ids that share a path with an earlier one, or name a source present
    for storage_id in ids:
        entry = hints.get(storage_id)
        if entry is None:
            continue
        if by_path.setdefault(entry.path, storage_id) != storage_id or (
            entry.source_id is not None and entry.source_id in present
        ):
            linked.append(storage_id)
    pending = Pending(
        order=ids,
        by_path=by_path,
        hints={i: entry for i in ids if (entry := hints.get(i)) is not None},
        streams=len(ids),
    )
    if linked:
        _group(pending, linked, present)
    return pending


def _group(pending: Pending, linked: list[str], present: set[str]) -> None:
    """Merge the units of ``linked`` ids with those they share a path or a fork link with."""
    parent: dict[str, str] = {}
    hints, by_path = pending.hints, pending.by_path

    def find(x: str) -> str:
        parent.setdefault(x, x)
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    for storage_id in linked:
        entry = hints[storage_id]
        for other in (by_path[entry.path], entry.source_id):
            if other is not None and other in present:
                a, b = find(storage_id), find(other)
                if a != b:
                    parent[b] = a
    position = {i: n for n, i in enumerate(pending.order) if i in parent}
    groups: dict[str, list[str]] = {}
    for storage_id in sorted(parent, key=position.__getitem__):
        groups.setdefault(find(storage_id), []).append(storage_id)
    for ids in groups.values():
        key = ids[0]  # the first in recovery order
        pending.groups[key] = ids
        pending.members.update(ids[1:])
        for storage_id in ids:
            entry = hints.get(storage_id)
            if entry is not None:
                by_path[entry.path] = key
