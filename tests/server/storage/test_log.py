"""StreamLog: appends, reads, boundaries, group commit, durability and failure poisoning."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.storage import Durability, InvalidPosition, StreamLog, committer

from ._util import append, entry, header, open_dd, read_all, run, segment_files


def _json_messages(n: int, seed: int = 1) -> list[bytes]:
    rnd = random.Random(seed)
    return [b'{"i":%d,"pad":"%s"}' % (i, b"x" * rnd.randrange(0, 300)) for i in range(n)]


def test_json_messages_across_segments_and_index_points(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, segment_bytes=4096, index_interval_bytes=700)
        log = await dd.create_stream(header(), None)
        messages = _json_messages(600)
        staged = []
        i = 0
        rnd = random.Random(2)
        while i < len(messages):  # batches of 1..5 messages per entry, 8 entries in flight
            k = rnd.randrange(1, 6)
            staged.append(log.stage(entry(log, *messages[i : i + k])))
            i += k
            if len(staged) == 8:
                await asyncio.gather(*staged)
                staged.clear()
        await asyncio.gather(*staged)
        assert len(segment_files(tmp_path, log.id)) > 5
        assert await read_all(log) == messages
        assert await read_all(log, chunk=1) == messages  # one message per read at least

        boundaries = [0]
        for m in messages:
            boundaries.append(boundaries[-1] + len(m))
        assert log.durable_tail == boundaries[-1]
        for _ in range(200):  # random whole-message reads agree with the model
            k = rnd.randrange(len(messages))
            got = await log.read(boundaries[k], rnd.randrange(1, 3000), whole_messages=True)
            n = len(got.slices)
            assert n >= 1
            assert [s.data for s in got.slices] == messages[k : k + n]
            assert [s.position for s in got.slices] == boundaries[k : k + n]
            assert got.next_position == boundaries[k + n]
            assert all(s.whole for s in got.slices)
        for _ in range(300):  # ... and with an end: never past it, whole records or single messages
            k = rnd.randrange(len(messages))
            e = rnd.randrange(k + 1, len(messages) + 1)
            budget = rnd.choice([1, 500, 3000, 1 << 20])
            got = await log.read(boundaries[k], budget, boundaries[e], whole_messages=True)
            n = len(got.slices)
            assert 1 <= n <= e - k
            assert [s.data for s in got.slices] == messages[k : k + n]
            assert [s.position for s in got.slices] == boundaries[k : k + n]
            assert got.next_position == boundaries[k + n]
            assert n == 1 or boundaries[k + n] - boundaries[k] <= budget
            assert n == e - k or boundaries[k + n + 1] - boundaries[k] > budget
        await dd.close()

    run(go)


def test_byte_reads_split_messages(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, segment_bytes=2048, index_interval_bytes=300)
        log = await dd.create_stream(header(content_type="application/octet-stream"), None)
        rnd = random.Random(3)
        chunks = [
            bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 500))) for _ in range(80)
        ]
        for c in chunks:
            await append(log, c)
        data = b"".join(chunks)
        assert log.durable_tail == len(data)
        for _ in range(300):
            start = rnd.randrange(len(data) + 1)
            max_bytes = rnd.randrange(1, 2000)
            end = rnd.choice([None, rnd.randrange(start, len(data) + 1)])
            got = await log.read(start, max_bytes, end, whole_messages=False)
            limit = len(data) if end is None else end
            want = data[start : min(limit, start + max_bytes)]
            assert b"".join(s.data for s in got.slices) == want
            assert got.next_position == start + len(want)
            pos = start
            for s in got.slices:
                assert s.position == pos
                pos += len(s.data)
        # A slice is whole exactly when it is a complete stored message.
        got = await log.read(len(chunks[0]), 10**6, whole_messages=False)
        assert got.slices[0].whole and got.slices[0].data == chunks[1]
        got = await log.read(1, 10**6, whole_messages=False)
        assert not got.slices[0].whole
        await dd.close()

    run(go)


def test_large_messages(tmp_path: Path) -> None:
    """Messages larger than a segment, the read-ahead block and the whole-record checksum limit."""

    async def go() -> None:
        dd = await open_dd(tmp_path, segment_bytes=64 * 1024)
        log = await dd.create_stream(header(content_type="application/octet-stream"), None)
        big = os.urandom(3 * 1024 * 1024)
        small = b"after"
        await append(log, b"before")
        await append(log, big)
        await append(log, small)
        got = await log.read(6, 10, whole_messages=True)  # at least one message, even if huge
        assert [s.data for s in got.slices] == [big]
        got = await log.read(6 + 1000, 5000, whole_messages=False)  # a part of a huge record
        assert got.slices[0].data == big[1000:6000] and not got.slices[0].whole
        assert b"".join(await read_all(log, whole_messages=False, chunk=700_000)) == (
            b"before" + big + small
        )
        await dd.close()

    run(go)


def test_read_bounds_and_invalid_positions(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        fork = await dd.create_stream(
            header(fork_source_id="src", fork_source_path="/src", fork_position=100), None
        )
        assert fork.base == 100 and fork.state.tail == 100 and fork.durable_tail == 100
        await append(fork, b'"ab"', b'"cd"')
        assert fork.durable_tail == 108
        for bad in (0, 99, 109):
            with pytest.raises(InvalidPosition):
                await fork.read(bad, 100, whole_messages=True)
        with pytest.raises(InvalidPosition):  # inside a message
            await fork.read(102, 100, whole_messages=True)
        got = await fork.read(104, 100, whole_messages=True)
        assert [s.data for s in got.slices] == [b'"cd"'] and got.next_position == 108
        got = await fork.read(108, 100, whole_messages=True)  # at the tail: empty
        assert got.slices == () and got.next_position == 108
        got = await fork.read(100, 100, 104, whole_messages=True)  # end cap
        assert [s.data for s in got.slices] == [b'"ab"'] and got.next_position == 104
        got = await fork.read(100, 100, 103, whole_messages=True)  # end inside a message
        assert got.slices == () and got.next_position == 100
        got = await fork.read(100, 1, whole_messages=True)  # at least one message
        assert [s.data for s in got.slices] == [b'"ab"']
        await dd.close()

    run(go)


def test_readers_never_see_staged_data(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        await append(log, b"1")
        pending = log.stage(entry(log, b"2"))
        assert log.state.tail == 2 and log.durable_tail == 1
        got = await log.read(0, 100, whole_messages=True)
        assert [s.data for s in got.slices] == [b"1"]
        await pending
        assert log.durable_tail == 2
        await dd.close()

    run(go)


def test_boundaries(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, index_interval_bytes=64)
        log = await dd.create_stream(header(), None)
        for i in range(30):
            await append(log, b"[%02d]" % i, b'"x"')  # 4 + 3 bytes per entry
        staged = log.stage(entry(log, b"[99]", b'"y"'))  # staged, not yet durable
        assert await log.is_boundary(0) and await log.is_boundary(4) and await log.is_boundary(7)
        assert not await log.is_boundary(1) and not await log.is_boundary(5)
        assert await log.is_boundary(210) and await log.is_boundary(214)
        assert await log.is_boundary(217)
        assert not await log.is_boundary(212) and not await log.is_boundary(218)
        assert await log.boundary_after(0, 0, messages=True) == 0
        assert await log.boundary_after(0, 3, messages=True) == 11
        assert await log.boundary_after(203, 3, messages=True) == 214  # runs into staged entries
        assert await log.boundary_after(0, 62, messages=True) == 217
        with pytest.raises(InvalidPosition):
            await log.boundary_after(0, 63, messages=True)
        with pytest.raises(InvalidPosition):
            await log.boundary_after(1, 1, messages=True)
        assert await log.boundary_after(7, 4, messages=False) == 11
        assert await log.boundary_after(7, 2, messages=False) == 9
        with pytest.raises(InvalidPosition):
            await log.boundary_after(7, 5, messages=False)  # past the end of the message at 7
        with pytest.raises(InvalidPosition):
            await log.boundary_after(217, 1, messages=False)
        await staged
        await dd.close()

    run(go)


def test_listeners_fire_after_durable_commit(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        seen: list[int] = []
        unsubscribe = log.add_listener(lambda: seen.append(log.durable_tail))
        log.add_listener(lambda: 1 / 0)  # a failing listener does not break the commit
        await append(log, b"1")
        await append(log, b"22", closes=True)
        assert seen == [1, 3]
        assert log.durable_closed and log.state.closed
        unsubscribe()
        log.stage_soft_delete()
        await log.flush()
        assert seen == [1, 3] and log.state.soft_deleted
        await dd.close()

    run(go)


def test_group_commit_shares_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)

    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        syncs.clear()

        async def writer(w: int) -> None:
            for i in range(20):
                await log.stage(entry(log, b'{"w":%d,"i":%d}' % (w, i), producer=(f"p{w}", 0, i)))

        await asyncio.gather(*(writer(w) for w in range(32)))
        assert log.state.entries == 640
        assert 0 < len(syncs) < 640 / 4, len(syncs)
        assert len(await read_all(log)) == 640
        await dd.close()

    run(go)


def test_hazard_30_every_acked_append_was_fsynced_on_the_fd_it_was_written_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hazard 30, with the shared write-ahead log (storage/committer.py): with a one-entry fd cache,
    three streams whose segments roll and WAL files that rotate, (1) every acknowledged append's record
    was written to a WAL file and that same fd synced before the acknowledgement, and (2) a WAL file is
    removed only after every segment fd written while it was current has been synced, on that fd."""
    monkeypatch.setattr(committer, "CHECKPOINT_WAL_BYTES", 3000)  # rotate every few rounds
    events: list[tuple[str, int, int, bytes]] = []  # (op, fd, inode, bytes written)
    real_pwritev, real_pwrite, real_sync, real_unlink = (
        os.pwritev,
        os.pwrite,
        os.fdatasync,
        os.unlink,
    )

    def pwritev(fd: int, buffers, offset: int) -> int:  # type: ignore[no-untyped-def]
        events.append(("write", fd, os.fstat(fd).st_ino, b"".join(bytes(b) for b in buffers)))
        return real_pwritev(fd, buffers, offset)

    def pwrite(fd: int, data, offset: int) -> int:  # type: ignore[no-untyped-def]
        events.append(("write", fd, os.fstat(fd).st_ino, bytes(data)))
        return real_pwrite(fd, data, offset)

    def fdatasync(fd: int) -> None:
        events.append(("sync", fd, os.fstat(fd).st_ino, b""))
        real_sync(fd)

    def unlink(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        events.append(("unlink", -1, os.stat(path).st_ino, str(path).encode()))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "pwritev", pwritev)
    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "unlink", unlink)
    segment_inodes: set[int] = set()

    async def go() -> None:
        dd = await open_dd(tmp_path, max_open_files=1, segment_bytes=1500)
        logs: list[StreamLog] = [await dd.create_stream(header(f"/s{i}"), None) for i in range(3)]
        for round_ in range(40):
            futs = []
            for n, log in enumerate(logs):
                payload = b'"s%d-r%02d"' % (n, round_)
                fut = log.stage(entry(log, payload))
                fut.add_done_callback(lambda _f, p=payload: events.append(("ack", -1, -1, p)))
                futs.append(fut)
            await asyncio.gather(*futs)
        for log in logs:
            assert len(segment_files(tmp_path, log.id)) > 1  # segments rolled too
            segment_inodes.update(p.stat().st_ino for p in segment_files(tmp_path, log.id))
        await dd.close()
        assert not list((tmp_path / "wal").iterdir())  # a clean shutdown leaves nothing to replay

    run(go)
    wal_inodes = {ino for op, _, ino, data in events if op == "unlink" and data.endswith(b".wal")}
    assert len(wal_inodes) >= 2  # the WAL rotated (the first rotation waits for no checkpoint)
    acks = 0
    for at, (op, _, _, payload) in enumerate(events):
        if op != "ack":
            continue
        acks += 1
        # (1) a write of the record to a WAL fd, then a sync of that fd, before the ack
        synced = False
        for i, (op1, fd, ino, data) in enumerate(events[:at]):
            if op1 == "write" and ino in wal_inodes and payload in data:
                synced = any(op2 == "sync" and fd2 == fd for op2, fd2, _, _ in events[i + 1 : at])
        assert synced, f"ack of {payload!r} before its WAL write was synced"
    assert acks == 120
    for at, (op, _, wal_ino, name) in enumerate(events):
        if op != "unlink" or wal_ino not in wal_inodes:
            continue
        # (2) every segment write made before the last write to this WAL file was synced on its fd
        last = max(i for i, e in enumerate(events[:at]) if e[0] == "write" and e[2] == wal_ino)
        for i, (op1, fd, ino, _) in enumerate(events[:last]):
            if op1 == "write" and ino in segment_inodes:
                assert any(
                    e[0] == "sync" and e[1] == fd and e[2] == ino for e in events[i + 1 : at]
                ), f"{name!r} removed before a segment written through fd {fd} was synced"


