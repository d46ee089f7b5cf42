"""Data directory life cycle: lock, recovery, torn tails, quarantine, snapshots, create and delete."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.storage import AlreadyLocked, DataDir, StreamState, catalog, codec, recovery
from durastream_server.storage.records import ProducerTuple

from ._util import (
    append,
    drop_snapshot,
    entry,
    header,
    open_dd,
    read_all,
    run,
    sample_digest,
    segment_files,
)


def _write_records(root: Path, messages: list[bytes], **overrides: object) -> str:
    """Create /s holding one entry per message, close cleanly, drop the snapshot; returns the id."""

    async def go() -> str:
        dd = await open_dd(root, **overrides)
        log = await dd.create_stream(header(), None)
        for m in messages:
            await append(log, m)
        await dd.close()
        return log.id

    log_id = run(go)
    drop_snapshot(root, log_id)
    return log_id


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_second_open_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        with pytest.raises(AlreadyLocked):
            await open_dd(tmp_path)
        await dd.close()
        again = await open_dd(tmp_path)  # released on close
        await again.close()

    run(go)


def test_torn_tail_is_truncated_before_new_appends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Hazard 18: write 3 records, cut 3 bytes off the last, restart, append, read everything."""
    log_id = _write_records(tmp_path, [b'"one"', b'"two"', b'"three"'])
    (seg,) = segment_files(tmp_path, log_id)
    os.truncate(seg, seg.stat().st_size - 3)

    async def go() -> None:
        with caplog.at_level(logging.WARNING):
            dd = await open_dd(tmp_path)
        assert "torn tail" in caplog.text
        log = dd.logs[log_id]
        assert log.state.tail == 10 and log.state.entries == 2
        await append(log, b'"new"')
        assert await read_all(log) == [b'"one"', b'"two"', b'"new"']
        await dd.close()
        dd = await open_dd(tmp_path)  # and it stays that way
        assert await read_all(dd.logs[log_id]) == [b'"one"', b'"two"', b'"new"']
        await dd.close()

    run(go)


@pytest.mark.parametrize("garbage", [b"\x00" * 4096, b"\xd5", b"\xd5\x1e\x01\x02\xff\xff"])
def test_garbage_tail_is_truncated(tmp_path: Path, garbage: bytes) -> None:
    log_id = _write_records(tmp_path, [b"1", b"2"])
    (seg,) = segment_files(tmp_path, log_id)
    with open(seg, "ab") as f:
        f.write(garbage)

    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert await read_all(log) == [b"1", b"2"]
        await append(log, b"3")
        assert await read_all(log) == [b"1", b"2", b"3"]
        await dd.close()

    run(go)


def test_torn_tail_past_a_snapshot_falls_back_to_full_replay(tmp_path: Path) -> None:
    async def go() -> str:
        dd = await open_dd(tmp_path, snapshot_interval_entries=1)
        log = await dd.create_stream(header(), None)
        for m in (b"1", b"22", b"333"):
            await append(log, m)
        await dd.close()
        return log.id

    log_id = run(go)
    assert (tmp_path / "streams" / log_id / "snapshot").exists()
    (seg,) = segment_files(tmp_path, log_id)
    os.truncate(seg, seg.stat().st_size - 1)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert log.state.tail == 3 and log.state.entries == 2
        assert await read_all(log) == [b"1", b"22"]
        await dd.close()

    run(reopen)


