"""Engine-level scenarios for the remaining hazards of /work/shared/hazards.md (by number)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.engine.producer_sweep import ProducerPolicy
from durastream_server.errors import BadRequest, ProducerForgotten, StorageFailure, StreamClosed
from durastream_server.offsets import format_offset
from tests.server.engine.support import (
    FakeClock,
    append,
    close_engine,
    create,
    open_engine,
    read,
    run,
    text,
)


def test_hazard_19_dedup_and_closure_survive_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        data, engine = await open_engine(tmp_path)
        await create(engine, "s")
        await append(engine, "s", b"a", producer=("p", 0, 0), stream_seq="001")
        await append(engine, "s", b"b", producer=("p", 0, 1), stream_seq="002", close=True)
        await close_engine(data, engine)

        data, engine = await open_engine(tmp_path)
        try:
            for seq, body in ((0, b"a"), (1, b"b")):
                retry = await append(engine, "s", body, producer=("p", 0, seq), close=seq == 1)
                assert retry.duplicate and retry.closed
            with pytest.raises(StreamClosed):
                await append(engine, "s", b"c", producer=("p", 0, 2))
            assert await text(engine, "s") == b"ab"
        finally:
            await close_engine(data, engine)

    asyncio.run(main())


def test_hazard_22_non_canonical_offsets_are_rejected(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        await create(engine, "s", b"0123456789")
        for bad in ("0_5", "1_0", "5", "0000000000000000_5", "0000000000000001_0000000000000005"):
            with pytest.raises(BadRequest):
                await read(engine, "s", bad)
            with pytest.raises(BadRequest):
                await engine.wait("s", bad, 0.01)
            with pytest.raises(BadRequest):
                await create(engine, "f", forked_from="s", content_type=None, fork_offset=bad)
        assert b"".join((await read(engine, "s", format_offset(5))).messages) == b"56789"

    run(tmp_path, scenario)


def test_hazard_34_a_late_retry_is_a_duplicate_or_refused_never_new_data(tmp_path: Path) -> None:
    """Hazard 34 asks for a defined behaviour, 403/409 rather than silent acceptance: within the expiry
    a late retry is a duplicate; after it, 409 PRODUCER_FORGOTTEN for a client that asks (the connector
    always does); with ``--producer-expiry-seconds 0`` producers are never forgotten."""
    clock = FakeClock()
    week = 7 * 24 * 3600

    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        await append(engine, "s", b"batch", producer=("q-p", 0, 0))
        clock.advance(week - 60)
        await engine.sweep_producers()
        assert (await append(engine, "s", b"batch", producer=("q-p", 0, 0))).duplicate
        clock.advance(week + 1)
        await engine.sweep_producers()
        with pytest.raises(ProducerForgotten):
            await append(engine, "s", b"batch", producer=("q-p", 0, 0), refuse_forgotten=True)
        assert await text(engine, "s") == b"batch"

    run(tmp_path, scenario, clock=clock)

    async def never(engine: Engine) -> None:
        await create(engine, "n")
        await append(engine, "n", b"batch", producer=("p", 0, 0))
        clock.advance(365 * 24 * 3600)
        await engine.sweep_producers()
        assert (await append(engine, "n", b"batch", producer=("p", 0, 0))).duplicate
        assert (await append(engine, "n", b"next", producer=("p", 0, 1))).producer_seq == 1
        assert await text(engine, "n") == b"batchnext"

    run(tmp_path / "never", never, clock=clock, policy=ProducerPolicy(0, 0, 0))


def test_hazard_40_json_lookalike_types_are_plain_bytes(tmp_path: Path) -> None:
    async def scenario(engine: Engine) -> None:
        patch_type = "application/json-patch+json"
        await create(engine, "p", b"[1,2]", content_type=patch_type)
        await append(engine, "p", b"not json at all", content_type=patch_type)
        result = await read(engine, "p")
        assert not result.json
        assert result.messages == (b"[1,2]", b"not json at all")
        # And a real JSON stream with parameters is JSON everywhere.
        await create(engine, "j", b"[1,2]", content_type="Application/JSON; charset=utf-8")
        assert (await read(engine, "j")).messages == (b"1", b"2")

    run(tmp_path, scenario)


def test_storage_failure_is_never_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write poisons the log: the append fails and its retry is not a 204 duplicate."""

    def broken_write(*args: object, **kwargs: object) -> object:
        raise OSError(errno.EIO, "injected I/O error")

    async def scenario(engine: Engine) -> None:
        await create(engine, "s", b"ok")
        monkeypatch.setattr(os, "pwritev", broken_write)  # where a disk would raise it
        with pytest.raises(StorageFailure):
            await append(engine, "s", b"lost", producer=("p", 0, 0))
        with pytest.raises(StorageFailure):
            await append(engine, "s", b"lost", producer=("p", 0, 0))
        with pytest.raises(StorageFailure):
            await append(engine, "s", b"", close=True)
        assert b"".join((await read(engine, "s")).messages) == b"ok"
        assert not engine.head("s").closed

    run(tmp_path, scenario)