def test_enospc_poisons_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwritev
    fail = {"on": False}

    def pwritev(fd: int, buffers, offset: int) -> int:  # type: ignore[no-untyped-def]
        if fail["on"]:
            real(fd, [bytes(buffers[0])[:10]], offset)  # a torn partial write, then the error
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)

    async def go() -> tuple[str, int]:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        other = await dd.create_stream(header("/other"), None)
        await append(log, b"1")
        fail["on"] = True
        first = log.stage(entry(log, b"2"))
        second = log.stage(entry(log, b"3"))
        for fut in (first, second):
            with pytest.raises(errors.InsufficientStorage):
                await fut
        assert log.poisoned
        with pytest.raises(errors.InsufficientStorage):
            await log.stage(entry(log, b"4"))
        with pytest.raises(errors.InsufficientStorage):
            await log.flush()
        assert log.durable_tail == 1
        assert [s.data for s in (await log.read(0, 100, whole_messages=True)).slices] == [b"1"]
        fail["on"] = False
        await append(other, b"fine")  # other logs are unaffected
        await dd.close()
        return log.id, other.id

    log_id, _ = run(go)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert log.state.tail == 1 and await read_all(log) == [b"1"]
        await append(log, b"5")
        assert await read_all(log) == [b"1", b"5"]
        await dd.close()

    run(reopen)


