"""Packing a batch's ranges into tasks: few tasks for many small ranges, large ranges still split.

Every Python task costs Spark a fixed 50-100 ms, so a batch over 10,000 streams of a few messages each
must not be 10,000 tasks (Kafka's connector makes one task per topic-partition; a stream here is as small
as a chat session). Ranges are taken in path order and added to the current task until the next would
pass a cap: ``maxBytesPerPartition`` and ``maxMessagesPerPartition``, both lowered so that the batch
makes at least ``minPartitions`` tasks. A range larger than a cap is first cut into parts of at most the
cap at message boundaries (``planner.split_points``), and its parts are packed like any range.

All of this is a pure function of the batch's ranges and their sizes, and both are fixed by the two
offsets Spark wrote to its offset log (a range's data never changes), so a replayed batch gets exactly the
same tasks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from durastream_spark.source.planner import RangeSize, SplitRules


class Piece(NamedTuple):
    """A range, or a part of one, with its size (``messages`` 0 when it was sized by its offsets'
    byte positions, which do not count messages). A tuple: a batch over 10,000 streams makes one per
    range, and a tuple is built and read in C."""

    stream: str
    start: str
    end: str
    size: RangeSize


@dataclass(frozen=True)
class TaskCaps:
    """The most a task holds: payload bytes (soft: one larger message is a task of its own) and
    messages (``None``: no cap)."""

    bytes: int
    messages: int | None


def task_caps(sizes: Iterable[RangeSize], rules: SplitRules, counted: bool = True) -> TaskCaps:
    """The per-partition options, lowered to an even share of the batch when ``minPartitions`` asks
    for more tasks than they would give. ``counted=False``: the sizes hold bytes only (sized by
    positions, messages not counted), so the share is of bytes and there is no message cap (the caller
    counts messages when ``maxMessagesPerPartition`` is set)."""
    if not rules.min_partitions:
        return TaskCaps(rules.max_bytes_per_partition, rules.max_messages_per_partition)
    listed = list(sizes)
    total_bytes = sum(size.bytes for size in listed)
    if not counted:
        return byte_caps(total_bytes, rules)
    caps = TaskCaps(rules.max_bytes_per_partition, rules.max_messages_per_partition)
    wanted = rules.min_partitions
    share_bytes = max(1, math.ceil(total_bytes / wanted))
    total_messages = sum(size.messages for size in listed)
    share_messages = max(1, math.ceil(total_messages / wanted))
    return TaskCaps(
        min(caps.bytes, share_bytes),
        share_messages if caps.messages is None else min(caps.messages, share_messages),
    )


def byte_caps(total_bytes: int, rules: SplitRules) -> TaskCaps:
    """``task_caps(..., counted=False)`` from the batch's total bytes alone (a batch sized by its
    offsets' positions has no ``RangeSize`` a range to sum)."""
    caps = TaskCaps(rules.max_bytes_per_partition, rules.max_messages_per_partition)
    if not rules.min_partitions:
        return caps
    share_bytes = max(1, math.ceil(total_bytes / rules.min_partitions))
    return TaskCaps(min(caps.bytes, share_bytes), caps.messages)


def parts_needed(size: RangeSize, caps: TaskCaps) -> int:
    """How many parts keep a range within the caps (never more than its messages)."""
    parts = math.ceil(size.bytes / caps.bytes) if caps.bytes else 1
    if caps.messages:
        parts = max(parts, math.ceil(size.messages / caps.messages))
    return max(1, min(parts, size.messages))


def pack(pieces: Sequence[Piece], caps: TaskCaps) -> list[list[Piece]]:
    """Tasks of consecutive pieces, each within the caps (a piece over a cap is a task of its own)."""
    tasks: list[list[Piece]] = []
    current: list[Piece] = []
    held_bytes = held_messages = 0
    for piece in pieces:
        size = piece.size
        over = held_bytes + size.bytes > caps.bytes or (
            caps.messages is not None and held_messages + size.messages > caps.messages
        )
        if current and over:
            tasks.append(current)
            current, held_bytes, held_messages = [], 0, 0
        current.append(piece)
        held_bytes += size.bytes
        held_messages += size.messages
    if current:
        tasks.append(current)
    return tasks


def pack_bytes(sizes: Sequence[int], cap: int) -> list[int]:
    """``pack`` of pieces sized by bytes alone (no message cap), as the ends of the tasks: task ``k``
    is ``sizes[ends[k - 1]:ends[k]]``. The same greedy cut as ``pack``, over a column of integers,
    so a batch of 10,000 ranges is packed without a ``Piece`` a range."""
    ends: list[int] = []
    first = held = 0
    for index, size in enumerate(sizes):
        if index > first and held + size > cap:
            ends.append(index)
            first, held = index, 0
        held += size
    if sizes:
        ends.append(len(sizes))
    return ends
