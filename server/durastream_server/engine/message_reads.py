"""Whole-message reads for message frames (extension, ``docs/extensions.md`` section 2).

A frames response carries per-message metadata next to the values, so its size is not just payload: a
chunk of tiny messages could be several times the server's chunk size. ``read_whole_messages`` charges
each message its length plus a fixed ``overhead`` and trims the read to the budget, always keeping at
least one message so a reader never stalls on a message larger than a chunk.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from durastream_server.engine.view import StreamView
from durastream_server.storage.records import MessageSlice


async def read_whole_messages(
    view: StreamView, start: int, end: int, max_bytes: int, overhead: int
) -> tuple[list[MessageSlice], int]:
    """Whole messages of ``view`` in ``[start, end)`` costing at most ``max_bytes`` (at least one);
    returns them and the position after the last one."""
    slices, next_position = await view.read(start, max_bytes, end, whole_messages=True)
    if overhead and len(slices) > 1:
        costs = list(accumulate(len(s.data) + overhead for s in slices))
        keep = max(1, bisect_right(costs, max_bytes))
        if keep < len(slices):
            next_position = slices[keep].position
            del slices[keep:]
    return slices, next_position
