"""Start-up of packed streams with records (decision 0010 step 2, ``wal.Kind.PACKED_RECORDS``): the
replay writes no segment for them, ``packs.settle`` carries the live ones into packs (a stream's
rounds of one WAL file coalesced into one entry) and gives each stream its extents, each logical byte
once, including after a crash between a pack's rename and its WAL file's removal; a DROP voids them,
a torn WAL tail is an unacknowledged round, a damaged pack entry leaves a gap in its stream only.

The packed creates are made by the real server storage (``DataDir``); the records entries are written
through ``WalFile`` as step 2's rounds write them (the commit path that writes them is not built yet:
see decision 0010, "Step 2: status")."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from durastream_server.storage import codec, packs, recovery, wal
from durastream_server.storage.extents import Extents
from durastream_server.storage.records import AppendEntry, ProducerTuple
from durastream_server.storage.segments import segment_name

from ._util import append, header, open_dd, run, sample_digest


def _packed_streams(root: Path, count: int) -> list[tuple[str, bytes]]:
    """``count`` packed creates, checkpointed into a pack: (id, header record) each."""

    async def go() -> list[tuple[str, bytes]]:
        dd = await open_dd(root)
        made = [await dd.create_stream(header(f"/p{i}"), None) for i in range(count)]
        await dd.close()
        return [(log.id, bytes(codec.encode_header(log.header))) for log in made]

    return run(go)


def _record(position: int, payload: bytes, seq: int) -> bytes:
    return bytes(
        codec.encode_append(
            AppendEntry(
                position=position,
                messages=(payload,),
                timestamp_ms=1_700_000_000_001,
                producer=ProducerTuple("writer", 0, seq),
                digest=sample_digest(payload),
            )
        )
    )


def _round(root: Path, generation: int, entries: list[wal.WalEntry]) -> None:
    """One synced round in WAL file ``generation`` (made if needed), as the committer appends it."""
    directory = root / wal.WAL_DIR
    path = directory / wal.wal_name(generation)
    if path.exists():
        fd = os.open(path, os.O_WRONLY)
        wal_file = wal.WalFile(directory, generation, fd)
        wal_file.end = path.stat().st_size
    else:
        wal_file = wal.WalFile.create(directory, generation)
    try:
        wal_file.append(entries)
    finally:
        wal_file.close()


def _records(log_id: str, position: int, *records: bytes) -> wal.WalEntry:
    return wal.WalEntry(log_id, 0, position, list(records), wal.Kind.PACKED_RECORDS)


def _read(root: Path, extents: Extents) -> bytes:
    """The stream's virtual segment 0, read through its extents (every one is in a pack now)."""
    out = b""
    for piece in extents.pieces(0, extents.end):
        path = root / packs.PACKS_DIR / packs.pack_name(piece.generation)
        with open(path, "rb") as fh:
            fh.seek(piece.offset)
            out += fh.read(piece.length)
    return out


def _next_generation(root: Path) -> int:
    return max(packs.pack_generations(root / packs.PACKS_DIR), default=-1) + 1


def test_packed_records_of_two_wal_files_come_back_from_packs_in_order(tmp_path: Path) -> None:
    [(a, head_a), (b, head_b)] = _packed_streams(tmp_path, 2)
    g = _next_generation(tmp_path)
    r1, r2, r3 = _record(0, b'"one"', 0), _record(1, b'"two"', 1), _record(2, b'"three"', 2)
    _round(tmp_path, g, [_records(a, len(head_a), r1)])
    _round(tmp_path, g, [_records(a, len(head_a) + len(r1), r2), _records(b, len(head_b), r1)])
    _round(tmp_path, g + 1, [_records(a, len(head_a) + len(r1) + len(r2), r3)])
    report = wal.replay(tmp_path, sync=True)
    settled = report.packed
    assert not list((tmp_path / wal.WAL_DIR).iterdir())  # every WAL file retired
    assert not os.listdir(tmp_path / "streams")  # no directory made, no segment written
    assert _read(tmp_path, settled.extents[a]) == head_a + r1 + r2 + r3
    assert _read(tmp_path, settled.extents[b]) == head_b + r1
    # A's two rounds of WAL file g are one entry of pack g: one extent per file holding its bytes.
    assert len(settled.extents[a]) == 3  # the header's pack, pack g, pack g + 1
    assert set(settled.live) == {a, b} and not settled.gaps
    assert report.next_generation == g + 2
    # A second start-up reads the packs alone and gives the same extents.
    again = wal.replay(tmp_path, sync=True).packed
    assert _read(tmp_path, again.extents[a]) == head_a + r1 + r2 + r3


