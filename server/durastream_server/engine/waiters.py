"""Waiting for a stream to change: long-poll and SSE park here.

A ``WaitSet`` belongs to one stream incarnation. It is woken only by that incarnation's durable commits
(the engine registers ``notify`` as a ``StreamLog`` listener), so a fork's waiters never wake for its
source's appends, and nobody wakes for data that is not yet on disk.

Three ways out besides a wake-up: the timeout (``False``), the stream's deletion (the waiter gets the
NotFound/Gone error, never a fake "200 up to date", hazard 33) and engine shutdown (answers like a
timeout, so clients simply reconnect).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import Any

from durastream_server.errors import ProtocolError
from durastream_server.timers import time_left


class _Shutdown(Exception):
    """Internal: the engine is closing; the waiter answers as at a timeout."""


class WaitSet:
    __slots__ = ("_futures", "_failure", "_closed")

    def __init__(self) -> None:
        # None while nobody waits: every stream has a WaitSet, and an empty set is 216 bytes of each
        # idle stream's memory (issue 17).
        self._futures: set[asyncio.Future[None]] | None = None
        self._failure: Callable[[], ProtocolError] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._futures) if self._futures is not None else 0

    def notify(self) -> None:
        """Wake every waiter; each re-checks its condition."""
        futures, self._futures = self._futures, None
        for future in futures or ():
            if not future.done():
                future.set_result(None)

    def fail(self, make_error: Callable[[], ProtocolError]) -> None:
        """The stream is gone: current and future waiters raise a fresh ``make_error()``."""
        self._failure = make_error
        futures, self._futures = self._futures, None
        for future in futures or ():
            if not future.done():
                future.set_exception(make_error())

    def shutdown(self) -> None:
        self._closed = True
        futures, self._futures = self._futures, None
        for future in futures or ():
            if not future.done():
                future.set_exception(_Shutdown())

    async def wait_until(
        self,
        ready: Callable[[], bool],
        timeout: float,
        release: Iterable[asyncio.Future[Any]] = (),
    ) -> bool:
        """Return True once ``ready()`` holds; False after ``timeout`` seconds, on shutdown, or as soon as
        any future in ``release`` completes (the HTTP layer's client hang-up and server drain).

        One plain future per wait, resolved by ``notify``, a timer, or ``release``: no task and no
        ``asyncio.wait_for`` per parked reader, which matters when a commit wakes a hundred of them at
        once (docs/decisions/0004-performance.md).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        release = tuple(release)
        while True:
            if self._failure is not None:
                raise self._failure()
            if ready():
                return True
            remaining = time_left(deadline, loop.time())  # < 1 ms left is expired: no re-arm spin
            if not remaining or self._closed or any(f.done() for f in release):
                return False
            future: asyncio.Future[None] = loop.create_future()
            if self._futures is None:
                self._futures = set()
            self._futures.add(future)
            try:
                await wait_for_any(future, remaining, release)
            except _Shutdown:
                return False
            finally:
                if self._futures is not None:
                    self._futures.discard(future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake_on(future: asyncio.Future[None], _source: asyncio.Future[Any]) -> None:
    _wake(future)


async def wait_for_any(
    future: asyncio.Future[None], timeout: float, release: Iterable[asyncio.Future[Any]] = ()
) -> None:
    """Await ``future`` until it completes, ``timeout`` seconds pass (it is then resolved) or any of
    ``release`` completes. One timer and callbacks, no task: parked waits stay cheap."""
    loop = asyncio.get_running_loop()
    timer = loop.call_later(max(timeout, 0.0), _wake, future)
    wake = functools.partial(_wake_on, future)
    for other in release:
        other.add_done_callback(wake)
    try:
        await future
    finally:
        timer.cancel()
        for other in release:
            other.remove_done_callback(wake)
