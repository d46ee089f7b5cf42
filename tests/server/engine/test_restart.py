"""The engine rebuilt from disk: registry, fork graph, soft deletes and interrupted cascades."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.errors import Conflict, CorruptStream, Gone, NotFound, StreamClosed
from durastream_server.offsets import format_offset
from durastream_server.storage import DataDir
from tests.server.engine.support import (
    ZERO,
    append,
    close_engine,
    config,
    create,
    open_engine,
    read,
    text,
)


def test_state_survives_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        data, engine = await open_engine(tmp_path)
        await create(engine, "closed", b"final", closed=True)
        await create(engine, "src", b"abcdef")
        await create(
            engine,
            "fork",
            forked_from="src",
            content_type=None,
            fork_offset=ZERO,
            fork_sub_offset=4,
        )
        await append(engine, "fork", b"!", producer=("p", 0, 0))
        await engine.delete("src")  # soft: the fork reads it
        await close_engine(data, engine)

        data, engine = await open_engine(tmp_path)
        try:
            assert engine.head("closed").closed
            with pytest.raises(StreamClosed):
                await append(engine, "closed", b"x")
            with pytest.raises(Gone):
                engine.head("src")
            with pytest.raises(Conflict):
                await create(engine, "src")
            assert await text(engine, "fork") == b"abcd!"
            assert (await append(engine, "fork", b"!", producer=("p", 0, 0))).duplicate
            assert not (
                await create(
                    engine,
                    "fork",
                    forked_from="src",
                    content_type=None,
                    fork_offset=ZERO,
                    fork_sub_offset=4,
                )
            ).created
            await engine.delete("fork")
            with pytest.raises(NotFound):
                engine.head("src")
            assert set(data.logs) == {engine.head("closed").storage_id}
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def test_interrupted_cascade_is_finished_at_start(tmp_path: Path) -> None:
    async def main() -> None:
        data, engine = await open_engine(tmp_path)
        await create(engine, "src", b"data")
        await create(engine, "fork", forked_from="src", content_type=None)
        await engine.delete("src")
        # Simulate a crash right after the fork's directory was removed, before the cascade:
        # delete the fork behind the engine's back.
        fork_log = next(log for log in data.logs.values() if log.header.path == "fork")
        await data.delete_stream(fork_log)
        await engine.close()
        await data.close()

        data, engine = await open_engine(tmp_path)  # start() collects the orphan
        try:
            assert data.logs == {}
            with pytest.raises(NotFound):
                engine.head("src")
            assert (await create(engine, "src")).created
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def test_missing_fork_source_reads_as_corrupt(tmp_path: Path) -> None:
    async def main() -> None:
        data, engine = await open_engine(tmp_path)
        await create(engine, "src", b"data")
        await create(engine, "fork", forked_from="src", content_type=None)
        await append(engine, "fork", b"+own")
        source_log = next(log for log in data.logs.values() if log.header.path == "src")
        await data.delete_stream(source_log)  # storage lost the source behind our back
        await engine.close()
        await data.close()

        data, engine = await open_engine(tmp_path)
        try:
            with pytest.raises(CorruptStream):  # never silently served without its prefix
                await read(engine, "fork")
            own = await read(engine, "fork", format_offset(4))
            assert own.messages == (b"+own",)
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def test_quarantined_path_is_reported_as_corrupt(tmp_path: Path) -> None:
    async def main() -> None:
        data = await DataDir.open(config(tmp_path))
        data.corrupt["bad"] = "checksum failure at byte 123"
        engine = Engine(data, sweep_interval=0)
        await engine.start()
        try:
            with pytest.raises(CorruptStream):
                engine.head("bad")
            with pytest.raises(CorruptStream):
                await create(engine, "bad")
        finally:
            await close_engine(data, engine)

    asyncio.run(main())
