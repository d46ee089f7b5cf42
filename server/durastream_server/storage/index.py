"""Where a logical position lives on disk: a sparse index plus a small window of recent records.

Both map a logical position to the global file offset of a record that starts at or before it; a read
then scans record headers forward from there. Any record start ``(p, o)`` with ``p <= start`` is a valid
starting point: positions only grow through the log, so no record before ``o`` can hold bytes at or
after ``start``.

Memory is O(data / interval) for the sparse part (16 K points per GiB at the 64 KiB default) and
O(RECENT_RECORDS) (at most 4 KiB) for the recent window, which makes the common "tail the stream" read start at its exact record.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

# Small on purpose: it is per log, and tailing readers start within the last few records.
RECENT_RECORDS = 128


class SparseIndex:
    """(position, global file offset) roughly every ``interval`` file bytes, in log order."""

    __slots__ = ("interval", "positions", "offsets")

    def __init__(self, interval: int, positions: array | None = None, offsets: array | None = None):
        self.interval = max(1, interval)
        self.positions: array = positions if positions is not None else array("q")
        self.offsets: array = offsets if offsets is not None else array("q")

    def note(self, position: int, offset: int) -> None:
        """Called for every record start; keeps one point per ``interval`` bytes."""
        offsets = self.offsets
        if not offsets or offset - offsets[-1] >= self.interval:
            self.positions.append(position)
            offsets.append(offset)

    def floor(self, position: int) -> tuple[int, int] | None:
        """The last point with a position <= ``position``."""
        i = bisect_right(self.positions, position) - 1
        if i < 0:
            return None
        return self.positions[i], self.offsets[i]

    def __len__(self) -> int:
        return len(self.offsets)


class RecentRecords:
    """Exact (position, offset) of the last ``limit`` records, so tailing readers skip the scan."""

    __slots__ = ("limit", "positions", "offsets")

    def __init__(self, limit: int = RECENT_RECORDS) -> None:
        self.limit = limit
        self.positions = array("q")
        self.offsets = array("q")

    def note(self, position: int, offset: int) -> None:
        self.positions.append(position)
        self.offsets.append(offset)
        if len(self.positions) > 2 * self.limit:  # trim in bulk: amortized O(1) per record
            del self.positions[: self.limit]
            del self.offsets[: self.limit]

    def floor(self, position: int) -> tuple[int, int] | None:
        i = bisect_right(self.positions, position) - 1
        if i < 0:
            return None
        return self.positions[i], self.offsets[i]


class LogIndex:
    """The lookup a read uses: the closest known record start at or before a position."""

    __slots__ = ("sparse", "recent")

    def __init__(self, sparse: SparseIndex) -> None:
        self.sparse = sparse
        self.recent = RecentRecords()

    def note(self, position: int, offset: int) -> None:
        self.sparse.note(position, offset)
        self.recent.note(position, offset)

    def floor(self, position: int) -> tuple[int, int]:
        best = self.sparse.floor(position)
        recent = self.recent.floor(position)
        if recent is not None and (best is None or recent[1] > best[1]):
            best = recent
        if best is None:
            raise LookupError(position)
        return best
