"""TTL and Expires-At (sections 4, 5.1, 4.2), with a fake clock and explicit sweeps."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.errors import Gone, NotFound
from tests.server.engine.support import (
    FakeClock,
    Recorder,
    append,
    close_engine,
    create,
    open_engine,
    read,
    run,
    text,
    until,
)


def at(clock: FakeClock, seconds: float) -> datetime:
    return datetime.fromtimestamp(clock.now + seconds, timezone.utc)


def test_sliding_ttl_expires_idle_streams_for_every_operation(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "t", b"data", ttl_seconds=2)
        clock.advance(1.9)
        assert engine.head("t").ttl_seconds == 2
        clock.advance(0.1)
        # Expired: every operation answers 404 even before the sweeper ran.
        with pytest.raises(NotFound):
            engine.head("t")
        with pytest.raises(NotFound):
            await read(engine, "t")
        with pytest.raises(NotFound):
            await append(engine, "t", b"x")
        with pytest.raises(NotFound):
            await engine.delete("t")
        assert engine.list_streams() == []
        assert await engine.sweep_expired() == 1
        with pytest.raises(NotFound):
            engine.head("t")

    run(tmp_path, scenario, clock=clock)


def test_reads_and_writes_refresh_ttl_but_head_does_not(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "w", ttl_seconds=2)
        await create(engine, "r", b"x", ttl_seconds=2)
        await create(engine, "n", ttl_seconds=2)
        await create(engine, "c", ttl_seconds=2)
        await create(engine, "h", ttl_seconds=2)
        clock.advance(1.5)
        await append(engine, "w", b"keep alive")
        await read(engine, "r")
        await read(engine, "n", "now")
        await append(engine, "c", b"", close=True)
        engine.head("h")
        clock.advance(1.5)
        assert await engine.sweep_expired() == 1
        for path in ("w", "r", "n", "c"):
            engine.head(path)
        with pytest.raises(NotFound):
            engine.head("h")

    run(tmp_path, scenario, clock=clock)


def test_expires_at_is_absolute(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "a", b"data", expires_at=at(clock, 4))
        clock.advance(2)
        await read(engine, "a")
        await append(engine, "a", b"more")
        clock.advance(2)
        with pytest.raises(NotFound):
            await read(engine, "a")
        assert await engine.sweep_expired() == 1

    run(tmp_path, scenario, clock=clock)


def test_hazard_26_waiting_reader_counts_as_access(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "lp", ttl_seconds=2)).info.next_offset
        waiter = asyncio.create_task(engine.wait("lp", tail, 30.0))
        await until(lambda: engine.waiting("lp") == 1)
        clock.advance(10)  # far past the TTL while the long-poll is parked
        assert await engine.sweep_expired() == 0
        engine.head("lp")
        await append(engine, "lp", b"x")
        assert await waiter
        # The wait's end is an access too: the window restarts from it.
        clock.advance(1.5)
        assert await engine.sweep_expired() == 0
        clock.advance(0.5)
        assert await engine.sweep_expired() == 1

    run(tmp_path, scenario, clock=clock)


def test_expiry_releases_waiters_with_not_found(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "x", expires_at=at(clock, 5))).info.next_offset
        waiter = asyncio.create_task(engine.wait("x", tail, 30.0))
        await until(lambda: engine.waiting("x") == 1)
        clock.advance(5)  # Expires-At is absolute: waiting does not extend it
        assert await engine.sweep_expired() == 1
        with pytest.raises(NotFound):
            await waiter

    run(tmp_path, scenario, clock=clock)


def test_expired_source_with_forks_is_soft_deleted(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        recorder = Recorder()
        engine.add_observer(recorder)
        await create(engine, "src", b"source data", ttl_seconds=2)
        await create(engine, "fork", forked_from="src", content_type=None, ttl_seconds=2)
        clock.advance(1.5)
        await read(engine, "fork")  # refreshes the fork only
        clock.advance(0.5)
        with pytest.raises(Gone):  # expired with a live fork: answers as soft-deleted
            engine.head("src")
        assert await engine.sweep_expired() == 1
        with pytest.raises(Gone):
            engine.head("src")
        assert await text(engine, "fork") == b"source data"
        assert ("deleted", "src") in recorder.events
        # The fork expires too; the cascade collects the source.
        clock.advance(2)
        assert await engine.sweep_expired() == 1
        for path in ("src", "fork"):
            with pytest.raises(NotFound):
                engine.head(path)

    run(tmp_path, scenario, clock=clock)


def test_fork_inherits_ttl_and_expires_with_it(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"d", ttl_seconds=1)
        forked = await create(engine, "f", forked_from="src", content_type=None)
        assert forked.info.ttl_seconds == 1
        clock.advance(1)
        await engine.sweep_expired()
        for path in ("src", "f"):
            with pytest.raises(NotFound):
                engine.head(path)

    run(tmp_path, scenario, clock=clock)


def test_create_over_an_expired_stream_makes_a_new_one(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        old = await create(engine, "r", b"original", ttl_seconds=1)
        clock.advance(1)
        new = await create(engine, "r", b'["new data"]', content_type="application/json")
        assert new.created and new.info.storage_id != old.info.storage_id
        assert (await read(engine, "r")).messages == (b'"new data"',)

    run(tmp_path, scenario, clock=clock)


def test_background_sweeper_deletes_expired_streams(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        data, engine = await open_engine(tmp_path, clock)
        await engine.close()  # replace the sweeper-less engine with one that sweeps often
        engine = Engine(data, clock=clock, sweep_interval=0.001)
        await engine.start()
        try:
            await create(engine, "t", ttl_seconds=1)
            clock.advance(1)
            await until(lambda: not data.logs)  # the directory is gone, without any request
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def test_the_sweep_looks_only_at_streams_that_can_expire(tmp_path: Path) -> None:
    """The sweep runs four times a second: it must not scan every stream (100,000 took 48 ms)."""
    clock = FakeClock()

    def expiring(engine: Engine) -> set[str]:
        return {inc.path for inc in engine._registry.expiring}

    async def scenario(engine: Engine) -> None:
        for n in range(50):
            await create(engine, f"plain/{n}")
        await create(engine, "ttl", ttl_seconds=2)
        await create(engine, "at", expires_at=at(clock, 5))
        await create(engine, "fork", forked_from="at", content_type=None)  # inherits Expires-At
        assert expiring(engine) == {"ttl", "at", "fork"}
        await engine.delete("ttl")
        assert expiring(engine) == {"at", "fork"}
        clock.advance(6)
        assert await engine.sweep_expired() == 2
        assert expiring(engine) == set() and len(engine.list_streams()) == 50

    run(tmp_path, scenario, clock=clock)

    async def restarted(engine: Engine) -> None:
        assert expiring(engine) == set()
        await create(engine, "ttl", ttl_seconds=60)
        assert expiring(engine) == {"ttl"}

    run(tmp_path, restarted, clock=clock)
