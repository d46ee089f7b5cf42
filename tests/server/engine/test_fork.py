"""Forks (section 4.2): creation, sub-offsets, stitched reads, chains, soft delete and cascade GC."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.errors import (
    BadRequest,
    ConfigMismatch,
    Conflict,
    ContentTypeMismatch,
    Gone,
    NotFound,
)
from durastream_server.offsets import format_offset
from tests.server.engine.support import ZERO, append, create, read, read_all, run, text


async def fork(engine: Engine, path: str, source: str, **kw):
    kw.setdefault("content_type", None)
    return await create(engine, path, forked_from=source, **kw)


def test_fork_at_tail_offset_and_zero(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        mid = (await create(engine, "src", b"first")).info.next_offset
        await append(engine, "src", b"second")
        head = await fork(engine, "f-head", "src", content_type="text/plain")
        assert head.created and head.info.content_type == "text/plain"
        assert not head.info.closed
        await fork(engine, "f-mid", "src", fork_offset=mid)
        await fork(engine, "f-zero", "src", fork_offset=ZERO)
        assert await text(engine, "f-head") == b"firstsecond"
        assert await text(engine, "f-mid") == b"first"
        assert await text(engine, "f-zero") == b""
        assert engine.head("f-mid").next_offset == mid

    run(tmp_path, scenario)


def test_fork_errors(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"small data")
        with pytest.raises(NotFound):
            await fork(engine, "f", "nope")
        with pytest.raises(BadRequest):
            await fork(engine, "f", "src", fork_offset=format_offset(10**16 - 1))
        with pytest.raises(BadRequest):
            await fork(engine, "f", "src", fork_offset="9999999999999999_9999999999999999")
        with pytest.raises(BadRequest):
            await fork(engine, "f", "src", fork_offset="0_5")
        with pytest.raises(BadRequest):
            await fork(engine, "f", "src", fork_offset=format_offset(11))  # past the tail
        with pytest.raises(ContentTypeMismatch):
            await fork(engine, "f", "src", content_type="application/json")
        with pytest.raises(NotFound):
            engine.head("f")
        # A stream already at the fork path with another configuration: 409.
        await create(engine, "taken", content_type="application/json")
        with pytest.raises(ConfigMismatch):
            await fork(engine, "taken", "src", content_type="text/plain")

    run(tmp_path, scenario)


def test_hazard_22_json_fork_offset_must_be_a_message_boundary(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "j", b'[{"a":1},{"b":2}]', content_type="application/json")
        with pytest.raises(BadRequest):
            await fork(engine, "f", "j", fork_offset=format_offset(3))
        boundary = format_offset(len(b'{"a":1}'))
        await fork(engine, "f", "j", fork_offset=boundary)
        assert (await read(engine, "f")).messages == (b'{"a":1}',)

    run(tmp_path, scenario)


def test_hazard_21_rejected_fork_does_not_leak_a_reference(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"data")
        with pytest.raises(ContentTypeMismatch):
            await fork(engine, "f", "src", content_type="application/json")
        with pytest.raises(BadRequest):
            await fork(engine, "f", "src", fork_offset=format_offset(99))
        await engine.delete("src")
        with pytest.raises(NotFound):  # hard-deleted, not soft (410)
            engine.head("src")
        assert (await create(engine, "src")).created

    run(tmp_path, scenario)


def test_sub_offsets(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        anchor = (await create(engine, "b", b"first")).info.next_offset
        await append(engine, "b", b"second")
        await fork(engine, "b3", "b", fork_offset=ZERO, fork_sub_offset=3)
        assert await text(engine, "b3") == b"fir"
        await fork(engine, "b-mid", "b", fork_offset=anchor, fork_sub_offset=3)
        assert await text(engine, "b-mid") == b"firstsec"
        await fork(engine, "b-eq", "b", fork_offset=ZERO, fork_sub_offset=5)
        assert await text(engine, "b-eq") == b"first"
        with pytest.raises(BadRequest):  # past the end of the message at the anchor
            await fork(engine, "b-over", "b", fork_offset=ZERO, fork_sub_offset=6)
        with pytest.raises(BadRequest):  # default anchor is the tail: nothing follows it
            await fork(engine, "b-tail", "b", fork_sub_offset=1)
        with pytest.raises(BadRequest):
            await fork(engine, "b-neg", "b", fork_offset=ZERO, fork_sub_offset=-1)
        # Idempotency: same sub-offset 200, different 409; sub-offset 0 == absent.
        assert not (await fork(engine, "b3", "b", fork_offset=ZERO, fork_sub_offset=3)).created
        with pytest.raises(ConfigMismatch):
            await fork(engine, "b3", "b", fork_offset=ZERO, fork_sub_offset=2)
        await fork(engine, "b0", "b", fork_offset=ZERO)
        assert not (await fork(engine, "b0", "b", fork_offset=ZERO, fork_sub_offset=0)).created
        # Appends and an initial body land after the materialized prefix.
        await append(engine, "b3", b"LO")
        assert await text(engine, "b3") == b"firLO"
        await fork(engine, "b-body", "b", fork_offset=ZERO, fork_sub_offset=3, body=b"XY")
        assert await text(engine, "b-body") == b"firXY"

        await create(engine, "j", b'[{"a":1},{"b":2},{"c":3}]', content_type="application/json")
        await fork(engine, "j2", "j", fork_offset=ZERO, fork_sub_offset=2)
        assert (await read(engine, "j2")).messages == (b'{"a":1}', b'{"b":2}')
        await fork(engine, "j3", "j", fork_offset=ZERO, fork_sub_offset=3)
        assert len((await read(engine, "j3")).messages) == 3
        with pytest.raises(BadRequest):
            await fork(engine, "j4", "j", fork_offset=ZERO, fork_sub_offset=4)

        await create(engine, "empty")
        with pytest.raises(BadRequest):
            await fork(engine, "e1", "empty", fork_offset=ZERO, fork_sub_offset=1)

    run(tmp_path, scenario)


def test_sub_offsets_compose_across_chained_forks(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "l0", b"abcdef")
        await fork(engine, "l1", "l0", fork_offset=ZERO, fork_sub_offset=4)
        assert await text(engine, "l1") == b"abcd"
        await fork(engine, "l2", "l1", fork_offset=ZERO, fork_sub_offset=2)
        assert await text(engine, "l2") == b"ab"
        with pytest.raises(BadRequest):  # l1 sees the message cut at 4 bytes
            await fork(engine, "l2-over", "l1", fork_offset=ZERO, fork_sub_offset=5)
        await append(engine, "l2", b"Z")
        assert await text(engine, "l2") == b"abZ"

    run(tmp_path, scenario)


def test_forks_do_not_inherit_producer_or_stream_seq_state(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", content_type="application/json")
        await append(
            engine,
            "src",
            b'[{"i":1},{"i":2},{"i":3}]',
            content_type="application/json",
            producer=("p", 0, 0),
            stream_seq="9",
        )
        await fork(engine, "f", "src", fork_offset=ZERO, fork_sub_offset=1)
        retry = await append(
            engine,
            "f",
            b'[{"i":99}]',
            content_type="application/json",
            producer=("p", 0, 0),
            stream_seq="1",
        )
        assert not retry.duplicate
        assert (await read(engine, "f")).messages == (b'{"i":1}', b'{"i":99}')

    run(tmp_path, scenario)


def test_reads_stitch_and_isolate(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        source_tail = (await create(engine, "src", b"A")).info.next_offset
        await append(engine, "src", b"B")
        await fork(engine, "f", "src")
        await append(engine, "f", b"C")
        await append(engine, "src", b" after")  # not visible in the fork
        result = await read(engine, "f")
        assert b"".join(result.messages) == b"ABC"
        assert result.up_to_date
        # Reading from an offset inside the inherited range, and from the fork point.
        assert b"".join((await read(engine, "f", source_tail)).messages) == b"BC"
        assert b"".join((await read(engine, "f", format_offset(2))).messages) == b"C"
        # Small chunks still walk across the boundary.
        assert await read_all(engine, "f", max_bytes=1) == b"ABC"
        # Positions are the shared offset space.
        assert result.positions == (ZERO, format_offset(1), format_offset(2))

    run(tmp_path, scenario)


def test_three_level_chains(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "l0", b"X")
        await fork(engine, "l1", "l0")
        await append(engine, "l1", b"Y")
        await fork(engine, "l2", "l1")
        await append(engine, "l2", b"Z")
        await append(engine, "l0", b"0")
        await append(engine, "l1", b"1")
        assert await text(engine, "l0") == b"X0"
        assert await text(engine, "l1") == b"XY1"
        assert await text(engine, "l2") == b"XYZ"

    run(tmp_path, scenario)


def test_json_fork_reads_across_the_boundary(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b'[{"from":"source"}]', content_type="application/json")
        created = await fork(engine, "f", "src")
        assert created.info.content_type == "application/json"
        await append(engine, "f", b'[{"from":"fork"}]', content_type="application/json")
        result = await read(engine, "f")
        assert result.json
        assert result.messages == (b'{"from":"source"}', b'{"from":"fork"}')
        with pytest.raises(BadRequest):  # inside an inherited message
            await read(engine, "f", format_offset(2))

    run(tmp_path, scenario)


def test_closed_source_can_be_forked_and_fork_starts_open(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"closed data", closed=True)
        created = await fork(engine, "f", "src", fork_offset=ZERO, fork_sub_offset=6)
        assert not created.info.closed
        await append(engine, "f", b" more")
        assert await text(engine, "f") == b"closed more"
        assert engine.head("src").closed
        await append(engine, "f", b"", close=True)
        assert engine.head("f").closed

    run(tmp_path, scenario)


def test_soft_delete_lifecycle(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"preserved")
        await fork(engine, "f", "src")
        await engine.delete("src")
        with pytest.raises(Gone):
            engine.head("src")
        with pytest.raises(Gone):
            await read(engine, "src")
        with pytest.raises(Gone):
            await append(engine, "src", b"x")
        with pytest.raises(Gone):
            await engine.delete("src")
        with pytest.raises(Conflict):
            await create(engine, "src")
        with pytest.raises(Conflict):
            await fork(engine, "f2", "src")
        assert await text(engine, "f") == b"preserved"
        assert [s.path for s in engine.list_streams()] == ["f"]
        # Deleting the last fork collects the source: the path is free again.
        await engine.delete("f")
        with pytest.raises(NotFound):
            engine.head("src")
        assert (await create(engine, "src")).created

    run(tmp_path, scenario)


def test_cascade_through_three_levels_and_middle_deletion(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "l0", b"A")
        await fork(engine, "l1", "l0")
        await append(engine, "l1", b"B")
        await fork(engine, "l2", "l1")
        await append(engine, "l2", b"C")
        await engine.delete("l1")  # middle: soft
        with pytest.raises(Gone):
            engine.head("l1")
        assert await text(engine, "l2") == b"ABC"
        assert await text(engine, "l0") == b"A"
        await engine.delete("l0")  # soft: l1 (soft-deleted) still reads from it
        with pytest.raises(Gone):
            engine.head("l0")
        assert await text(engine, "l2") == b"ABC"
        await engine.delete("l2")
        for path in ("l0", "l1", "l2"):
            with pytest.raises(NotFound):
                engine.head(path)

    run(tmp_path, scenario)


def test_source_survives_when_all_forks_are_deleted(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"alive")
        for i in range(10):
            await fork(engine, f"f{i}", "src")
        for i in range(10):
            assert await text(engine, f"f{i}") == b"alive"
            await engine.delete(f"f{i}")
        assert await text(engine, "src") == b"alive"
        await engine.delete("src")
        with pytest.raises(NotFound):
            engine.head("src")

    run(tmp_path, scenario)


def test_hazard_31_fork_while_appending_then_delete_source(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"base")

        async def appender() -> None:
            for i in range(200):
                await append(engine, "src", b"%d;" % i)

        async def forker() -> None:
            for i in range(20):
                await fork(engine, f"f{i}", "src")
                await asyncio.sleep(0)

        await asyncio.gather(appender(), forker())
        await engine.delete("src")
        with pytest.raises(Gone):
            engine.head("src")
        for i in range(20):
            data = await text(engine, f"f{i}")
            assert data.startswith(b"base")

    run(tmp_path, scenario)


def test_delete_source_while_fork_creation_is_in_flight(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "src", b"data")
        creating = asyncio.create_task(fork(engine, "f", "src"))
        await asyncio.sleep(0)  # the fork is planned and its directory is being written
        await engine.delete("src")
        await creating
        with pytest.raises(Gone):  # the in-flight fork held a reference: soft delete
            engine.head("src")
        assert await text(engine, "f") == b"data"

    run(tmp_path, scenario)


def test_fork_lifetime_inheritance_and_idempotent_refork(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "ttl-src", b"d", ttl_seconds=3600)
        inherited = await fork(engine, "f-inherit", "ttl-src")
        assert inherited.info.ttl_seconds == 3600 and inherited.info.expires_at is None
        assert not (await fork(engine, "f-inherit", "ttl-src")).created  # same effective config
        own = await fork(engine, "f-own", "ttl-src", ttl_seconds=7200)
        assert own.info.ttl_seconds == 7200
        with pytest.raises(ConfigMismatch):
            await fork(engine, "f-own", "ttl-src")  # would inherit 3600
        far = datetime.now(timezone.utc) + timedelta(days=1)
        pinned = await fork(engine, "f-at", "ttl-src", expires_at=far)
        assert pinned.info.ttl_seconds is None and pinned.info.expires_at is not None

        await create(engine, "at-src", b"d", expires_at=far)
        assert (await fork(engine, "f-at-inherit", "at-src")).info.expires_at == (
            engine.head("at-src").expires_at
        )
        assert (await fork(engine, "f-at-ttl", "at-src", ttl_seconds=5)).info.ttl_seconds == 5

    run(tmp_path, scenario)
