"""Packed appends (decision 0010 step 2, pieces 1, 3 and 4; ``StorageConfig.packed_appends``) at the
storage layer, real files: a packed stream's small appends go into the round's WAL entry only
(``wal.Kind.PACKED_RECORDS``, no directory), ``StreamLog.extents`` covers its header and records, a
checkpoint carries them into a pack and relocates the extents, a start-up's ``packs.settle`` finds the
same bytes and ``recovery.recover_packed`` folds the same state and dedup state; a power loss with the
WAL live before and after the carry, and the crash between a pack's rename and its WAL file's removal,
lose nothing and read nothing twice; a batch that would pass ``StorageConfig.packed_threshold`` promotes the stream
with its packed records (its CREATE entry carries them), also across a crash after that round's sync.

Reads through extents and start-up adoption of such streams are pieces 2 and 5 (another branch): the
bytes are checked here with ``packs.read_virtual``, the state with ``recovery.recover_packed``."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.engine import producers
from durastream_server.storage import DataDir, committer, packs, recovery, wal
from durastream_server.storage import promotion as promotion_module
from durastream_server.storage.extents import IN_PACK, IN_WAL, Extents
from durastream_server.storage.log import StreamLog
from durastream_server.storage.records import ProducerTuple
from durastream_server.storage.segments import segment_name

from ._util import (
    append,
    checkpoint,
    config,
    crash_copy,
    entry,
    header,
    open_dd,
    read_all,
    run,
    sample_digest,
)


@pytest.fixture(autouse=True)
def _no_idle_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tests decide when checkpoints run (close, or a forced rotation).
    monkeypatch.setattr(committer, "CHECKPOINT_IDLE_SECONDS", 3600.0)


_checkpoint = checkpoint


def _kinds(root: Path) -> list[int]:
    """The entry kinds of every WAL file of ``root``, in order."""
    return [kind for _, s in packs.wal_scans(root) for *_, kind in s.entries]


async def _producer_appends(log, n: int, start: int = 0) -> None:  # noqa: ANN001
    for seq in range(start, start + n):
        await append(log, b'"m%d"' % seq, producer=("writer", 0, seq))


def _directory_segment(root: Path, n: int) -> bytes:
    """The same appends on a stream that has a directory (packed appends off: promoted by its
    first write): its segment 0, the bytes the packed stream's virtual segment 0 must equal."""

    async def go() -> bytes:
        dd = await open_dd(root)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, n)
        assert not log.packed
        await dd.close()
        return (root / "streams" / log.id / segment_name(0)).read_bytes()

    return run(go)


def _is_duplicate(state, seq: int) -> bool:  # noqa: ANN001
    retry = ProducerTuple("writer", 0, seq)
    decision = producers.validate(state, retry, sample_digest(b'"m%d"' % seq))
    return isinstance(decision, producers.Duplicate)


