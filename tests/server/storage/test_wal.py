"""The shared write-ahead log (storage/wal.py, storage/committer.py): what a restart puts back, and what a
failed WAL does to the data directory.

A power loss cannot be staged in a test, so its effect is: the data directory is copied while the server
runs (the disk as a crash leaves it, WAL included), and in the copy the segment files lose what was never
synced in them (truncated back to what the create synced). Opening the copy must give back every
acknowledged append, with its producer state, as the original had it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.storage import DataDir, StreamLog, committer, wal

from ._util import append, config, crash_copy, entry, header, open_dd, read_all, run, segment_files


@pytest.fixture(autouse=True)
def _no_idle_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    # The copies below must catch the WAL before the idle checkpoint syncs the segments and removes it.
    monkeypatch.setattr(committer, "CHECKPOINT_IDLE_SECONDS", 3600.0)


def _lose_unsynced(copy: Path, log_id: str, keep: int) -> None:
    """What a power loss may do to segment data that was never synced: it is gone (the first segment
    keeps its first ``keep`` bytes, which the create synced)."""
    first, *rest = segment_files(copy, log_id)
    with open(first, "r+b") as fh:
        fh.truncate(keep)
    for segment in rest:
        segment.unlink()


def _wal_fd(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").endswith(".wal")


def test_acknowledged_appends_the_segments_lost_are_put_back(tmp_path: Path) -> None:
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> tuple[str, int]:
        dd = await open_dd(root)
        log = await dd.create_stream(header("/s"), None)
        synced = log._file_end  # the header, synced by the create
        for seq in range(20):
            await append(log, b'{"n":%d}' % seq, producer=("p", 3, seq))
        crash_copy(root, copy)
        await dd.close()
        return log.id, synced

    log_id, synced = run(write)
    _lose_unsynced(copy, log_id, synced)
    report = wal.replay(copy, sync=True)
    assert report.entries >= 1 and report.repaired == report.entries and report.skipped == 0
    assert not list((copy / "wal").glob("*.wal"))  # replayed, synced, removed

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        log = dd.logs[log_id]
        assert await read_all(log) == [b'{"n":%d}' % seq for seq in range(20)]
        producer = log.state.producers["p"]
        assert (producer.epoch, producer.last_seq) == (3, 19)  # the dedup state came back with it
        await append(log, b'{"n":20}', producer=("p", 3, 20))
        await dd.close()

    run(reopen)


def test_a_process_crash_leaves_nothing_to_write_back(tmp_path: Path) -> None:
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> str:
        dd = await open_dd(root)
        log = await dd.create_stream(header("/s"), None)
        for n in range(5):
            await append(log, b"%d" % n)
        crash_copy(root, copy)  # the page cache survives a process crash: the segments are whole
        await dd.close()
        return log.id

    log_id = run(write)
    report = wal.replay(copy, sync=True)
    assert report.entries >= 1 and report.repaired == 0

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert await read_all(dd.logs[log_id]) == [b"%d" % n for n in range(5)]
        await dd.close()

    run(reopen)


def test_blocks_a_power_loss_left_zeroed_are_written_back_between_intact_ones(
    tmp_path: Path,
) -> None:
    """A power loss can keep a file's size but not its data (zero-filled blocks). Here two stretches in
    the middle of what the WAL covers are zeroed, with intact records around them: the replay must
    write back exactly the entries that differ, and compare the ones after them against the file as
    it now is."""
    root, copy = tmp_path / "live", tmp_path / "crashed"
    messages = [b'{"n":%d,"pad":"%s"}' % (n, b"x" * (n % 50)) for n in range(200)]

    async def write() -> tuple[str, int]:
        dd = await open_dd(root)
        log = await dd.create_stream(header("/s"), None)
        synced = log._file_end
        for n, message in enumerate(messages):
            await append(log, message, producer=("p", 0, n))
        crash_copy(root, copy)
        await dd.close()
        return log.id, synced

    log_id, synced = run(write)
    (segment,) = segment_files(copy, log_id)
    data = bytearray(segment.read_bytes())
    size = len(data)
    for start, length in ((synced + 500, 700), (size - 3000, 1200)):
        data[start : start + length] = bytes(length)
    segment.write_bytes(bytes(data))
    report = wal.replay(copy, sync=True)
    assert 2 <= report.repaired < report.entries == len(messages)
    assert segment.stat().st_size == size

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert dd.corrupt == {}
        log = dd.logs[log_id]
        assert await read_all(log) == messages
        assert log.state.producers["p"].last_seq == len(messages) - 1
        await dd.close()

    run(reopen)


def test_a_torn_wal_tail_is_a_round_never_acknowledged(tmp_path: Path) -> None:
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> tuple[str, int]:
        dd = await open_dd(root)
        log = await dd.create_stream(header("/s"), None)
        synced = log._file_end
        for n in range(3):
            await append(log, b"%d" % n)
        crash_copy(root, copy)
        await dd.close()
        return log.id, synced

    log_id, synced = run(write)
    # A round that was being written when the power went: a whole entry's worth of bytes, torn in its
    # checksummed body, after the acknowledged ones.
    wal_file = next((copy / "wal").glob("*.wal"))
    data = wal_file.read_bytes()
    whole = len(data)
    torn = bytearray(data[-60:])
    torn[-1] ^= 0xFF
    wal_file.write_bytes(data + bytes(torn))
    _lose_unsynced(copy, log_id, synced)
    report = wal.replay(copy, sync=True)
    assert report.entries == 3 and report.repaired == 3
    assert whole > 0

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert await read_all(dd.logs[log_id]) == [b"0", b"1", b"2"]
        await dd.close()

    run(reopen)


def test_entries_of_a_deleted_stream_are_skipped(tmp_path: Path) -> None:
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> tuple[str, str]:
        dd = await open_dd(root)
        gone = await dd.create_stream(header("/gone"), None)
        kept = await dd.create_stream(header("/kept"), None)
        await append(gone, b"a")
        await append(kept, b"b")
        await dd.delete_stream(gone)
        crash_copy(root, copy)
        await dd.close()
        return gone.id, kept.id

    gone_id, kept_id = run(write)
    report = wal.replay(copy, sync=True)
    assert report.skipped == 1
    assert not (copy / "streams" / gone_id).exists()

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert gone_id not in dd.logs and await read_all(dd.logs[kept_id]) == [b"b"]
        await dd.close()

    run(reopen)


def test_many_streams_share_one_wal_sync_per_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit across streams: 32 streams with one append each in flight cost a few syncs, not
    one per stream (each stream's writer used to sync its own segment)."""
    syncs: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    async def go() -> None:
        dd = await open_dd(root := tmp_path / "live")
        logs = [await dd.create_stream(header(f"/s{i}"), None) for i in range(32)]
        monkeypatch.setattr(os, "fdatasync", counting)
        for round_ in range(5):
            await asyncio.gather(*(append(log, b"%d" % round_) for log in logs))
        assert len(syncs) <= 10, len(syncs)  # about one per round of 32 appends
        assert all(_wal_fd(fd) for fd in syncs)
        monkeypatch.undo()
        for log in logs:
            assert await read_all(log) == [b"%d" % r for r in range(5)]
        await dd.close()
        assert not list((root / "wal").glob("*.wal"))

    run(go)


