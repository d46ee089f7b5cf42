"""The cyclic GC's young threshold while bulk requests are in flight (``http/collections_hold.py``):
raised by the first, put back exactly by the last, whatever the order they end in or how."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durastream_server.engine.engine import Engine
from durastream_server.http import bulk, multirange
from durastream_server.http.collections_hold import (
    BULK,
    BULK_YOUNG_THRESHOLD,
    SERVING_YOUNG_THRESHOLD,
    BulkCollections,
    start_serving,
)
from durastream_server.http.handlers import Request
from tests.server.engine.support import Recorder, append, create, run


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The test's own starting thresholds (the interpreter default), put back afterwards."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*saved)


def test_the_first_hold_raises_the_young_threshold_and_the_last_puts_it_back(
    thresholds: tuple[int, int, int],
) -> None:
    holds = BulkCollections()

    async def request(started: asyncio.Event, release: asyncio.Event, seen: list[Any]) -> None:
        with holds.held():
            started.set()
            await release.wait()
            seen.append((gc.get_threshold(), holds.depth))

    async def main() -> list[Any]:
        seen: list[Any] = []
        first_in, second_in = asyncio.Event(), asyncio.Event()
        first_out, second_out = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(request(first_in, first_out, seen))
        await first_in.wait()
        second = asyncio.create_task(request(second_in, second_out, seen))
        await second_in.wait()
        first_out.set()  # the first to start ends first: the second still holds
        await first
        seen.append((gc.get_threshold(), holds.depth))
        second_out.set()
        await second
        seen.append((gc.get_threshold(), holds.depth))
        return seen

    raised = (BULK_YOUNG_THRESHOLD, thresholds[1], thresholds[2])
    assert asyncio.run(main()) == [(raised, 2), (raised, 1), (raised, 1), (thresholds, 0)]


def test_a_hold_that_raises_or_is_cancelled_puts_the_thresholds_back(
    thresholds: tuple[int, int, int],
) -> None:
    holds = BulkCollections()
    with pytest.raises(RuntimeError, match="entry failed"), holds.held():
        assert gc.get_threshold()[0] == BULK_YOUNG_THRESHOLD
        raise RuntimeError("entry failed")
    assert gc.get_threshold() == thresholds and holds.depth == 0

    async def parked() -> None:
        with holds.held():
            await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.create_task(parked())
        await asyncio.sleep(0)
        assert holds.depth == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert gc.get_threshold() == thresholds and holds.depth == 0


def test_a_disabled_hold_counts_but_leaves_the_thresholds(thresholds: tuple[int, int, int]) -> None:
    holds = BulkCollections(enabled=False)
    with holds.held():
        assert holds.depth == 1 and gc.get_threshold() == thresholds
    assert holds.depth == 0 and gc.get_threshold() == thresholds


def test_a_hold_never_lowers_a_higher_threshold_nor_turns_collections_on() -> None:
    saved = gc.get_threshold()
    holds = BulkCollections()
    try:
        for young in (0, 5 * BULK_YOUNG_THRESHOLD):
            gc.set_threshold(young, 10, 10)
            with holds.held():
                assert gc.get_threshold() == (young, 10, 10)
            assert gc.get_threshold() == (young, 10, 10)
    finally:
        gc.set_threshold(*saved)


def _request(body: bytes, content_type: str, sent: list[dict[str, Any]] | None = None) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if sent is not None:
            sent.append(message)

    headers = {"content-type": content_type, "content-length": str(len(body))}
    return Request(
        method="POST",
        raw_path=b"/v1/stream/__ds/x-durastream/ensure",
        query_string=b"",
        headers=headers,
        scheme="http",
        server=None,
        receive=receive,
        send=send,
    )


class _Probe(Recorder):
    """Notes the threshold and the holds in flight when each stream is created and appended to."""

    def __init__(self) -> None:
        super().__init__()
        self.during: set[tuple[int, int]] = set()

    def on_created(self, path: str, next_offset: str) -> None:
        self.during.add((gc.get_threshold()[0], BULK.depth))

    def on_appended(self, path: str, next_offset: str) -> None:
        self.during.add((gc.get_threshold()[0], BULK.depth))


def test_bulk_ensure_and_commits_run_their_entries_under_the_hold(
    tmp_path: Path, thresholds: tuple[int, int, int]
) -> None:
    """The real handlers on a real engine: every entry's create and append happens with the raised
    threshold, and once answered the thresholds are the ones before."""
    assert BULK.enabled  # on by default (collections_hold.py)
    probe = _Probe()
    paths = [f"held/s{i}" for i in range(50)]

    async def scenario(engine: Engine) -> None:
        engine.add_observer(probe)
        body = json.dumps({"streams": paths, "content_type": "application/json"}).encode()
        answer = await bulk.serve_ensure(engine, _request(body, "application/json"), 1 << 20)
        assert all(r["created"] for r in answer["results"]), answer
        assert gc.get_threshold() == thresholds and BULK.depth == 0
        entries = [
            (
                path,
                {
                    "Content-Type": "application/json",
                    "Durastream-Commit-Key": "k0",
                    "Producer-Id": f"w{i}",
                    "Producer-Epoch": "0",
                    "Producer-Seq": "0",
                },
                json.dumps([{"i": i}]).encode(),
            )
            for i, path in enumerate(paths)
        ]
        body = bulk.encode_requests(entries)
        answer = await bulk.serve_commits(engine, _request(body, bulk.CONTENT_TYPE), 1 << 20)
        assert all(r["status"] == 200 for r in answer["results"]), answer
        assert gc.get_threshold() == thresholds and BULK.depth == 0

    run(tmp_path, scenario)
    assert probe.during == {(BULK_YOUNG_THRESHOLD, 1)}


def test_a_multi_range_read_runs_under_the_hold(
    tmp_path: Path, thresholds: tuple[int, int, int]
) -> None:
    """The real multi-range read handler: its ranges are read with the raised threshold (each keeps
    its objects alive until the answer is sent, as a bulk entry does), and once answered, or failed,
    the thresholds are the ones before."""
    paths = [f"mr/s{i}" for i in range(20)]
    during: set[tuple[int, int]] = set()

    async def scenario(engine: Engine) -> None:
        for i, path in enumerate(paths):
            await create(engine, path)
            await append(engine, path, f"m{i}".encode())
        # format=frames (the default) reads into columns (read_range_frames); frames-lines would
        # read answers (read_range_answers).
        read_frames = engine.read_range_frames

        async def noting(*args: Any, **kwargs: Any) -> Any:  # the real read, the threshold noted
            during.add((gc.get_threshold()[0], BULK.depth))
            return await read_frames(*args, **kwargs)

        engine.read_range_frames = noting  # type: ignore[method-assign]
        ranges = [
            {"path": path, "offset": "-1", "end": engine.head(path).next_offset} for path in paths
        ]
        sent: list[dict[str, Any]] = []
        body = json.dumps({"ranges": ranges}).encode()
        await multirange.serve_reads(
            engine, _request(body, "application/json", sent), 1 << 20, 1 << 20
        )
        assert sent[0]["status"] == 200 and b'"end_reached":true' in sent[1]["body"]
        assert gc.get_threshold() == thresholds and BULK.depth == 0
        with pytest.raises(Exception, match="format must be one of"):
            bad = json.dumps({"ranges": ranges, "format": "nope"}).encode()
            await multirange.serve_reads(
                engine, _request(bad, "application/json"), 1 << 20, 1 << 20
            )
        assert gc.get_threshold() == thresholds and BULK.depth == 0

    run(tmp_path, scenario)
    assert during == {(BULK_YOUNG_THRESHOLD, 1)}


def test_serving_freezes_the_heap_and_raises_the_young_threshold_once(
    thresholds: tuple[int, int, int],
) -> None:
    """What the server does once it listens: the heap frozen, the young threshold raised to
    ``SERVING_YOUNG_THRESHOLD`` with the older ones kept; a bulk hold then raises it further and
    puts the serving one back."""
    try:
        start_serving()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (SERVING_YOUNG_THRESHOLD, *thresholds[1:])
        with BulkCollections().held():
            assert gc.get_threshold()[0] == BULK_YOUNG_THRESHOLD
        assert gc.get_threshold() == (SERVING_YOUNG_THRESHOLD, *thresholds[1:])
        gc.set_threshold(0, 10, 10)  # collections off (an embedding process's choice): kept off
        start_serving()
        assert gc.get_threshold() == (0, 10, 10)
    finally:
        gc.unfreeze()
