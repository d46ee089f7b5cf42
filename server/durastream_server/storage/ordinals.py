"""Message boundaries and message counts from record headers, never from payloads.

A message's *ordinal* is how many messages of the log come before it. The sparse index stores the
ordinal of each of its points (``index.py``), so both questions below start at the nearest index point
and scan record headers (and the per-record message-length arrays) for at most about one index
interval. That keeps limit lookups, fork sub-offsets and boundary checks O(log n) plus a bounded scan
on streams of any size, and none of them reads a message payload.

Both functions block (``pread``), so ``StreamLog`` runs them in its read executor.
"""

from __future__ import annotations

from durastream_server.storage.files import FdCache
from durastream_server.storage.segments import ReadView, iter_appends

# (position, global file offset, ordinal) of a record start, from ``LogIndex``.
Point = tuple[int, int, int]


def floor_boundary(segs: ReadView, cache: FdCache, point: Point, position: int) -> tuple[int, int]:
    """``(floor, ordinal)``: the last message boundary ``<= position`` and the ordinal of the message
    that starts there (== the number of messages before it).

    ``point`` must be at or before ``position``; a ``position`` past the scanned data answers the end
    of the data.
    """
    floor, offset, ordinal = point
    with segs.window(cache) as window:
        for ref in iter_appends(window, offset, segs.end):
            if ref.position >= position:
                break
            end = ref.end
            if end <= position:
                ordinal += ref.n_messages
                floor = end
                continue
            at = ref.position
            for length in ref.lengths(window):
                if at + length > position:
                    break
                at += length
                ordinal += 1
            floor = at
            break
    return floor, ordinal


def message_start(segs: ReadView, cache: FdCache, point: Point, target: int) -> int:
    """Where the message with ordinal ``target`` starts; the end of the data if there are exactly
    ``target`` messages. ``point`` must have an ordinal ``<= target``."""
    at, offset, ordinal = point
    with segs.window(cache) as window:
        for ref in iter_appends(window, offset, segs.end):
            n = ref.n_messages
            if ordinal + n <= target:
                ordinal += n
                at = ref.end
                continue
            at = ref.position
            for length in ref.lengths(window)[: target - ordinal]:
                at += length
            return at
    return at
