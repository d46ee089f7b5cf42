"""How much the server holds right now: streams, producers, staged handles and bytes, quarantined
streams, free disk, and how many streams are still recovering. Taken when ``/metrics`` is scraped, not
kept up to date on the hot paths; a scrape during the background recovery after a start does not wait
for it, and counts what is recovered so far.

Producers and staged handles live per stream, so counting them visits every stream: that is done in
slices of ``SLICE`` streams with a yield to the event loop between them, so a scrape of 100,000
streams never holds the loop for more than a slice (requests interleave). The streams are listed once
at the start (a C-level copy of the registry's values); a stream created meanwhile is counted by the
next scrape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sized
from dataclasses import dataclass
from typing import Final, Protocol

SLICE: Final = 2000  # streams (or staging spaces) counted between two yields to the loop


class _HasProducers(Protocol):
    @property
    def producers(self) -> Sized: ...


class _HasHandles(Protocol):
    handles: dict  # type: ignore[type-arg]


@dataclass(frozen=True, slots=True)
class Census:
    streams: int  # paths with a current incarnation (soft-deleted ones kept for forks included)
    producers: int  # producer ids the current incarnations remember
    staged_handles: int  # open staged-append handles
    staged_bytes: int  # payload bytes they hold
    quarantined: int  # streams set aside under quarantine/
    disk_free_bytes: int | None  # free bytes on the data directory's file system (None: unknown)
    # Taken during the background recovery after a start (engine/recovery.py): then ``streams``,
    # ``producers`` and the staged counts are of the streams recovered so far only.
    recovering: bool = False
    streams_pending: int = 0  # stream directories not recovered yet


async def count_producers(states: Iterable[_HasProducers]) -> int:
    total = 0
    for i, state in enumerate(states, start=1):
        total += len(state.producers)
        if i % SLICE == 0:
            await asyncio.sleep(0)
    return total


async def count_staged(spaces: Iterable[_HasHandles]) -> tuple[int, int]:
    """Open handles and their staged payload bytes."""
    handles = size = 0
    for i, space in enumerate(spaces, start=1):
        handles += len(space.handles)
        for handle in space.handles.values():
            size += handle.size
        if i % SLICE == 0:
            await asyncio.sleep(0)
    return handles, size
