"""A plain create with a WAL (a new path, no data, not a fork: a packed create) runs as one callback of
its commit round instead of a task (``Engine._create_packed``, issue 17): the same answers, the same
serialization with other creates of its path (hazard 37), the same registration and observers, and a
failed round leaves nothing and releases the path."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from durastream_server.engine.api import CreateRequest
from durastream_server.engine.engine import Engine
from durastream_server.errors import ConfigMismatch, InsufficientStorage
from durastream_server.storage import DataDir, Durability
from tests.server.engine.support import ZERO, Recorder, append, close_engine, open_engine, read


def _run(root: Path, scenario) -> None:  # noqa: ANN001 - a coroutine function of (data, engine)
    async def main() -> None:
        data, engine = await open_engine(root, durability=Durability.FSYNC)
        try:
            await scenario(data, engine)
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def _plain(path: str, content_type: str = "application/json") -> CreateRequest:
    return CreateRequest(path=path, content_type=content_type)


def test_a_plain_create_runs_without_a_task_and_its_path_waits_for_it(tmp_path: Path) -> None:
    """The first create of a path takes no task; creates of the same path meanwhile take the
    ordinary path and wait for it: the same configuration finds the stream (200), another one is
    refused (409). One ``on_created``; nothing of the path's lock is left."""

    async def scenario(data: DataDir, engine: Engine) -> None:
        recorder = Recorder()
        engine.add_observer(recorder)
        first = engine.create_nowait(_plain("p"))
        assert not engine._creating  # no task
        assert not first.done()  # it waits for its commit round
        same = engine.create_nowait(_plain("p"))
        other = engine.create_nowait(_plain("p", "text/plain"))
        assert same in engine._creating and other in engine._creating  # tasks, waiting for "p"
        made = await first
        assert made.created and made.info.next_offset == ZERO
        assert made.info.content_type == "application/json"
        found = await same
        assert not found.created and found.info.storage_id == made.info.storage_id
        with pytest.raises(ConfigMismatch):
            await other
        assert recorder.events == [("created", "p", ZERO)]
        assert engine._create_locks._claims == {} and engine._create_locks._locks == {}
        assert data.logs[made.info.storage_id].packed
        await append(engine, "p", b"[1]", content_type="application/json")
        assert (await read(engine, "p")).messages == (b"1",)

    _run(tmp_path, scenario)


def test_many_plain_creates_at_once_share_rounds_and_come_back_after_a_restart(
    tmp_path: Path,
) -> None:
    """64 plain creates in flight: all created, in fewer rounds than creates, and all there after a
    restart (their create entries are durable before they are acknowledged)."""

    async def scenario(data: DataDir, engine: Engine) -> None:
        rounds = data._committer.rounds
        results = await asyncio.gather(*(engine.create_nowait(_plain(f"s{i}")) for i in range(64)))
        assert all(result.created for result in results)
        assert data._committer.rounds - rounds < 64
        assert not engine._creating and engine._create_locks._claims == {}

    _run(tmp_path, scenario)

    async def again(data: DataDir, engine: Engine) -> None:
        for i in range(64):
            assert not (await engine.create_nowait(_plain(f"s{i}"))).created

    _run(tmp_path, again)


def test_a_plain_create_whose_round_fails_leaves_nothing_and_frees_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's WAL write fails (out of space; injected, as a full disk cannot be made here): the
    create answers 507, no stream is registered, and the path can be created at once afterwards."""

    async def scenario(data: DataDir, engine: Engine) -> None:
        committer = data._committer

        def full(creation):  # noqa: ANN001, ANN202
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(OSError(errno.ENOSPC, "No space left on device"))
            return failed

        monkeypatch.setattr(committer, "create_soon", full)
        with pytest.raises(InsufficientStorage, match="no space to create 'f'"):
            await engine.create_nowait(_plain("f"))
        monkeypatch.undo()
        assert engine._create_locks._claims == {}
        assert "f" not in engine._registry.by_path
        assert (await engine.create_nowait(_plain("f"))).created

    _run(tmp_path, scenario)


def test_creates_the_plain_path_does_not_take_keep_their_task(tmp_path: Path) -> None:
    """With data, closed, or of a path that exists: the ordinary create, in a task."""

    async def scenario(data: DataDir, engine: Engine) -> None:
        await engine.create_nowait(_plain("exists"))
        for request in (
            CreateRequest(path="body", content_type="text/plain", body=b"x"),
            CreateRequest(path="closed", content_type="text/plain", closed=True),
            _plain("exists"),
        ):
            future = engine.create_nowait(request)
            assert future in engine._creating, request
            await future

    _run(tmp_path, scenario)
