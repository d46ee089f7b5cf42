"""Parking live readers (long-poll and SSE) in ``engine.wait``, without a thread or task pool per reader.

A parked reader must be released by whichever comes first: new data or closure (the engine's wait returns
True), its timeout (False), the client hanging up, or server shutdown. The last two are why the engine's wait
is raced against two futures here: uvicorn waits for running requests before the ASGI lifespan shutdown runs,
so waiting readers must be let go *before* that, or a SIGTERM would stall for a whole long-poll timeout.
Released-by-shutdown readers answer as at a timeout (hazard 33's "defined code" for shutdown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Protocol

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class Waitable(Protocol):
    async def wait(
        self,
        path: str,
        offset: str,
        timeout: float,
        release: Iterable[asyncio.Future[Any]] = (),
    ) -> bool: ...


class Disconnect:
    """Watches ``receive`` for ``http.disconnect`` once the request body has been consumed."""

    def __init__(self, receive: Receive) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.future.done():
                    self.future.set_result(None)
                return

    @property
    def happened(self) -> bool:
        return self.future.done()

    async def close(self) -> None:
        """Stop watching. Not awaited to completion: the watcher only ever waits in ``receive``, and
        a long-poll's answer should not wait a loop iteration for it (docs/decisions/0004)."""
        if not self._task.done():
            self._task.cancel()


class LiveReaders:
    """The server's parked readers: counts them (``/healthz`` reports it) and releases them on drain."""

    def __init__(self, engine: Waitable) -> None:
        self._engine = engine
        self._drain: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parked = 0

    @property
    def draining(self) -> bool:
        return self._drain.done()

    def drain(self) -> None:
        """Release every parked reader now, and every later one immediately."""
        if not self._drain.done():
            self._drain.set_result(None)

    async def wait(
        self, path: str, offset: str, timeout: float, disconnect: Disconnect
    ) -> bool | None:
        """True: data past ``offset`` (or closure). False: timeout. None: client gone or server draining.

        Errors of the engine's wait (the stream was deleted while waiting: NotFound/Gone) propagate.
        """
        if self.draining or disconnect.happened:
            return None
        # The engine's wait itself returns early when the drain or hang-up future completes, so a
        # parked reader costs one future, not a task plus an ``asyncio.wait`` (docs/decisions/0004).
        self.parked += 1
        try:
            woke = await self._engine.wait(
                path, offset, timeout, release=(self._drain, disconnect.future)
            )
        finally:
            self.parked -= 1
        if not woke and (self.draining or disconnect.happened):
            return None
        return woke
