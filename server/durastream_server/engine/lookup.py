"""Limit lookups (extension, ``docs/extensions.md`` section 3): the furthest message boundary within a
message and/or byte budget, computed from message ordinals without reading any payload.

This is what lets the connector honour ``maxMessagesPerTrigger``/``maxBytesPerTrigger`` and cut a
backlog into tasks without downloading it first. Bytes between two positions are their difference (a
position *is* a payload byte count); messages between two positions are a difference of message
ordinals (``storage/ordinals.py``). A fork chain is walked level by level: each level contributes the
messages of its own log inside the range it serves.
"""

from __future__ import annotations

from dataclasses import dataclass

from durastream_server.engine.view import StreamView
from durastream_server.storage.log import StreamLog


@dataclass(frozen=True, slots=True)
class Advance:
    """The answer for ``[start, end)``: ``end`` is a message boundary, ``messages`` the count inside."""

    end: int
    messages: int


async def advance(
    view: StreamView,
    start: int,
    cap: int,
    max_messages: int | None,
    max_bytes: int | None,
) -> Advance:
    """The furthest boundary ``X`` with ``start <= X <= cap`` such that ``[start, X)`` holds at most
    ``max_messages`` messages and ``max_bytes`` payload bytes (``None``: no limit).

    ``start`` and ``cap`` must be message boundaries of ``view``. ``max_bytes`` is soft: when it is at
    least 1, the first message is admitted even if it alone is larger.
    """
    if max_messages == 0 or max_bytes == 0 or start >= cap:
        return Advance(start, 0)
    position = start
    total = 0
    messages_left = max_messages
    bytes_left = max_bytes
    while position < cap:
        level = view.locate(position)
        stop = cap if level.limit is None else min(cap, level.limit)
        end, count = await _advance_in_log(
            level.log,
            position,
            stop,
            messages_left,
            bytes_left,
            admit_one=max_bytes is not None and total == 0,
        )
        total += count
        if end < stop:
            return Advance(end, total)
        if messages_left is not None:
            messages_left -= count
            if messages_left <= 0:
                return Advance(end, total)
        if bytes_left is not None:
            bytes_left -= end - position
            if bytes_left <= 0:
                return Advance(end, total)
        position = end
    return Advance(position, total)


async def _advance_in_log(
    log: StreamLog,
    start: int,
    stop: int,
    max_messages: int | None,
    max_bytes: int | None,
    *,
    admit_one: bool,
) -> tuple[int, int]:
    """``advance`` within one log's range ``[start, stop)``; ``start`` is a boundary of the log, ``stop``
    may cut a byte-stream message short (a fork point), which then counts as one message ending there.

    Two trips to the read executor at most: one to place ``start``, ``stop`` and the byte limit among
    message ordinals, one to turn the chosen ordinals back into positions.
    """
    probes = [start, stop]
    bytes_inside = max_bytes is not None and max_bytes < stop - start
    if bytes_inside:
        assert max_bytes is not None
        probes.append(start + max_bytes)
    floors = await log.message_floors(probes)
    start_ordinal = floors[0][1]
    stop_floor, stop_ordinal = floors[1]
    available = stop_ordinal + (1 if stop_floor < stop else 0) - start_ordinal

    candidates: list[tuple[int, int]] = [(stop, available)]  # (position, messages before it)
    wanted: list[int] = []  # message counts whose end position must be looked up
    if max_messages is not None and max_messages < available:
        wanted.append(max_messages)
    if bytes_inside:
        byte_floor, byte_ordinal = floors[2]
        if byte_floor == start and admit_one:
            wanted.append(1)  # the byte limit is soft: the first message always fits
        else:
            candidates.append((byte_floor, byte_ordinal - start_ordinal))
    if wanted:
        ends = await log.message_starts([start_ordinal + count for count in wanted])
        candidates.extend((min(end, stop), count) for end, count in zip(ends, wanted, strict=True))
    end, count = min(candidates)
    if end == stop:
        count = available
    return end, count
