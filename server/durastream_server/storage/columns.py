"""Whole messages of many reads gathered as columns, for one frames body (multi-range reads,
docs/extensions.md section 10).

A packed Spark task's multi-range request reads 2,000 small streams at a time, each one record of a
few messages. Answered read by read, each range built a list, a ``MessageRun`` (its payload sliced out
of the ``pread`` buffer), an answer tuple and its offset token, and the frames encoder then walked those
objects again for the body's columns. ``MessageColumns`` is where the read puts each record's messages
directly, in the order of the answer: the payloads side by side in one buffer, each message's length,
and per run of messages (a record, or a slice of a fallback read) its count, its append time and the
shift from its place in the values to its logical position. ``http/frames.encode_columns`` turns that
into the body with C-level passes only; nothing is kept per range beyond those integers.

Filled by one reader at a time (the multi-range read's worker-thread trip, then the loop for ranges
read alone: never both at once).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from durastream_server.storage.records import MessageRun, MessageSlice


class MessageColumns:
    """The messages of consecutive reads, in order (module docstring). Message ``i`` of run ``r`` is
    at logical position ``shifts[r] + b`` where ``b`` is where it starts in ``values``, and was
    appended at ``times[r]``."""

    __slots__ = ("values", "lengths", "shifts", "counts", "times")

    def __init__(self) -> None:
        self.values = bytearray()  # every message's bytes, side by side
        self.lengths = array("I")  # each message's length (a stored message's fits a u32)
        self.shifts: list[int] = []  # per run: its position minus where its bytes start in values
        self.counts: list[int] = []  # per run: how many messages
        self.times: list[int] = []  # per run: the append time, ms since the epoch

    @property
    def messages(self) -> int:
        return len(self.lengths)

    def add(self, items: Iterable[MessageSlice | MessageRun]) -> None:
        """Append the messages of a read's answer (whole messages: runs or single slices)."""
        values = self.values
        for item in items:
            data = item.data
            self.shifts.append(item.position - len(values))
            self.times.append(item.timestamp_ms)
            if type(item) is MessageRun:
                self.counts.append(len(item.lengths))
                self.lengths.extend(item.lengths)
            else:
                self.counts.append(1)
                self.lengths.append(len(data))
            values += data
