"""Staged appends through the engine on a real data directory: visibility, dedupe, commit semantics,
errors, expiry (fake clock), restarts and the crash windows around a commit."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.engine.api import CreateRequest
from durastream_server.engine.txnapi import StageRequest, TxnLimits
from durastream_server.offsets import format_offset

from ..engine.support import (
    FakeClock,
    append,
    close_engine,
    create,
    open_engine,
    read,
    read_all,
    run,
)
from .support import JSON, TEXT, abort, commit, stage, staging_files


def test_stage_is_invisible_and_wakes_nobody_until_the_commit(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s", b"base;")
        inc = engine._lookup("s")
        wakes = []
        inc.log.add_listener(lambda: wakes.append(inc.log.durable_tail))
        tail = format_offset(5)
        waiter = asyncio.ensure_future(engine.wait("s", tail, 30))
        staged = await stage(engine, "s", "h1", b"one;")
        await stage(engine, "s", "h1", b"two;")
        assert staged.messages == 1 and staged.bytes == 4 and staged.next_offset == tail
        assert await read_all(engine, "s") == b"base;"
        assert (await read(engine, "s")).next_offset == tail
        assert engine.head("s").next_offset == tail
        assert wakes == [] and not waiter.done()
        result = await commit(engine, "s", "h1")
        assert result.next_offset == format_offset(13) and result.messages == 2
        assert await asyncio.wait_for(waiter, 5) is True
        assert wakes == [13]  # one durable commit for the whole group
        assert await read_all(engine, "s") == b"base;one;two;"
        chunk = await read(engine, "s", tail)
        assert chunk.messages == (b"one;", b"two;") and chunk.up_to_date

    run(tmp_path, scenario)


def test_two_handles_commit_in_the_listed_order_as_one_unit(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "j", content_type=JSON)
        await stage(engine, "j", "h1", b'[{"a":1},{"a":2}]', JSON)
        await stage(engine, "j", "h2", b'{"b":1}', JSON)
        await stage(engine, "j", "h1", b'{"a":3}', JSON)
        result = await commit(engine, "j", "h2", "h1", producer=("c", 7, 0))
        assert (result.messages, result.duplicate) == (4, False)
        body = await read(engine, "j")
        assert body.messages == (b'{"b":1}', b'{"a":1}', b'{"a":2}', b'{"a":3}')
        assert len(set(body.timestamps_ms)) == 1  # all became visible at the commit's time
        assert staging_files(tmp_path) == []

    run(tmp_path, scenario)


def test_commit_retry_is_a_duplicate_and_a_reused_tuple_is_refused(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h1", b"x")
        await stage(engine, "s", "h2", b"y")
        first = await commit(engine, "s", "h1", "h2", producer=("c", 1, 0))
        again = await commit(engine, "s", "h1", "h2", producer=("c", 1, 0))
        assert again.duplicate and again.next_offset == first.next_offset
        assert (again.producer_epoch, again.producer_seq) == (1, 0)
        with pytest.raises(errors.DuplicateMismatch):
            await commit(engine, "s", "h2", "h1", producer=("c", 1, 0))
        with pytest.raises(errors.DuplicateMismatch):
            await commit(engine, "s", "h1", "h2", producer=("c", 1, 0), close=True)
        with pytest.raises(errors.TxnAlreadyCommitted):
            await commit(engine, "s", "h1", producer=("c", 1, 1))
        with pytest.raises(errors.TxnAlreadyCommitted):
            await stage(engine, "s", "h1", b"more")
        with pytest.raises(errors.TxnAlreadyCommitted):
            await abort(engine, "s", "h1")
        with pytest.raises(errors.StaleEpoch):
            await commit(engine, "s", "h3", producer=("c", 0, 5))
        with pytest.raises(errors.SequenceGap):
            await commit(engine, "s", "h3", producer=("c", 1, 5))
        assert await read_all(engine, "s") == b"xy"

    run(tmp_path, scenario)


def test_unknown_handle_and_stream_seq(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h1", b"x")
        with pytest.raises(errors.TxnNotFound) as info:
            await commit(engine, "s", "h1", "nope")
        assert info.value.status == 404 and "nope" in info.value.message
        await commit(engine, "s", "h1", producer=("c", 0, 0), stream_seq="b")
        await stage(engine, "s", "h2", b"y")
        with pytest.raises(errors.StreamSeqRegression):
            await commit(engine, "s", "h2", producer=("c", 0, 1), stream_seq="a")
        assert await read_all(engine, "s") == b"x"

    run(tmp_path, scenario)


def test_duplicate_stage_requests_are_deduped_within_the_handle(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        first = await stage(engine, "s", "h", b"a", producer=("w", 0, 0))
        retry = await stage(engine, "s", "h", b"a", producer=("w", 0, 0))
        assert not first.duplicate and retry.duplicate
        assert (retry.messages, retry.bytes) == (1, 1)
        with pytest.raises(errors.DuplicateMismatch):
            await stage(engine, "s", "h", b"B", producer=("w", 0, 0))
        with pytest.raises(errors.SequenceGap):
            await stage(engine, "s", "h", b"c", producer=("w", 0, 2))
        await stage(engine, "s", "h", b"b", producer=("w", 0, 1))
        # The handle's producer state is its own: the same tuple on another handle is new data.
        await stage(engine, "s", "other", b"z", producer=("w", 0, 0))
        await commit(engine, "s", "h", "other")
        assert await read_all(engine, "s") == b"abz"

    run(tmp_path, scenario)


def test_abort_then_commit_is_refused_and_abort_is_idempotent(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h1", b"x")
        assert (await abort(engine, "s", "h1")).aborted == 1
        assert (await abort(engine, "s", "h1", "never-staged")).aborted == 0
        assert staging_files(tmp_path) == []
        with pytest.raises(errors.TxnAborted):
            await commit(engine, "s", "h1")
        with pytest.raises(errors.TxnAborted):
            await stage(engine, "s", "h1", b"again")
        # An abort that arrived before any stage still fences a late (zombie) stage.
        with pytest.raises(errors.TxnAborted):
            await stage(engine, "s", "never-staged", b"late")

    run(tmp_path, scenario)
    run(tmp_path, _expect_aborted)  # the tombstones are durable


def test_aborts_of_unknown_names_are_capped_and_expire(tmp_path: Path) -> None:
    """Issue 14 item 6: 210k unknown names in 70 aborts were kept 7 days (+44 MiB). Unknown names are
    fenced for the default handle TTL, at most ``max_fenced_per_stream`` per stream, oldest out first;
    names of staged handles keep their 7-day tombstones; an abort names at most as many as a commit."""
    clock = FakeClock()
    limits = TxnLimits(fence_seconds=100, max_fenced_per_stream=50, max_handles_per_commit=40)

    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "staged", b"x")
        await abort(engine, "s", "staged", *[f"u{n}" for n in range(39)])
        for batch in range(1, 5):  # 4 x 40 more unknown names
            await abort(engine, "s", *[f"u{batch}-{n}" for n in range(40)])
        with pytest.raises(errors.BadRequest, match="at most 40 per request"):
            await abort(engine, "s", *[f"v{n}" for n in range(41)])
        space = engine._txns._spaces[engine._lookup("s").id]
        assert len(space.fenced) == 50 and "staged" in space.tombstones
        with pytest.raises(errors.TxnAborted):  # the most recent ones still fence a late stage
            await stage(engine, "s", "u4-39", b"late")
        await stage(
            engine, "s", "u0", b"late"
        )  # pushed out by newer ones: harmless, never committed
        clock.advance(101)
        await engine.sweep_expired()
        assert space.fenced == {}
        await stage(engine, "s", "u4-39", b"later")
        with pytest.raises(errors.TxnAborted):  # a staged handle's tombstone lives 7 days
            await stage(engine, "s", "staged", b"again")

    run(tmp_path, scenario, clock=clock, limits=limits)

    async def after_restart(engine) -> None:
        space = engine._txns._spaces[engine._lookup("s").id]
        assert space.fenced == {} and "staged" in space.tombstones

    run(tmp_path, after_restart, clock=clock, limits=limits)


def test_fenced_names_survive_a_restart_within_the_cap(tmp_path: Path) -> None:
    clock = FakeClock()
    limits = TxnLimits(fence_seconds=100, max_fenced_per_stream=5)

    async def scenario(engine) -> None:
        await create(engine, "s")
        await abort(engine, "s", *[f"u{n}" for n in range(8)])

    run(tmp_path, scenario, clock=clock, limits=limits)

    async def after_restart(engine) -> None:
        space = engine._txns._spaces[engine._lookup("s").id]
        assert list(space.fenced) == [f"u{n}" for n in range(3, 8)]
        with pytest.raises(errors.TxnAborted):
            await stage(engine, "s", "u7", b"late")

    run(tmp_path, after_restart, clock=clock, limits=limits)


async def _expect_aborted(engine) -> None:
    with pytest.raises(errors.TxnAborted):
        await commit(engine, "s", "h1", producer=("c", 0, 0))
    assert await read_all(engine, "s") == b""


def test_expired_handle_is_410_before_and_after_the_sweep_and_after_restart(
    tmp_path: Path,
) -> None:
    clock = FakeClock()

    async def scenario(engine) -> None:
        await create(engine, "s")
        staged = await stage(engine, "s", "short", b"x", ttl=10)
        await stage(engine, "s", "long", b"y")
        assert staged.expires_at_ms == int((clock.now + 10) * 1000)
        with pytest.raises(errors.BadRequest):
            await stage(engine, "s", "too-long", b"z", ttl=604801)
        clock.advance(10)
        with pytest.raises(errors.TxnExpired) as info:
            await commit(engine, "s", "short", "long")
        assert info.value.status == 410
        await engine.sweep_expired()
        assert len(staging_files(tmp_path)) == 1  # "long" (3600 s) remains
        with pytest.raises(errors.TxnExpired):
            await commit(engine, "s", "short")
        with pytest.raises(errors.TxnExpired):
            await stage(engine, "s", "short", b"again")

    run(tmp_path, scenario, clock=clock)

    async def after_restart(engine) -> None:
        with pytest.raises(errors.TxnExpired):
            await commit(engine, "s", "short")
        await commit(engine, "s", "long")
        assert await read_all(engine, "s") == b"y"

    run(tmp_path, after_restart, clock=clock)


def test_closed_stream_refuses_stages_and_commits_and_reclaims_handles(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"x")
        await append(engine, "s", b"", content_type=None, close=True)
        with pytest.raises(errors.StreamClosed) as info:
            await stage(engine, "s", "h", b"y")
        assert info.value.headers["Stream-Closed"] == "true"
        with pytest.raises(errors.StreamClosed):
            await commit(engine, "s", "h")
        await engine.sweep_expired()
        assert staging_files(tmp_path) == []
        assert await read_all(engine, "s") == b""

    run(tmp_path, scenario)


def test_commit_that_closes_the_stream_and_its_retry(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"last")
        done = await commit(engine, "s", "h", producer=("c", 0, 0), close=True)
        assert done.closed and engine.head("s").closed
        retry = await commit(engine, "s", "h", producer=("c", 0, 0), close=True)
        assert retry.duplicate and retry.closed and retry.next_offset == done.next_offset
        with pytest.raises(errors.StreamClosed):
            await commit(engine, "s", "h", producer=("c", 0, 1))
        assert await read_all(engine, "s") == b"last"

    run(tmp_path, scenario)


def test_stream_deleted_or_recreated_between_stage_and_commit(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"x")
        await engine.delete("s")
        with pytest.raises(errors.NotFound):
            await commit(engine, "s", "h")
        with pytest.raises(errors.NotFound):
            await stage(engine, "s", "h", b"y")
        await create(engine, "s")
        with pytest.raises(errors.TxnNotFound):
            await commit(engine, "s", "h")
        assert await read_all(engine, "s") == b""

    run(tmp_path, scenario)


def test_forks_never_see_their_sources_handles(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "src", b"a")
        await stage(engine, "src", "h", b"staged")
        await engine.create(CreateRequest(path="fork", content_type=TEXT, forked_from="src"))
        with pytest.raises(errors.TxnNotFound):
            await commit(engine, "fork", "h")
        await commit(engine, "src", "h")
        assert await read_all(engine, "fork") == b"a"
        assert await read_all(engine, "src") == b"astaged"

    run(tmp_path, scenario)


def test_stage_validates_like_an_append(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "j", content_type=JSON)
        with pytest.raises(errors.InvalidJson):
            await stage(engine, "j", "h", b"{nope", JSON)
        with pytest.raises(errors.EmptyJsonArray):
            await stage(engine, "j", "h", b"[]", JSON)
        with pytest.raises(errors.ContentTypeMismatch):
            await stage(engine, "j", "h", b"x", TEXT)
        with pytest.raises(errors.BadRequest):
            await stage(engine, "j", "bad handle!", b"1", JSON)
        with pytest.raises(errors.TxnNotFound):
            await commit(engine, "j", "h")  # nothing was created by the rejected stages
        assert staging_files(tmp_path) == []

    run(tmp_path, scenario)


def test_handle_size_limit(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"12345678")
        with pytest.raises(errors.TxnTooLarge) as info:
            await stage(engine, "s", "h", b"9")
        assert info.value.status == 413 and "32 bytes per handle" in info.value.message
        await commit(engine, "s", "h")
        assert await read_all(engine, "s") == b"12345678"

    # 8 payload bytes in one message: 8 + MESSAGE_OVERHEAD (24) against the limit.
    run(tmp_path, scenario, limits=TxnLimits(max_handle_bytes=32))


def test_handles_survive_a_restart_with_their_dedupe_state(tmp_path: Path) -> None:
    async def first(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"a", producer=("w", 0, 0))
        await stage(engine, "s", "h", b"b", producer=("w", 0, 1))

    async def second(engine) -> None:
        retry = await stage(engine, "s", "h", b"b", producer=("w", 0, 1))
        assert retry.duplicate and (retry.messages, retry.bytes) == (2, 2)
        await stage(engine, "s", "h", b"c", producer=("w", 0, 2))
        await commit(engine, "s", "h")
        assert await read_all(engine, "s") == b"abc"

    run(tmp_path, first)
    run(tmp_path, second)


def test_torn_staging_file_tail_is_cut_at_restart(tmp_path: Path) -> None:
    async def first(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"kept")
        await stage(engine, "s", "h", b"torn-by-the-crash")

    run(tmp_path, first)
    (path,) = staging_files(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 3)

    async def second(engine) -> None:
        retry = await stage(engine, "s", "h", b"!")
        assert (retry.messages, retry.bytes) == (2, 5)
        await commit(engine, "s", "h")
        assert await read_all(engine, "s") == b"kept!"

    run(tmp_path, second)


def test_crash_between_commit_record_and_staging_cleanup(tmp_path: Path) -> None:
    """The commit is durable but its staging files were not yet removed when the process died: at
    start-up the leftover file is recognised from the commit record and removed, never re-committed."""
    saved = tmp_path / "saved"

    async def first(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"once")
        (path,) = staging_files(tmp_path / "data")
        saved.mkdir()
        shutil.copy(path, saved / path.name)
        await commit(engine, "s", "h", producer=("c", 0, 0))
        assert not path.exists()
        shutil.copy(saved / path.name, path)  # as if the unlink never happened

    async def second(engine) -> None:
        await until_no_staging_files(tmp_path / "data")
        assert (await commit(engine, "s", "h", producer=("c", 0, 0))).duplicate
        with pytest.raises(errors.TxnAlreadyCommitted):
            await commit(engine, "s", "h", producer=("c", 0, 1))
        assert await read_all(engine, "s") == b"once"

    run(tmp_path / "data", first)
    run(tmp_path / "data", second)


async def until_no_staging_files(root: Path) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while staging_files(root):
        assert loop.time() < deadline, "leftover staging file was not removed"
        await asyncio.sleep(0.01)


def test_concurrent_stages_and_a_commit_of_the_same_handle(tmp_path: Path) -> None:
    """Stages in flight when the commit arrives are either in the commit or refused, never lost
    silently or committed twice."""

    async def scenario(engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h", b"0,")

        def stage_one(i: int) -> asyncio.Future:
            return asyncio.ensure_future(stage(engine, "s", "h", f"{i},".encode()))

        before = [stage_one(i) for i in range(1, 10)]
        commits = [asyncio.ensure_future(commit(engine, "s", "h")) for _ in range(2)]
        after = [stage_one(i) for i in range(10, 20)]
        results = await asyncio.gather(*before, *after, return_exceptions=True)
        first, retry = await asyncio.gather(*commits)
        assert not first.duplicate and retry.duplicate  # the concurrent retry waited, then 204
        accepted = [i for i, r in enumerate(results, 1) if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert accepted and refused
        assert all(isinstance(r, errors.TxnAlreadyCommitted) for r in refused)
        data = await read_all(engine, "s")
        assert data == b"".join(f"{i},".encode() for i in [0, *accepted])
        assert first.messages == 1 + len(accepted)

    run(tmp_path, scenario)


def test_staging_is_durable_before_the_answer(tmp_path: Path) -> None:
    """With fsync durability, the staged record is in the file when stage() returns."""

    async def go() -> None:
        from durastream_server.storage import Durability

        data, engine = await open_engine(tmp_path, durability=Durability.FSYNC)
        try:
            await create(engine, "s")
            await engine.stage(StageRequest("s", "h", TEXT, b"payload-bytes"))
            (path,) = staging_files(tmp_path)
            assert b"payload-bytes" in path.read_bytes()
        finally:
            await close_engine(data, engine)

    asyncio.run(go())


def test_crash_in_the_middle_of_a_commit_then_retry_succeeds_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's first chunk reaches the segment, then the write fails and (as if the process died)
    nothing is undone. After a restart none of it is visible, and the same commit succeeds once."""
    from durastream_server.storage import group

    monkeypatch.setattr(group, "RECORD_TARGET", 4)
    monkeypatch.setattr(group, "WRITE_CHUNK", 16)
    real_pwrite = group.pwrite_all
    calls = {"n": 0}

    def crash_on_second_write(fd: int, buffers: list, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "injected I/O error")
        return real_pwrite(fd, buffers, offset)

    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        for i in range(6):
            await stage(engine, "s", "h", f"part-{i};".encode())
        monkeypatch.setattr(group, "pwrite_all", crash_on_second_write)
        monkeypatch.setattr(group, "_undo", lambda target, written: None)
        with pytest.raises(errors.StorageFailure) as info:
            await commit(engine, "s", "h", producer=("c", 0, 0))
        assert info.value.status == 503
        assert await read_all(engine, "s") == b"base;"
        monkeypatch.setattr(group, "pwrite_all", real_pwrite)

    async def second(engine) -> None:
        assert await read_all(engine, "s") == b"base;"
        done = await commit(engine, "s", "h", producer=("c", 0, 0))
        assert not done.duplicate and done.messages == 6
        assert (await commit(engine, "s", "h", producer=("c", 0, 0))).duplicate
        expected = b"base;" + b"".join(f"part-{i};".encode() for i in range(6))
        assert await read_all(engine, "s") == expected

    run(tmp_path, first)
    run(tmp_path, second)


