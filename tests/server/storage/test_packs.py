"""Packed creates (decision 0010 step 1; ``storage/packs.py``, ``storage/promotion.py``) at the storage
layer: each state of a packed stream, a power loss with the WAL live (the data directory copied while it
runs, as ``test_wal.py`` does), a failed promotion, a damaged pack, and ``check``'s view of them."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path

import pytest

from durastream_server import datacheck, errors
from durastream_server.storage import DataDir, Durability, codec, committer, packindex, packs, wal
from durastream_server.storage import promotion as promotion_module
from durastream_server.storage.segments import segment_name

from ._util import append, checkpoint, config, crash_copy, header, open_dd, read_all, run


@pytest.fixture(autouse=True)
def _no_idle_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tests decide when checkpoints run (close, or a forced rotation).
    monkeypatch.setattr(committer, "CHECKPOINT_IDLE_SECONDS", 3600.0)


_checkpoint = checkpoint


def _packs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / packs.PACKS_DIR).iterdir())


def test_a_packed_create_makes_no_directory_and_its_first_append_promotes_it(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header("/p", ttl_seconds=30), None)
        assert log.packed and not os.listdir(tmp_path / "streams")
        assert dd._committer.packs.is_packed(log.id)
        assert await read_all(log) == []
        # Concurrent writes while it is promoted: in order, one directory.
        await asyncio.gather(*(append(log, b'"%d"' % i) for i in range(5)))
        assert not log.packed and os.listdir(tmp_path / "streams") == [log.id]
        assert await read_all(log) == [b'"%d"' % i for i in range(5)]
        assert not os.listdir(tmp_path / "staging")
        await dd.close()
        assert _packs(tmp_path) == []  # its pack held nothing live after the promotion
        dd = await open_dd(tmp_path)
        again = dd.logs[log.id]
        assert not again.packed and again.header.ttl_seconds == 30
        assert await read_all(again) == [b'"%d"' % i for i in range(5)]
        await dd.close()

    run(go)


def test_packed_streams_come_back_from_their_pack_after_a_clean_close(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        made = [await dd.create_stream(header(f"/k{i}", "text/plain"), None) for i in range(3)]
        await dd.close()
        assert len([n for n in _packs(tmp_path) if n.endswith(".pack")]) == 1
        assert not os.listdir(tmp_path / "wal") and not os.listdir(tmp_path / "streams")
        dd = await open_dd(tmp_path)
        assert sorted(dd.logs) == sorted(log.id for log in made)
        for log in made:
            back = dd.logs[log.id]
            assert back.packed and back.header == log.header and await read_all(back) == []
        await append(dd.logs[made[0].id], b"x")
        assert dd.packs_bytes > 0 and dd.packed_streams == 2
        await dd.close()

    run(go)


def test_a_power_loss_with_the_wal_live_keeps_packed_promoted_and_deleted_streams_right(
    tmp_path: Path,
) -> None:
    """Copied with the WAL live: the promotion's directory never reached the disk (taken away in the
    copy), a packed stream was deleted, another stayed packed from an older pack."""
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> dict[str, str]:
        dd = await open_dd(root)
        old = await dd.create_stream(header("/old"), None)
        gone_old = await dd.create_stream(header("/gone-old"), None)
        await _checkpoint(dd)  # /old and /gone-old are in a pack now
        assert [n for n in _packs(root) if n.endswith(".pack")]
        grown = await dd.create_stream(header("/grown"), None)
        half = await dd.create_stream(header("/half"), None)
        gone = await dd.create_stream(header("/gone"), None)
        await append(grown, b'"g1"')
        await append(grown, b'"g2"')
        await append(half, b'"h1"')
        await dd.delete_stream(await _current(dd, "/gone"))
        await dd.delete_stream(gone_old)
        crash_copy(root, copy)
        await dd.close()
        return {
            "old": old.id,
            "grown": grown.id,
            "half": half.id,
            "gone": gone.id,
            "gone_old": gone_old.id,
        }

    ids = run(write)
    shutil.rmtree(copy / "streams" / ids["grown"])  # the promoted directory's name was lost
    # Half made: the directory and the header reached the disk, the first write's record not.
    segment = copy / "streams" / ids["half"] / segment_name(0)
    header_end = codec.parse_frame(segment.read_bytes()).record_len
    os.truncate(segment, header_end)

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert not dd.quarantined
        assert set(dd.logs) == {ids["old"], ids["grown"], ids["half"]}
        assert dd.logs[ids["old"]].packed and await read_all(dd.logs[ids["old"]]) == []
        assert await read_all(dd.logs[ids["grown"]]) == [b'"g1"', b'"g2"']
        assert await read_all(dd.logs[ids["half"]]) == [b'"h1"']
        await dd.close()
        # And again: the start-up wrote what the WAL files said into the packs' sidecars.
        dd = await DataDir.open(config(copy))
        assert set(dd.logs) == {ids["old"], ids["grown"], ids["half"]}
        await dd.close()

    run(reopen)


async def _current(dd: DataDir, path: str):  # noqa: ANN202
    return next(log for log in dd.logs.values() if log.header.path == path)


def test_a_delete_whose_wal_file_is_retired_before_the_pack_is_written_to_its_sidecar(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        # Three of five stay live: the pack is not half void, so it is kept with a sidecar.
        kept = [await dd.create_stream(header(f"/keep{i}"), None) for i in range(3)]
        gone = await dd.create_stream(header("/gone"), None)
        grown = await dd.create_stream(header("/grown"), None)
        await _checkpoint(dd)
        [pack] = [n for n in _packs(tmp_path) if n.endswith(".pack")]
        generation = int(pack.split(".")[0])
        await dd.delete_stream(gone)
        await append(grown, b"1")
        await _checkpoint(dd)  # retires the WAL file with the DROP and the promotion
        assert not os.listdir(tmp_path / "wal")
        assert packs.read_dead(tmp_path / packs.PACKS_DIR, generation) == {gone.id, grown.id}
        await dd.delete_stream(dd.logs[grown.id])
        await _checkpoint(dd)
        await dd.close()
        dd = await open_dd(tmp_path)
        assert set(dd.logs) == {log.id for log in kept}
        await dd.close()

    run(go)


def _no_space_in_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """``mkdir`` in ``streams/`` fails as on a full disk (the one system call failed for real would
    need a full file system)."""
    real_mkdir = os.mkdir

    def no_space(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if os.sep + "streams" + os.sep in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", no_space)


async def _healed(log) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + 30
    while log.poisoned:  # heals (out of space), as any log does
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


def test_a_failed_promotion_fails_that_write_only_and_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header("/p"), None)
        with monkeypatch.context() as patched:
            _no_space_in_streams(patched)
            with pytest.raises(errors.InsufficientStorage):
                await append(log, b'"lost"')
        assert log.packed and not os.listdir(tmp_path / "streams")
        await _healed(log)
        assert log.state.tail == 0
        await append(log, b'"kept"')
        assert await read_all(log) == [b'"kept"']
        await dd.close()
        dd = await open_dd(tmp_path)
        assert await read_all(dd.logs[log.id]) == [b'"kept"']
        await dd.close()

    run(go)


def test_a_damaged_entry_in_a_pack_quarantines_only_the_stream_it_holds(tmp_path: Path) -> None:
    """The pack's index names the damaged entry's stream (its id is under the failed CRC): it is
    quarantined by its path; the entries after the damage are read (hazard 32)."""

    async def go() -> list[str]:
        dd = await open_dd(tmp_path)
        made = [await dd.create_stream(header(f"/d{i}"), None) for i in range(3)]
        await dd.close()
        return [log.id for log in made]

    ids = run(go)
    [pack] = (tmp_path / packs.PACKS_DIR).glob("*.pack")
    data = bytearray(pack.read_bytes())
    at = data.index(b"/d1")  # inside the second entry's header record
    data[at] ^= 0xFF
    pack.write_bytes(bytes(data))
    report = datacheck.verify_dir(tmp_path)
    assert report.damaged and any(f.kind == "pack" for f in report.findings)
    assert sorted((s.path, s.status) for s in report.streams) == [
        ("/d0", "ok"),
        ("/d1", "damaged"),
        ("/d2", "ok"),
    ]

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        assert set(dd.logs) == {ids[0], ids[2]}  # the entries after the damage are read
        assert "/d1" in dd.corrupt  # not made anew, listed by /healthz
        await dd.close()

    run(reopen)


def test_check_and_inspect_see_packed_streams_as_empty_streams(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        await dd.create_stream(header("/packed", "text/plain", ttl_seconds=60), None)
        grown = await dd.create_stream(header("/grown"), None)
        await append(grown, b'"1"')
        await dd.close()

    run(go)
    report = datacheck.verify_dir(tmp_path)
    assert not report.damaged and report.packed == 1 and report.packs_bytes > 0
    by_path = {s.path: s for s in report.streams}
    assert set(by_path) == {"/packed", "/grown"}
    packed = by_path["/packed"]
    assert packed.status == "ok" and packed.messages == 0 and packed.tail == 0
    assert packed.content_type == "text/plain" and packed.ttl_seconds == 60
    assert by_path["/grown"].messages == 1
    only = datacheck.verify_dir(tmp_path, only="/packed")
    assert [s.path for s in only.streams] == ["/packed"]


def test_a_torn_wal_tail_after_packed_creates_is_an_unacknowledged_round(tmp_path: Path) -> None:
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> str:
        dd = await open_dd(root)
        kept = await dd.create_stream(header("/kept"), None)
        crash_copy(root, copy)
        await dd.close()
        return kept.id

    kept = run(write)
    [path] = (copy / wal.WAL_DIR).glob("*.wal")
    with open(path, "ab") as fh:
        fh.write(b"\xd5\x77\x01\x03garbage")  # a round torn mid-entry

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert set(dd.logs) == {kept}
        await dd.close()
        [pack] = (copy / packs.PACKS_DIR).glob("*.pack")
        assert b"garbage" not in pack.read_bytes()  # cut at its last whole entry

    run(reopen)


def test_packs_opened_with_durability_none_are_served_deleted_and_promoted(tmp_path: Path) -> None:
    """A data directory written with fsync, reopened with ``--durability none`` (no WAL): the
    sidecar says what a DROP or a promotion would have said."""

    async def go() -> None:
        dd = await open_dd(tmp_path)
        made = [await dd.create_stream(header(f"/n{i}"), None) for i in range(3)]
        await dd.close()
        dd = await open_dd(tmp_path, durability=Durability.NONE)
        await dd.delete_stream(dd.logs[made[0].id])
        await append(dd.logs[made[1].id], b'"grown"')
        assert await read_all(dd.logs[made[1].id]) == [b'"grown"']
        await dd.close()
        dd = await open_dd(tmp_path)
        assert set(dd.logs) == {made[1].id, made[2].id}
        assert await read_all(dd.logs[made[1].id]) == [b'"grown"']
        await dd.delete_stream(dd.logs[made[1].id])
        await dd.close()
        dd = await open_dd(tmp_path)
        assert set(dd.logs) == {made[2].id} and dd.logs[made[2].id].packed
        await dd.close()

    run(go)


def test_promotions_beyond_the_fd_bound_close_their_files_at_the_checkpoint(tmp_path: Path) -> None:
    """Promotions are not held back by the pinned handles as creates are: 60 of them in flight keep
    60 segment files open until their checkpoint, which then trims the cache to its bound."""

    async def go() -> None:
        dd = await open_dd(tmp_path, max_open_files=8)
        logs = await asyncio.gather(*(dd.create_stream(header(f"/f{i}"), None) for i in range(60)))
        await asyncio.gather(*(append(log, b'"x"') for log in logs))
        await _checkpoint(dd)
        assert len(dd._ctx.cache) <= 8
        await dd.close()

    run(go)


def test_a_write_whose_promotion_failed_does_not_come_back_after_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed promotion's CREATE and record are durable in the WAL before the mkdir fails; the
    UNPROMOTE entry written before the answer voids them. Copied with the WAL live: once right after
    the failure (the stream comes back packed and empty), once after a later write promoted it (only
    that write). A directory the failed promotion left behind is removed by the replay."""
    root = tmp_path / "live"

    async def write() -> tuple[str, str]:
        dd = await open_dd(root)
        log = await dd.create_stream(header("/p"), None)
        other = await dd.create_stream(header("/other"), None)
        with monkeypatch.context() as patched:
            _no_space_in_streams(patched)
            with pytest.raises(errors.InsufficientStorage):
                await append(log, b'"lost"')
        kinds = [
            e[4] for e in wal.read_kinds(dd._committer._wal.path, dd._committer._wal.generation)
        ]
        assert kinds[-1] == wal.Kind.UNPROMOTE and wal.Kind.CREATE in kinds
        crash_copy(root, tmp_path / "after-failure")
        await _healed(log)
        await append(log, b'"kept"')
        await append(other, b'"o"')
        crash_copy(root, tmp_path / "after-retry")
        await dd.close()
        return log.id, other.id

    log_id, other_id = run(write)
    # As if removing the failed promotion's directory had failed too (a header-only segment 0).
    leftover = tmp_path / "after-failure" / "streams" / log_id
    leftover.mkdir()
    (leftover / segment_name(0)).write_bytes(codec.encode_header(header("/p")))

    async def reopen() -> None:
        dd = await DataDir.open(config(tmp_path / "after-failure"))
        assert set(dd.logs) == {log_id, other_id} and not dd.quarantined
        assert dd.logs[log_id].packed and await read_all(dd.logs[log_id]) == []
        assert not os.listdir(tmp_path / "after-failure" / "streams")
        await append(dd.logs[log_id], b'"new"')
        assert await read_all(dd.logs[log_id]) == [b'"new"']
        await dd.close()
        dd = await DataDir.open(config(tmp_path / "after-retry"))
        assert await read_all(dd.logs[log_id]) == [b'"kept"']
        assert await read_all(dd.logs[other_id]) == [b'"o"']
        await dd.close()

    run(reopen)


