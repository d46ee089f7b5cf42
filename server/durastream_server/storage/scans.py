"""Header scans of many logs in one worker-thread trip.

A limit lookup or a boundary check of an idle stream scans a few KiB of record headers in the read
executor (``StreamLog.message_floors``/``message_starts``/``first_at_time``). The scan itself costs tens
of microseconds; the trip to a worker thread and back costs more (a thread wake-up, future chaining, two
loop wake-ups). A multi-range lookup of 10,000 streams made 10,000 trips. Scans submitted during one
loop turn (the lookups of a multi-range request run together, ``http/multirange.py``) are run here as
one job of at most ``MAX_JOB`` scans, each answered or failed on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Final

MAX_JOB: Final = 256  # scans per worker-thread trip

_Work = Callable[[], Any]


class ScanBatcher:
    """Runs blocking scan functions in the read executor, those submitted in one loop turn together."""

    __slots__ = ("_executor", "_pending")

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._pending: list[tuple[_Work, asyncio.Future[Any]]] = []

    def run(self, work: _Work) -> asyncio.Future[Any]:
        """``work()`` in a worker thread: a future with its result or its exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        pending = self._pending
        pending.append((work, future))
        if len(pending) == 1:
            loop.call_soon(self._flush)
        elif len(pending) >= MAX_JOB:
            self._flush()
        return future

    def _flush(self) -> None:
        jobs, self._pending = self._pending, []
        if not jobs:
            return
        loop = asyncio.get_running_loop()
        try:
            done = loop.run_in_executor(self._executor, _run_all, [work for work, _ in jobs])
        except RuntimeError as exc:  # the executor is shut down: the data directory is closing
            _fail(jobs, exc)
            return
        done.add_done_callback(lambda outcome: _settle(jobs, outcome))


def _run_all(works: list[_Work]) -> list[tuple[bool, Any]]:
    outcomes: list[tuple[bool, Any]] = []
    for work in works:
        try:
            outcomes.append((True, work()))
        except BaseException as exc:  # noqa: BLE001 - handed to the one who asked
            outcomes.append((False, exc))
    return outcomes


def _settle(
    jobs: list[tuple[_Work, asyncio.Future[Any]]], outcome: asyncio.Future[list[tuple[bool, Any]]]
) -> None:
    if outcome.cancelled():
        for _, future in jobs:
            future.cancel()
        return
    error = outcome.exception()
    if error is not None:
        _fail(jobs, error)
        return
    for (_, future), (ok, value) in zip(jobs, outcome.result(), strict=True):
        if future.done():  # its waiter was cancelled
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _fail(jobs: list[tuple[_Work, asyncio.Future[Any]]], error: BaseException) -> None:
    for _, future in jobs:
        if not future.done():
            future.set_exception(error)