def test_packed_appends_are_wal_entries_only_and_their_extents_read_the_virtual_segment(
    tmp_path: Path,
) -> None:
    root = tmp_path / "packed"
    expected = _directory_segment(tmp_path / "dir", 3)

    async def go() -> tuple[str, object]:
        dd = await open_dd(root, packed_appends=True)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 3)
        assert log.packed and not os.listdir(root / "streams")  # no directory made
        assert _kinds(root).count(wal.Kind.PACKED_RECORDS) == 3  # one entry per round
        assert log.extents is not None and log.extents.start == 0
        assert log.extents.end == log._file_end == len(expected)
        assert log.extents.files() == {(IN_WAL, dd._committer.generation - 1)}
        assert packs.read_virtual(root, log.extents) == expected
        assert log.durable_tail == log.state.tail and _is_duplicate(log.state, 2)
        # The checkpoint carries header and records into the WAL file's pack, the extents follow.
        await _checkpoint(dd)
        assert not list((root / wal.WAL_DIR).glob("*.wal"))
        assert {where for where, _ in log.extents.files()} == {IN_PACK}
        assert len(log.extents) == 2  # the header's entry and the coalesced records' entry
        assert packs.read_virtual(root, log.extents) == expected
        # More appends after the carry: a new extent in the new WAL file.
        await _producer_appends(log, 2, start=3)
        assert {w for w, _ in log.extents.files()} == {IN_PACK, IN_WAL}
        virtual = packs.read_virtual(root, log.extents)
        assert virtual.startswith(expected) and len(virtual) == log._file_end
        state = log.state
        await dd.close()
        assert not os.listdir(root / "streams")
        return log.id, (virtual, state)

    log_id, (virtual, state) = run(go)
    # A fresh start-up finds the same bytes, folded to the same state and dedup state.
    settled = wal.replay(root, sync=True).packed
    assert set(settled.live) == {log_id} and not settled.gaps
    assert packs.read_virtual(root, settled.extents[log_id]) == virtual
    recovered = recovery.recover_packed(log_id, virtual, 64 * 1024)
    assert recovered.state.tail == state.tail and recovered.state.producers == state.producers
    assert _is_duplicate(recovered.state, 4) and not _is_duplicate(recovered.state, 5)


def test_packed_appends_off_write_no_packed_records(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 2)
        assert not log.packed and log.extents is None  # promoted by its first write, as in step 1
        assert wal.Kind.PACKED_RECORDS not in _kinds(tmp_path)
        await dd.close()

    run(go)


def test_a_power_loss_before_and_after_the_carry_loses_no_acknowledged_packed_append(
    tmp_path: Path,
) -> None:
    root = tmp_path / "live"

    async def go() -> tuple[str, bytes, bytes]:
        dd = await open_dd(root, packed_appends=True)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 2)
        before = packs.read_virtual(root, log.extents)
        crash_copy(root, tmp_path / "before")  # header and records in the live WAL file only
        await _checkpoint(dd)
        await _producer_appends(log, 2, start=2)
        after = packs.read_virtual(root, log.extents)
        crash_copy(root, tmp_path / "after")  # in a pack and in the live WAL file
        await dd.close()
        return log.id, before, after

    log_id, before, after = run(go)
    for name, expected, seq in (("before", before, 1), ("after", after, 3)):
        settled = wal.replay(tmp_path / name, sync=True).packed
        assert not settled.gaps and not os.listdir(tmp_path / name / "streams")
        assert packs.read_virtual(tmp_path / name, settled.extents[log_id]) == expected
        state = recovery.recover_packed(log_id, expected, 64 * 1024).state
        assert _is_duplicate(state, seq) and not _is_duplicate(state, seq + 1)


def test_a_crash_between_the_packs_rename_and_the_wal_files_removal_reads_each_byte_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, copy = tmp_path / "live", tmp_path / "crashed"
    finish = packs.PackBook.finish

    def copy_then_finish(book: packs.PackBook, plan: packs.Retirement, w) -> None:  # noqa: ANN001
        if not copy.exists():
            crash_copy(root, copy)  # the pack is renamed in and synced, the WAL file still there
        finish(book, plan, w)

    monkeypatch.setattr(packs.PackBook, "finish", copy_then_finish)

    async def go() -> tuple[str, bytes]:
        dd = await open_dd(root, packed_appends=True)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 3)
        expected = packs.read_virtual(root, log.extents)
        await _checkpoint(dd)
        await dd.close()
        return log.id, expected

    log_id, expected = run(go)
    assert list((copy / packs.PACKS_DIR).glob("*.pack")) and list((copy / "wal").glob("*.wal"))
    settled = wal.replay(copy, sync=True).packed
    assert packs.read_virtual(copy, settled.extents[log_id]) == expected
    assert not list((copy / wal.WAL_DIR).iterdir())


