"""Offset-range arithmetic of the source, without any I/O (tested on its own, like Kafka's range calculator).

- ``plan_next_end``: from a batch's start offset and the streams' current tails, which streams advance, which
  are already resolved (``latest``), which are gone (data loss) and which ranges admission control may cut.
- ``ranges_between``: the per-stream ranges ``[start, end)`` a micro-batch reads, from Spark's two offsets.
  A pure function of its inputs: this is what makes ``partitions(start, end)`` replay-deterministic.
- ``batch_ranges``: the same for ``spark.read`` from ``startingOffsets``/``endingOffsets``.
- ``batch_due``: whether a trigger under ``minMessagesPerTrigger``/``minBytesPerTrigger`` plans a batch
  now or waits (``maxTriggerDelay``), from the lag and the last batch's time.
- ``allocate``: splits a per-trigger budget (messages or bytes) across streams in proportion to their lag,
  exactly (largest remainder, ties by path), so the total never exceeds the limit.
- ``split_points``: where to cut a range that is too large for one task (``packing.py`` decides how many
  parts, from ``maxBytesPerPartition``, ``maxMessagesPerPartition`` and ``minPartitions``). Cuts come from
  an injected limit-lookup function (the server's ``lookup=limit``), so every cut is a message boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from durastream_spark.errors import OptionError
from durastream_spark.source.offsets import (
    EARLIEST,
    LATEST,
    EarliestSpec,
    LatestSpec,
    OffsetSpec,
    SourceOffset,
    SpecificSpec,
    is_symbolic,
    offset_after,
)


class StreamRange(NamedTuple):
    """``[start, end)`` of one stream. ``start`` is ``EARLIEST`` or a token; ``end`` is a token. A
    tuple, as ``RangeSize``: a batch over 10,000 streams makes one per stream."""

    stream: str
    start: str
    end: str


@dataclass(frozen=True)
class LossNotice:
    """A range that is gone; the caller passes it to the data-loss reporter."""

    stream: str
    start: str | None
    end: str | None
    reason: str


class RangeSize(NamedTuple):
    """How much a range holds, as the server's limit lookup counts it (messages, payload bytes). A
    tuple: planning a batch over 10,000 streams makes one per range."""

    messages: int
    bytes: int


# --------------------------------------------------------------------------------------------------------
# Micro-batch ends
# --------------------------------------------------------------------------------------------------------


@dataclass
class EndPlan:
    """What ``plan_next_end`` decided. ``fixed`` ends need no lookup; ``pending`` ranges may be limited."""

    fixed: dict[str, str] = field(default_factory=dict)
    pending: list[StreamRange] = field(default_factory=list)
    losses: list[LossNotice] = field(default_factory=list)


def plan_next_end(
    start: SourceOffset,
    tails: Mapping[str, str],
    target: Mapping[str, str] | None = None,
    finished: Mapping[str, str] | None = None,
    paths: Iterable[str] | None = None,
) -> EndPlan:
    """Plan the next end offset.

    ``tails``: every selected stream that exists now. ``target``: the ``Trigger.AvailableNow`` target (tails
    when the query started); streams absent from it do not advance. ``finished``: streams this reader saw
    closed, with their final offsets; such a stream disappearing after it was read to its end is no loss.
    ``paths``: the streams to plan (default: every stream of ``start`` and ``tails``). A caller that knows
    which streams changed since it planned ``start`` passes those: the others keep their start, and the
    cost follows what changed. A planned path absent from the plan's ends is dropped from the offset.
    """
    plan = EndPlan()
    finished = finished or {}
    if paths is None:
        paths = start.raw.keys() | tails.keys()
    for path in sorted(paths):
        value = start.start_of(path)
        explicit = start.get(path) is not None
        tail = tails.get(path)
        if tail is None:
            if value == EARLIEST or is_symbolic(value):
                if explicit and value == EARLIEST:
                    plan.fixed[path] = EARLIEST  # not created yet: it will start at its beginning
                continue
            if finished.get(path) != value:
                plan.losses.append(
                    LossNotice(
                        path,
                        value,
                        None,
                        "the stream no longer exists (deleted or expired: 404/410), so anything "
                        "after the offset the query had reached is gone",
                    )
                )
            continue  # dropped from the offset: if it is created again, it is read from its beginning
        if target is not None and path not in target:
            # Appeared after Trigger.AvailableNow fixed its target: it waits for the next query run.
            if not is_symbolic(value) and explicit:
                plan.fixed[path] = value
            continue
        cap = tail
        if target is not None and offset_after(tail, target[path]):
            cap = target[path]
        if is_symbolic(value):
            # Batch 0 of startingOffsets=latest: resolve, read nothing. (An instant the caller could
            # not resolve was reported as lost; it is resolved to the same point.)
            plan.fixed[path] = cap
        elif value == EARLIEST:
            plan.pending.append(StreamRange(path, EARLIEST, cap))
        elif offset_after(value, tail):
            plan.losses.append(
                LossNotice(
                    path,
                    value,
                    tail,
                    f"the stream's tail {tail} is before the offset {value} the query had reached "
                    "(the stream was deleted and re-created, or truncated); reading it again from its "
                    "beginning",
                )
            )
            plan.pending.append(StreamRange(path, EARLIEST, cap))
        elif value == cap or offset_after(value, cap):
            plan.fixed[path] = value
        else:
            plan.pending.append(StreamRange(path, value, cap))
    return plan


def ranges_between(
    start: SourceOffset, end: SourceOffset
) -> tuple[list[StreamRange], list[LossNotice]]:
    """The ranges a micro-batch reads. Only streams in ``end`` are read; ``LATEST`` starts read nothing.

    A start after its end means the stream went backwards (re-created or truncated): that is reported, and
    the batch reads the new incarnation from its beginning up to ``end``, exactly as ``plan_next_end``
    planned it, so a replay of the batch reads the same range.
    """
    ranges: list[StreamRange] = []
    losses: list[LossNotice] = []
    starts = start.raw
    # Streams whose stored value did not change read nothing: compared as stored, without decoding, so
    # a batch over 100,000 streams of which 1,000 moved costs 1,000 ranges, not 100,000.
    moved = sorted(path for path, value in end.raw.items() if starts.get(path) != value)
    for path in moved:
        end_value = end.start_of(path)
        if end_value == EARLIEST or is_symbolic(end_value):
            continue
        begin = start.start_of(path)
        if begin == end_value or is_symbolic(begin):
            continue
        if begin != EARLIEST and offset_after(begin, end_value):
            losses.append(
                LossNotice(
                    path,
                    begin,
                    end_value,
                    f"the batch ends at {end_value}, before the offset {begin} the query had reached "
                    "(the stream was deleted and re-created, or truncated)",
                )
            )
            begin = EARLIEST
        ranges.append(StreamRange(path, begin, end_value))
    return ranges, losses


def batch_ranges(
    starting: OffsetSpec,
    ending: OffsetSpec,
    tails: Mapping[str, str],
    *,
    starting_raw: str | None = None,
    ending_raw: str | None = None,
    starting_option: str = "startingOffsets",
    ending_option: str = "endingOffsets",
) -> list[StreamRange]:
    """``spark.read`` ranges from the two specs (instants already resolved) and the current tails. Raises
    ``OptionError`` (naming ``starting_option``/``ending_option``) when a spec names an offset past a
    stream's tail or a start after its end."""
    if isinstance(starting, EarliestSpec) and isinstance(ending, LatestSpec):
        # The default read, each stream whole up to its tail: nothing can be out of bounds, and a
        # read of 10,000 streams needs no per-stream checks.
        return [
            StreamRange(path, EARLIEST, tail)
            for path, tail in sorted(tails.items())
            if tail != EARLIEST  # a server that names an empty stream's tail -1: nothing to read
        ]
    ranges: list[StreamRange] = []
    for path in sorted(tails):
        tail = tails[path]
        begin = _resolve_start(starting, path, tail)
        finish = _resolve_end(ending, path, tail)
        if offset_after(finish, tail):
            raise OptionError(
                ending_option,
                ending_raw,
                f"offsets at or before each stream's tail (stream {path!r}: {tail})",
                reason=f"stream {path!r} ends at {finish}, past its tail {tail}",
            )
        if begin != EARLIEST and offset_after(begin, tail):
            raise OptionError(
                starting_option,
                starting_raw,
                f"offsets at or before each stream's tail (stream {path!r}: {tail})",
                reason=f"stream {path!r} starts at {begin}, past its tail {tail}",
            )
        if begin != EARLIEST and offset_after(begin, finish):
            raise OptionError(
                starting_option,
                starting_raw,
                "a start at or before the end of each stream",
                reason=f"stream {path!r} starts at {begin}, after its end {finish} ({ending_option})",
            )
        if begin != finish:
            ranges.append(StreamRange(path, begin, finish))
    return ranges


