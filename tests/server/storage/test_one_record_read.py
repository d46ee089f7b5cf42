"""The lean read of an idle stream's one record (``reader.read_one_record``, the multi-range read of
many small streams): the answer of ``read_range`` exactly, and ``read_range`` itself for anything else."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from durastream_server.storage import DataDir, StreamLog
from durastream_server.storage.codec import CorruptRecord
from durastream_server.storage.columns import MessageColumns
from durastream_server.storage.log import DiskRead
from durastream_server.storage.packview import PackedView
from durastream_server.storage.reader import (
    parse_one_record,
    parse_record_into,
    preread_records,
    read_one_record,
    read_range,
)
from durastream_server.storage.segments import SegmentView

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


def _fields(columns: MessageColumns) -> tuple:
    return (
        bytes(columns.values),
        list(columns.lengths),
        columns.shifts,
        columns.counts,
        columns.times,
    )


def _record_bytes(read: DiskRead) -> bytes:
    """What ``read_one_record`` would ``pread`` for a directory stream's read: its last segment's
    bytes from the record it scans from to the view's end."""
    view = read.segments
    assert type(view) is SegmentView
    fd = os.open(view.path(view.bases[-1]), os.O_RDONLY)
    try:
        return os.pread(fd, view.end - read.scan_from, read.scan_from - view.bases[-1])
    finally:
        os.close(fd)


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
                # Into columns: not this read either, and the columns are left as they were.
                buf = _record_bytes(read)
                columns = MessageColumns()
                args = (read.scan_from, read.start, read.cap, budget, OVERHEAD)
                assert parse_record_into(columns, (buf, 0, len(buf)), *args) == 0, name
                assert _fields(columns) == _fields(MessageColumns()), name
                assert read.run(budget, True, True, OVERHEAD) == _general(read, budget), name
            # The budget cuts the first record: the general read returns a part of it.
            cut = await _disk_read(log, 0, first_end)
            slices, next_position, count = cut.run(100, True, True, OVERHEAD)
            assert 0 < count < len(MESSAGES) and next_position < first_end
        finally:
            await dd.close()

    run(go)


async def _packed_neighbours(dd: DataDir, count: int) -> list[DiskRead]:
    """``count`` packed streams of one append each, whose records lie side by side in one WAL file,
    each planned as a disk read of its whole stream."""
    logs = [await dd.create_stream(header(f"/n{i}"), None) for i in range(count)]
    for i, log in enumerate(logs):
        await append(log, *MESSAGES[: 1 + i % len(MESSAGES)])
    return [await _disk_read(log, 0, log.durable_tail) for log in logs]


def test_neighbouring_records_are_read_by_one_pread_and_parsed_in_place(tmp_path: Path) -> None:
    """Packed streams' records side by side in one file come back from one ``pread`` (one shared
    buffer, each record's own span of it), and each parses to what its single read answers."""

    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        try:
            reads = await _packed_neighbours(dd, 12)
            assert all(type(read.segments) is PackedView for read in reads)
            got = preread_records([(r.segments, r.scan_from) for r in reads], reads[0].cache)
            assert all(item is not None for item in got)
            assert len({id(item[0]) for item in got if item is not None}) == 1  # one pread
            columns, expected = MessageColumns(), MessageColumns()
            for read, item in zip(reads, got, strict=True):
                assert item is not None
                buf, at, stop = item
                assert stop - at == read.segments.end - read.scan_from
                lean = parse_one_record(
                    buf, read.scan_from, read.start, read.cap, 1 << 20, OVERHEAD, at, stop
                )
                assert lean is not None and lean == _general(read, 1 << 20)
                expected.add(lean[0])
                count = parse_record_into(
                    columns, item, read.scan_from, read.start, read.cap, 1 << 20, OVERHEAD
                )
                assert count == lean[2]
            # Straight into columns: the same messages, positions and times as the runs give.
            assert _fields(columns) == _fields(expected)
        finally:
            await dd.close()

    run(go)


