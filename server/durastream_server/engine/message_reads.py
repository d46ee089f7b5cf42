"""Whole-message reads for message frames (extension, ``docs/extensions.md`` section 2).

A frames response carries per-message metadata next to the values, so its size is not just payload: a
chunk of tiny messages could be several times the server's chunk size. ``read_whole_messages`` charges
each message its length plus a fixed ``overhead`` and trims the read to the budget, always keeping at
least one message so a reader never stalls on a message larger than a chunk.
"""

from __future__ import annotations

from bisect import bisect_right

from durastream_server.engine.view import StreamView
from durastream_server.storage.records import MessageSlice


async def read_whole_messages(
    view: StreamView, start: int, end: int, max_bytes: int, overhead: int
) -> tuple[list[MessageSlice], int]:
    """Whole messages of ``view`` in ``[start, end)`` costing at most ``max_bytes`` (at least one);
    returns them and the position after the last one."""
    slices, next_position = await view.read(start, max_bytes, end, whole_messages=True)
    count = len(slices)
    if overhead and count > 1 and next_position - start + count * overhead > max_bytes:

        def cost(i: int) -> int:
            """What the first ``i + 1`` messages cost: their bytes (positions are contiguous from
            ``start``) plus ``i + 1`` overheads. It grows with ``i``, so a binary search finds the cut
            in O(log n) calls, where summing every message's cost was a tenth of a frames read."""
            last = slices[i]
            return last.position + len(last.data) - start + (i + 1) * overhead

        keep = max(1, bisect_right(range(count), max_bytes, key=cost))
        if keep < len(slices):
            next_position = slices[keep].position
            del slices[keep:]
    return slices, next_position