def test_a_crash_between_the_packs_rename_and_the_wal_files_removal_reads_each_record_once(
    tmp_path: Path,
) -> None:
    [(a, head_a)] = _packed_streams(tmp_path, 1)
    g = _next_generation(tmp_path)
    r1, r2 = _record(0, b'"one"', 0), _record(1, b'"two"', 1)
    _round(tmp_path, g, [_records(a, len(head_a), r1)])
    _round(tmp_path, g, [_records(a, len(head_a) + len(r1), r2)])
    kept = tmp_path / "kept.wal"
    shutil.copy(tmp_path / wal.WAL_DIR / wal.wal_name(g), kept)
    wal.replay(tmp_path, sync=True)
    assert (tmp_path / packs.PACKS_DIR / packs.pack_name(g)).exists()
    # The WAL file is back beside the pack written from it: the same records in both.
    shutil.copy(kept, tmp_path / wal.WAL_DIR / wal.wal_name(g))
    settled = wal.replay(tmp_path, sync=True).packed
    assert _read(tmp_path, settled.extents[a]) == head_a + r1 + r2
    assert not settled.gaps


def test_a_drop_voids_a_packed_streams_records_and_its_packs_go(tmp_path: Path) -> None:
    [(a, head_a), (b, _head_b)] = _packed_streams(tmp_path, 2)
    g = _next_generation(tmp_path)
    _round(tmp_path, g, [_records(a, len(head_a), _record(0, b'"one"', 0))])
    wal.replay(tmp_path, sync=True)
    g2 = _next_generation(tmp_path)
    _round(tmp_path, g2, [wal.WalEntry(a, 0, 0, [], wal.Kind.DROP)])
    settled = wal.replay(tmp_path, sync=True).packed
    assert set(settled.live) == {b} and a not in settled.extents
    # Pack g held only A's records: removed. The first pack keeps B (its sidecar names A).
    assert not (tmp_path / packs.PACKS_DIR / packs.pack_name(g)).exists()


def test_a_torn_wal_tail_is_an_unacknowledged_round_of_packed_records(tmp_path: Path) -> None:
    [(a, head_a)] = _packed_streams(tmp_path, 1)
    g = _next_generation(tmp_path)
    r1, r2 = _record(0, b'"one"', 0), _record(1, b'"two"', 1)
    _round(tmp_path, g, [_records(a, len(head_a), r1)])
    _round(tmp_path, g, [_records(a, len(head_a) + len(r1), r2)])
    path = tmp_path / wal.WAL_DIR / wal.wal_name(g)
    os.truncate(path, path.stat().st_size - 3)  # the second round torn (never acknowledged)
    settled = wal.replay(tmp_path, sync=True).packed
    assert _read(tmp_path, settled.extents[a]) == head_a + r1
    assert not settled.gaps


def test_a_damaged_pack_entry_leaves_a_gap_in_its_stream_only(tmp_path: Path) -> None:
    [(a, head_a), (b, head_b)] = _packed_streams(tmp_path, 2)
    g = _next_generation(tmp_path)
    r1, r2 = _record(0, b'"one"', 0), _record(1, b'"two"', 1)
    _round(tmp_path, g, [_records(a, len(head_a), r1), _records(b, len(head_b), r1)])
    _round(tmp_path, g + 1, [_records(a, len(head_a) + len(r1), r2)])
    wal.replay(tmp_path, sync=True)
    pack = tmp_path / packs.PACKS_DIR / packs.pack_name(g)
    data = bytearray(pack.read_bytes())
    data[data.index(a.encode()) + 4] ^= 0xFF  # A's entry in pack g (its id, under the CRC)
    pack.write_bytes(bytes(data))
    settled = wal.replay(tmp_path, sync=True).packed
    assert settled.damaged == 1
    assert settled.gaps == [a]
    assert _read(tmp_path, settled.extents[a]) == head_a  # served up to the gap
    assert _read(tmp_path, settled.extents[b]) == head_b + r1  # the entry after the damage


