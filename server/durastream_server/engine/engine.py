"""The protocol engine. CONTRACT STUB: the engine module owner implements it.

One ``Engine`` per server, on one asyncio loop. It owns the path -> current incarnation map, derived fork
reference counts (never stored, so they cannot drift: hazard 31), TTL and expiry, producer validation
(section 5.2.1), ``Stream-Seq``, closure, JSON mode (section 9.1) and waiters.

Validation of a request and ``StreamLog.stage()`` of its entry happen with no ``await`` in between, which
serializes append, close and delete per stream (hazard 17).
"""

from __future__ import annotations

from collections.abc import Callable

from durastream_server.engine.api import (
    AppendRequest,
    AppendResult,
    CreateRequest,
    CreateResult,
    ReadRequest,
    ReadResult,
    StreamInfo,
    StreamListing,
)
from durastream_server.storage import DataDir


class StreamObserver:
    """Hooks for the subscription layer. Called on the loop, after the change is durable."""

    def on_created(self, path: str, next_offset: str) -> None: ...

    def on_appended(self, path: str, next_offset: str) -> None: ...

    def on_deleted(self, path: str) -> None: ...


class Engine:
    def __init__(self, data: DataDir, *, clock: Callable[[], float] | None = None) -> None:
        raise NotImplementedError

    async def create(self, request: CreateRequest) -> CreateResult: ...

    async def append(self, request: AppendRequest) -> AppendResult: ...

    def head(self, path: str) -> StreamInfo: ...

    async def read(self, request: ReadRequest) -> ReadResult: ...

    async def wait(self, path: str, offset: str, timeout: float) -> bool:
        """Wait until data past ``offset`` is durable or the stream is closed; False on timeout.

        Raises NotFound/Gone if the stream is deleted while waiting (hazard 33). Counts as access for a
        sliding TTL for its whole duration (hazard 26).
        """
        ...

    async def delete(self, path: str) -> None: ...

    def list_streams(self, prefix: str = "") -> list[StreamListing]: ...

    def add_observer(self, observer: StreamObserver) -> None: ...

    async def close(self) -> None:
        """Release waiters (they answer as at a timeout) and flush storage."""
        ...