def _reopen_promoted(root: Path, log_id: str, messages: list[bytes], last_seq: int) -> None:
    """A start-up finds the promoted stream whole in its directory, producer state included."""

    async def reopen() -> None:
        dd = await DataDir.open(config(root))
        log = dd.logs[log_id]
        assert not log.packed and await read_all(log) == messages
        assert _is_duplicate(log.state, 3) and log.state.producers["writer"].last_seq == last_seq
        await dd.close()

    run(reopen)


def test_a_batch_past_the_threshold_promotes_the_stream_with_its_packed_records(
    tmp_path: Path,
) -> None:
    root = tmp_path / "live"

    async def go() -> tuple[str, list[bytes]]:
        dd = await open_dd(root, packed_appends=True, packed_threshold=4096)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 3)
        await _checkpoint(dd)  # some records in a pack
        await _producer_appends(log, 2, start=3)  # some in the WAL
        assert log.packed
        virtual = packs.read_virtual(root, log.extents)
        big = b'"' + b"x" * 5000 + b'"'
        await append(log, big, producer=("writer", 0, 5))
        assert not log.packed and log.extents is None
        segment = (root / "streams" / log.id / segment_name(0)).read_bytes()
        assert segment.startswith(virtual) and len(segment) == log._file_end
        assert (
            not dd._committer.packs.is_packed(log.id) and log.id not in dd._committer.packs.extents
        )
        messages = await read_all(log)
        assert len(messages) == 6 and messages[-1] == big
        await dd.close()
        return log.id, messages

    log_id, messages = run(go)

    _reopen_promoted(root, log_id, messages, 5)
    assert not [n for n in os.listdir(root / packs.PACKS_DIR) if n.endswith(".pack")]


