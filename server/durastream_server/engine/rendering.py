"""Read results into response payloads, with the per-message work off the event loop when it is large.

A read of JSON messages is answered as one JSON array (section 9.1.5), so every message gets a comma:
per-message work. Storage returns the messages of a record as one ``MessageRun`` (a buffer and its
lengths), and this module cuts runs into messages only to join them again with commas, C-level, in the
read executor once a read holds more than ``INLINE_MESSAGES`` messages (``Engine.offload``). The read
budgets count ``MESSAGE_OVERHEAD`` per message, so a read holds at most about chunk / 25 messages, and
the work and the transient objects of one render are bounded by the chunk size whatever the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, islice
from operator import attrgetter
from typing import Final

from durastream_server.storage.records import MessageRun, MessageSlice

# Reads with at most this many messages are rendered on the loop (about 0.1 ms): a trip to the read
# executor costs more than that, and the long-poll wake-ups of docs/decisions/0004 are small reads.
INLINE_MESSAGES: Final = 1024

Item = MessageSlice | MessageRun
_DATA: Final = attrgetter("data")


def message_count(items: Iterable[Item]) -> int:
    return sum(len(item.lengths) if type(item) is MessageRun else 1 for item in items)


def split_run(run: MessageRun) -> Iterable[bytes]:
    """The messages of a run, each as its own bytes object (C-level slicing)."""
    if len(run.lengths) == 1:
        return (run.data,)
    cuts = list(accumulate(run.lengths, initial=0))
    return map(run.data.__getitem__, map(slice, cuts, islice(cuts, 1, None)))


def values(items: Iterable[Item]) -> Iterable[bytes]:
    """Every message (or byte-stream piece) of ``items``, in order."""
    return chain.from_iterable(
        split_run(item) if type(item) is MessageRun else (item.data,) for item in items
    )


def payload(items: Sequence[Item], *, json: bool) -> bytes:
    """The response body of a read: a JSON array for JSON streams, the bytes themselves otherwise."""
    if json:
        return b"[" + b",".join(values(items)) + b"]"
    if len(items) == 1:
        return items[0].data  # type: ignore[no-any-return]
    return b"".join(map(_DATA, items))
