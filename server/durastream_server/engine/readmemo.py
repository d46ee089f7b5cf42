"""The last small read result of recently read streams, for the next identical read.

This is the fan-out case: a commit wakes every reader parked at a stream's tail, and each reads the same
range (then parks again at the same new tail), so all but the first get the first one's answer
(docs/decisions/0004-performance.md). A memo is only worth something for the moments after a commit, so
the memos live here, a bounded number for the whole engine (the most recently read streams), not one per
stream: a read result kept by every stream that was read once was about 900 bytes of each idle stream's
memory with 100,000 streams (issue 17).
"""

from __future__ import annotations

from typing import Final

STREAMS: Final = 256  # streams whose last small read result is kept (the fan-out of one round)
MAX_BYTES: Final = 4096  # largest read result kept


class ReadMemos:
    """``key -> (request, durable tail, durable closed, result)`` for at most ``capacity`` keys, the
    least recently stored dropped first. The caller compares the first three before using a result."""

    __slots__ = ("_memos", "_capacity")

    def __init__(self, capacity: int = STREAMS) -> None:
        self._memos: dict[object, tuple[object, int, bool, object]] = {}
        self._capacity = capacity

    def get(self, key: object) -> tuple[object, int, bool, object] | None:
        return self._memos.get(key)

    def put(self, key: object, memo: tuple[object, int, bool, object]) -> None:
        memos = self._memos
        memos.pop(key, None)  # re-inserted at the end: the most recent
        memos[key] = memo
        if len(memos) > self._capacity:
            del memos[next(iter(memos))]

    def __len__(self) -> int:
        return len(self._memos)