def test_a_crash_after_the_promoting_rounds_sync_replays_the_packed_records_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the sync the stream is packed and whole (the power-loss tests above); after it, its
    directory is not made yet (copied then): the replay makes it from the CREATE entry, which
    carries the header and the packed records, and puts the new record after them."""
    root, copy = tmp_path / "live", tmp_path / "crashed"
    make = promotion_module.Promotion.make

    def copy_then_make(self: promotion_module.Promotion):  # noqa: ANN202
        if not copy.exists():
            crash_copy(root, copy)
        return make(self)

    monkeypatch.setattr(promotion_module.Promotion, "make", copy_then_make)

    async def go() -> tuple[str, list[bytes]]:
        dd = await open_dd(root, packed_appends=True, packed_threshold=4096)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 3)
        await _checkpoint(dd)
        await _producer_appends(log, 1, start=3)
        big = b'"' + b"y" * 5000 + b'"'
        await append(log, big, producer=("writer", 0, 4))
        messages = await read_all(log)
        await dd.close()
        return log.id, messages

    log_id, messages = run(go)
    assert not os.listdir(copy / "streams")

    _reopen_promoted(copy, log_id, messages, 4)


async def _keep_and_gone(tmp_path: Path) -> tuple[DataDir, StreamLog, StreamLog]:
    """A packed data directory with two packed streams with records: ``/keep`` (one append) and
    ``/gone`` (two), the one a delete test deletes."""
    dd = await open_dd(tmp_path, packed_appends=True)
    keep = await dd.create_stream(header("/keep"), None)
    gone = await dd.create_stream(header("/gone"), None)
    await _producer_appends(keep, 1)
    await _producer_appends(gone, 2)
    return dd, keep, gone


def test_a_delete_of_a_packed_stream_with_records_voids_them_and_its_pack_goes(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        dd, keep, gone = await _keep_and_gone(tmp_path)
        await _checkpoint(dd)
        g = next(iter(gone.extents.files()))[1]
        assert dd._committer.packs.counts[g] == 4  # two creates, two records entries
        await dd.delete_stream(gone)
        await _checkpoint(dd)
        assert dd._committer.packs.counts[g] == 2
        expected = packs.read_virtual(tmp_path, keep.extents)
        await dd.close()
        settled = wal.replay(tmp_path, sync=True).packed
        assert set(settled.live) == {keep.id}
        assert packs.read_virtual(tmp_path, settled.extents[keep.id]) == expected

    run(go)


def test_a_fork_of_a_packed_stream_with_records_promotes_the_source_first(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        source = await dd.create_stream(header("/src"), None)
        await _producer_appends(source, 2)
        virtual = packs.read_virtual(tmp_path, source.extents)
        fork = await dd.create_stream(
            header(
                "/fork",
                fork_source_id=source.id,
                fork_source_path="/src",
                fork_position=source.durable_tail,
            ),
            None,
        )
        assert not source.packed and source.extents is None  # the fork reads its files
        segment = (tmp_path / "streams" / source.id / segment_name(0)).read_bytes()
        assert segment == virtual
        assert await read_all(source) == [b'"m0"', b'"m1"']
        assert fork.header.fork_source_id == source.id
        await dd.close()

    run(go)


def test_a_rewritten_half_void_pack_relocates_the_extents_it_held(tmp_path: Path) -> None:
    """Deleting most packed streams of a pack rewrites it with the live entries only (step 1's
    compaction): the extents and header offsets of the streams left move with their entries."""

    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        made = [await dd.create_stream(header(f"/p{i}"), None) for i in range(6)]
        for log in made[:3]:
            await _producer_appends(log, 2)
        await _checkpoint(dd)
        keep, fresh = made[2], made[5]  # one with records, one without
        expected = packs.read_virtual(tmp_path, keep.extents)
        before = (keep.extents.pieces(0, keep.extents.end), dd._committer.packs.header_at[fresh.id])
        for log in [*made[:2], *made[3:5]]:
            await dd.delete_stream(log)
        await _checkpoint(dd)
        after = (keep.extents.pieces(0, keep.extents.end), dd._committer.packs.header_at[fresh.id])
        assert after != before  # the pack was rewritten: its entries moved
        assert packs.read_virtual(tmp_path, keep.extents) == expected
        await _producer_appends(fresh, 1)  # its header extent from the moved offset
        fresh_virtual = packs.read_virtual(tmp_path, fresh.extents)
        recovered = recovery.recover_packed(fresh.id, fresh_virtual, 1 << 16)
        assert recovered.state.tail == fresh.state.tail == 4
        await dd.close()
        settled = wal.replay(tmp_path, sync=True).packed
        assert set(settled.live) == {keep.id, fresh.id}
        assert packs.read_virtual(tmp_path, settled.extents[keep.id]) == expected
        assert packs.read_virtual(tmp_path, settled.extents[fresh.id]) == fresh_virtual

    run(go)


def test_a_packed_round_out_of_space_fails_that_append_only_and_heals_from_the_extents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 2)
        with monkeypatch.context() as patched:
            real = wal.WalFile.append

            def no_space(self: wal.WalFile, entries: list[wal.WalEntry]) -> None:
                patched.setattr(wal.WalFile, "append", real)  # once: the undo's sync succeeds
                raise OSError(errno.ENOSPC, "No space left on device")

            patched.setattr(wal.WalFile, "append", no_space)
            with pytest.raises(errors.InsufficientStorage):
                await append(log, b'"lost"', producer=("writer", 0, 2))
        deadline = asyncio.get_running_loop().time() + 30
        while log.poisoned:  # heals (out of space), folded again from its packed records
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        assert log.packed and log.state.producers["writer"].last_seq == 1
        await _producer_appends(log, 1, start=2)  # the retry is written, not a duplicate
        virtual = packs.read_virtual(tmp_path, log.extents)
        state = recovery.recover_packed(log.id, virtual, 1 << 16).state
        assert state.tail == log.durable_tail and state.producers == log.state.producers
        await dd.close()

    run(go)


def test_a_directory_asked_for_while_a_packed_round_is_in_flight_is_made_after_it(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        log = await dd.create_stream(header("/p"), None)
        e = entry(log, b'"a"')
        staged = log.stage(e)
        await asyncio.gather(staged, log.ensure_directory())
        assert not log.packed and log.extents is None
        assert await read_all(log) == [b'"a"']
        await dd.close()

    run(go)


def test_a_stream_dropped_while_its_wal_file_is_being_carried_counts_as_void(
    tmp_path: Path,
) -> None:
    """The checkpoint planned the carry of a WAL file, then (while the carry waits) a stream with
    records there is deleted: its carried entry is not counted live, so the pack is rewritten
    without it once its drop is retired, and the other stream's extents follow."""

    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        c = dd._committer
        keep = await dd.create_stream(header("/keep"), None)
        gone = await dd.create_stream(header("/gone"), None)
        await _producer_appends(keep, 1)
        await _producer_appends(gone, 1)
        g = c.generation - 1
        expected = packs.read_virtual(tmp_path, keep.extents)
        await c._pack_lock.acquire()
        c._rotate = True
        c._start()
        deadline = asyncio.get_running_loop().time() + 30
        while not c._unpacked:  # planned, waiting for the lock
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        await dd.delete_stream(gone)
        c._pack_lock.release()
        await _checkpoint(dd)  # the carry of g, then the retirement of the drop's WAL file
        assert c.packs.entries[g] == c.packs.counts[g] == 2  # rewritten: keep's create, records
        assert packs.read_virtual(tmp_path, keep.extents) == expected
        await dd.close()
        settled = wal.replay(tmp_path, sync=True).packed
        assert set(settled.live) == {keep.id}
        assert packs.read_virtual(tmp_path, settled.extents[keep.id]) == expected

    run(go)