def test_fsync_failure_poisons_with_storage_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)
        fut = log.stage(entry(log, b"1"))
        with pytest.raises(errors.StorageFailure) as info:
            await fut
        assert not isinstance(info.value, errors.InsufficientStorage)
        with pytest.raises(errors.StorageFailure):
            await log.stage(entry(log, b"2"))
        monkeypatch.undo()
        await dd.close()

    run(go)


def test_durability_none_skips_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd))

    async def go() -> None:
        dd = await open_dd(tmp_path, durability=Durability.NONE)
        log = await dd.create_stream(header(), None)
        for i in range(10):
            await append(log, b"%d" % i)
        assert len(await read_all(log)) == 10
        await dd.close()

    run(go)
    assert syncs == []


def test_cancelled_stager_does_not_break_the_commit(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        fut = log.stage(entry(log, b"1"))
        fut.cancel()  # e.g. the client went away; the entry is staged and will be written
        await log.flush()
        assert log.durable_tail == 1 and await read_all(log) == [b"1"]
        await dd.close()

    run(go)


def test_small_read_from_a_large_log_touches_few_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 50 MB log: a read near the middle preads O(index interval + result), not O(data)."""

    async def go() -> None:
        dd = await open_dd(tmp_path, durability=Durability.NONE, segment_bytes=8 * 1024 * 1024)
        log = await dd.create_stream(header(content_type="application/octet-stream"), None)
        block = b"z" * 1000
        for _ in range(50):
            futs = [log.stage(entry(log, block)) for _ in range(1000)]
            await asyncio.gather(*futs)
        assert log.durable_tail == 50_000_000
        read_sizes: list[int] = []
        real = os.pread

        def pread(fd: int, n: int, off: int) -> bytes:
            data = real(fd, n, off)
            read_sizes.append(len(data))
            return data

        monkeypatch.setattr(os, "pread", pread)
        got = await log.read(25_000_500, 2000, whole_messages=False)
        assert b"".join(s.data for s in got.slices) == b"z" * 2000
        assert sum(read_sizes) < 300 * 1024, read_sizes
        read_sizes.clear()
        got = await log.read(31_337_000, 1000, whole_messages=True)
        assert got.slices[0].data == block
        assert sum(read_sizes) < 300 * 1024, read_sizes
        assert await log.is_boundary(40_000_000)
        assert not await log.is_boundary(40_000_001)
        assert sum(read_sizes) < 600 * 1024
        monkeypatch.undo()
        await dd.close()

    run(go)


def test_one_batch_larger_than_iov_max(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])

    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        syncs.clear()
        futs = [log.stage(entry(log, b"[%d]" % i)) for i in range(3000)]
        await asyncio.gather(*futs)
        assert len(syncs) == 1  # all 3000 entries in one write + one fsync
        assert await read_all(log) == [b"[%d]" % i for i in range(3000)]
        await dd.close()
        dd = await open_dd(tmp_path)
        assert await read_all(dd.logs[log.id]) == [b"[%d]" % i for i in range(3000)]
        await dd.close()

    run(go)


def test_concurrent_writers_and_tailing_readers(tmp_path: Path) -> None:
    """Several streams, a tiny fd cache, readers woken by listeners: every reader sees exactly the
    durable data in order, never more than durable_tail."""

    async def go() -> None:
        dd = await open_dd(tmp_path, max_open_files=2, segment_bytes=4096, index_interval_bytes=512)
        logs = [await dd.create_stream(header(f"/t{i}"), None) for i in range(4)]
        per_stream = 150

        async def writer(log: StreamLog, w: int) -> None:
            for i in range(per_stream):
                await log.stage(entry(log, b'{"w":%d,"i":%d,"pad":"%s"}' % (w, i, b"p" * (i % 50))))

        async def reader(log: StreamLog) -> list[bytes]:
            woken = asyncio.Event()
            log.add_listener(woken.set)
            got: list[bytes] = []
            pos = 0
            while len(got) < 2 * per_stream:
                await woken.wait()
                woken.clear()
                while pos < log.durable_tail:
                    tail = log.durable_tail
                    chunk = await log.read(pos, 700, whole_messages=True)
                    assert chunk.next_position <= log.durable_tail
                    assert chunk.slices and chunk.next_position <= max(tail, log.durable_tail)
                    got.extend(s.data for s in chunk.slices)
                    pos = chunk.next_position
            return got

        readers = [asyncio.ensure_future(reader(log)) for log in logs]
        await asyncio.gather(*(writer(log, w) for log in logs for w in range(2)))
        results = await asyncio.wait_for(asyncio.gather(*readers), 30)
        for log, got in zip(logs, results, strict=True):
            assert got == await read_all(log)
            assert len(got) == 2 * per_stream
        await dd.close()

    run(go)
