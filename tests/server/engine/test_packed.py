"""The engine over packed streams (fsync durability; decision 0010, ``storage/packs.py``): it never knows
a log is packed, and every operation answers as for a stream with a directory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.errors import NotFound
from durastream_server.storage import Durability
from tests.server.engine.support import (
    FakeClock,
    append,
    close_engine,
    create,
    open_engine,
    read,
    read_all,
)


def _run(tmp_path: Path, scenario, clock=None) -> None:  # noqa: ANN001
    async def main() -> None:
        data, engine = await open_engine(tmp_path, clock, durability=Durability.FSYNC)
        try:
            await scenario(engine)
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def _directories(tmp_path: Path) -> int:
    return len(os.listdir(tmp_path / "streams"))


def test_head_read_list_fork_and_delete_of_a_packed_stream(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "p")
        assert _directories(tmp_path) == 0
        info = engine.head("p")
        assert info.next_offset == (await read(engine, "p")).next_offset
        assert await read_all(engine, "p") == b""
        assert (await read(engine, "p", "now")).up_to_date
        assert [s.path for s in engine.list_streams()] == ["p"]
        # A fork of a packed source needs no file of it: the source stays packed.
        await create(engine, "f", forked_from="p", content_type=None)
        assert _directories(tmp_path) == 1
        await append(engine, "f", b"fork data")
        assert await read_all(engine, "f") == b"fork data"
        await engine.delete("f")
        await engine.delete("p")
        with pytest.raises(NotFound):
            engine.head("p")
        assert engine.list_streams() == []

    _run(tmp_path, scenario)


def test_a_packed_stream_expires_like_any_other(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "t", ttl_seconds=2)
        await create(engine, "kept", ttl_seconds=2)
        clock.advance(1.5)
        await append(engine, "kept", b"alive")  # promotes it and refreshes its TTL
        clock.advance(0.6)
        with pytest.raises(NotFound):
            engine.head("t")
        assert await engine.sweep_expired() == 1
        assert await read_all(engine, "kept") == b"alive"

    _run(tmp_path, scenario, clock)