def test_an_unpromote_that_cannot_be_written_stops_writes_until_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both the promotion and its UNPROMOTE entry fail: no log writes again (a later promotion would
    be replayed over the failed one's entries) until a restart."""

    async def go() -> None:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header("/p"), None)
        real_append = wal.WalFile.append

        def refuse_unpromote(self, entries):  # noqa: ANN001, ANN202
            if any(e.kind == wal.Kind.UNPROMOTE for e in entries):
                raise OSError(errno.EIO, "Input/output error")
            return real_append(self, entries)

        with monkeypatch.context() as patched:
            _no_space_in_streams(patched)
            patched.setattr(wal.WalFile, "append", refuse_unpromote)
            with pytest.raises(errors.InsufficientStorage):
                await append(log, b'"lost"')
        assert dd._committer.failure is not None
        await dd.close()

    run(go)


def _pack_bytes(root: Path) -> int:
    """The packs and their sidecars (the disk bound of decision 0010; indexes are counted apart)."""
    return sum(
        p.stat().st_size for p in (root / packs.PACKS_DIR).iterdir() if p.suffix != packindex.SUFFIX
    )


def test_packs_hold_only_live_packed_creates_while_appends_fill_wal_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 creates, of which 1 stays packed, while appends fill several WAL files: each checkpoint
    writes a pack of its file's live packed creates only (not the WAL file), and half-void packs
    are rewritten, so packs/ stays a few KiB. Start-up then finds the one packed stream."""
    monkeypatch.setattr(committer, "CHECKPOINT_WAL_BYTES", 256 * 1024)

    async def go() -> None:
        dd = await open_dd(tmp_path)
        unused = await dd.create_stream(header("/unused"), None)
        busy = [await dd.create_stream(header(f"/s{i}"), None) for i in range(999)]
        payload = b'"' + b"x" * 2000 + b'"'
        for round_ in range(4):  # each pass writes every stream: ~2 MiB, several WAL files
            await asyncio.gather(*(append(log_, payload) for log_ in busy))
            await _checkpoint(dd)
            await _checkpoint(dd)  # the promotions' WAL files retired: their creates are void
            assert _pack_bytes(tmp_path) < 4096, (round_, _packs(tmp_path))
        assert dd._committer.packs.disk_bytes < 4096
        await dd.close()
        dd = await open_dd(tmp_path)
        assert dd.logs[unused.id].packed and dd._committer.packs.live == {
            unused.id: dd._committer.packs.live[unused.id]
        }
        assert _pack_bytes(tmp_path) < 4096
        await dd.close()

    run(go)


def test_a_half_void_pack_is_rewritten_with_its_live_creates_and_its_sidecar_goes(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        logs = [await dd.create_stream(header(f"/p{i}"), None) for i in range(10)]
        await _checkpoint(dd)
        [pack] = [n for n in _packs(tmp_path) if n.endswith(".pack")]
        generation = int(pack.split(".")[0])
        full = _pack_bytes(tmp_path)
        for log_ in logs[:4]:  # 4 of 10 void: a sidecar
            await dd.delete_stream(log_)
        await _checkpoint(dd)
        assert packs.read_dead(tmp_path / packs.PACKS_DIR, generation) == {g.id for g in logs[:4]}
        await dd.delete_stream(logs[4])  # 5 of 10: rewritten with the 5 live ones
        await _checkpoint(dd)
        index = packindex.index_name(generation)
        assert _packs(tmp_path) == [index, pack]  # the sidecar gone, the index of the new pack
        size = (tmp_path / packs.PACKS_DIR / pack).stat().st_size
        rows = packindex.read(tmp_path / packs.PACKS_DIR, generation, size)
        assert rows is not None and [r.log_id for r in rows] == [g.id for g in logs[5:]]
        assert _pack_bytes(tmp_path) < full * 0.6
        scanned = wal.scan(tmp_path / packs.PACKS_DIR / pack, generation, resync=True)
        assert [e[0] for e in scanned.entries] == [g.id for g in logs[5:]]
        assert dd._committer.packs.entries[generation] == 5
        await dd.close()
        dd = await open_dd(tmp_path)
        assert set(dd.logs) == {g.id for g in logs[5:]}
        assert all(dd.logs[g.id].packed for g in logs[5:])
        await dd.close()

    run(go)


def test_an_old_pack_that_is_a_whole_wal_file_is_cut_to_its_live_creates_at_start_up(
    tmp_path: Path,
) -> None:
    """Packs written before this change were whole WAL files (records of other streams included):
    the first start-up rewrites them with their live packed creates only."""

    async def go() -> str:
        dd = await open_dd(tmp_path)
        keep = await dd.create_stream(header("/keep"), None)
        busy = await dd.create_stream(header("/busy"), None)
        for i in range(50):
            await append(busy, b'"%d"' % i)
        path = dd._committer._wal.path
        generation = dd._committer._wal.generation
        whole = path.read_bytes()
        await dd.close()
        (tmp_path / packs.PACKS_DIR / packs.pack_name(generation)).write_bytes(whole)
        return keep.id

    keep_id = run(go)
    before = _pack_bytes(tmp_path)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        assert dd.logs[keep_id].packed
        assert _pack_bytes(tmp_path) < before / 4
        await dd.close()

    run(reopen)


def test_a_crash_at_each_step_of_writing_or_rewriting_a_pack_loses_or_duplicates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data directory copied as a SIGKILL would leave it just before and after every rename into
    ``packs/`` (a new pack of a retired WAL file, a half-void pack rewritten, and each pack's index)
    and before the WAL file's and an old index's removal: each copy starts with the same streams,
    each once, packed as they were, and every pack then has the index of its own bytes."""
    root = tmp_path / "live"
    snapshots: list[tuple[str, Path]] = []
    real_rename, real_unlink = os.rename, os.unlink

    def snapshot(label: str) -> None:
        into = tmp_path / f"crash{len(snapshots)}"
        shutil.copytree(
            root, into, ignore=lambda d, names: names if Path(d).name == "trash" else ()
        )
        snapshots.append((label, into))

    def rename(src, dst, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(dst).endswith((".pack", packindex.SUFFIX)):
            snapshot(f"before renaming {dst}")
            real_rename(src, dst, *args, **kwargs)
            snapshot(f"after renaming {dst}")
            return None
        return real_rename(src, dst, *args, **kwargs)

    def unlink(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).endswith((".wal", ".dead", packindex.SUFFIX)):
            snapshot(f"before removing {path}")
        return real_unlink(path, *args, **kwargs)

    async def write() -> tuple[set[str], set[str], int]:
        dd = await open_dd(root)
        logs = [await dd.create_stream(header(f"/p{i}"), None) for i in range(10)]
        await _checkpoint(dd)  # pack A
        first = len(snapshots)
        for log_ in logs[:6]:
            await dd.delete_stream(log_)
        await append(logs[6], b'"grown"')
        late = [await dd.create_stream(header(f"/late{i}"), None) for i in range(2)]
        # Retires the WAL file of the deletes, the promotion and /late*: A (7 of 10 void) is
        # rewritten, pack B holds /late*, then the WAL file goes.
        await _checkpoint(dd)
        await dd.close()
        packed = {g.id for g in logs[7:] + late}
        return packed, packed | {logs[6].id}, first

    with monkeypatch.context() as patched:
        patched.setattr(os, "rename", rename)
        patched.setattr(os, "unlink", unlink)
        packed, streams, first = run(write)
    assert len(snapshots) >= 8, [label for label, _ in snapshots]

    labels = [label for label, _ in snapshots[first:]]
    assert any("before renaming" in x for x in labels) and any(".wal" in x for x in labels), labels
    assert any(f"renaming {root}" in x and x.endswith(packindex.SUFFIX) for x in labels), labels
    assert any(f"removing {root}" in x and x.endswith(packindex.SUFFIX) for x in labels), labels

    async def reopen(label: str, copy: Path) -> None:
        for _ in range(2):  # and once more after the first start-up settled the packs
            dd = await DataDir.open(config(copy))
            book = dd._committer.packs
            # Every delete and the append were acknowledged before these copies were taken.
            assert set(dd.logs) == streams, label
            assert {i for i, log_ in dd.logs.items() if log_.packed} == packed == set(book.live)
            assert sum(book.counts.values()) == len(packed), label
            scanned = [
                e[0]
                for g in packs.pack_generations(copy / packs.PACKS_DIR)
                for e in wal.scan(copy / packs.PACKS_DIR / packs.pack_name(g), g).entries
            ]
            assert sorted(scanned) == sorted(packed), label  # one entry per packed stream
            for g in packs.pack_generations(copy / packs.PACKS_DIR):
                pack = copy / packs.PACKS_DIR / packs.pack_name(g)
                rows = packindex.read(copy / packs.PACKS_DIR, g, pack.stat().st_size)
                want = wal.scan(pack, g).entries
                assert rows is not None, label
                assert [(r.log_id, r.kind) for r in rows] == [(e[0], e[4]) for e in want], label
            assert not [n for n in os.listdir(copy / packs.PACKS_DIR) if n.endswith(".tmp")]
            await dd.close()

    for label, copy in snapshots[first:]:
        run(lambda: reopen(label, copy))  # noqa: B023


def test_a_failed_promotion_whose_directory_cannot_be_removed_stops_writes_until_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment write fails after the mkdir and the directory cannot be removed either: once the
    UNPROMOTE's WAL file were retired, a restart would take that directory for the stream. So no log
    writes until the restart, whose replay removes it: the stream is packed and empty."""

    async def go() -> str:
        dd = await open_dd(tmp_path)
        log = await dd.create_stream(header("/p"), None)
        with monkeypatch.context() as patched:
            patched.setattr(
                promotion_module,
                "pwrite_all",
                lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")),
            )
            patched.setattr(promotion_module.shutil, "rmtree", lambda *a, **k: None)
            with pytest.raises(errors.InsufficientStorage):
                await append(log, b'"lost"')
        assert os.listdir(tmp_path / "streams") == [log.id]
        assert dd._committer.failure is not None
        await dd.close()
        return log.id

    log_id = run(go)

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        assert not os.listdir(tmp_path / "streams")
        assert dd.logs[log_id].packed and await read_all(dd.logs[log_id]) == []
        await dd.close()

    run(reopen)


def test_no_space_for_a_pack_keeps_its_wal_file_writes_go_on_and_the_next_checkpoint_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's pack is new bytes: on a full disk it cannot be written. The retired WAL file then
    stays (it still holds the packed creates), no stream stops accepting writes, and once there is
    space the next checkpoint writes the packs of every file left, oldest first. A crash or a clean
    close meanwhile reads the files left in wal/ again."""

    def no_space(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    def wal_files(root: Path) -> list[str]:
        return sorted(os.listdir(root / "wal"))

    async def go() -> None:
        dd = await open_dd(tmp_path)
        with monkeypatch.context() as patched:
            patched.setattr(packs, "write_pack", no_space)
            first = await dd.create_stream(header("/first"), None)
            await _checkpoint(dd)
            second = await dd.create_stream(header("/second"), None)
            busy = await dd.create_stream(header("/busy"), None)
            await append(busy, b'"1"')  # a promotion: writes go on
            await _checkpoint(dd)
            assert dd._committer.failure is None
            assert len(dd._committer._unpacked) == 2
            assert not [n for n in _packs(tmp_path) if n.endswith(".pack")]
            assert len(wal_files(tmp_path)) == 2  # both retired files kept
            await append(busy, b'"2"')
            crashed = crash_copy(tmp_path, tmp_path.parent / "crashed")
        await _checkpoint(dd)  # space again: both files' packs written, the files removed
        assert dd._committer._unpacked == [] and dd._committer.failure is None
        assert len([n for n in _packs(tmp_path) if n.endswith(".pack")]) == 2
        assert len(wal_files(tmp_path)) <= 1
        assert dd.packed_streams == 2
        await dd.close()
        for root in (tmp_path, crashed):
            dd = await open_dd(root)
            assert dd.logs[first.id].packed and dd.logs[second.id].packed
            assert await read_all(dd.logs[first.id]) == []
            assert await read_all(dd.logs[busy.id]) == [b'"1"', b'"2"']
            assert dd.packed_streams == 2
            await dd.close()

    run(go)


def test_a_close_while_out_of_space_for_packs_leaves_the_wal_files_to_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    async def go() -> None:
        dd = await open_dd(tmp_path)
        with monkeypatch.context() as patched:
            patched.setattr(packs, "write_pack", no_space)
            made = [await dd.create_stream(header(f"/k{i}"), None) for i in range(3)]
            await dd.close()
        assert os.listdir(tmp_path / "wal")  # kept: they hold the packed creates
        dd = await open_dd(tmp_path)
        assert all(dd.logs[log.id].packed for log in made)
        await dd.close()
        assert not os.listdir(tmp_path / "wal")
        assert [n for n in _packs(tmp_path) if n.endswith(".pack")]

    run(go)
