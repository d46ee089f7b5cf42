"""The lean read of an idle stream's one record (``reader.read_one_record``, the multi-range read of
many small streams): the answer of ``read_range`` exactly, and ``read_range`` itself for anything else."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from durastream_server.storage import StreamLog
from durastream_server.storage.log import DiskRead
from durastream_server.storage.reader import read_one_record, read_range

from ._util import append, header, open_dd, run

OVERHEAD = 16
MESSAGES = [b'{"i":%d,"pad":"%s"}' % (i, b"x" * (i * 7 % 40)) for i in range(10)]


async def _disk_read(log: StreamLog, start: int, end: int) -> DiskRead:
    """The log's planned disk read of ``[start, end)``, once the just-committed tail is no longer kept
    in memory (a read of it is then planned from disk)."""
    deadline = time.monotonic() + 10
    while True:
        planned = log.plan_read(start, end)
        if isinstance(planned, DiskRead):
            return planned
        assert time.monotonic() < deadline, f"the read of [{start}, {end}) stayed in memory"
        await asyncio.sleep(0.02)


def _general(read: DiskRead, max_bytes: int) -> tuple[list, int, int]:
    return read_range(
        read.segments,
        read.cache,
        read.scan_from,
        read.start,
        read.cap,
        max_bytes,
        True,
        True,
        OVERHEAD,
    )


def _lean(read: DiskRead, max_bytes: int) -> tuple[list, int, int] | None:
    return read_one_record(
        read.segments, read.cache, read.scan_from, read.start, read.cap, max_bytes, OVERHEAD
    )


def test_one_record_is_read_as_read_range_reads_it(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        try:
            log = await dd.create_stream(header(), None)
            await append(log, *MESSAGES)
            read = await _disk_read(log, 0, log.durable_tail)
            lean = _lean(read, 1 << 20)
            assert lean is not None
            assert lean == _general(read, 1 << 20)
            slices, next_position, count = lean
            assert (next_position, count) == (log.durable_tail, len(MESSAGES))
            assert bytes(slices[0].data) == b"".join(MESSAGES)
            assert read.run(1 << 20, True, True, OVERHEAD, evict=False) == lean
        finally:
            await dd.close()

    run(go)


def test_other_reads_are_left_to_read_range(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        try:
            log = await dd.create_stream(header(), None)
            await append(log, *MESSAGES)
            first_end = log.durable_tail
            await append(log, b'{"later":1}', b'{"later":2}')
            tail = log.durable_tail
            cases = {
                "two records": (0, tail, 1 << 20),
                "the second record only": (first_end, tail, 1 << 20),
                "a record cut short by the budget": (0, first_end, 100),
            }
            for name, (start, end, budget) in cases.items():
                read = await _disk_read(log, start, end)
                assert _lean(read, budget) is None, name
                assert read.run(budget, True, True, OVERHEAD) == _general(read, budget), name
            # The budget cuts the first record: the general read returns a part of it.
            cut = await _disk_read(log, 0, first_end)
            slices, next_position, count = cut.run(100, True, True, OVERHEAD)
            assert 0 < count < len(MESSAGES) and next_position < first_end
        finally:
            await dd.close()

    run(go)