def test_a_failed_wal_sync_stops_every_write_until_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error on the WAL leaves its state unknown: no stream of the data directory may write
    (a later write could land where the restart puts back bytes of the failed round); after a restart
    everything acknowledged is there and writes work again."""
    real = os.fdatasync

    def broken(fd: int) -> None:
        if _wal_fd(fd):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    async def go() -> tuple[str, str]:
        dd = await open_dd(tmp_path)
        first = await dd.create_stream(header("/first"), None)
        other = await dd.create_stream(header("/other"), None)
        await append(first, b"kept")
        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(errors.StorageFailure) as failed:
            await append(first, b"lost")
        assert not isinstance(failed.value, errors.InsufficientStorage)
        monkeypatch.undo()
        with pytest.raises(errors.StorageFailure):  # a stream that was not in the failed round
            await other.stage(entry(other, b"refused"))
        assert first.durable_tail == 4 and await read_all(first) == [b"kept"]
        await dd.close()
        return first.id, other.id

    first_id, other_id = run(go)

    async def restart() -> None:
        dd = await open_dd(tmp_path)
        first, other = dd.logs[first_id], dd.logs[other_id]
        assert await read_all(first) == [b"kept"]  # the failed round was cut off the WAL
        await append(first, b"again")
        await append(other, b"fine")
        assert await read_all(first) == [b"kept", b"again"]
        await dd.close()

    run(restart)


def test_out_of_space_in_the_wal_fails_the_round_and_the_logs_heal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwritev
    full = {"on": False}

    def pwritev(fd: int, buffers, offset: int) -> int:  # type: ignore[no-untyped-def]
        if full["on"] and _wal_fd(fd):
            real(fd, [bytes(buffers[0])[:5]], offset)  # torn, then the error
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)

    async def go() -> str:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header("/s"), None)
        await append(log, b"1")
        full["on"] = True
        with pytest.raises(errors.InsufficientStorage):
            await append(log, b"2", producer=("p", 0, 0))
        full["on"] = False
        assert dd._committer.failure is None  # out of space is not an unknown state
        await _until_writable(log)
        # The failed append is not remembered: its producer retry is written, not a duplicate.
        await append(log, b"2", producer=("p", 0, 0))
        assert await read_all(log) == [b"1", b"2"]
        await dd.close()
        return log.id

    log_id = run(go)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        assert await read_all(dd.logs[log_id]) == [b"1", b"2"]
        await dd.close()

    run(reopen)


async def _until_writable(log: StreamLog) -> None:
    deadline = time.monotonic() + 10
    while log.poisoned:
        assert time.monotonic() < deadline, "the log did not heal"
        await asyncio.sleep(0.01)
