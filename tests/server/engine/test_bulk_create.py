"""Bulk creates (``Engine.create_batch_nowait``, a bulk ``ensure``'s new streams): one task and one
commit-round wait for the batch, with the same outcome per stream as ``create`` (issue 16)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from durastream_server.engine.api import AppendRequest, AppendResult, CreateResult
from durastream_server.engine.engine import Engine
from durastream_server.errors import (
    ConfigMismatch,
    NotFound,
    ProtocolError,
    StorageFailure,
    StreamClosed,
)
from durastream_server.storage import catalog
from durastream_server.storage.datadir import Durability, _create_failed, _NewStream
from durastream_server.storage.records import ProducerTuple, StreamHeader
from tests.server.engine.support import (
    ZERO,
    FakeClock,
    Recorder,
    append,
    close_engine,
    create,
    open_engine,
    text,
    until,
)

DURABILITIES = [Durability.NONE, Durability.FSYNC]


def _run(root: Path, durability: Durability, scenario, clock=None) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        data, engine = await open_engine(root, clock, durability=durability)
        try:
            await scenario(engine)
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_batch_creates_new_streams_finds_existing_ones_and_survives_a_restart(
    tmp_path: Path, durability: Durability
) -> None:
    paths = [f"b/{i}" for i in range(300)]

    async def scenario(engine: Engine) -> None:
        recorder = Recorder()
        engine.add_observer(recorder)
        await create(engine, "b/7", b'"there"', content_type="application/json")
        # b/3 listed twice: the second waits for the batch and finds the stream.
        listed = [*paths, "b/3"]
        future = engine.create_batch_nowait(listed, "application/json")
        assert future in engine._creating
        results = await future
        assert all(isinstance(r, CreateResult) for r in results)
        created = [r.created for r in results]  # type: ignore[union-attr]
        assert created == [p != "b/7" for p in paths] + [False]
        assert results[3].info.storage_id == results[-1].info.storage_id  # type: ignore[union-attr]
        assert not engine._creating and not engine._bulk_creating
        assert sorted(e[1] for e in recorder.events if e[0] == "created") == sorted(
            ["b/7", *(p for p in paths if p != "b/7")]
        )
        assert results[0].info.next_offset == ZERO  # type: ignore[union-attr]
        assert results[0].info.content_type == "application/json"  # type: ignore[union-attr]
        await append(engine, "b/0", b'{"a":1}', content_type="application/json")

    _run(tmp_path, durability, scenario)

    async def after(engine: Engine) -> None:
        assert await text(engine, "b/0") == b'{"a":1}'
        for path in paths:
            assert engine.head(path).content_type == "application/json"

    _run(tmp_path, durability, after)


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_put_racing_a_batch_for_the_same_path_makes_one_stream(
    tmp_path: Path, durability: Durability
) -> None:
    """Hazard 37 across the two create paths: PUTs started before and after a batch naming the same
    paths, all concurrent: exactly one incarnation per path, every answer names it."""
    paths = [f"r/{i}" for i in range(50)]

    async def scenario(engine: Engine) -> None:
        before = [asyncio.ensure_future(create(engine, p)) for p in paths[:10]]
        await asyncio.sleep(0)  # those hold their paths' locks now
        batch = engine.create_batch_nowait(paths, "text/plain")
        after = [asyncio.ensure_future(create(engine, p)) for p in paths]
        results = await batch
        singles = await asyncio.gather(*before, *after)
        by_path: dict[str, set[str]] = {p: set() for p in paths}
        made: dict[str, int] = dict.fromkeys(paths, 0)
        answered = [*zip(paths[:10], singles[:10], strict=True)]
        answered += zip(paths, singles[10:], strict=True)
        for path, result in answered:
            by_path[path].add(result.info.storage_id)
            made[path] += result.created
        for path, result in zip(paths, results, strict=True):
            assert isinstance(result, CreateResult)
            by_path[path].add(result.info.storage_id)
            made[path] += result.created
        assert all(len(ids) == 1 for ids in by_path.values()), by_path
        assert all(count == 1 for count in made.values()), made

    _run(tmp_path, durability, scenario)


def test_an_expired_stream_in_a_batch_is_replaced_by_a_new_one(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        old = await create(engine, "x/old", b"gone", ttl_seconds=1)
        clock.advance(5)
        results = await engine.create_batch_nowait(["x/old", "x/new"], "text/plain")
        assert [r.created for r in results] == [True, True]  # type: ignore[union-attr]
        assert results[0].info.storage_id != old.info.storage_id  # type: ignore[union-attr]
        assert await text(engine, "x/old") == b""

    _run(tmp_path, Durability.FSYNC, scenario, clock)


def test_a_caller_going_away_does_not_leave_a_stream_made_but_unregistered(tmp_path: Path) -> None:
    """The batch runs in its own task: cancelling the caller's wait (a client gone) leaves it to
    finish, so every stream it makes durable is registered."""
    paths = [f"c/{i}" for i in range(100)]

    async def scenario(engine: Engine) -> None:
        batch = engine.create_batch_nowait(paths, "text/plain")
        waiter = asyncio.ensure_future(asyncio.shield(batch))
        await asyncio.sleep(0)
        waiter.cancel()
        results = await batch
        assert all(r.created for r in results)  # type: ignore[union-attr]
        for path in paths:
            assert engine.head(path).next_offset == ZERO

    _run(tmp_path, Durability.FSYNC, scenario)


def test_a_create_that_fails_in_a_batch_answers_alone(tmp_path: Path) -> None:
    """``DataDir.create_streams``'s round outcomes are per stream: a create whose directory cannot
    be made (a file is in its place) fails with ``StorageFailure``; the others of the batch are
    made. (A directory create, ``packed=False``, stands in for a round's own failure per stream.)"""

    async def main() -> None:
        data, engine = await open_engine(tmp_path, durability=Durability.FSYNC)
        try:
            committer = data._committer
            headers = [
                StreamHeader(path=f"f/{i}", content_type="text/plain", created_at_ms=1)
                for i in range(3)
            ]
            creations = [
                _NewStream(data, f"id{i}", catalog.Entry(h.path, None), b"x", None, packed=False)
                for i, h in enumerate(headers)
            ]
            os.makedirs(data._streams, exist_ok=True)
            Path(creations[1].directory).write_bytes(b"in the way")
            outcomes = await committer.create_many(creations)
            assert outcomes[0] is None and outcomes[2] is None
            assert isinstance(outcomes[1], OSError)
            failure = _create_failed(headers[1].path, outcomes[1])
            assert isinstance(failure, StorageFailure) and "f/1" in str(failure)
            assert os.path.isdir(creations[0].directory) and os.path.isdir(creations[2].directory)
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_batch_of_appends_settles_each_entry_as_its_own_append(
    tmp_path: Path, durability: Durability
) -> None:
    """``append_batch`` (a bulk ``commits`` request's inline commits): per entry the answer a single
    append gets: appended in order (two entries of one stream), a duplicate (answered by its own
    task), a closed stream and a missing one refused alone; observers hear each append once."""
    paths = [f"a/{i}" for i in range(200)]

    async def scenario(engine: Engine) -> None:
        recorder = Recorder()
        engine.add_observer(recorder)
        await engine.create_batch_nowait([*paths, "a/closed"], "text/plain")
        await append(engine, "a/closed", b"", close=True)
        await append(engine, "a/0", b"seen", producer=("p", 0, 0))
        requests = [
            AppendRequest(path=p, content_type="text/plain", body=p.encode(), producer=_tuple(0))
            for p in paths[1:]
        ]
        requests += [
            AppendRequest(path="a/1", content_type="text/plain", body=b"+", producer=_tuple(1)),
            AppendRequest(path="a/0", content_type="text/plain", body=b"seen", producer=_tuple(0)),
            AppendRequest(path="a/closed", content_type="text/plain", body=b"late"),
            AppendRequest(path="a/none", content_type="text/plain", body=b"lost"),
        ]
        batch = engine.append_batch(requests)
        await batch.all_done
        *fresh, second, duplicate, closed, missing = batch.outcomes
        assert all(isinstance(r, AppendResult) and not r.duplicate for r in fresh)
        assert isinstance(second, AppendResult) and second.producer_seq == 1
        assert isinstance(duplicate, AppendResult) and duplicate.duplicate
        assert isinstance(closed, StreamClosed)
        assert isinstance(missing, NotFound)
        assert await text(engine, "a/1") == b"a/1+"
        assert await text(engine, "a/0") == b"seen"
        appended = [e[1] for e in recorder.events if e[0] == "appended"]
        assert sorted(appended) == sorted([*paths[1:], "a/1", "a/0"])  # a/0: its first append

    _run(tmp_path, durability, scenario)


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_run_of_keyed_parts_of_one_stream_is_still_judged_part_by_part(
    tmp_path: Path, durability: Durability
) -> None:
    """A multi-part entry's parts reach ``append_batch`` as a run of one stream (same path, type
    and commit key): the run shares the stream's lookup and the keyed digest, but each part keeps
    its own verdict: a replayed part is a duplicate, a part after it is appended, a part reusing its
    tuple under another key is refused, a missing stream's run fails alone, and the stream after
    it is appended."""

    def part(path: str, producer: str, body: bytes, key: str = "k1") -> AppendRequest:
        return AppendRequest(
            path=path,
            content_type="text/plain",
            body=body,
            producer=ProducerTuple(producer, 3, 0),
            key=key,
        )

    async def scenario(engine: Engine) -> None:
        await engine.create_batch_nowait(["r/a", "r/b"], "text/plain")
        first = engine.append_batch([part("r/a", "w-0", b"A0")])
        await first.all_done
        assert isinstance(first.outcomes[0], AppendResult)
        batch = engine.append_batch(
            [
                part("r/a", "w-0", b"A0"),  # the replay of the committed part
                part("r/a", "w-1", b"A1"),
                part("r/a", "w-2", b"A2", key="other"),  # the same run's type, another key
                part("r/none", "w-0", b"N0"),
                part("r/none", "w-1", b"N1"),
                part("r/b", "w-0", b"B0"),
                part("r/b", "w-1", b"B1"),
            ]
        )
        await batch.all_done
        replay, fresh, other_key, *missing, b0, b1 = batch.outcomes
        assert isinstance(replay, AppendResult) and replay.duplicate
        assert isinstance(fresh, AppendResult) and not fresh.duplicate
        assert isinstance(other_key, AppendResult) and not other_key.duplicate
        assert all(isinstance(m, NotFound) for m in missing)
        assert isinstance(b0, AppendResult) and isinstance(b1, AppendResult)
        assert await text(engine, "r/a") == b"A0A1A2"
        assert await text(engine, "r/b") == b"B0B1"
        again = engine.append_batch(
            [part("r/a", "w-1", b"A1", key="other"), part("r/a", "w-2", b"A2", key="other")]
        )
        await again.all_done
        reused, replayed = again.outcomes
        assert isinstance(reused, ProtocolError) and reused.status == 409  # w-1's tuple, key k1
        assert isinstance(replayed, AppendResult) and replayed.duplicate
        assert await text(engine, "r/a") == b"A0A1A2"

    _run(tmp_path, durability, scenario)


def _tuple(seq: int) -> ProducerTuple:
    return ProducerTuple("p", 0, seq)


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_batch_of_appends_keeps_a_hot_tail_only_for_parked_readers(
    tmp_path: Path, durability: Durability
) -> None:
    """A bulk request's commit keeps no hot tail (nor the index's recent window) for a stream nobody
    waits on: the log is idle once settled. A stream with a parked reader keeps it, the reader
    wakes, and every stream reads back its data."""
    paths = [f"h/{i}" for i in range(50)]

    async def scenario(engine: Engine) -> None:
        await engine.create_batch_nowait(paths, "text/plain")
        parked = asyncio.ensure_future(engine.wait("h/7", "-1", 30.0))
        await until(lambda: len(engine._registry.by_path["h/7"].waiters or ()) == 1)
        batch = engine.append_batch(
            [AppendRequest(path=p, content_type="text/plain", body=p.encode()) for p in paths]
        )
        await batch.all_done
        assert all(isinstance(r, AppendResult) for r in batch.outcomes)
        logs = {p: engine._registry.by_path[p].log for p in paths}
        cold = [p for p in paths if p != "h/7"]
        assert [p for p in cold if not logs[p].idle] == []
        assert all(len(logs[p]._index.recent.positions) == 0 for p in cold)
        assert not logs["h/7"].idle  # its hot tail, for the reader just woken
        assert await asyncio.wait_for(parked, 5.0)
        for p in paths:
            assert await text(engine, p) == p.encode()
        # A single append (not a bulk batch) keeps its hot tail as before.
        await append(engine, "h/3", b"+")
        assert not logs["h/3"].idle

    _run(tmp_path, durability, scenario)


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_batch_of_paths_another_batch_is_making_waits_for_it(
    tmp_path: Path, durability: Durability
) -> None:
    """Two of a routed sink's tasks ensure the same new streams at once: the second batch waits for
    the first (no task or lock per path: its batch is its only task) and answers each path as the
    serialized create would: the stream the first made (200), or the same 409 as ``PUT`` when the
    content type differs; exactly one stream is made per path (hazard 37)."""
    paths = [f"w/{i}" for i in range(200)]

    async def scenario(engine: Engine) -> None:
        first = engine.create_batch_nowait(paths, "application/json")
        second = engine.create_batch_nowait(paths[:150], "application/json")
        third = engine.create_batch_nowait(paths[150:], "text/plain")
        assert len(engine._creating) == 3  # the three batches' tasks, none per path
        made, found, refused = await first, await second, await third
        assert all(isinstance(r, CreateResult) and r.created for r in made)
        assert all(isinstance(r, CreateResult) and not r.created for r in found)
        assert (
            [r.info.storage_id for r in found]
            == [  # type: ignore[union-attr]
                r.info.storage_id  # type: ignore[union-attr]
                for r in made[:150]
            ]
        )
        assert all(isinstance(r, ConfigMismatch) and r.status == 409 for r in refused)
        assert "content type" in str(refused[0])
        assert not engine._creating and not engine._bulk_creating

    _run(tmp_path, durability, scenario)


def test_a_path_another_batch_failed_to_make_is_created_by_the_waiting_one(
    tmp_path: Path,
) -> None:
    """When the batch a path waited for did not make it (here: the data directory refused the
    first batch's streams), the waiting batch decides by the serialized create: it makes it."""

    async def scenario(engine: Engine) -> None:
        data = engine._data
        real = data.create_streams
        calls = 0

        async def refuse_first(headers: list[StreamHeader]) -> list[object]:
            nonlocal calls
            calls += 1
            if calls == 1:
                return [StorageFailure("refused for the test")] * len(headers)
            return await real(headers)

        data.create_streams = refuse_first  # type: ignore[method-assign]
        first = engine.create_batch_nowait(["x/a", "x/b"], "text/plain")
        second = engine.create_batch_nowait(["x/a", "x/b"], "text/plain")
        failed, made = await first, await second
        assert all(isinstance(r, StorageFailure) for r in failed)
        assert all(isinstance(r, CreateResult) and r.created for r in made)
        assert engine.head("x/a").content_type == "text/plain"

    _run(tmp_path, Durability.FSYNC, scenario)