def test_packed_creates_made_before_a_start_up_take_packed_appends_after_it(tmp_path: Path) -> None:
    """``settle`` says where each live packed create's header record is in its pack (one kept as
    it was, one written at start-up from a WAL file left by a power loss): their first appends after
    the start-up are packed records too, with the right header extent."""
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> tuple[str, str]:
        dd = await open_dd(root, packed_appends=True)
        old = await dd.create_stream(header("/old"), None)
        await _checkpoint(dd)  # /old is in a pack
        new = await dd.create_stream(header("/new"), None)  # /new only in the live WAL file
        crash_copy(root, copy)
        await dd.close()
        return old.id, new.id

    ids = run(write)

    async def reopen() -> dict[str, bytes]:
        dd = await DataDir.open(config(copy, packed_appends=True))
        out = {}
        for log_id in ids:
            log = dd.logs[log_id]
            await _producer_appends(log, 2)
            assert log.packed and log.extents is not None
            out[log_id] = packs.read_virtual(copy, log.extents)
            state = recovery.recover_packed(log_id, out[log_id], 1 << 16).state
            assert state.tail == log.durable_tail and state.producers == log.state.producers
        assert not os.listdir(copy / "streams")
        await dd.close()
        return out

    virtual = run(reopen)
    settled = wal.replay(copy, sync=True).packed
    for log_id in ids:
        assert packs.read_virtual(copy, settled.extents[log_id]) == virtual[log_id]


def test_a_close_writes_no_snapshot_for_a_packed_stream_with_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True, snapshot_interval_entries=1)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 260)  # past the close's snapshot threshold (256 entries)
        assert log.packed
        await dd.close()
        assert not os.listdir(tmp_path / "streams")
        assert "snapshot not written" not in caplog.text

    run(go)


def test_a_delete_with_a_packed_write_in_flight_leaves_nothing_tracked_or_live(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 1)
        staged = log.stage(entry(log, b'"late"'))
        await asyncio.gather(dd.delete_stream(log), staged, return_exceptions=True)
        await _checkpoint(dd)
        book = dd._committer.packs
        assert log.id not in book.extents and not book.is_packed(log.id)
        await dd.close()
        assert not wal.replay(tmp_path, sync=True).packed.live
        assert not [n for n in os.listdir(tmp_path / packs.PACKS_DIR) if n.endswith(".pack")]

    run(go)


