"""Time lookups (extension, ``docs/extensions.md`` section 7): the first message of a stream whose append
time is at or after an instant, found from the index without reading any payload.

This is what lets the connector start (or, in a batch read, end) at a point in time, like Kafka's
``offsetsForTimes``. Append times never go backwards along a stream: the engine gives every append
``max(now, the stream's last append time)`` (so a clock that steps back, across a restart or not, never
makes a later message look older), and a fork's own messages are never older than the latest append time
of its source (``StreamHeader.append_time_floor_ms``). So "the first message at or after T" is a
partition point: everything from it on is at or after T, everything before it is earlier.

A fork chain is walked level by level in position order (its deepest source first, the stream's own log
last): a level answers with the first message of its own log that is late enough, and the first level
whose answer lies inside the range that level serves in this view wins. Each level costs a bisect over
its sparse index and a header scan of about one index interval (``storage/times.py``).
"""

from __future__ import annotations

from durastream_server.engine.view import StreamView


async def first_at(view: StreamView, start: int, end: int, at_ms: int) -> int | None:
    """The position of the first message of ``view`` in ``[start, end)`` whose append time is
    ``>= at_ms``, or None if there is none. ``start`` must be a message boundary."""
    if start >= end:
        return None
    for level in reversed(view.levels):
        stop = view.tail if level.limit is None else level.limit
        if stop <= start or level.log.base >= stop:
            continue  # this level holds nothing at or after ``start`` in this view
        if level.log.base >= end:
            break
        found = await level.log.first_at_time(at_ms)
        if found is None or found[0] >= stop:
            continue  # nothing that late in the part of its log this view sees
        position = max(found[0], start)
        return position if position < end else None
    return None
