"""Record groups in the storage layer: a staged-append commit written as several records, its recovery
(whole or not at all), crash injection in the middle of the write, and readers during the write."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.storage import DataDir, StreamLog, codec, group, txnfile
from durastream_server.storage.records import (
    CommittedHandle,
    GroupCommit,
    ProducerTuple,
    StagedSource,
)
from durastream_server.storage.state import StreamState, apply_entry

from ..storage._util import append, drop_snapshot, header, open_dd, read_all, run, segment_files

CREATED_MS = 1_700_000_000_000


def make_source(directory: Path, name: str, records: list[list[bytes]]) -> StagedSource:
    """A staging file for handle ``name`` holding one staged record per element of ``records``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = str(directory / txnfile.staging_file_name(name))
    head = txnfile.encode_handle_header(txnfile.HandleHeader(name, CREATED_MS, 3600))
    frames: list[bytes | bytearray] = [head]
    state = StreamState(tail=0)
    for i, messages in enumerate(records):
        entry = codec.AppendEntry(
            position=state.tail, messages=tuple(messages), timestamp_ms=CREATED_MS + i
        )
        apply_entry(state, entry)
        frames.append(codec.encode_append(entry))
    end = txnfile.create_staging_file(path, frames, sync=False)
    n = sum(len(r) for r in records)
    return StagedSource(path, len(head), end, n, state.tail)


def make_group(log: StreamLog, *sources: StagedSource, closes: bool = False) -> GroupCommit:
    names = {txnfile.staging_file_name(n): n for n in ("A", "B")}
    return GroupCommit(
        position=log.state.tail,
        size=sum(s.size for s in sources),
        n_messages=sum(s.n_messages for s in sources),
        timestamp_ms=CREATED_MS + 1000,
        sources=sources,
        closes=closes,
        producer=ProducerTuple("committer", 3, 0),
        digest=b"group-digest",
        txn_handles=tuple(
            CommittedHandle(names[Path(s.path).name], CREATED_MS + 3_600_000) for s in sources
        ),
    )


def disk_records(root: Path, log_id: str) -> list[tuple[Path, int, codec.AppendMeta]]:
    """Every APPEND record on disk: (segment, local offset, meta)."""
    out = []
    for seg in segment_files(root, log_id):
        data = seg.read_bytes()
        off = 0
        while off < len(data):
            frame = codec.parse_frame(data, off)
            if frame.kind == codec.Kind.APPEND:
                meta = codec.decode_append_meta(data, off + codec.FRAME_SIZE, frame.body_len)
                out.append((seg, off, meta))
            off += frame.record_len
    return out


@pytest.fixture
def small_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny group records and write chunks, so a few short messages make a multi-record group."""
    monkeypatch.setattr(group, "RECORD_TARGET", 8)
    monkeypatch.setattr(group, "WRITE_CHUNK", 64)


MESSAGES_A = [[b'"a0"', b'"a1"'], [b'"a2"'], [b'"a3"', b'"a4"', b'"a5"']]
MESSAGES_B = [[b'"b0"'], [b'"b1"', b'"b2"']]
ALL = [m for r in MESSAGES_A + MESSAGES_B for m in r]


async def _commit_group(root: Path, **overrides: object) -> tuple[str, GroupCommit]:
    """Stream /s: one plain append ``"p"``, then the group of handles A and B; closed cleanly."""
    dd = await open_dd(root, **overrides)
    log = await dd.create_stream(header(), None)
    await append(log, b'"p"')
    txn = Path(log.directory) / "txn"
    grp = make_group(log, make_source(txn, "A", MESSAGES_A), make_source(txn, "B", MESSAGES_B))
    await log.stage_group(grp)
    assert log.durable_tail == grp.end
    assert await read_all(log) == [b'"p"', *ALL]
    await dd.close()
    return log.id, grp


def test_group_is_several_records_flagged_and_recovers_whole(
    tmp_path: Path, small_records: None
) -> None:
    log_id, grp = _run_commit(tmp_path, segment_bytes=200)
    records = disk_records(tmp_path, log_id)
    group_records = records[1:]
    assert len(group_records) > 2
    assert len(segment_files(tmp_path, log_id)) > 1, "the group should span segments"
    assert [m.continues for _, _, m in group_records] == [True] * (len(group_records) - 1) + [False]
    last = group_records[-1][2]
    assert last.producer == ProducerTuple("committer", 3, 0)
    assert [h.name for h in last.txn_handles] == ["A", "B"]
    assert all(m.producer is None and not m.txn_handles for _, _, m in group_records[:-1])
    for with_snapshot in (True, False):
        if not with_snapshot:
            drop_snapshot(tmp_path, log_id)

        async def reopen() -> None:
            dd = await open_dd(tmp_path, segment_bytes=200)
            log = dd.logs[log_id]
            assert log.durable_tail == grp.end
            assert await read_all(log) == [b'"p"', *ALL]
            assert log.state.producers["committer"].last_seq == 0
            assert set(log.state.txn_committed) == {"A", "B"}
            assert log.state.entries == 2  # the plain append + the group, counted once
            await dd.close()

        run(reopen)


def _run_commit(root: Path, **overrides: object) -> tuple[str, GroupCommit]:
    return run(lambda: _commit_group(root, **overrides))


def test_group_records_hold_whole_staged_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit moves staged records whole (no per-message re-framing): a group record gathers
    consecutive staged records until it holds RECORD_TARGET payload bytes, never splits one, and its
    messages and lengths are exactly the staged ones."""
    monkeypatch.setattr(group, "RECORD_TARGET", 12)  # A's records hold 8, 4 and 12 payload bytes
    log_id, grp = _run_commit(tmp_path)
    records = [m for _, _, m in disk_records(tmp_path, log_id)][1:]
    assert [m.lengths for m in records] == [
        (4, 4, 4),  # A's first two staged records, gathered: 12 bytes
        (4, 4, 4),  # A's third record alone reaches the target
        (4, 4, 4),  # B's two records: the group's last record, with its meta
    ]
    assert [m.continues for m in records] == [True, True, False]
    assert [m.position for m in records] == [grp.position + 12 * i for i in range(3)]
    assert records[-1].producer == ProducerTuple("committer", 3, 0)
    assert records[-1].digest == b"group-digest"

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        assert await read_all(dd.logs[log_id]) == [b'"p"', *ALL]
        await dd.close()

    run(reopen)