def test_packed_appends_read_back_across_a_carry_and_a_restart(tmp_path: Path) -> None:
    """With the read half (h24): reads through the extents the round adds, relocated by the carry,
    and adopted at start-up (registered with the pack book), then more packed appends after it."""
    expected = [b'"m%d"' % i for i in range(5)]

    async def go() -> str:
        dd = await open_dd(tmp_path, packed_appends=True)
        log = await dd.create_stream(header("/p"), None)
        await _producer_appends(log, 3)
        assert await read_all(log) == expected[:3]
        await _checkpoint(dd)
        assert {w for w, _ in log.extents.files()} == {IN_PACK}
        assert await read_all(log) == expected[:3]
        await dd.close()
        return log.id

    log_id = run(go)

    async def reopen() -> None:
        dd = await DataDir.open(config(tmp_path, packed_appends=True))
        log = dd.logs[log_id]
        assert log.packed and await read_all(log) == expected[:3]
        assert dd._committer.packs.extents[log_id] is log.extents  # adopted, tracked
        assert _is_duplicate(log.state, 2)
        await _producer_appends(log, 2, start=3)
        assert log.packed and not os.listdir(tmp_path / "streams")
        await _checkpoint(dd)
        assert await read_all(log) == expected
        await dd.close()

    run(reopen)


def test_packed_records_answered_after_their_streams_drop_are_not_carried(tmp_path: Path) -> None:
    """``PackBook.wrote``'s guard: a round of packed records answered after its stream's DROP is
    durable (a round in flight during the delete) must not bring the stream back into the books:
    the checkpoint of that WAL file would carry the dropped stream's records into its pack, count
    them live, and keep that pack (and the stream's extents) forever, past the disk bound.

    Driven on the real pack book in the order the committer's rounds would answer, since
    ``DataDir.delete_stream`` waits for the log's batch first (the window is the engine's)."""
    book = packs.PackBook(tmp_path)
    book.appends = True
    head = b"h" * 40
    book.created("gone", 1, head, at=100)
    book.created("kept", 1, head, at=200)
    rows = {}
    for log_id, at in (("gone", 300), ("kept", 400)):
        extents = Extents()
        extents.add(IN_WAL, 1, at - 200, len(head), 0)  # its header, in the same WAL file
        extents.add(IN_WAL, 1, at, 30, len(head))
        rows[log_id] = extents
    book.superseded("gone", 1)  # its DROP, durable in WAL file 1 ...
    book.wrote("gone", rows["gone"], 1)  # ... then the round of its last packed records answers
    book.wrote("kept", rows["kept"], 1)
    assert "gone" not in book.extents and not book.is_packed("gone")
    plan = book.plan(1)
    assert set(plan.records) == {"kept"}  # nothing of the dropped stream carried
    assert plan.rows()["kept"] == [(400, 30, len(head))]
    assert [e.log_id for e in plan.keep] == ["kept"] and plan.dead == {1: ["gone"]}


