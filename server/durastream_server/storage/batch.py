"""One loop future for the many entries of a bulk request (issue 16, docs/decisions/0008-bulk-writes.md,
"Batched settling").

The commit round settles each entry it wrote where the entry's future would be: a bulk request of
10,000 new streams made 10,000 ``asyncio.Future`` objects (and as many for the engine's answers), each
with a done callback the loop dispatched in a turn of its own, to be gathered by the request again. A
``Batch`` is one future and a list of outcomes; each entry gets a ``Slot``, a plain object with the
three methods the round calls on a future (``done``, ``set_result``, ``set_exception``), which records
the outcome synchronously. The last slot settled resolves the batch's future: one wake-up per request.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Batch:
    """The outcomes of ``count`` entries, in order (a result, or the exception that failed it), and
    ``all_done``, resolved once every entry is settled."""

    __slots__ = ("all_done", "left", "outcomes")

    def __init__(self, count: int) -> None:
        self.outcomes: list[Any] = [None] * count
        self.left = count
        self.all_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not count:
            self.all_done.set_result(None)

    def settle(self, index: int, outcome: Any) -> None:
        self.outcomes[index] = outcome
        self.left -= 1
        if not self.left and not self.all_done.done():
            self.all_done.set_result(None)

    def follow(self, index: int, future: asyncio.Future[Any]) -> None:
        """Entry ``index`` is settled by ``future`` (an entry that took a path of its own)."""

        def done(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled():
                self.settle(index, asyncio.CancelledError())
            else:
                failure = fut.exception()
                self.settle(index, fut.result() if failure is None else failure)

        future.add_done_callback(done)


class Completion(Protocol):
    """What a round calls on an entry's completion: an ``asyncio.Future``, a ``Slot``, or the
    engine's ``_Settles`` (a small append's answer, settled without a future of the log's)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exc: BaseException) -> None: ...


class Slot:
    """Entry ``index`` of ``batch`` where a round expects the entry's future. Settled once; a later
    call is ignored, as a done future's would be skipped by its ``done()`` check."""

    __slots__ = ("_batch", "_done", "_index")

    def __init__(self, batch: Batch, index: int) -> None:
        self._batch = batch
        self._index = index
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any) -> None:
        if not self._done:
            self._done = True
            self._batch.settle(self._index, result)

    def set_exception(self, exc: BaseException) -> None:
        if not self._done:
            self._done = True
            self._batch.settle(self._index, exc)