def test_encode_append_parts_matches_encode_append() -> None:
    messages = (b'"a"', b'{"k":[1,2]}', b"3")
    lengths = b"".join(len(m).to_bytes(4, "little") for m in messages)
    for fields in (
        {},
        {"continues": True},
        {
            "closes": True,
            "producer": ProducerTuple("p", 2, 7),
            "stream_seq": "0009",
            "digest": b"d" * 20,
            "txn_handles": (CommittedHandle("h", 42),),
        },
    ):
        whole = codec.encode_append(
            codec.AppendEntry(position=5, messages=messages, timestamp_ms=9, **fields)
        )
        parts = codec.encode_append_parts(
            5, 9, 3, lengths, [messages[0], memoryview(b"".join(messages[1:]))], **fields
        )
        assert b"".join(bytes(p) for p in parts) == bytes(whole)


@pytest.mark.parametrize("cut", ["before_last_record", "inside_last_record", "after_first_record"])
def test_incomplete_trailing_group_is_truncated_to_its_start(
    tmp_path: Path, small_records: None, cut: str
) -> None:
    """A crash mid-commit: none of the group survives recovery, and new appends land cleanly."""
    log_id, grp = _run_commit(tmp_path, segment_bytes=200)
    drop_snapshot(tmp_path, log_id)
    records = disk_records(tmp_path, log_id)
    first_group_seg, first_group_off, _ = records[1]
    if cut == "after_first_record":
        seg, off, _ = records[2]
    else:
        seg, off, _ = records[-1]
        if cut == "inside_last_record":
            off += 5
    with open(seg, "r+b") as f:
        f.truncate(off)
    for later in segment_files(tmp_path, log_id):
        if later.name > seg.name:
            later.unlink()

    async def recover() -> None:
        dd = await open_dd(tmp_path, segment_bytes=200)
        assert dd.corrupt == {}
        log = dd.logs[log_id]
        assert log.durable_tail == grp.position
        assert await read_all(log) == [b'"p"']
        assert "committer" not in log.state.producers
        assert log.state.txn_committed == {}
        await append(log, b'"after"')
        assert await read_all(log) == [b'"p"', b'"after"']
        await dd.close()

    run(recover)
    assert segment_files(tmp_path, log_id)[-1] == first_group_seg
    assert disk_records(tmp_path, log_id)[1][1] == first_group_off  # "after" replaced the group