def test_a_packed_streams_records_fold_to_the_state_its_promoted_segment_holds(
    tmp_path: Path,
) -> None:
    """The virtual segment 0 read back through the extents is byte for byte the segment 0 a promoted
    stream holds, and folds to the same state, producer dedup state included (a retried append after
    a restart is seen as a duplicate): the records of a real directory stream, written by the real
    writer, are cut at their record boundaries into a packed create and packed records entries."""
    live = tmp_path / "directory"

    async def write() -> tuple[str, bytes]:
        dd = await open_dd(live)
        log = await dd.create_stream(header("/chat"), None)
        for seq, payload in enumerate([b'"hello"', b'"how are you"', b'"bye"']):
            await append(log, payload, producer=("writer", 0, seq))
        await dd.close()
        return log.id, (live / "streams" / log.id / segment_name(0)).read_bytes()

    log_id, segment = run(write)
    boundaries = [0]
    while boundaries[-1] < len(segment):
        boundaries.append(boundaries[-1] + codec.parse_frame(segment, boundaries[-1]).record_len)
    assert len(boundaries) == 5  # the header and three appends
    packed = tmp_path / "packed"
    for name in ("streams", wal.WAL_DIR):
        (packed / name).mkdir(parents=True)
    head = segment[: boundaries[1]]
    _round(packed, 0, [wal.WalEntry(log_id, 0, 0, [head], wal.Kind.PACKED)])
    _round(packed, 0, [_records(log_id, boundaries[1], segment[boundaries[1] : boundaries[2]])])
    _round(packed, 1, [_records(log_id, boundaries[2], segment[boundaries[2] : boundaries[3]])])
    _round(packed, 1, [_records(log_id, boundaries[3], segment[boundaries[3] :])])
    settled = wal.replay(packed, sync=True).packed
    virtual = packs.read_virtual(packed, settled.extents[log_id])
    assert virtual == segment
    folded = recovery.recover_packed(log_id, virtual, 64)
    directory = recovery.recover_stream(str(live / "streams" / log_id), log_id, 64, sync=False)
    assert folded.state == directory.state
    assert (folded.file_end, folded.last_record) == (directory.file_end, directory.last_record)
    producer = folded.state.producers.get("writer")
    assert producer is not None and (producer.epoch, producer.last_seq) == (0, 2)
    assert producer.digest(2) == sample_digest(b'"bye"')  # a retry of seq 2 is a duplicate


def test_a_damaged_record_in_a_packed_stream_quarantines_it_never_cuts_it(tmp_path: Path) -> None:
    head = bytes(codec.encode_header(header("/q")))
    record = bytearray(_record(0, b'"x"', 0))
    record[-1] ^= 0xFF
    with pytest.raises(recovery.Quarantine, match="do not fold"):
        recovery.recover_packed("0" * 32, head + bytes(record), 64)


def test_a_pack_of_packed_records_alone_is_live_for_the_serving_pack_book(tmp_path: Path) -> None:
    """A pack holding only a live stream's records (its create is in an older pack) must not look
    empty to the checkpoint's ``PackBook.plan``, which removes packs with nothing live."""
    [(a, head_a)] = _packed_streams(tmp_path, 1)
    g = _next_generation(tmp_path)
    _round(tmp_path, g, [_records(a, len(head_a), _record(0, b'"one"', 0))])
    settled = wal.replay(tmp_path, sync=True).packed
    book = packs.PackBook(tmp_path)
    book.load(settled)
    assert book.counts.get(g)
    assert g not in book.plan(g + 1).remove
