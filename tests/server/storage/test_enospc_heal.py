"""Out of space: writers get 507, nothing acknowledged is lost, and the log heals *without a restart*.

A write that fails with ENOSPC poisons the log (``log.py``); once space returns the log re-reads its state
from disk and accepts appends again. These tests inject the error exactly where a full disk raises it
(``os.pwritev``, including a torn partial write first) and check: the failed appends are not remembered
(a producer retry of the failed seq is written, not answered as a duplicate), a still-full disk keeps
failing cleanly, and the healed log survives a restart with the same contents.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.config import ServerConfig
from durastream_server.engine.api import AppendRequest, AppendResult, CreateRequest, ReadRequest
from durastream_server.server import Backend
from durastream_server.storage import log as storage_log
from durastream_server.storage.records import ProducerTuple
from tests.server.http.test_app_inprocess import _call, _started

from ._util import append, entry, header, open_dd, read_all, run

HEAL_DEADLINE_SECONDS = 10.0


class DiskFull:
    """Patch ``os.pwritev`` to tear a write and raise ENOSPC while ``full`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.failures = 0
        real = os.pwritev

        def pwritev(fd: int, buffers, offset: int) -> int:  # type: ignore[no-untyped-def]
            if self.full:
                self.failures += 1
                real(fd, [bytes(buffers[0])[:7]], offset)  # a torn partial record, then the error
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, buffers, offset)

        monkeypatch.setattr(os, "pwritev", pwritev)


async def _until_healed(log) -> None:  # noqa: ANN001
    deadline = time.monotonic() + HEAL_DEADLINE_SECONDS
    while log.poisoned:
        assert time.monotonic() < deadline, "the log did not heal by itself"
        await asyncio.sleep(0.01)


def test_log_heals_after_enospc_without_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = DiskFull(monkeypatch)

    async def go() -> str:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        await append(log, b"1", producer=("p", 0, 0))
        disk.full = True
        failed = log.stage(entry(log, b"2", producer=("p", 0, 1)))
        with pytest.raises(errors.InsufficientStorage):
            await failed
        assert log.poisoned and log.durable_tail == 1
        # Still full: the log heals from disk, the next append fails again (507), nothing is acked.
        await _until_healed(log)
        assert log.state.tail == 1 and log.state.producers["p"].last_seq == 0
        with pytest.raises(errors.InsufficientStorage):
            await log.stage(entry(log, b"2", producer=("p", 0, 1)))
        assert disk.failures == 2
        # Space returns: no restart, the retry of the failed seq is written (not a duplicate).
        disk.full = False
        await _until_healed(log)
        await append(log, b"2", producer=("p", 0, 1))
        await append(log, b"3", producer=("p", 0, 2))
        assert await read_all(log) == [b"1", b"2", b"3"]
        assert log.state.producers["p"].last_seq == 2
        await dd.close()
        return log.id

    log_id = run(go)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert await read_all(log) == [b"1", b"2", b"3"]
        assert log.state.producers["p"].last_seq == 2
        await append(log, b"4")
        assert await read_all(log) == [b"1", b"2", b"3", b"4"]
        await dd.close()

    run(reopen)


def test_heal_after_a_failed_close_reopens_nothing_that_was_acked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append-and-close that failed for space is forgotten: the stream is open after healing."""
    disk = DiskFull(monkeypatch)

    async def go() -> None:
        dd = await open_dd(tmp_path, segment_bytes=200)  # the failed batch opens a new segment
        log = await dd.create_stream(header(), None)
        for i in range(5):
            await append(log, b'"%d"' % i)
        before = await read_all(log)
        disk.full = True
        with pytest.raises(errors.InsufficientStorage):
            await log.stage(entry(log, b'"x"' * 40, closes=True))
        assert log.state.closed  # accepted state was ahead of the disk
        disk.full = False
        await _until_healed(log)
        assert not log.state.closed and not log.durable_closed
        await append(log, b'"after"')
        assert await read_all(log) == [*before, b'"after"']
        await dd.close()

    run(go)


def test_http_writers_get_507_with_a_json_body_then_succeed_when_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = DiskFull(monkeypatch)

    async def scenario() -> None:
        backend = await Backend.open(ServerConfig(data_dir=tmp_path / "data"))
        try:
            app = await _started(backend)  # type: ignore[arg-type]
            path = b"/v1/stream/full"
            plain = [(b"content-type", b"text/plain")]

            def producer(seq: int) -> list[tuple[bytes, bytes]]:
                return [
                    *plain,
                    (b"producer-id", b"w"),
                    (b"producer-epoch", b"0"),
                    (b"producer-seq", str(seq).encode()),
                ]

            status, _, _ = await _call(app, "PUT", path, plain, b"a")
            assert status == 201
            disk.full = True
            status, headers, body = await _call(app, "POST", path, producer(0), b"b")
            assert status == 507, (status, body)
            error = json.loads(body)["error"]
            assert error["code"] == "INSUFFICIENT_STORAGE"
            assert "no space" in error["message"].lower()
            disk.full = False
            deadline = time.monotonic() + HEAL_DEADLINE_SECONDS
            while True:  # the client retries the same tuple until the log has healed
                status, _, body = await _call(app, "POST", path, producer(0), b"b")
                if status != 507:
                    break
                assert time.monotonic() < deadline, "the server did not recover by itself"
                await asyncio.sleep(0.02)
            assert status == 200, (status, body)  # written, not a 204 "duplicate" of the failure
            status, _, body = await _call(app, "GET", path, [], query=b"offset=-1")
            assert status == 200 and body == b"ab"
        finally:
            await backend.close()

    asyncio.run(scenario())


async def _decided_in_the_heals_last_step(
    monkeypatch: pytest.MonkeyPatch, decide: Callable[[], asyncio.Future[AppendResult]]
) -> asyncio.Future[AppendResult]:
    """``decide()`` called in the heal's last step, before it replaces the poisoned state: a request
    arriving then is decided on that state, and its answer is awaited after the heal."""
    decided: list[asyncio.Future[AppendResult]] = []
    real = storage_log.StreamLog._drop_hot

    def decide_then_drop_hot(log: storage_log.StreamLog) -> None:
        if log.poisoned and not decided:
            decided.append(decide())
        real(log)

    monkeypatch.setattr(storage_log.StreamLog, "_drop_hot", decide_then_drop_hot)
    deadline = time.monotonic() + HEAL_DEADLINE_SECONDS
    while not decided:
        assert time.monotonic() < deadline, "the log did not heal by itself"
        await asyncio.sleep(0.01)
    return decided[0]


def test_a_retry_decided_a_duplicate_on_the_poisoned_state_is_not_acknowledged_by_the_heal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poisoned log's state still holds the failed append, so a producer's retry of it is decided
    a duplicate; if the heal lands between that decision and the wait for durability, the healed
    log (nothing pending, the append forgotten) must not let the retry be answered 204: that was a
    lost append (the chaos soak: a 204, then 409 gaps). The retry is decided in the loop turn just
    before the heal's last step, as a request arriving then is."""
    disk = DiskFull(monkeypatch)

    def producer(seq: int) -> AppendRequest:
        return AppendRequest("s", "text/plain", b"%d;" % seq, producer=ProducerTuple("p", 0, seq))

    async def scenario() -> None:
        config = ServerConfig(data_dir=tmp_path / "data", packed_appends=False)
        backend = await Backend.open(config)
        engine = backend.engine
        try:
            await engine.create(CreateRequest("s", content_type="text/plain"))
            await engine.append(producer(0))  # the stream has its directory: heals from it
            disk.full = True
            with pytest.raises(errors.InsufficientStorage):
                await engine.append(producer(1))
            disk.full = False
            retry = await _decided_in_the_heals_last_step(
                monkeypatch, lambda: engine.append_nowait(producer(1))
            )
            with pytest.raises(errors.InsufficientStorage):
                await retry  # 507, not a 204 for an append that is not on disk
            written = await engine.append(producer(1))  # now decided on the healed state
            assert not written.duplicate
            assert (await engine.append(producer(2))).producer_seq == 2
        finally:
            await backend.close()
        backend = await Backend.open(config)
        try:
            await backend.engine.recovered()  # streams recover in the background after a start
            read = await backend.engine.read(ReadRequest("s", offset="-1", max_bytes=1 << 20))
            assert read.body == b"0;1;2;"
        finally:
            await backend.close()

    asyncio.run(scenario())


def test_an_append_found_closed_by_a_failed_close_is_not_refused_after_the_heal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append-and-close that failed for space leaves the poisoned log's state closed; an append
    decided on that state just before the heal's last step must not be answered 409 "closed" once
    the heal has reopened the stream (a writer would stop for good): 507, and its retry is written."""
    disk = DiskFull(monkeypatch)

    async def scenario() -> None:
        backend = await Backend.open(ServerConfig(data_dir=tmp_path / "data", packed_appends=False))
        engine = backend.engine
        try:
            await engine.create(CreateRequest("s", content_type="text/plain"))
            await engine.append(AppendRequest("s", "text/plain", b"a"))
            disk.full = True
            with pytest.raises(errors.InsufficientStorage):
                await engine.append(AppendRequest("s", "text/plain", b"b", close=True))
            disk.full = False
            append = await _decided_in_the_heals_last_step(  # on the failed close's state
                monkeypatch, lambda: engine.append_nowait(AppendRequest("s", "text/plain", b"c"))
            )
            with pytest.raises(errors.InsufficientStorage):
                await append  # 507, not a 409 for a stream that is open
            await engine.append(AppendRequest("s", "text/plain", b"c"))
            read = await engine.read(ReadRequest("s", offset="-1", max_bytes=1 << 20))
            assert read.body == b"ac" and not read.info.closed
        finally:
            await backend.close()

    asyncio.run(scenario())


def test_a_retry_while_the_log_is_poisoned_gets_507_not_a_stream_seq_409(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until it heals, a poisoned log's state still holds the failed append's ``Stream-Seq``: a retry
    checked against it would get 409 (not greater than the last), a refusal for good. It gets the
    storage error (507) instead, and once healed the retry is written."""
    disk = DiskFull(monkeypatch)
    monkeypatch.setattr(storage_log, "HEAL_FIRST_DELAY", 0.5)  # poisoned while the retry comes

    def request() -> AppendRequest:
        return AppendRequest("s", "text/plain", b"b", stream_seq="0002")

    async def scenario() -> None:
        backend = await Backend.open(ServerConfig(data_dir=tmp_path / "data", packed_appends=False))
        engine = backend.engine
        try:
            await engine.create(CreateRequest("s", content_type="text/plain"))
            await engine.append(AppendRequest("s", "text/plain", b"a", stream_seq="0001"))
            disk.full = True
            with pytest.raises(errors.InsufficientStorage):
                await engine.append(request())
            disk.full = False
            with pytest.raises(errors.InsufficientStorage):  # poisoned: not a Stream-Seq 409
                await engine.append(request())
            deadline = time.monotonic() + HEAL_DEADLINE_SECONDS
            while True:  # the writer retries until the log has healed
                try:
                    await engine.append(request())
                    break
                except errors.InsufficientStorage:
                    assert time.monotonic() < deadline, "the log did not heal by itself"
                    await asyncio.sleep(0.02)
            read = await engine.read(ReadRequest("s", offset="-1", max_bytes=1 << 20))
            assert read.body == b"ab"
        finally:
            await backend.close()

    asyncio.run(scenario())