def _resolve_start(spec: OffsetSpec, path: str, tail: str) -> str:
    if isinstance(spec, EarliestSpec):
        return EARLIEST
    if isinstance(spec, LatestSpec):
        return tail
    assert isinstance(spec, SpecificSpec)
    value = spec.value_for(path)
    return tail if value == LATEST else value


def _resolve_end(spec: OffsetSpec, path: str, tail: str) -> str:
    if isinstance(spec, LatestSpec):
        return tail
    assert isinstance(spec, SpecificSpec)
    value = spec.value_for(path)
    return tail if value == LATEST else value


# --------------------------------------------------------------------------------------------------------
# Admission control
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TriggerMinimum:
    """``minMessagesPerTrigger`` / ``minBytesPerTrigger`` (either may be None) and ``maxTriggerDelay``."""

    messages: int | None
    bytes: int | None
    max_delay_ms: int


def batch_due(
    lags: Mapping[str, RangeSize], minimum: TriggerMinimum, last_batch_ms: int | None, now_ms: int
) -> bool:
    """Whether the trigger plans a batch: enough is waiting (either minimum reached), or the delay has
    passed since the last batch (``last_batch_ms``; None: there was none, so the first batch of a new
    query is not held back, like Kafka's). Otherwise the trigger skips the batch."""
    waiting_messages = sum(size.messages for size in lags.values())
    waiting_bytes = sum(size.bytes for size in lags.values())
    if minimum.messages is not None and waiting_messages >= minimum.messages:
        return True
    if minimum.bytes is not None and waiting_bytes >= minimum.bytes:
        return True
    return last_batch_ms is None or now_ms - last_batch_ms >= minimum.max_delay_ms


