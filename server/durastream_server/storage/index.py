"""Where a logical position lives on disk: a sparse index plus a small window of recent records.

Both map a logical position to the global file offset of a record that starts at or before it; a read
then scans record headers forward from there. Any record start ``(p, o)`` with ``p <= start`` is a valid
starting point: positions only grow through the log, so no record before ``o`` can hold bytes at or
after ``start``.

Memory is O(data / interval) for the sparse part (16 K points per GiB at the 64 KiB default) and
O(RECENT_RECORDS) (at most 6 KiB) for the recent window, which makes the common "tail the stream" read start at its exact record.

Every point also carries its record's *message ordinal*: how many messages of this log come before the
record. Limit lookups and fork sub-offsets count messages between two positions as a difference of
ordinals, so they cost a bisect plus a header scan of at most about one interval, never a walk from the
start of the stream (``ordinals.py``).

Sparse points also carry their record's *effective append time*: the largest append time of any message
of this log up to and including that record (records without messages do not count). Effective times
never decrease along the log, so "the first message whose append time is >= T" is a bisect over them plus
a header scan of about one interval (time lookups, ``times.py``). The engine clamps append times to the
stream's last one, so for data it wrote the effective time *is* the append time; the running maximum only
makes the lookup exact ("the first message at or after which some append time reached T") even for a log
whose times went backwards.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right

# Small on purpose: it is per log, and tailing readers start within the last few records.
RECENT_RECORDS = 128


class _Points:
    """Lookups over parallel ``positions``/``offsets``/``ordinals`` arrays, in log order."""

    __slots__ = ()
    positions: array
    offsets: array
    ordinals: array

    def floor(self, position: int) -> tuple[int, int] | None:
        """The last point with a position <= ``position``."""
        i = bisect_right(self.positions, position) - 1
        if i < 0:
            return None
        return self.positions[i], self.offsets[i]

    def floor_entry(self, position: int) -> tuple[int, int, int] | None:
        """The last point ``(position, offset, ordinal)`` with a position <= ``position``."""
        i = bisect_right(self.positions, position) - 1
        if i < 0:
            return None
        return self.positions[i], self.offsets[i], self.ordinals[i]

    def floor_ordinal(self, ordinal: int) -> tuple[int, int, int] | None:
        """The last point whose ordinal is <= ``ordinal`` (ordinals never decrease)."""
        i = bisect_right(self.ordinals, ordinal) - 1
        if i < 0:
            return None
        return self.positions[i], self.offsets[i], self.ordinals[i]


# Most streams are small: their sparse index has one point (the stream's start), and four arrays were
# 320 bytes of each idle stream (issue 17). An index whose points fit here shares read-only one-point
# arrays (by value: a start position of 0, a header's size, an ordinal of 0, a time floor of 0) until its
# second point, when ``note`` copies them first; nothing else changes an index's arrays.
_SHARED_MAX = 1 << 16
_SHARED: dict[int, array] = {}
_NO_POINTS = array("q")


def _shared_point(value: int) -> array | None:
    """A shared one-element array holding ``value`` (None: not a value that is shared)."""
    if not 0 <= value < _SHARED_MAX:
        return None
    shared = _SHARED.get(value)
    if shared is None:
        shared = _SHARED.setdefault(value, array("q", (value,)))
    return shared


class SparseIndex(_Points):
    """(position, global file offset, message ordinal, effective append time) roughly every
    ``interval`` file bytes, in log order. ``messages`` counts every message noted so far (the durable
    message count of the log); ``last_time`` is the effective append time of the last message noted
    (or the stream's time floor, ``StreamHeader.append_time_floor_ms``, before any)."""

    __slots__ = (
        "interval",
        "positions",
        "offsets",
        "ordinals",
        "times",
        "messages",
        "last_time",
        "_shared",
    )

    def __init__(
        self,
        interval: int,
        positions: array | None = None,
        offsets: array | None = None,
        ordinals: array | None = None,
        messages: int = 0,
        times: array | None = None,
        last_time: int = 0,
    ):
        self.interval = max(1, interval)
        self.positions: array = positions if positions is not None else _NO_POINTS
        self.offsets: array = offsets if offsets is not None else _NO_POINTS
        self.ordinals: array = ordinals if ordinals is not None else _NO_POINTS
        self.times: array = times if times is not None else _NO_POINTS
        # The arrays are shared (``_shared_point``, ``_NO_POINTS``): copy before appending.
        self._shared = positions is None or offsets is None or ordinals is None or times is None
        self.messages = messages
        self.last_time = last_time
        if not len(self.positions) == len(self.offsets) == len(self.ordinals) == len(self.times):
            raise ValueError("sparse index arrays differ in length")

    @classmethod
    def starting_at(cls, interval: int, position: int, offset: int, last_time: int) -> SparseIndex:
        """``SparseIndex(interval, last_time=last_time)`` with its first point ``note(position,
        offset, 0)``: a new log's (its start, after its header record), in one step, from shared
        arrays when the values are shared ones (a create: issue 17)."""
        index = cls(interval, last_time=last_time)
        if not index._share_first(position, offset):
            index.note(position, offset, 0)
        return index

    def note(self, position: int, offset: int, n_messages: int, timestamp_ms: int = 0) -> None:
        """Called for every record start (``n_messages`` in the record, appended at ``timestamp_ms``;
        0 messages for the stream's first point, which is not a record); keeps one point per
        ``interval`` bytes."""
        if n_messages and timestamp_ms > self.last_time:
            self.last_time = timestamp_ms
        offsets = self.offsets
        new_point = not offsets or offset - offsets[-1] >= self.interval
        # A first point may be made of shared arrays; any other is appended to the index's own.
        if new_point and (offsets or not self._share_first(position, offset)):
            if self._shared:
                self._own()
            self.positions.append(position)
            self.offsets.append(offset)
            self.ordinals.append(self.messages)
            self.times.append(self.last_time)
        self.messages += n_messages

    def _share_first(self, position: int, offset: int) -> bool:
        """Make the first point out of shared arrays, if its values are shared ones."""
        shared = (
            _shared_point(position),
            _shared_point(offset),
            _shared_point(self.messages),
            _shared_point(self.last_time),
        )
        if None in shared:
            return False
        self.positions, self.offsets, self.ordinals, self.times = shared  # type: ignore[assignment]
        self._shared = True
        return True

    def _own(self) -> None:
        """Copies of the arrays, to append to (they were shared)."""
        self.positions = array("q", self.positions)
        self.offsets = array("q", self.offsets)
        self.ordinals = array("q", self.ordinals)
        self.times = array("q", self.times)
        self._shared = False

    def floor_time(self, at_ms: int) -> tuple[int, int, int] | None:
        """The last point ``(position, offset, effective time)`` whose effective time is below
        ``at_ms``: the first message at or after ``at_ms`` starts after it, and no later than the
        next point. None when every point is at or after ``at_ms``."""
        i = bisect_left(self.times, at_ms) - 1
        if i < 0:
            return None
        return self.positions[i], self.offsets[i], self.times[i]

    def __len__(self) -> int:
        return len(self.offsets)


class RecentRecords(_Points):
    """Exact (position, offset, ordinal) of the last ``limit`` records, so tailing readers skip the
    scan."""

    __slots__ = ("limit", "positions", "offsets", "ordinals")

    def __init__(self, limit: int = RECENT_RECORDS) -> None:
        self.limit = limit
        self.positions = array("q")
        self.offsets = array("q")
        self.ordinals = array("q")

    def note(self, position: int, offset: int, ordinal: int) -> None:
        self.positions.append(position)
        self.offsets.append(offset)
        self.ordinals.append(ordinal)
        if len(self.positions) > 2 * self.limit:  # trim in bulk: amortized O(1) per record
            del self.positions[: self.limit]
            del self.offsets[: self.limit]
            del self.ordinals[: self.limit]


# The window of every index that has none: never noted into (``LogIndex.note`` makes a new one first).
_NO_RECENT = RecentRecords(0)


class LogIndex:
    """The lookup a read uses: the closest known record start at or before a position.

    The recent window is kept while the log is written to, and dropped (``forget_recent``) when it
    goes idle: three arrays were about 240 bytes of each idle stream, and more for a stream with many
    records (issue 17). Without it a lookup starts at the sparse point, at most one interval back."""

    __slots__ = ("sparse", "recent")

    def __init__(self, sparse: SparseIndex) -> None:
        self.sparse = sparse
        self.recent = _NO_RECENT

    def note(self, position: int, offset: int, n_messages: int, timestamp_ms: int) -> None:
        """A durable APPEND record starts at global ``offset`` with ``n_messages`` messages appended
        at ``timestamp_ms``."""
        sparse = self.sparse
        ordinal = sparse.messages
        sparse.note(position, offset, n_messages, timestamp_ms)
        recent = self.recent
        if recent is _NO_RECENT:
            recent = self.recent = RecentRecords()
        recent.note(position, offset, ordinal)

    def forget_recent(self) -> None:
        """Drop the recent window (an idle log; the next ``note`` starts a new one)."""
        self.recent = _NO_RECENT

    @property
    def messages(self) -> int:
        """Messages in the durable part of the log."""
        return self.sparse.messages

    @property
    def last_time(self) -> int:
        """Effective append time of the last durable message (the time floor if there is none)."""
        return self.sparse.last_time

    def floor_entry(self, position: int) -> tuple[int, int, int]:
        """The closest known record start ``(position, offset, ordinal)`` at or before ``position``."""
        best = self.sparse.floor_entry(position)
        recent = self.recent.floor_entry(position)
        if recent is not None and (best is None or recent[1] > best[1]):
            best = recent
        if best is None:
            raise LookupError(position)
        return best

    def floor_ordinal(self, ordinal: int) -> tuple[int, int, int]:
        """The closest known record start with at most ``ordinal`` messages before it."""
        best = self.sparse.floor_ordinal(ordinal)
        recent = self.recent.floor_ordinal(ordinal)
        if recent is not None and (best is None or recent[1] > best[1]):
            best = recent
        if best is None:
            raise LookupError(ordinal)
        return best

    def exact(self, position: int) -> int | None:
        """The ordinal of the recent record that starts exactly at ``position``, if there is one."""
        recent = self.recent.floor_entry(position)
        if recent is not None and recent[0] == position:
            return recent[2]
        return None

    def floor(self, position: int) -> tuple[int, int]:
        # The two ``_Points.floor`` written out: every read plans one (a multi-range read 10,000
        # in a request), and their calls and tuples were half of this.
        sparse = self.sparse
        i = bisect_right(sparse.positions, position) - 1
        recent = self.recent
        j = bisect_right(recent.positions, position) - 1
        if j >= 0:
            offset = recent.offsets[j]
            if i < 0 or offset > sparse.offsets[i]:
                return recent.positions[j], offset
        if i < 0:
            raise LookupError(position)
        return sparse.positions[i], sparse.offsets[i]
