"""Recovery after start (engine/recovery.py): a path's streams recover when a request names them, the
rest in the background; forks recover with their sources; the catalog is only a hint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.errors import Gone, NotFound
from durastream_server.storage import DataDir, catalog
from tests.server.engine.support import (
    append,
    close_engine,
    config,
    create,
    open_engine,
    read_all,
)


async def _populate(root: Path) -> None:
    data, engine = await open_engine(root)
    for name in ("a", "b", "c"):
        await create(engine, name, name.encode())
        await append(engine, name, b"+" + name.encode(), producer=(f"p{name}", 0, 0))
    await create(engine, "fork", forked_from="b", content_type=None)
    await append(engine, "fork", b"!")
    await close_engine(data, engine)


async def _open_lazy(root: Path) -> tuple[DataDir, Engine]:
    """A data directory opened as the server opens it, and an engine whose background recovery is
    not started (``start()`` starts it): only ``prepare`` recovers."""
    data = await DataDir.open(config(root), lazy=True)
    return data, Engine(data, sweep_interval=0)


def test_a_request_recovers_its_own_stream_first(tmp_path: Path) -> None:
    async def main() -> None:
        await _populate(tmp_path)
        data, engine = await _open_lazy(tmp_path)
        try:
            assert engine.recovering and engine.streams_pending == 4
            await engine.prepare("a")
            assert engine.streams_pending == 3  # that stream only
            assert await read_all(engine, "a") == b"a+a"
            assert (await append(engine, "a", b"+a", producer=("pa", 0, 0))).duplicate
            with pytest.raises(NotFound):  # not recovered: what the HTTP layer never asks
                engine.head("c")
            await engine.prepare("fork")  # a fork recovers with its source
            assert engine.streams_pending == 1
            assert await read_all(engine, "fork") == b"b+b!"
            await engine.prepare("never-created")
            assert engine.streams_pending == 1
            await engine.start()  # the background recovery takes the rest
            await asyncio.wait_for(engine.recovered(), 30)
            assert not engine.recovering and engine.streams_pending == 0
            assert await read_all(engine, "c") == b"c+c"
            assert [s.path for s in engine.list_streams()] == ["a", "b", "c", "fork"]
            assert (await engine.census()).streams == 4
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def test_deleting_a_source_before_the_background_reached_its_fork_keeps_the_fork(
    tmp_path: Path,
) -> None:
    """The fork graph is derived from every incarnation's header: a source recovered without its
    forks would count none and be deleted for good, under a fork that still reads it."""

    async def main() -> None:
        await _populate(tmp_path)
        data, engine = await _open_lazy(tmp_path)
        try:
            await engine.prepare("b")
            await engine.delete("b")
            with pytest.raises(Gone):  # soft-deleted: the fork reads it
                engine.head("b")
            assert await read_all(engine, "fork") == b"b+b!"
        finally:
            await close_engine(data, engine)
        data, engine = await open_engine(tmp_path)
        try:
            assert await read_all(engine, "fork") == b"b+b!"
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def test_concurrent_requests_and_the_background_recover_a_stream_once(tmp_path: Path) -> None:
    async def main() -> None:
        await _populate(tmp_path)
        data, engine = await _open_lazy(tmp_path)
        try:
            await engine.start()
            await asyncio.gather(*(engine.prepare(name) for name in ("a", "b", "a", "fork", "c")))
            await asyncio.wait_for(engine.recovered(), 30)
            assert sorted(data.logs) == sorted(inc.id for inc in engine._registry.by_id.values())
            assert len(data.logs) == 4
            assert await read_all(engine, "a") == b"a+a"
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


@pytest.mark.parametrize("damage", ["missing", "damaged", "wrong"])
def test_the_catalog_is_only_a_hint(tmp_path: Path, damage: str) -> None:
    """Without the catalog, or with a damaged line, headers are read; a catalog that names another
    path than the header makes every request wait for the whole recovery, never a wrong answer."""

    async def main() -> None:
        await _populate(tmp_path)
        path = tmp_path / catalog.CATALOG_NAME
        entries = catalog.load(tmp_path).entries
        a_id = next(i for i, entry in entries.items() if entry.path == "a")
        if damage == "missing":
            path.unlink()
        elif damage == "damaged":
            path.write_bytes(path.read_bytes().replace(b'"a"', b'"z"'))  # checksum fails
        else:
            entries[a_id] = catalog.Entry("c", None)  # "a"'s directory claimed for "c"
            path.write_bytes(b"".join(catalog.encode(i, e) for i, e in entries.items()))
        data, engine = await _open_lazy(tmp_path)
        try:
            await engine.start()
            await asyncio.wait_for(engine.prepare("c"), 30)
            assert await read_all(engine, "c") == b"c+c"
            await asyncio.wait_for(engine.prepare("a"), 30)
            assert await read_all(engine, "a") == b"a+a"
            await asyncio.wait_for(engine.recovered(), 30)
        finally:
            await close_engine(data, engine)
        assert catalog.load(tmp_path).entries[a_id] == catalog.Entry(
            "a", None
        )  # rewritten from headers

    asyncio.run(main())


def test_a_failed_recovery_is_never_answered_as_a_missing_stream(tmp_path: Path) -> None:
    async def main() -> None:
        await _populate(tmp_path)
        data, engine = await _open_lazy(tmp_path)
        real = data.recover

        async def broken(ids: list[str]) -> list:
            raise OSError("the I/O pool is gone")  # fault injection: what a shutdown does

        try:
            data.recover = broken  # type: ignore[method-assign]
            with pytest.raises(OSError):
                await engine.prepare("a")
            data.recover = real  # type: ignore[method-assign]
            await engine.start()
            await asyncio.wait_for(engine.recovered(), 30)
            assert await read_all(engine, "c") == b"c+c"
            assert engine.recovering and engine.streams_pending == 1  # "a" stays pending
            with pytest.raises(OSError):  # the failure again, not "does not exist"
                await engine.prepare("a")
        finally:
            await close_engine(data, engine)

    asyncio.run(main())