def allocate(lags: Mapping[str, int], limit: int | None) -> dict[str, int]:
    """Each stream's share of ``limit``, in proportion to its lag, summing to exactly ``min(limit, total)``.

    Largest-remainder rounding, ties broken by path, so the result is deterministic; every share is at most
    the stream's lag. ``limit=None`` means no limit: every stream gets its whole lag.
    """
    for path, lag in lags.items():
        if lag < 0:
            raise ValueError(f"lag of {path!r} is negative: {lag}")
    total = sum(lags.values())
    if limit is None or total <= limit:
        return dict(lags)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    shares: dict[str, int] = {}
    remainders: list[tuple[int, str]] = []
    for path in sorted(lags):
        numerator = lags[path] * limit
        shares[path] = numerator // total
        remainders.append((numerator % total, path))
    left = limit - sum(shares.values())
    # Largest remainder first; among equal remainders, the path that sorts first.
    for _, path in sorted(remainders, key=lambda item: (-item[0], item[1]))[:left]:
        shares[path] += 1
    return shares


# --------------------------------------------------------------------------------------------------------
# Splitting ranges into tasks
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitRules:
    """``maxBytesPerPartition``, ``maxMessagesPerPartition`` and ``minPartitions``."""

    max_bytes_per_partition: int
    max_messages_per_partition: int | None = None
    min_partitions: int | None = None


LookupFn = Callable[[str, int, int], tuple[str, int, int]]
"""``lookup(start, max_messages, max_bytes) -> (end, messages, bytes)`` within the range's end."""


def split_points(
    start: str,
    end: str,
    size: RangeSize,
    parts: int,
    lookup: LookupFn,
    *,
    max_messages_per_part: int | None = None,
    max_bytes_per_part: int | None = None,
) -> list[str]:
    """Cut ``[start, end)`` into about ``parts`` pieces of equal bytes and messages; return the cuts.

    Each cut targets the remaining bytes and messages divided by the remaining parts, so rounding at message
    boundaries does not leave a sliver at the end. Hard per-part caps (``maxMessagesPerPartition`` /
    ``maxBytesPerPartition``) are honoured for the remainder too (bytes softly: a message larger than the cap
    is a part of its own). Every cut is strictly inside ``(start, end)`` and increasing.
    """
    cuts: list[str] = []
    current = start
    remaining_messages, remaining_bytes = size.messages, size.bytes
    parts_left = max(1, parts)

    def over_caps() -> bool:
        if max_messages_per_part and remaining_messages > max_messages_per_part:
            return True
        return bool(
            max_bytes_per_part and remaining_bytes > max_bytes_per_part and remaining_messages > 1
        )

    while remaining_messages > 1 and (parts_left > 1 or over_caps()):
        target_messages = math.ceil(remaining_messages / parts_left)
        target_bytes = max(1, math.ceil(remaining_bytes / parts_left))
        if max_messages_per_part:
            target_messages = min(target_messages, max_messages_per_part)
        if max_bytes_per_part:
            target_bytes = min(target_bytes, max_bytes_per_part)
        cut, messages, size_bytes = lookup(current, target_messages, target_bytes)
        if cut == end or messages >= remaining_messages:
            break
        if messages <= 0 or not offset_after(cut, current):
            raise ValueError(
                f"limit lookup from {current} made no progress (answered {cut}, {messages} messages)"
            )
        cuts.append(cut)
        current = cut
        remaining_messages -= messages
        remaining_bytes -= size_bytes
        parts_left = max(1, parts_left - 1)
    return cuts
