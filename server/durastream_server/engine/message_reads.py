"""Whole-message reads for message frames (extension, ``docs/extensions.md`` section 2).

A frames response carries per-message metadata next to the values, so its size is not just payload: a
chunk of tiny messages could be several times the server's chunk size. ``read_whole_messages`` charges
each message its length plus a fixed ``overhead`` and trims the read to the budget, always keeping at
least one message so a reader never stalls on a message larger than a chunk.

The read asks storage for runs: a record returned whole comes back as one ``MessageRun`` rather than a
``MessageSlice`` per message (the per-message objects were most of a frames read's server time), so the
trim works on items that hold one message or many.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from durastream_server.engine.view import StreamView
from durastream_server.storage.records import MessageRun, MessageSlice

Item = MessageSlice | MessageRun


def message_count(item: Item) -> int:
    return len(item.lengths) if type(item) is MessageRun else 1


async def read_whole_messages(
    view: StreamView, start: int, end: int, max_bytes: int, overhead: int
) -> tuple[list[Item], int]:
    """Whole messages of ``view`` in ``[start, end)`` costing at most ``max_bytes`` (at least one);
    returns them (slices and runs, in order) and the position after the last one."""
    items, next_position = await view.read(start, max_bytes, end, whole_messages=True, runs=True)
    if not overhead or not items:
        return items, next_position
    counts = list(accumulate(map(message_count, items)))  # messages up to and including item k
    total = counts[-1]
    if total <= 1 or next_position - start + total * overhead <= max_bytes:
        return items, next_position

    # Positions are contiguous from ``start``, so the bytes of everything up to an item's end are
    # ``end - start``; the cost adds one overhead per message. Both grow, so binary searches find the
    # cut: first the item it falls in, then (for a run) the message.
    def cost_through(k: int) -> int:
        return items[k].end - start + counts[k] * overhead

    whole = bisect_right(range(len(items)), max_bytes, key=cost_through)  # items kept entirely
    kept = items[:whole]
    before = counts[whole - 1] if whole else 0
    if whole < len(items):
        item = items[whole]
        if type(item) is MessageRun:
            ends = list(accumulate(item.lengths, initial=item.position))[1:]

            def cost_within(i: int) -> int:
                return ends[i] - start + (before + i + 1) * overhead

            fit = bisect_right(range(len(ends)), max_bytes, key=cost_within)
            if fit or not before:
                kept.append(item.head(max(1, fit)))
        elif not before:
            kept.append(item)  # at least one message, however large
    return kept, kept[-1].end
