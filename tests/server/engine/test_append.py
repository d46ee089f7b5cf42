"""Append and close (section 5.2, 5.2.1, 5.3): precedence, producers, Stream-Seq, JSON mode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durastream_server.engine import jsonmode
from durastream_server.engine.engine import Engine
from durastream_server.errors import (
    BadRequest,
    ContentTypeMismatch,
    DuplicateMismatch,
    InvalidJson,
    NotFound,
    SequenceGap,
    StaleEpoch,
    StreamClosed,
    StreamSeqRegression,
)
from durastream_server.offsets import format_offset
from tests.server.engine.support import Recorder, append, create, read, run, text, until


def test_basic_appends_and_offsets(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        offsets = [(await append(engine, "s", b"chunk%d" % i)).next_offset for i in range(5)]
        assert offsets == sorted(offsets) and len(set(offsets)) == 5
        assert await text(engine, "s") == b"chunk0chunk1chunk2chunk3chunk4"
        assert engine.head("s").next_offset == offsets[-1]

    run(tmp_path, scenario)


def test_request_validation(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        with pytest.raises(NotFound):
            await append(engine, "missing", b"x")
        with pytest.raises(NotFound):
            await append(engine, "missing", b"", close=True)
        await create(engine, "s")
        with pytest.raises(BadRequest):
            await append(engine, "s", b"")  # empty body without close
        with pytest.raises(BadRequest):
            await append(engine, "s", b"", producer=("p", 0, 0))
        with pytest.raises(BadRequest):
            await append(engine, "s", b"x", content_type=None)
        with pytest.raises(BadRequest):
            await append(engine, "s", b"x", content_type="garbage")
        with pytest.raises(ContentTypeMismatch):
            await append(engine, "s", b"{}", content_type="application/json")
        assert (
            await append(engine, "s", b"ok", content_type="TEXT/PLAIN; charset=utf-8")
        ).next_offset
        assert await text(engine, "s") == b"ok"

    run(tmp_path, scenario)


def test_close_only_ignores_content_type_and_is_idempotent(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "j", b'{"a":1}', content_type="application/json")
        closed = await append(engine, "j", b"", content_type="text/plain", close=True)
        assert closed.closed and not closed.duplicate
        again = await append(engine, "j", b"", content_type=None, close=True)
        assert again.closed and again.duplicate and again.next_offset == closed.next_offset
        assert engine.head("j").closed

    run(tmp_path, scenario)


def test_append_to_closed_stream_is_409_with_final_offset(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "c", b"some content")
        final = (await append(engine, "c", b"", close=True)).next_offset
        for kwargs in ({}, {"close": True}, {"content_type": "application/json"}):
            with pytest.raises(StreamClosed) as err:
                await append(engine, "c", b"nope", **kwargs)
            assert err.value.headers == {"Stream-Closed": "true", "Stream-Next-Offset": final}
        # Empty body without close is malformed, closed or not.
        with pytest.raises(BadRequest):
            await append(engine, "c", b"")

    run(tmp_path, scenario)


def test_close_with_final_append(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "c")
        await append(engine, "c", b"first ")
        result = await append(engine, "c", b"final", close=True)
        assert result.closed
        read_result = await read(engine, "c")
        assert b"".join(read_result.messages) == b"first final"
        assert read_result.closed

    run(tmp_path, scenario)


def test_producer_sequence_rules(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "p")
        first = await append(engine, "p", b"m0", producer=("w", 0, 0))
        assert (first.duplicate, first.producer_epoch, first.producer_seq) == (False, 0, 0)
        await append(engine, "p", b"m1", producer=("w", 0, 1))
        await append(engine, "p", b"m2", producer=("w", 0, 2))
        dup = await append(engine, "p", b"m1", producer=("w", 0, 1))
        assert dup.duplicate and dup.producer_seq == 2  # highest accepted, not the request's
        with pytest.raises(SequenceGap) as gap:
            await append(engine, "p", b"m4", producer=("w", 0, 4))
        assert gap.value.headers == {"Producer-Expected-Seq": "3", "Producer-Received-Seq": "4"}
        with pytest.raises(BadRequest):
            await append(engine, "p", b"e1", producer=("w", 1, 5))
        bumped = await append(engine, "p", b"e1", producer=("w", 1, 0))
        assert bumped.producer_epoch == 1
        with pytest.raises(StaleEpoch) as stale:
            await append(engine, "p", b"zombie", producer=("w", 0, 3))
        assert stale.value.headers == {"Producer-Epoch": "1"}
        with pytest.raises(SequenceGap) as fresh:
            await append(engine, "p", b"x", producer=("other", 0, 7))
        assert fresh.value.headers["Producer-Expected-Seq"] == "0"
        assert await text(engine, "p") == b"m0m1m2e1"

    run(tmp_path, scenario)


def test_hazard_4_reused_tuple_with_different_body_is_rejected(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "p")
        await append(engine, "p", b"A", producer=("w", 0, 0))
        with pytest.raises(DuplicateMismatch):
            await append(engine, "p", b"B", producer=("w", 0, 0))
        assert (await append(engine, "p", b"A", producer=("w", 0, 0))).duplicate
        assert await text(engine, "p") == b"A"

    run(tmp_path, scenario)


def test_producer_dedupe_precedes_stream_seq(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "p")
        await append(engine, "p", b"msg", producer=("w", 0, 0), stream_seq="app-001")
        retry = await append(engine, "p", b"msg", producer=("w", 0, 0), stream_seq="app-001")
        assert retry.duplicate
        with pytest.raises(StreamSeqRegression):
            await append(engine, "p", b"msg", producer=("w", 0, 1), stream_seq="app-001")

    run(tmp_path, scenario)


def test_stream_seq_is_bytewise_lexicographic(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        await append(engine, "s", b"a", stream_seq="2")
        with pytest.raises(StreamSeqRegression):
            await append(engine, "s", b"b", stream_seq="10")  # "10" < "2"
        with pytest.raises(StreamSeqRegression):
            await append(engine, "s", b"b", stream_seq="2")  # equal is a regression too
        await append(engine, "s", b"c", stream_seq="a")
        with pytest.raises(StreamSeqRegression):
            await append(engine, "s", b"d", stream_seq="B")  # "B" < "a" in byte order
        await append(engine, "s", b"e", stream_seq="\u00e9")  # non-ASCII sorts after ASCII
        assert await text(engine, "s") == b"ace"

    run(tmp_path, scenario)


def test_producer_close_semantics(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "c")
        await append(engine, "c", b"message", producer=("w", 0, 0))
        closed = await append(engine, "c", b"", content_type=None, close=True, producer=("w", 0, 1))
        assert closed.closed and not closed.duplicate and closed.producer_seq == 1
        again = await append(engine, "c", b"", content_type=None, close=True, producer=("w", 0, 1))
        assert again.duplicate and again.closed and again.producer_seq == 1
        with pytest.raises(StreamClosed):
            await append(engine, "c", b"", content_type=None, close=True, producer=("w", 0, 2))
        with pytest.raises(StreamClosed):
            await append(engine, "c", b"", content_type=None, close=True, producer=("x", 0, 0))

    run(tmp_path, scenario)


def test_close_retry_with_different_body_dedupes_to_the_original(tmp_path: Path) -> None:
    """Conformance ``close-with-different-body-dedup``: the closing tuple always answers 204."""

    async def scenario(engine: Engine) -> None:
        await create(engine, "c")
        first = await append(engine, "c", b"body-A", close=True, producer=("w", 0, 0))
        assert not first.duplicate
        retry = await append(engine, "c", b"body-B", close=True, producer=("w", 0, 0))
        assert retry.duplicate and retry.closed
        assert await text(engine, "c") == b"body-A"

    run(tmp_path, scenario)


def test_hazard_35_retry_of_pre_close_batch_after_close(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "c")
        await append(engine, "c", b"b0", producer=("w", 0, 0))
        await append(engine, "c", b"", content_type=None, close=True, producer=("w", 0, 1))
        retry = await append(engine, "c", b"b0", producer=("w", 0, 0))
        assert retry.duplicate and retry.closed and retry.producer_seq == 1
        with pytest.raises(DuplicateMismatch):  # a reused tuple is still not a retry
            await append(engine, "c", b"other", producer=("w", 0, 0))
        await create(engine, "d")
        await append(engine, "d", b"first", producer=("w", 0, 0))
        await append(engine, "d", b"final", close=True, producer=("w", 1, 0))
        with pytest.raises(StaleEpoch):  # a stale epoch is fenced (403), closed or not
            await append(engine, "d", b"stale", close=True, producer=("w", 0, 1))

    run(tmp_path, scenario)


def test_json_mode_appends(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "j", content_type="application/json")
        await append(engine, "j", b'{"single": 1}', content_type="application/json")
        await append(engine, "j", b'[{"batch": 2}, {"batch": 3}]', content_type="application/json")
        await append(engine, "j", b'[["nested", "array"]]', content_type="application/json")
        with pytest.raises(InvalidJson):
            await append(engine, "j", b"{ invalid json }", content_type="application/json")
        with pytest.raises(InvalidJson):  # a JSON stream validates even with producer headers
            await append(
                engine, "j", b"nope", content_type="application/json", producer=("w", 0, 0)
            )
        result = await read(engine, "j")
        assert result.json
        assert result.messages == (
            b'{"single": 1}',
            b'{"batch": 2}',
            b'{"batch": 3}',
            b'["nested", "array"]',
        )
        # JSON offsets count stored message bytes: every message has its own offset.
        assert result.positions[1] == format_offset(len(b'{"single": 1}'))

    run(tmp_path, scenario)


def test_hazard_17_close_races_appends(tmp_path: Path) -> None:
    """Appends racing a close: once the close answered, no append is accepted and closure holds."""

    async def scenario(engine: Engine) -> None:
        await create(engine, "race")
        outcomes: list[str] = []

        async def writer(i: int) -> None:
            try:
                await append(engine, "race", b"%d," % i)
                outcomes.append("ok")
            except StreamClosed:
                outcomes.append("closed")

        tasks = [asyncio.create_task(writer(i)) for i in range(50)]
        await asyncio.sleep(0)
        close_task = asyncio.create_task(append(engine, "race", b"", close=True))
        tasks += [asyncio.create_task(writer(i)) for i in range(50, 100)]
        await asyncio.gather(*tasks, close_task)
        closed_at = close_task.result().next_offset
        result = await read(engine, "race")
        assert result.closed and result.next_offset == closed_at
        assert outcomes.count("ok") == len(result.messages)
        assert "closed" in outcomes
        with pytest.raises(StreamClosed):
            await append(engine, "race", b"late")

    run(tmp_path, scenario)


def test_duplicate_waits_for_the_original_to_be_durable(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "d")
        original = asyncio.create_task(append(engine, "d", b"x", producer=("w", 0, 0)))
        await asyncio.sleep(0)  # staged, maybe not durable yet
        duplicate = await append(engine, "d", b"x", producer=("w", 0, 0))
        assert duplicate.duplicate
        # When the duplicate was answered, the original's data was readable.
        assert duplicate.next_offset == format_offset(1)
        assert engine.head("d").next_offset == format_offset(1)
        await original

    run(tmp_path, scenario)


def test_cancelled_append_is_still_committed_and_observed(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        recorder = Recorder()
        engine.add_observer(recorder)
        await create(engine, "s")
        task = asyncio.create_task(append(engine, "s", b"abc"))
        await asyncio.sleep(0)  # staged; now waiting for durability
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: engine.head("s").next_offset == format_offset(3))
        await until(lambda: ("appended", "s", format_offset(3)) in recorder.events)
        assert await text(engine, "s") == b"abc"

    run(tmp_path, scenario)


def test_large_json_bodies_keep_validation_and_precedence(tmp_path: Path) -> None:
    element = b'{"payload":"' + b"x" * 1000 + b'"}'
    count = jsonmode.OFFLOAD_BYTES // len(element) + 200
    big = b"[" + b",".join([element] * count) + b"]"  # parsed off the event loop
    assert len(big) >= jsonmode.OFFLOAD_BYTES

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidJson):
            await create(engine, "j", big[:-1], content_type="application/json")
        with pytest.raises(NotFound):
            engine.head("j")
        await create(engine, "j", big, content_type="application/json")
        await append(engine, "j", big, content_type="application/json")
        assert len((await read(engine, "j", max_bytes=1 << 30)).messages) == 2 * count
        with pytest.raises(InvalidJson):
            await append(engine, "j", big + b"x", content_type="application/json")
        await append(engine, "j", b"", close=True)
        with pytest.raises(StreamClosed):  # closed outranks the JSON error
            await append(engine, "j", big + b"x", content_type="application/json")

    run(tmp_path, scenario)
