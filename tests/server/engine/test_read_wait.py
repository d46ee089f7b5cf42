"""Reads and waits (sections 5.6-5.8, 8): offsets, EOF, up-to-date, long-poll semantics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.errors import BadRequest, EndBeyondTail, Gone, NotFound
from durastream_server.offsets import format_offset
from tests.server.engine.support import ZERO, append, create, read, read_all, run, until


def test_offsets_sentinels_and_errors(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "s", b"historical")).info.next_offset
        now = await read(engine, "s", "now")
        assert now.messages == () and now.up_to_date and now.next_offset == tail
        assert not now.closed
        assert now.start_offset == tail
        beginning = await read(engine, "s", "-1")
        assert beginning.messages == (b"historical",) and beginning.start_offset == ZERO
        at_tail = await read(engine, "s", tail)
        assert at_tail.messages == () and at_tail.up_to_date and at_tail.next_offset == tail
        for bad in ("", "0,1", "0 1", "0_5", "-2", "../x", "0000000000000000_000000000000000a"):
            with pytest.raises(BadRequest):
                await read(engine, "s", bad)
        with pytest.raises(BadRequest):  # beyond the tail: never handed out by this stream
            await read(engine, "s", format_offset(11))
        with pytest.raises(NotFound):
            await read(engine, "missing")
        with pytest.raises(NotFound):
            await read(engine, "missing", "now")

    run(tmp_path, scenario)


def test_chunked_reads_cover_everything_and_only_the_last_is_up_to_date(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        payload = bytes(i % 256 for i in range(100 * 1024))
        await create(engine, "big", content_type="application/octet-stream")
        await append(engine, "big", payload, content_type="application/octet-stream")
        first = await read(engine, "big", max_bytes=4096)
        assert not first.up_to_date and len(b"".join(first.messages)) <= 4096
        assert await read_all(engine, "big", max_bytes=4096) == payload

    run(tmp_path, scenario)


def test_json_reads_return_whole_messages(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "j", b'[{"a":1},{"b":22},{"c":333}]', content_type="application/json")
        first = await read(engine, "j", max_bytes=1)
        assert first.messages == (b'{"a":1}',) and not first.up_to_date
        rest = await read(engine, "j", first.next_offset)
        assert rest.messages == (b'{"b":22}', b'{"c":333}') and rest.up_to_date
        with pytest.raises(BadRequest):  # not a message boundary
            await read(engine, "j", format_offset(2))

    run(tmp_path, scenario)


def test_closed_is_reported_only_at_the_final_offset(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "c", b"first")
        second = (await append(engine, "c", b"second")).next_offset
        await append(engine, "c", b"", close=True)
        partial = await read(engine, "c", max_bytes=3)
        assert partial.messages and not partial.closed and not partial.up_to_date
        whole = await read(engine, "c")
        assert whole.closed and whole.up_to_date and whole.next_offset == second
        eof = await read(engine, "c", second)
        assert eof.messages == () and eof.closed and eof.up_to_date
        now = await read(engine, "c", "now")
        assert now.closed and now.up_to_date and now.next_offset == second

    run(tmp_path, scenario)


def test_hazard_23_closed_stream_below_tail_is_not_eof(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "c", b"0123456789", closed=True)
        for position in range(10):
            result = await read(engine, "c", format_offset(position))
            assert b"".join(result.messages) == b"0123456789"[position:]
            assert result.closed  # this read reaches the final offset
            # A wait below the tail returns at once (data is there), never blocks.
            assert await engine.wait("c", format_offset(position), 5.0)
        bounded = await read(engine, "c", ZERO, end_offset=format_offset(4))
        assert b"".join(bounded.messages) == b"0123"
        assert not bounded.closed and not bounded.up_to_date

    run(tmp_path, scenario)


def test_end_offset_validation(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "s", b"abcdef")
        with pytest.raises(BadRequest):
            await read(engine, "s", format_offset(4), end_offset=format_offset(2))
        # Bounded reads never clamp: an end past the durable tail is a typed 400 naming the tail.
        with pytest.raises(EndBeyondTail) as beyond:
            await read(engine, "s", ZERO, end_offset=format_offset(99))
        assert beyond.value.headers["Stream-Next-Offset"] == format_offset(6)
        at_tail = await read(engine, "s", ZERO, end_offset=format_offset(6))
        assert b"".join(at_tail.messages) == b"abcdef" and at_tail.up_to_date

    run(tmp_path, scenario)


def test_wait_wakes_on_durable_append(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "w", b"old")).info.next_offset
        waiter = asyncio.create_task(engine.wait("w", tail, 10.0))
        await until(lambda: engine.waiting("w") == 1)
        await append(engine, "w", b"new")
        assert await waiter is True
        assert b"".join((await read(engine, "w", tail)).messages) == b"new"

    run(tmp_path, scenario)


def test_wait_times_out(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "w")).info.next_offset
        assert await engine.wait("w", tail, 0.05) is False
        assert await engine.wait("w", "now", 0.05) is False

    run(tmp_path, scenario)


def test_wait_now_waits_for_data_past_the_tail_at_call_time(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "w", b"historical")
        waiter = asyncio.create_task(engine.wait("w", "now", 10.0))
        await until(lambda: engine.waiting("w") == 1)
        await append(engine, "w", b"new")
        assert await waiter

    run(tmp_path, scenario)


def test_hazard_16_append_and_close_wakes_a_tail_waiter_with_data(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "c", b"initial")).info.next_offset
        waiter = asyncio.create_task(engine.wait("c", tail, 10.0))
        await until(lambda: engine.waiting("c") == 1)
        final = await append(engine, "c", b"sse-data", close=True)
        assert await waiter
        result = await read(engine, "c", tail)
        assert result.messages == (b"sse-data",)
        assert result.closed and result.next_offset == final.next_offset
        eof = await read(engine, "c", final.next_offset)
        assert eof.messages == () and eof.closed
        # Closed at the tail: waiting returns at once.
        assert await engine.wait("c", final.next_offset, 10.0)

    run(tmp_path, scenario)


def test_hazard_16_reader_at_old_tail_is_not_told_closed_before_seeing_final_data(
    tmp_path: Path,
) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "c", b"initial")).info.next_offset
        closing = asyncio.create_task(append(engine, "c", b"final", close=True))
        observed = []
        # Read repeatedly while the close commits: no response may say closed without the data.
        while not closing.done():
            result = await read(engine, "c", tail)
            observed.append(result)
            await asyncio.sleep(0)
        await closing
        observed.append(await read(engine, "c", tail))
        for result in observed:
            if result.closed:
                assert result.messages == (b"final",)
        assert observed[-1].closed

    run(tmp_path, scenario)


def test_hazard_33_delete_releases_waiters_with_not_found(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "d")).info.next_offset
        waiter = asyncio.create_task(engine.wait("d", tail, 10.0))
        await until(lambda: engine.waiting("d") == 1)
        await engine.delete("d")
        with pytest.raises(NotFound):
            await waiter

        await create(engine, "src", b"x")
        await create(engine, "f", forked_from="src", content_type=None)
        waiter = asyncio.create_task(engine.wait("src", "now", 10.0))
        await until(lambda: engine.waiting("src") == 1)
        await engine.delete("src")  # soft delete: 410
        with pytest.raises(Gone):
            await waiter

    run(tmp_path, scenario)


def test_shutdown_releases_waiters_as_timeouts(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "s")).info.next_offset
        waiter = asyncio.create_task(engine.wait("s", tail, 10.0))
        await until(lambda: engine.waiting("s") == 1)
        await engine.close()
        assert await waiter is False

    run(tmp_path, scenario)


def test_shutdown_makes_no_wait_set_for_idle_streams_and_later_waits_end_at_once(
    tmp_path: Path,
) -> None:
    async def scenario(engine: Engine) -> None:
        for i in range(50):
            await create(engine, f"idle-{i}")
        tail = (await create(engine, "s", b"x")).info.next_offset
        waiter = asyncio.create_task(engine.wait("s", tail, 10.0))
        await until(lambda: engine.waiting("s") == 1)
        await engine.close()
        assert await waiter is False
        incs = [engine._lookup(f"idle-{i}") for i in range(50)]
        assert all(inc.waiters is None for inc in incs)  # 100,000 idle streams: no 100,000 objects
        # A wait that comes after the shutdown answers as at a timeout at once (no 10 s park), and
        # says True if the data is already there.
        assert await asyncio.wait_for(engine.wait("idle-0", "now", 10.0), 1.0) is False
        assert await asyncio.wait_for(engine.wait("s", "-1", 10.0), 1.0) is True

    run(tmp_path, scenario)


def test_fork_waiters_wake_only_for_fork_appends(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"source")
        tail = (await create(engine, "f", forked_from="src", content_type=None)).info.next_offset
        # Inherited data is there at once.
        assert await engine.wait("f", "-1", 10.0)
        waiter = asyncio.create_task(engine.wait("f", tail, 10.0))
        await until(lambda: engine.waiting("f") == 1)
        await append(engine, "src", b" source extra")  # durable, listeners already ran
        for _ in range(10):  # give a (wrongly) woken waiter every chance to finish
            await asyncio.sleep(0)
        assert not waiter.done()
        await append(engine, "f", b" fork new")
        assert await waiter
        assert (await read(engine, "f", tail)).messages == (b" fork new",)

    run(tmp_path, scenario)


def test_many_waiters_all_wake(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        tail = (await create(engine, "m")).info.next_offset
        waiters = [asyncio.create_task(engine.wait("m", tail, 10.0)) for _ in range(100)]
        await until(lambda: engine.waiting("m") == 100)
        await append(engine, "m", b"x")
        await until(lambda: all(w.done() for w in waiters))
        assert all(w.result() for w in waiters)

    run(tmp_path, scenario)
