"""Test support: an engine on a real data directory (with optional staged-append limits and a fake
clock), run inside ``asyncio.run``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from durastream_server.engine.api import (
    AppendRequest,
    AppendResult,
    CreateRequest,
    CreateResult,
    ReadRequest,
    ReadResult,
)
from durastream_server.engine.engine import Engine, StreamObserver
from durastream_server.engine.producer_sweep import ProducerPolicy
from durastream_server.engine.txnapi import TxnLimits
from durastream_server.offsets import format_offset
from durastream_server.storage import DataDir, Durability, StorageConfig
from durastream_server.storage.records import ProducerTuple

ZERO = format_offset(0)


class FakeClock:
    """A time.time stand-in the test advances by hand."""

    def __init__(self, start: float = 1_900_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recorder(StreamObserver):
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def on_created(self, path: str, next_offset: str) -> None:
        self.events.append(("created", path, next_offset))

    def on_appended(self, path: str, next_offset: str) -> None:
        self.events.append(("appended", path, next_offset))

    def on_deleted(self, path: str) -> None:
        self.events.append(("deleted", path))


def config(root: Path, durability: Durability = Durability.NONE) -> StorageConfig:
    return StorageConfig(root=root, durability=durability)


async def open_engine(
    root: Path,
    clock: Callable[[], float] | None = None,
    limits: TxnLimits | None = None,
    durability: Durability = Durability.NONE,
    policy: ProducerPolicy | None = None,
) -> tuple[DataDir, Engine]:
    data = await DataDir.open(config(root, durability))
    engine = Engine(data, clock=clock, sweep_interval=0, txn_limits=limits, producer_policy=policy)
    await engine.start()
    return data, engine


async def close_engine(data: DataDir, engine: Engine) -> None:
    await engine.close()
    await data.close()


def run(
    root: Path,
    scenario: Callable[[Engine], Awaitable[None]],
    *,
    clock: Callable[[], float] | None = None,
    limits: TxnLimits | None = None,
    policy: ProducerPolicy | None = None,
) -> None:
    async def main() -> None:
        data, engine = await open_engine(root, clock, limits, policy=policy)
        try:
            await scenario(engine)
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


# Request shorthands ---------------------------------------------------------------------------


async def create(
    engine: Engine, path: str, body: bytes = b"", content_type: str | None = "text/plain", **kw
) -> CreateResult:
    return await engine.create(CreateRequest(path=path, content_type=content_type, body=body, **kw))


async def append(
    engine: Engine,
    path: str,
    body: bytes,
    content_type: str | None = "text/plain",
    *,
    producer: tuple[str, int, int] | None = None,
    **kw,
) -> AppendResult:
    return await engine.append(
        AppendRequest(
            path=path,
            content_type=content_type,
            body=body,
            producer=ProducerTuple(*producer) if producer else None,
            **kw,
        )
    )


async def read(
    engine: Engine, path: str, offset: str = "-1", max_bytes: int = 1 << 20, **kw
) -> ReadResult:
    return await engine.read(ReadRequest(path=path, offset=offset, max_bytes=max_bytes, **kw))


async def read_all(
    engine: Engine, path: str, offset: str = "-1", max_bytes: int = 1 << 20
) -> bytes:
    """Follow next offsets until up to date; concatenate the payload."""
    out = b""
    for _ in range(10_000):
        result = await read(engine, path, offset, max_bytes)
        out += b"".join(result.messages)
        if result.up_to_date:
            return out
        offset = result.next_offset
    raise AssertionError("read did not converge")


async def text(engine: Engine, path: str) -> bytes:
    result = await read(engine, path)
    assert result.up_to_date
    return b"".join(result.messages)


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` on the loop until it holds (deadline, no fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)