def test_mid_file_corruption_quarantines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Hazard 32: a checksum failure followed by valid data is never served and never reset."""
    log_id = _write_records(tmp_path, [b'"aaaa"', b'"bbbb"', b'"cccc"', b'"dddd"'])
    (seg,) = segment_files(tmp_path, log_id)
    data = seg.read_bytes()
    _flip(seg, data.index(b"bbbb"))

    async def go() -> None:
        with caplog.at_level(logging.ERROR):
            dd = await open_dd(tmp_path)
        assert log_id not in dd.logs
        assert "/s" in dd.corrupt and "mid-file corruption" in dd.corrupt["/s"]
        assert "quarantined" in caplog.text and log_id in caplog.text and "'/s'" in caplog.text
        await dd.close()

    run(go)
    # Set aside whole and unchanged, never deleted.
    moved = tmp_path / "quarantine" / log_id / seg.name
    assert not seg.exists()
    assert moved.read_bytes() != data and moved.stat().st_size == len(data)
    quarantined = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(quarantined) == 1  # logged once

    async def again() -> None:  # the path stays reserved across restarts, without a second log
        caplog.clear()
        dd = await open_dd(tmp_path)
        (entry,) = dd.quarantined.values()
        assert entry.path == "/s" and entry.id == log_id and "mid-file corruption" in entry.reason
        assert "mid-file corruption" in dd.corrupt["/s"]
        assert not any(r.levelno >= logging.ERROR for r in caplog.records)
        await dd.close()

    run(again)


def test_corruption_under_a_snapshot_is_caught_on_read(tmp_path: Path) -> None:
    async def go() -> str:
        dd = await open_dd(tmp_path, snapshot_interval_entries=1)
        log = await dd.create_stream(header(), None)
        for m in (b'"aaaa"', b'"bbbb"', b'"cccc"'):
            await append(log, m)
        await dd.close()
        return log.id

    log_id = run(go)
    (seg,) = segment_files(tmp_path, log_id)
    _flip(seg, seg.read_bytes().index(b"bbbb"))

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]  # the snapshot skipped the damaged record at start-up...
        with pytest.raises(errors.CorruptStream):
            await log.read(0, 1000, whole_messages=True)  # ...but a read never returns it
        await dd.close()

    run(reopen)


def test_unreadable_segment_quarantines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_id = _write_records(tmp_path, [b"1"])
    (seg,) = segment_files(tmp_path, log_id)
    real = os.open

    def failing_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path) == str(seg):
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)

    async def go() -> None:
        dd = await open_dd(tmp_path)
        assert log_id not in dd.logs
        assert any("unreadable" in entry.reason for entry in dd.quarantined.values())
        await dd.close()

    run(go)


def test_missing_middle_segment_quarantines(tmp_path: Path) -> None:
    log_id = _write_records(tmp_path, [b"x" * 300 for _ in range(20)], segment_bytes=1024)
    segs = segment_files(tmp_path, log_id)
    assert len(segs) > 3
    os.unlink(segs[1])

    async def go() -> None:
        dd = await open_dd(tmp_path)
        assert log_id not in dd.logs and "/s" in dd.corrupt
        await dd.close()

    run(go)


@pytest.mark.parametrize("with_catalog", [True, False])
def test_damaged_header_quarantines_by_storage_id(tmp_path: Path, with_catalog: bool) -> None:
    log_id = _write_records(tmp_path, [b"1"])
    (seg,) = segment_files(tmp_path, log_id)
    _flip(seg, 20)
    if not with_catalog:
        (tmp_path / catalog.CATALOG_NAME).unlink()

    async def go() -> None:
        dd = await open_dd(tmp_path)
        # The catalog (storage/catalog.py) still knows its path: reserved, never re-created empty.
        known = "/s" if with_catalog else None
        assert dd.logs == {} and list(dd.corrupt) == ([known] if known else [])
        assert dd.quarantined[log_id].path == known
        assert "header" in dd.quarantined[log_id].reason
        await dd.close()

    run(go)


def _dedup_state_log(root: Path, **overrides: object) -> tuple[str, StreamState]:
    async def go() -> tuple[str, StreamState]:
        dd = await open_dd(root, **overrides)
        log = await dd.create_stream(header(), None)
        for i in range(300):
            await append(
                log,
                b'{"n":%d}' % i,
                producer=(f"p{i % 7}", i // 100, i),
                stream_seq=f"{i:08d}",
                ts=1000 + i,
            )
        await append(log, b'"last"', producer=("p1", 5, 9), closes=True)
        state = StreamState(
            tail=log.state.tail,
            closed=log.state.closed,
            closed_by=log.state.closed_by,
            last_stream_seq=log.state.last_stream_seq,
            producers={k: v for k, v in log.state.producers.items()},
            soft_deleted=log.state.soft_deleted,
            last_timestamp_ms=log.state.last_timestamp_ms,
            entries=log.state.entries,
        )
        await dd.close()
        return log.id, state

    return run(go)


def test_snapshot_plus_replay_equals_full_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_id, expected = _dedup_state_log(
        tmp_path, snapshot_interval_entries=64, index_interval_bytes=256
    )
    assert (tmp_path / "streams" / log_id / "snapshot").exists()
    starts: list[int] = []
    real_replay = recovery._replay

    def spy(segs, start, *rest):  # type: ignore[no-untyped-def]
        starts.append(start)
        return real_replay(segs, start, *rest)

    monkeypatch.setattr(recovery, "_replay", spy)

    async def state_and_messages() -> tuple[StreamState, list[bytes], int]:
        dd = await open_dd(tmp_path, index_interval_bytes=256)
        log = dd.logs[log_id]
        result = (log.state, await read_all(log), len(log._index.sparse))
        await dd.close()
        return result

    with_snapshot = run(state_and_messages)
    assert starts and starts[-1] > 1000  # replay started after the snapshot point
    drop_snapshot(tmp_path, log_id)
    starts.clear()
    full = run(state_and_messages)
    assert starts[-1] == len(codec.encode_header(header()))  # right after the header
    assert with_snapshot[0] == full[0] == expected
    assert with_snapshot[1] == full[1] and len(full[1]) == 301
    assert with_snapshot[2] > 10 and full[2] > 10


def test_damaged_snapshot_is_ignored(tmp_path: Path) -> None:
    log_id, expected = _dedup_state_log(tmp_path, snapshot_interval_entries=32)
    snap = tmp_path / "streams" / log_id / "snapshot"
    _flip(snap, snap.stat().st_size // 2)

    async def go() -> None:
        dd = await open_dd(tmp_path)
        assert dd.logs[log_id].state == expected
        await dd.close()

    run(go)


def test_dedup_state_survives_a_crash_right_after_the_ack(tmp_path: Path) -> None:
    """Hazard 19: producer tuple, Stream-Seq and closure are in the data record itself. 'Crash' by
    copying the data directory while the server still runs (no close, no snapshot)."""
    crashed = tmp_path / "crashed"

    async def go() -> str:
        dd = await open_dd(tmp_path / "live")
        log = await dd.create_stream(header(), None)
        await append(log, b'"a"', producer=("w", 3, 0), stream_seq="s1")
        await append(log, b'"b"', producer=("w", 3, 1), stream_seq="s2", closes=True)
        shutil.copytree(tmp_path / "live", crashed)
        await dd.close()
        return log.id

    log_id = run(go)

    async def recover() -> None:
        dd = await open_dd(crashed)
        state = dd.logs[log_id].state
        assert state.producers["w"].epoch == 3 and state.producers["w"].last_seq == 1
        assert state.producers["w"].digest(1) == sample_digest(b'"b"')
        assert state.last_stream_seq == "s2"
        assert state.closed and state.closed_by == ProducerTuple("w", 3, 1)
        assert dd.logs[log_id].durable_closed
        await dd.close()

    run(recover)


def test_soft_delete_survives_reopen(tmp_path: Path) -> None:
    async def go() -> str:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        await append(log, b"1")
        await log.stage_soft_delete()
        await dd.close()
        return log.id

    log_id = run(go)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert log.state.soft_deleted and await read_all(log) == [b"1"]
        await dd.close()

    run(reopen)


def test_create_with_initial_entry_is_atomic_and_durable(tmp_path: Path) -> None:
    async def go() -> str:
        dd = await open_dd(tmp_path)
        h = header("/with-data")
        initial = entry_at(h.fork_position, b'"first"', closes=True)
        log = await dd.create_stream(h, initial)
        assert log.state.tail == 7 and log.durable_tail == 7 and log.durable_closed
        assert await read_all(log) == [b'"first"']
        assert os.listdir(tmp_path / "staging") == []
        with pytest.raises(ValueError):
            await dd.create_stream(header("/bad"), entry_at(5, b"x"))  # does not start at base
        assert len(dd.logs) == 1
        await dd.close()
        return log.id

    log_id = run(go)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert log.header.path == "/with-data" and log.state.closed
        assert await read_all(log) == [b'"first"']
        await dd.close()

    run(reopen)


def entry_at(position: int, *messages: bytes, closes: bool = False):  # type: ignore[no-untyped-def]
    from durastream_server.storage import AppendEntry

    return AppendEntry(position=position, messages=messages, timestamp_ms=1, closes=closes)


def test_crash_during_staging_leaves_no_stream(tmp_path: Path) -> None:
    """Hazard 20: a half-built stream in staging/ is discarded, never promoted."""
    run(lambda: _open_close(tmp_path))
    half = tmp_path / "staging" / "0123456789abcdef0123456789abcdef"
    half.mkdir()
    (half / "00000000000000000000.seg").write_bytes(b"\xd5\x1e\x01\x01\x10\x00")

    async def go() -> None:
        dd = await open_dd(tmp_path)
        assert dd.logs == {} and dd.corrupt == {}
        assert os.listdir(tmp_path / "staging") == []
        await dd.close()

    run(go)


async def _open_close(root: Path) -> None:
    dd = await open_dd(root)
    await dd.close()


def test_failed_create_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)

        def broken(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(errors.InsufficientStorage):
            await dd.create_stream(header(), None)
        monkeypatch.undo()
        assert dd.logs == {}
        assert os.listdir(tmp_path / "staging") == [] and os.listdir(tmp_path / "streams") == []
        await dd.close()

    run(go)


def test_delete_then_recreate_gives_a_distinct_empty_stream(tmp_path: Path) -> None:
    async def go() -> str:
        dd = await open_dd(tmp_path)
        old = await dd.create_stream(header("/same"), None)
        await append(old, b'"old"')
        pending = old.stage(entry(old, b'"pending"'))
        await dd.delete_stream(old)
        await pending  # delete waited for the pending commit
        assert old.id not in dd.logs
        with pytest.raises(errors.NotFound):
            await old.read(0, 100, whole_messages=True)
        with pytest.raises(errors.StorageFailure):
            await old.stage(entry(old, b'"late"'))
        new = await dd.create_stream(header("/same"), None)
        assert new.id != old.id and new.state.tail == 0
        assert await read_all(new) == []
        await append(new, b'"new"')
        await dd.delete_stream(old)  # idempotent
        await dd.close()
        assert not (tmp_path / "streams" / old.id).exists()
        return new.id

    new_id = run(go)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        assert list(dd.logs) == [new_id]
        assert await read_all(dd.logs[new_id]) == [b'"new"']
        assert os.listdir(tmp_path / "trash") == []
        await dd.close()

    run(reopen)


def test_meta_path(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        path = dd.meta_path("subscriptions.json")
        assert path == tmp_path / "meta" / "subscriptions.json" and path.parent.is_dir()
        for bad in ("../x", "/etc/passwd", ""):
            with pytest.raises(ValueError):
                dd.meta_path(bad)
        await dd.close()

    run(go)


def test_many_streams_recover(tmp_path: Path) -> None:
    async def go() -> dict[str, list[bytes]]:
        dd = await open_dd(tmp_path, max_open_files=4)
        expected = {}
        for i in range(40):
            log = await dd.create_stream(header(f"/s/{i}"), None)
            for j in range(i % 5):
                await append(log, b"[%d,%d]" % (i, j))
            expected[log.id] = await read_all(log)
        await dd.close()
        return expected

    expected = run(go)

    async def reopen() -> None:
        dd: DataDir = await open_dd(tmp_path, max_open_files=4)
        assert {k: await read_all(v) for k, v in dd.logs.items()} == expected
        await dd.close()

    run(reopen)


def test_stale_snapshot_that_does_not_line_up_is_discarded(tmp_path: Path) -> None:
    """A snapshot left over from data that was later cut and rewritten must not be trusted, even if
    the files grew past the offset it covers again."""

    async def first_life() -> str:
        dd = await open_dd(tmp_path, snapshot_interval_entries=1)
        log = await dd.create_stream(header(), None)
        for m in (b'"a"', b'"bb"', b'"ccc"'):
            await append(log, m)
        await dd.close()
        return log.id

    log_id = run(first_life)
    snap = tmp_path / "streams" / log_id / "snapshot"
    old_snapshot = snap.read_bytes()
    (seg,) = segment_files(tmp_path, log_id)
    data = seg.read_bytes()
    os.truncate(seg, data.index(b'"bb"') - 5)  # cut inside record 2: a torn tail
    snap.unlink()

    async def second_life() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        for m in (b'"dddddddddd"', b'"e"', b'"ffffffffffffffff"'):
            await append(log, m)
        await dd.close()

    run(second_life)
    drop_snapshot(tmp_path, log_id)
    assert seg.stat().st_size > len(data)
    snap.write_bytes(old_snapshot)

    async def third_life() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert await read_all(log) == [b'"a"', b'"dddddddddd"', b'"e"', b'"ffffffffffffffff"']
        assert log.state.entries == 4
        await dd.close()

    run(third_life)


def test_corruption_in_an_earlier_segment_quarantines(tmp_path: Path) -> None:
    log_id = _write_records(tmp_path, [b'"%04d"' % i for i in range(40)], segment_bytes=1024)
    segs = segment_files(tmp_path, log_id)
    assert len(segs) > 2
    _flip(segs[0], segs[0].stat().st_size - 3)  # the last record of the first segment

    async def go() -> None:
        dd = await open_dd(tmp_path)
        assert log_id not in dd.logs and "mid-file corruption" in dd.corrupt["/s"]
        await dd.close()

    run(go)