def test_damaged_group_record_followed_by_valid_data_quarantines(
    tmp_path: Path, small_records: None
) -> None:
    log_id, _ = _run_commit(tmp_path)
    drop_snapshot(tmp_path, log_id)
    seg, off, meta = disk_records(tmp_path, log_id)[1]
    with open(seg, "r+b") as f:
        f.seek(off + codec.FRAME_SIZE + meta.payload_off)
        byte = f.read(1)
        f.seek(off + codec.FRAME_SIZE + meta.payload_off)
        f.write(bytes([byte[0] ^ 0xFF]))

    async def recover() -> None:
        dd = await open_dd(tmp_path)
        assert "/s" in dd.corrupt and log_id not in dd.logs
        await dd.close()

    run(recover)


def test_write_failure_mid_group_poisons_then_recovery_drops_the_group(
    tmp_path: Path, small_records: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inject an I/O error after part of the group is on disk, and skip the undo (as if the process
    died there): the commit fails, and after a restart none of the group is visible and the same
    staged data can be committed, once."""
    real_pwrite = group.pwrite_all
    calls = {"n": 0}

    def failing_pwrite(fd: int, buffers: list, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "injected I/O error")
        return real_pwrite(fd, buffers, offset)

    async def first() -> tuple[str, GroupCommit]:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        await append(log, b'"p"')
        txn = Path(log.directory) / "txn"
        grp = make_group(log, make_source(txn, "A", MESSAGES_A), make_source(txn, "B", MESSAGES_B))
        monkeypatch.setattr(group, "pwrite_all", failing_pwrite)
        monkeypatch.setattr(group, "_undo", lambda target, written: None)
        with pytest.raises(errors.StorageFailure):
            await log.stage_group(grp)
        assert log.poisoned and log.durable_tail == grp.position
        assert await read_all(log) == [b'"p"']
        monkeypatch.setattr(group, "pwrite_all", real_pwrite)
        await dd.close()
        return log.id, grp

    log_id, grp = run(first)
    assert len(disk_records(tmp_path, log_id)) > 1, "part of the group reached the file"

    async def recover_and_retry() -> None:
        dd = await open_dd(tmp_path)
        log = dd.logs[log_id]
        assert await read_all(log) == [b'"p"']
        await log.stage_group(grp)  # the staging files are intact
        assert await read_all(log) == [b'"p"', *ALL]
        await dd.close()

    run(recover_and_retry)
    drop_snapshot(tmp_path, log_id)
    run(lambda: _expect_messages(tmp_path, log_id, [b'"p"', *ALL]))


async def _expect_messages(root: Path, log_id: str, expected: list[bytes]) -> None:
    dd = await open_dd(root)
    assert await read_all(dd.logs[log_id]) == expected
    await dd.close()


def test_readers_never_see_part_of_a_group(
    tmp_path: Path, small_records: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hold the writer after its first chunk of the group is on disk: reads still end at the old tail,
    then see the whole group at once."""
    written = threading.Event()
    release = threading.Event()
    real_pwrite = group.pwrite_all

    def slow_pwrite(fd: int, buffers: list, offset: int) -> int:
        n = real_pwrite(fd, buffers, offset)
        written.set()
        assert release.wait(30)
        return n

    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        await append(log, b'"p"')
        txn = Path(log.directory) / "txn"
        grp = make_group(log, make_source(txn, "A", MESSAGES_A), make_source(txn, "B", MESSAGES_B))
        monkeypatch.setattr(group, "pwrite_all", slow_pwrite)
        durable = log.stage_group(grp)
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, written.wait, 30)
        assert os.path.getsize(segment_files(tmp_path, log.id)[-1]) > len(b'"p"') + 64
        assert log.durable_tail == grp.position
        chunk = await log.read(log.base, 1 << 20, whole_messages=True)
        assert [s.data for s in chunk.slices] == [b'"p"']
        assert not durable.done()
        release.set()
        await durable
        assert await read_all(log) == [b'"p"', *ALL]
        await dd.close()

    try:
        run(go)
    finally:
        release.set()


def test_corrupt_staging_file_fails_the_commit_and_exposes_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        dd: DataDir = await open_dd(tmp_path)
        log = await dd.create_stream(header(), None)
        await log.ensure_directory()  # packed until now (storage/packs.py): txn/ goes in it
        txn = Path(log.directory) / "txn"
        source = make_source(txn, "A", MESSAGES_A)
        with open(source.path, "r+b") as f:
            f.seek(source.end - 2)
            f.write(b"\xff")
        with pytest.raises(errors.StorageFailure):
            await log.stage_group(make_group(log, source))
        assert log.durable_tail == log.base
        await dd.close()
        dd = await open_dd(tmp_path)
        assert await read_all(dd.logs[log.id]) == []
        await dd.close()

    run(go)