def test_the_sweep_visits_only_streams_with_something_to_expire(tmp_path: Path) -> None:
    """Issue 16: a sink that routed one batch to many streams left a staged-append space per stream, and
    the sweep (4 times a second) walked all of them forever. Committed streams leave the sweep; a handle,
    a tombstone or a fence brings its stream back, and expiry still works."""
    clock = FakeClock()

    async def scenario(engine) -> None:
        txns = engine._txns
        for n in range(40):
            await create(engine, f"fan/{n}")
            await stage(engine, f"fan/{n}", f"h{n}", b"x")
        assert txns.sweepable() == 40
        for n in range(40):
            await commit(engine, f"fan/{n}", f"h{n}", producer=("w", 0, 0))
        await engine.sweep_expired()
        assert txns.sweepable() == 0  # nothing can expire: the sweep walks no stream
        await stage(engine, "fan/3", "short", b"y", ttl=10)
        await abort(engine, "fan/5", "never-staged")  # a fence, forgotten after an hour
        assert txns.sweepable() == 2
        clock.advance(11)
        await engine.sweep_expired()
        with pytest.raises(errors.TxnExpired):
            await commit(engine, "fan/3", "short", producer=("w", 1, 0))
        assert staging_files(tmp_path) == []
        clock.advance(8 * 24 * 3600)  # past every tombstone and fence
        await engine.sweep_expired()
        assert txns.sweepable() == 0
        assert await read_all(engine, "fan/3") == b"x"

    run(tmp_path, scenario, clock=clock)