def test_a_stream_dropped_while_its_records_are_carried_leaves_the_pack_removable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PackBook.carried_out`` counts live only the carried records of streams still packed: a
    stream deleted between the checkpoint's plan and the carry's end had its records carried all
    the same, but its DROP (answered meanwhile) could not name that new pack's entry as void. Were
    the entry counted live, the pack would outlive every stream in it (the disk bound). The carry
    is held in its worker thread (the only injection) while the delete runs for real."""
    entered, release = threading.Event(), threading.Event()
    carry_out = packs.PackBook.carry_out

    def held(self: packs.PackBook, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        entered.set()
        assert release.wait(30), "never released"
        return carry_out(self, *args, **kwargs)

    async def go() -> None:
        dd, keep, gone = await _keep_and_gone(tmp_path)
        loop = asyncio.get_running_loop()
        with monkeypatch.context() as patched:
            patched.setattr(packs.PackBook, "carry_out", held)
            carrying = asyncio.ensure_future(_checkpoint(dd))
            assert await loop.run_in_executor(None, entered.wait, 30), "no carry started"
            await asyncio.wait_for(dd.delete_stream(gone), 30)  # its DROP, mid-carry
            release.set()
            await asyncio.wait_for(carrying, 30)
        [(where, g)] = keep.extents.files()  # its header and records, carried into one pack
        assert where == IN_PACK
        book = dd._committer.packs
        assert book.counts[g] == 3  # two creates (the DROP's file not retired yet), keep's records
        await _checkpoint(dd)  # the DROP's WAL file: gone's create void
        assert book.counts[g] == 2
        await dd.delete_stream(keep)
        await _checkpoint(dd)
        assert g not in book.counts and g not in book.kept
        await dd.close()
        assert not list((tmp_path / packs.PACKS_DIR).glob("*.pack"))

    run(go)


def _round_jobs(root: Path, monkeypatch: pytest.MonkeyPatch, *, one_frame: bool) -> tuple:
    """Every round job the committer is given for a session of packed streams (several appends
    staged at once, a batch past the threshold, a checkpoint, a producer's appends), with the
    log ids numbered by first appearance; the messages read back; how often the one-frame
    ``round_job`` answered."""
    taken = []
    original = StreamLog._one_packed_append

    def counted(self: StreamLog, queue: list) -> object:  # type: ignore[type-arg]
        job = original(self, queue) if one_frame else None
        if job is not None:
            taken.append(self.id)
        return job

    monkeypatch.setattr(StreamLog, "_one_packed_append", counted)
    jobs: list[tuple] = []  # type: ignore[type-arg]
    ids: dict[str, int] = {}
    write_round = committer.Committer._write_round

    def recorded(self, round_jobs, *args):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        for job in round_jobs:
            number = ids.setdefault(job.target.log_id, len(ids))
            directory = job.target.directory.replace(str(root), "<root>")
            directory = directory.replace(job.target.log_id, f"<{number}>")
            target = (directory, job.target.segment_bytes, job.target.sync)
            jobs.append((number, target, job.items, job.seg_base, job.end, job.cost, job.packed))
            jobs.append(job.promote is None)
        return write_round(self, round_jobs, *args)

    monkeypatch.setattr(committer.Committer, "_write_round", recorded)

    async def go() -> list[list[bytes]]:
        dd = await open_dd(root, packed_appends=True, packed_threshold=4096)
        a = await dd.create_stream(header("/a"), None)
        b = await dd.create_stream(header("/b"), None)
        await _producer_appends(a, 3)
        await asyncio.gather(append(a, b'"x"'), append(a, b'"y"'), append(b, b'"z"'))
        await _checkpoint(dd)
        await _producer_appends(b, 2)
        await append(b, b'"' + b"x" * 5000 + b'"')  # past the threshold: promoted
        await append(b, b'"after"')
        await append(a, b'"last"', closes=True)
        messages = [await read_all(a), await read_all(b)]
        await dd.close()
        return messages

    messages = run(go)
    monkeypatch.setattr(StreamLog, "_one_packed_append", original)
    monkeypatch.setattr(committer.Committer, "_write_round", write_round)
    return jobs, messages, len(taken)


def test_the_one_frame_round_job_gives_the_general_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``StreamLog._one_packed_append`` (issue 17, h73) stands in for the general steps of
    ``round_job`` for one packed append: the same jobs, round by round, the same data."""
    ours = _round_jobs(tmp_path / "one-frame", monkeypatch, one_frame=True)
    general = _round_jobs(tmp_path / "general", monkeypatch, one_frame=False)
    assert ours[0] == general[0]
    assert ours[1] == general[1] and len(ours[1][1]) == 5
    assert general[2] == 0 and ours[2] >= 5, ours[2]