def test_a_damaged_record_among_neighbours_fails_alone(tmp_path: Path) -> None:
    """A record damaged on disk in the middle of one ``pread`` of neighbours fails its checksum,
    as its single read does; the records before and after it in the same buffer still parse."""

    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        try:
            reads = await _packed_neighbours(dd, 9)
            victim = reads[4]
            view = victim.segments
            row = len(view.rows) - 4
            file, offset, _, position = view.rows[row : row + 4]
            at = victim.scan_from - (position - offset)  # the record's offset in its file
            fd = os.open(view.files.path(file & 1, file >> 1), os.O_RDWR)
            try:
                (byte,) = os.pread(fd, 1, at + victim.segments.end - victim.scan_from - 3)
                os.pwrite(fd, bytes([byte ^ 0xFF]), at + victim.segments.end - victim.scan_from - 3)
            finally:
                os.close(fd)
            got = preread_records([(r.segments, r.scan_from) for r in reads], victim.cache)
            assert len({id(item[0]) for item in got if item is not None}) == 1
            for read, item in zip(reads, got, strict=True):
                assert item is not None
                buf, start, stop = item
                args = (buf, read.scan_from, read.start, read.cap, 1 << 20, OVERHEAD, start, stop)
                if read is victim:
                    with pytest.raises(CorruptRecord, match="checksum"):
                        parse_one_record(*args)
                    columns = MessageColumns()
                    with pytest.raises(CorruptRecord, match="checksum"):
                        parse_record_into(columns, item, *args[1:6])
                    assert _fields(columns) == _fields(MessageColumns())  # nothing added
                    with pytest.raises(CorruptRecord, match="checksum"):
                        read.run(1 << 20, True, True, OVERHEAD, evict=False)
                else:
                    assert parse_one_record(*args) == _general(read, 1 << 20)
        finally:
            await dd.close()

    run(go)


def test_directory_streams_are_read_without_caching_their_files(tmp_path: Path) -> None:
    """Directory streams' records: a cached file read through its handle, the others opened for
    their one ``pread`` and closed (the cache does not grow, no fd is left open), each answering
    what its single read answers; a file gone since planning (the stream deleted) is left to the
    single read, which fails as it should."""

    async def go() -> None:
        dd = await open_dd(tmp_path)
        try:
            logs = [await dd.create_stream(header(f"/d{i}"), None) for i in range(6)]
            for i, log in enumerate(logs):
                await append(log, *MESSAGES[: 1 + i])
            reads = [await _disk_read(log, 0, log.durable_tail) for log in logs]
            assert all(type(read.segments) is SegmentView for read in reads)
            cache = reads[0].cache
            kept = (reads[1].segments.log_id, reads[1].segments.bases[-1])
            cache.discard(lambda key: key != kept)  # the others as a busy server would have evicted
            cached = cache.acquire(kept, reads[1].segments.path(kept[1]))
            cache.release(cached)
            gone = reads[4].segments
            os.unlink(gone.path(gone.bases[-1]))
            keys_before, refs_before = set(cache._open), cached.refs
            fds_before = len(os.listdir("/proc/self/fd"))
            got = preread_records([(r.segments, r.scan_from) for r in reads], cache)
            assert set(cache._open) == keys_before and cached.refs == refs_before
            assert len(os.listdir("/proc/self/fd")) == fds_before
            columns, expected = MessageColumns(), MessageColumns()
            for read, item in zip(reads, got, strict=True):
                if read.segments is gone:
                    assert item is None
                    with pytest.raises(FileNotFoundError):
                        read.run(1 << 20, True, True, OVERHEAD, evict=False)
                    continue
                assert item is not None
                buf, at, stop = item
                lean = parse_one_record(
                    buf, read.scan_from, read.start, read.cap, 1 << 20, OVERHEAD, at, stop
                )
                assert lean is not None and lean == _general(read, 1 << 20)
                expected.add(lean[0])
                count = parse_record_into(
                    columns, item, read.scan_from, read.start, read.cap, 1 << 20, OVERHEAD
                )
                assert count == lean[2]
            # Straight into columns: the same messages, positions and times as the runs give.
            assert _fields(columns) == _fields(expected)
        finally:
            await dd.close()

    run(go)
