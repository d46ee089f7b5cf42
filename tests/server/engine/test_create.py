"""Create (section 5.1): 201/200/409, closed creates, JSON bodies, defaults, re-creation."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from durastream_server.engine.api import CreateRequest
from durastream_server.engine.engine import Engine
from durastream_server.errors import (
    BadRequest,
    ConfigMismatch,
    EmptyJsonArray,
    Gone,
    InvalidJson,
    NotFound,
    StreamClosed,
)
from tests.server.engine.support import (
    ZERO,
    FakeClock,
    Recorder,
    append,
    create,
    read,
    run,
    text,
)


def test_create_then_idempotent_then_mismatch(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        first = await create(engine, "s", b"hello")
        assert first.created
        assert first.info.content_type == "text/plain"
        assert first.info.next_offset.endswith("0005")
        again = await create(engine, "s")  # the body of a matching re-PUT is not compared
        assert not again.created
        assert again.info.storage_id == first.info.storage_id
        with pytest.raises(ConfigMismatch):
            await create(engine, "s", content_type="application/json")
        with pytest.raises(ConfigMismatch):
            await create(engine, "s", ttl_seconds=10)
        with pytest.raises(ConfigMismatch):
            await create(engine, "s", closed=True)

    run(tmp_path, scenario)


def test_hazard_37_content_type_compared_after_normalization(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        created = await create(engine, "j", content_type="application/json; charset=utf-8")
        assert created.info.content_type == "application/json; charset=utf-8"
        assert not (await create(engine, "j", content_type="APPLICATION/JSON")).created
        assert not (await create(engine, "j", content_type="application/json;charset=x")).created
        # Appends follow the same rule.
        await append(engine, "j", b'{"a":1}', content_type="application/json")
        assert (await read(engine, "j")).json

    run(tmp_path, scenario)


def test_hazard_37_concurrent_identical_creates_make_exactly_one(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        recorder = Recorder()
        engine.add_observer(recorder)
        results = await asyncio.gather(*(create(engine, "race", b"x") for _ in range(20)))
        assert sum(r.created for r in results) == 1
        assert len({r.info.storage_id for r in results}) == 1
        assert [e for e in recorder.events if e[0] == "created"] == [
            ("created", "race", results[0].info.next_offset)
        ]
        assert await text(engine, "race") == b"x"

    run(tmp_path, scenario)


def test_missing_content_type_defaults_to_octet_stream(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        assert (await create(engine, "a", content_type=None)).info.content_type == (
            "application/octet-stream"
        )
        assert (await create(engine, "b", content_type="bogus")).info.content_type == (
            "application/octet-stream"
        )
        assert not (await create(engine, "a", content_type=None)).created

    run(tmp_path, scenario)


def test_create_closed_with_body_is_atomic(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        created = await create(engine, "c", b"final", closed=True)
        assert created.info.closed
        result = await read(engine, "c")
        assert result.messages == (b"final",)
        assert result.closed and result.up_to_date
        with pytest.raises(StreamClosed):
            await append(engine, "c", b"more")
        assert not (await create(engine, "c", closed=True)).created
        with pytest.raises(ConfigMismatch):
            await create(engine, "c")  # closure status differs

    run(tmp_path, scenario)


def test_hazard_20_invalid_json_create_leaves_no_stream(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidJson):
            await create(engine, "j", b"{bad", content_type="application/json")
        with pytest.raises(NotFound):
            engine.head("j")
        with pytest.raises(NotFound):
            await append(engine, "j", b"1", content_type="application/json")
        # The retried PUT creates it with its data, not a 200 for an empty stream.
        created = await create(engine, "j", b'[{"a":1},{"b":2}]', content_type="application/json")
        assert created.created
        assert (await read(engine, "j")).messages == (b'{"a":1}', b'{"b":2}')

    run(tmp_path, scenario)


def test_json_put_allows_empty_array_post_does_not(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        created = await create(engine, "j", b"[]", content_type="application/json")
        assert created.info.next_offset.endswith("0000")
        with pytest.raises(EmptyJsonArray):
            await append(engine, "j", b"[]", content_type="application/json")

    run(tmp_path, scenario)


def test_lifetime_validation_and_normalization(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        at = datetime.now(timezone.utc) + timedelta(hours=1)
        with pytest.raises(BadRequest):
            await create(engine, "x", ttl_seconds=5, expires_at=at)
        created = await create(engine, "x", expires_at=at)
        assert created.info.expires_at is not None and created.info.expires_at.endswith("Z")
        # Same instant in another timezone: same configuration.
        other_zone = at.astimezone(timezone(timedelta(hours=-7)))
        assert not (await create(engine, "x", expires_at=other_zone)).created
        with pytest.raises(ConfigMismatch):
            await create(engine, "x", expires_at=at + timedelta(seconds=1))
        assert (await create(engine, "t", ttl_seconds=3600)).info.ttl_seconds == 3600
        assert not (await create(engine, "t", ttl_seconds=3600)).created
        with pytest.raises(ConfigMismatch):
            await create(engine, "t", ttl_seconds=7200)

    run(tmp_path, scenario)


def test_fork_headers_without_source_are_rejected(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        with pytest.raises(BadRequest):
            await engine.create(CreateRequest(path="x", content_type=None, fork_sub_offset=0))
        with pytest.raises(BadRequest):
            await engine.create(
                CreateRequest(
                    path="x", content_type=None, fork_offset="0000000000000000_0000000000000000"
                )
            )
        with pytest.raises(NotFound):
            engine.head("x")

    run(tmp_path, scenario)


def test_recreate_after_delete_is_fresh_and_isolated(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        old = await create(engine, "r", b"old data")
        await append(engine, "r", b" more", producer=("p", 0, 0), stream_seq="5")
        await engine.delete("r")
        new = await create(engine, "r", b"new data")
        assert new.created and new.info.storage_id != old.info.storage_id
        assert await text(engine, "r") == b"new data"
        # No producer or Stream-Seq state carried over.
        assert (
            await append(engine, "r", b"!", producer=("p", 0, 0), stream_seq="1")
        ).duplicate is False

    run(tmp_path, scenario)


def test_observers_see_create_append_delete(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        recorder = Recorder()
        engine.add_observer(recorder)
        await create(engine, "o")
        result = await append(engine, "o", b"abc")
        await append(engine, "o", b"", close=True)  # no data: not an append event
        await engine.delete("o")
        assert recorder.events == [
            ("created", "o", "0000000000000000_0000000000000000"),
            ("appended", "o", result.next_offset),
            ("deleted", "o"),
        ]

    run(tmp_path, scenario)


def test_a_failing_observer_does_not_fail_the_request(tmp_path: Path) -> None:
    class Broken(Recorder):
        def on_created(self, path: str, next_offset: str) -> None:
            raise RuntimeError("boom")

    async def scenario(engine: Engine) -> None:
        engine.add_observer(Broken())
        assert (await create(engine, "b")).created

    run(tmp_path, scenario)


def test_listing_index_follows_creates_deletes_and_restarts(tmp_path: Path) -> None:
    """The sorted path index (listing) holds exactly the current paths, through every change."""
    names = ["b", "a/2", "a/10", "a", "c/x"]

    def index(engine: Engine) -> list[str]:
        paths = list(engine._registry.paths)
        assert paths == sorted(engine._registry.by_path)
        return paths

    async def scenario(engine: Engine) -> None:
        for name in names:
            await create(engine, name)
        await create(engine, "fork", forked_from="a", content_type=None)
        assert index(engine) == ["a", "a/10", "a/2", "b", "c/x", "fork"]
        await engine.delete("b")
        await engine.delete("a")  # soft-deleted: its fork still reads it; still current
        assert index(engine) == ["a", "a/10", "a/2", "c/x", "fork"]
        assert [s.path for s in engine.list_streams()] == ["a/10", "a/2", "c/x", "fork"]
        await create(engine, "b")
        page = engine.list_page("a", match=None, after=None, limit=10, examine=2)
        assert [s.path for s in page.streams] == ["a/10"] and page.next == "a/10"
        page = engine.list_page("a", match=None, after=page.next, limit=10, examine=2)
        assert [s.path for s in page.streams] == ["a/2"] and page.next is None

    run(tmp_path, scenario)

    async def after_restart(engine: Engine) -> None:
        assert index(engine) == ["a", "a/10", "a/2", "b", "c/x", "fork"]

    run(tmp_path, after_restart)


def test_create_tasks_are_held_until_they_end_and_then_forgotten(tmp_path: Path) -> None:
    """A create runs in a task nobody awaits on the direct path (``create_nowait``): the engine holds
    it while it runs (the loop keeps only weak references) and forgets it when it ends, whether it
    created, found or failed (the task removes itself: no done callback per create)."""

    async def scenario(engine: Engine) -> None:
        future = engine.create_nowait(CreateRequest(path="held", content_type="text/plain"))
        assert future in engine._creating
        assert (await future).created
        bad = engine.create_nowait(
            CreateRequest(path="bad", content_type="application/json", body=b"{")
        )
        assert bad in engine._creating
        with pytest.raises(InvalidJson):
            await bad
        found = await asyncio.gather(*(create(engine, "held") for _ in range(5)))
        assert not any(result.created for result in found)
        assert not engine._creating

    run(tmp_path, scenario)


def test_creates_without_a_body_make_empty_streams_of_either_mode(tmp_path: Path) -> None:
    """No body: no message in JSON mode (nothing to validate) and none in byte mode; a JSON body that
    is empty of messages (``[]``) and a bad one are still parsed."""

    async def scenario(engine: Engine) -> None:
        for path, content_type in (("j", "application/json"), ("b", "text/plain")):
            created = await create(engine, path, b"", content_type=content_type)
            assert created.created and created.info.next_offset == ZERO
            assert (await read(engine, path)).messages == ()
        assert (await create(engine, "e", b"[]", content_type="application/json")).created
        with pytest.raises(InvalidJson):
            await create(engine, "x", b" ", content_type="application/json")

    run(tmp_path, scenario)


def test_head_if_any_is_head_except_for_a_path_never_used(tmp_path: Path) -> None:
    """``head_if_any`` (the bulk ensure's look): None only where ``head`` would answer 404 for a path
    without a stream; a stream's info, and ``head``'s errors for the others."""
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        assert engine.head_if_any("nothing") is None
        with pytest.raises(NotFound):
            engine.head("nothing")
        await create(engine, "s", b"abc")
        assert engine.head_if_any("s") == engine.head("s")
        await create(engine, "src", b"kept")
        await engine.create(CreateRequest(path="f", content_type="text/plain", forked_from="src"))
        await engine.delete("src")  # soft-deleted: its fork still reads it
        with pytest.raises(Gone):
            engine.head_if_any("src")
        await create(engine, "ttl", ttl_seconds=5)
        clock.advance(10)
        with pytest.raises(NotFound):  # expired, not yet swept: head's 404
            engine.head_if_any("ttl")

    run(tmp_path, scenario, clock=clock)
