"""The pack index (decision 0010, "Step 2: the pack index"; ``storage/packindex.py``) at the storage
layer: a damaged pack entry of a packed stream, whether its create, its first, a middle or its last
records entry, quarantines that stream (never served short) while the other streams of the same packs
serve whole; a missing, torn or stale index falls back to the scan (and today's behaviour for damage);
``settle`` writes the index of a clean pack that has none."""

from __future__ import annotations

import logging
import os
import random
from array import array
from pathlib import Path

import pytest

from durastream_server import datacheck, errors
from durastream_server.storage import DataDir, codec, committer, packindex, packs, wal
from durastream_server.storage.extents import coalesce, flat_lengths, records_offsets

from ._util import append, checkpoint, config, crash_copy, header, open_dd, read_all, run


@pytest.fixture(autouse=True)
def _no_idle_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer, "CHECKPOINT_IDLE_SECONDS", 3600.0)


def _three_streams(root: Path) -> list[str]:
    """/s0, /s1, /s2: packed, three records each, one per pack (three checkpoints): each stream's
    create and first records entry in pack 0, its middle one in pack 1, its last one in pack 2."""

    async def go() -> list[str]:
        dd = await open_dd(root, packed_appends=True)
        logs = [await dd.create_stream(header(f"/s{i}"), None) for i in range(3)]
        for round_ in range(3):
            for log in logs:
                await append(log, f'"m{round_}"'.encode())
            await checkpoint(dd)
        await dd.close()
        return [log.id for log in logs]

    ids = run(go)
    assert packs.pack_generations(root / packs.PACKS_DIR) == [0, 1, 2]
    return ids


def _rows(root: Path, generation: int) -> list[packindex.Row]:
    directory = root / packs.PACKS_DIR
    size = (directory / packs.pack_name(generation)).stat().st_size
    rows = packindex.read(directory, generation, size)
    assert rows is not None
    return rows


def _flip(root: Path, generation: int, row: packindex.Row) -> None:
    """Flip a byte in the middle of the entry ``row`` describes: its CRC fails."""
    pack = root / packs.PACKS_DIR / packs.pack_name(generation)
    data = bytearray(pack.read_bytes())
    data[row.offset + row.length // 2] ^= 0xFF
    pack.write_bytes(bytes(data))


_ENTRIES = {  # which entry of /s1: (pack generation, kind)
    "create": (0, 3),
    "first": (0, 5),
    "middle": (1, 5),
    "last": (2, 5),
}


async def _open_lazy(root: Path) -> DataDir:
    """As the server opens it: streams recovered on demand (``DataDir.recover``)."""
    return await DataDir.open(config(root, packed_appends=True), lazy=True)


async def _messages(dd: DataDir, log_id: str) -> int:
    if log_id not in dd.logs:
        await dd.recover([log_id])
    return len(await read_all(dd.logs[log_id]))


def _reopen_and_check(
    root: Path, quarantined: str, path: str, whole: tuple[str, ...] = (), messages: int = 0
) -> None:
    """Open ``root`` as the server does: the streams ``whole`` read back ``messages`` each, and the
    stream ``quarantined`` is never served, short or otherwise, its ``path`` reserved (listed by
    /healthz)."""

    async def check() -> None:
        dd = await _open_lazy(root)
        try:
            for log_id in whole:
                assert await _messages(dd, log_id) == messages
            if quarantined in dd.pending.hints:
                await dd.recover([quarantined])
            assert quarantined not in dd.logs
            assert path in dd.corrupt
        finally:
            await dd.close()

    run(check)


@pytest.mark.parametrize("which", sorted(_ENTRIES))
def test_a_damaged_entry_of_a_packed_stream_quarantines_it_and_the_others_serve_whole(
    tmp_path: Path, which: str
) -> None:
    ids = _three_streams(tmp_path)
    generation, kind = _ENTRIES[which]
    [row] = [r for r in _rows(tmp_path, generation) if r.log_id == ids[1] and r.kind == kind]
    _flip(tmp_path, generation, row)

    report = datacheck.verify_dir(tmp_path)
    assert report.damaged
    [s1] = [s for s in report.streams if s.path == "/s1"]
    assert s1.status == "damaged"
    assert all(s.status == "ok" for s in report.streams if s.path != "/s1")

    _reopen_and_check(tmp_path, ids[1], "/s1", (ids[0], ids[2]), 3)
    # The damage is kept: every start-up quarantines it again.
    _reopen_and_check(tmp_path, ids[1], "/s1", (ids[0], ids[2]), 3)
    assert generation in packs.pack_generations(tmp_path / packs.PACKS_DIR)


def test_without_a_valid_index_a_damaged_last_entry_is_served_as_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The fallback (the Limit of decision 0010 without the index): a torn index is not trusted."""
    ids = _three_streams(tmp_path)
    [row] = [r for r in _rows(tmp_path, 2) if r.log_id == ids[1]]
    index = tmp_path / packs.PACKS_DIR / packindex.index_name(2)
    index.write_bytes(index.read_bytes()[:-5])  # torn: its checksum fails
    _flip(tmp_path, 2, row)

    async def reopen() -> None:
        dd = await _open_lazy(tmp_path)
        try:
            assert await _messages(dd, ids[0]) == 3
            assert await _messages(dd, ids[1]) == 2  # the stream's id is under the failed CRC
            assert await _messages(dd, ids[2]) == 3
        finally:
            await dd.close()

    with caplog.at_level(logging.WARNING):
        run(reopen)
    assert "is not used: its checksum fails" in caplog.text
    assert "has no valid index" in caplog.text


@pytest.mark.parametrize("state", ["missing", "stale"])
def test_a_clean_pack_without_a_valid_index_is_read_whole_and_gets_one(
    tmp_path: Path, state: str
) -> None:
    ids = _three_streams(tmp_path)
    directory = tmp_path / packs.PACKS_DIR
    index = directory / packindex.index_name(1)
    if state == "missing":  # a crash between the pack's rename and its index's
        index.unlink()
    else:  # the index of another version of the pack (as before a rewrite): another size
        rows = _rows(tmp_path, 1)
        size = (directory / packs.pack_name(1)).stat().st_size
        index.write_bytes(packindex.encode(1, size + 141, rows + [rows[0]]))
        assert packindex.read(directory, 1, size) is None

    async def reopen() -> None:
        dd = await _open_lazy(tmp_path)
        try:
            for log_id in ids:
                assert await _messages(dd, log_id) == 3
        finally:
            await dd.close()

    run(reopen)
    assert [r.log_id for r in _rows(tmp_path, 1)] == ids  # written again by the start-up
    # And so a damaged entry of it is attributed from now on.
    [row] = [r for r in _rows(tmp_path, 1) if r.log_id == ids[2]]
    _flip(tmp_path, 1, row)

    _reopen_and_check(tmp_path, ids[2], "/s2")


def test_an_index_is_tied_to_its_packs_generation_and_size(tmp_path: Path) -> None:
    rows = [
        packindex.Row(0, 100, 3, "a" * 32, 0, "/x y"),
        packindex.Row(100, 50, 5, "a" * 32, 80, None),
    ]
    raw = packindex.encode(7, 150, rows)
    assert packindex.decode(raw, 7, 150) == rows
    for generation, size in ((8, 150), (7, 149)):
        with pytest.raises(ValueError, match="stale"):
            packindex.decode(raw, generation, size)
    damaged = bytearray(raw)
    damaged[40] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        packindex.decode(bytes(damaged), 7, 150)
    assert packindex.blamed(rows, [(120, 130)]) == [rows[1]]
    assert packindex.blamed(rows, [(99, 101)]) == rows


def test_a_pack_entry_damaged_while_serving_is_an_error_on_read_never_a_short_stream(
    tmp_path: Path,
) -> None:
    """The CRC of each record is checked when it is read (``reader``): damage that appears after
    start-up folded the stream answers ``CorruptStream`` (500), not the records before it."""
    ids = _three_streams(tmp_path)

    async def go() -> None:
        dd = await _open_lazy(tmp_path)
        try:
            assert await _messages(dd, ids[1]) == 3  # adopted whole: its records folded
            [row] = [r for r in _rows(tmp_path, 2) if r.log_id == ids[1]]
            _flip(tmp_path, 2, row)
            with pytest.raises(errors.CorruptStream):
                await read_all(dd.logs[ids[1]])
            assert await _messages(dd, ids[0]) == 3
        finally:
            await dd.close()

    run(go)


def test_after_a_power_loss_with_the_wal_live_a_damaged_pack_entry_still_quarantines(
    tmp_path: Path,
) -> None:
    """The data directory copied while the server runs, the WAL live (newer records of every stream
    in it, not checkpointed): the damaged entry of a pack is still attributed by its index, and the
    live WAL file's records of the other streams are read."""
    live = tmp_path / "live"
    ids = _three_streams(live)

    async def write_more() -> None:
        dd = await open_dd(live, packed_appends=True)
        for log_id in ids:  # opened whole (not lazy): every log is there
            await append(dd.logs[log_id], b'"m3"')
        crash_copy(live, tmp_path / "copy")
        await dd.close()

    run(write_more)
    copy = tmp_path / "copy"
    [row] = [r for r in _rows(copy, 1) if r.log_id == ids[1]]
    _flip(copy, 1, row)

    _reopen_and_check(copy, ids[1], "/s1", (ids[0], ids[2]), 4)
    _reopen_and_check(copy, ids[1], "/s1", (ids[0], ids[2]), 4)


def test_a_pack_kept_for_its_damage_outlives_the_deletes_of_its_other_streams(
    tmp_path: Path,
) -> None:
    """The other streams of the damaged pack deleted and checkpointed while serving: the pack is not
    removed (nor compacted), so the next start-up still quarantines the damaged entry's stream
    instead of finding it whole and shorter."""
    ids = _three_streams(tmp_path)
    [row] = [r for r in _rows(tmp_path, 2) if r.log_id == ids[1]]
    _flip(tmp_path, 2, row)

    async def delete_others() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        assert set(dd.logs) == {ids[0], ids[2]}
        for log_id in (ids[0], ids[2]):
            await dd.delete_stream(dd.logs[log_id])
        await checkpoint(dd)
        await checkpoint(dd)
        await dd.close()

    run(delete_others)
    assert 2 in packs.pack_generations(tmp_path / packs.PACKS_DIR)

    _reopen_and_check(tmp_path, ids[1], "/s1")
    _reopen_and_check(tmp_path, ids[1], "/s1")


@pytest.mark.parametrize("path", ["/plain", '/with "quotes" and \\ slash', "/naïve/日本", "/path"])
def test_the_path_of_a_packed_create_is_read_as_the_header_holds_it(path: str) -> None:
    record = bytes(codec.encode_header(header(path, fork_source_path="/x/path")))
    assert packindex._create_path(record) == packs.header_path(record) == path


def test_a_checkpoints_known_sizes_lay_out_the_same_pack_index_and_extents(
    tmp_path: Path,
) -> None:
    """Issue 16: a checkpoint merges a stream's rows as ``coalesce`` merges its entries
    (``_carried_entries``) and passes each entry's records bytes instead of summing them again; the
    pack, its index and the records' offsets are byte for byte those of the sums (and of the rows
    a clean scan of the pack gives)."""
    rng = random.Random(16)
    entries: list[wal.WalEntry] = []
    sizes: list[int] = []
    for s in range(40):
        log_id = f"{rng.getrandbits(128):032x}"
        create = wal.WalEntry(log_id, 0, 0, [b'{"path":"/s%d"}' % s], wal.Kind.PACKED)
        entries.append(create)
        sizes.append(len(create.records[0]))
        position, run = 40, []
        for _ in range(rng.randint(1, 6)):
            record = rng.randbytes(rng.randint(1, 40))
            run.append(wal.WalEntry(log_id, 0, position, [record], wal.Kind.PACKED_RECORDS))
            position += len(record) + (rng.random() < 0.3)  # some runs do not follow on
        merged = coalesce(run)
        read = {10_000 * s + e.offset: e.records[0] for e in run}  # as if at these WAL offsets
        rows = [(10_000 * s + e.offset, len(e.records[0]), e.offset) for e in run]
        carried: list[wal.WalEntry] = []
        carried_sizes: list[int] = []
        packs._carried_entries(log_id, rows, read, carried, carried_sizes)
        # The same bytes a run, joined into one record (one buffer to checksum and write).
        assert [(e.offset, e.records) for e in carried] == [
            (e.offset, [b"".join(e.records)]) for e in merged
        ]
        assert carried_sizes == packs.records_sizes(merged)
        entries += carried
        sizes += carried_sizes
    known, summed = tmp_path / "known", tmp_path / "summed"
    known.mkdir()
    summed.mkdir()
    size = packs.write_pack(known, 3, entries, sync=False, sizes=sizes)
    assert packs.write_pack(summed, 3, entries, sync=False) == size
    for name in (packs.pack_name(3), packindex.index_name(3)):
        assert (known / name).read_bytes() == (summed / name).read_bytes()
    scanned = wal.scan(known / packs.pack_name(3), 3, resync=True)
    assert packindex.rows_of_entries(entries, sizes) == packindex.rows_of_scan(scanned)
    assert packindex.encode_entries(3, size, entries, sizes) == packindex.encode(
        3, size, packindex.rows_of_scan(scanned)
    )
    rows = packs._rows(entries, sizes)
    assert rows == packs._rows(entries)
    offsets = records_offsets(entries)
    assert [r for e in entries for r in rows[e.log_id] if r[2] == e.offset] == [
        (at, n, e.offset) for e, at, n in zip(entries, offsets, sizes, strict=True)
    ]


def _count_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``packs.pread_exact`` counted: [calls so far]."""
    reads = [0]
    real = packs.pread_exact

    def counting(*args: int) -> bytes:
        reads[0] += 1
        return real(*args)

    monkeypatch.setattr(packs, "pread_exact", counting)
    return reads


def test_a_checkpoint_reads_its_wal_files_ranges_in_windows_as_one_pread_each_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16: ``_read_ranges`` reads nearby ranges in one window (close ones together, far ones
    and a window's limit apart), each range the bytes a ``pread`` of it gives; past the file's end
    it raises OSError as ``pread_exact`` does."""
    monkeypatch.setattr(packs, "_READ_WINDOW", 4096)
    rng = random.Random(16)
    data = rng.randbytes(200_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    streams, at = [], 0
    for _ in range(50):
        rows = []
        for _ in range(rng.randint(1, 5)):
            at += rng.choice([0, 3, 100, 20_000])
            length = rng.randint(1, 900)
            if at + length > len(data):
                break
            rows.append((at, length, 0))
            at += length
        streams.append(rows)
    fd = os.open(path, os.O_RDONLY)
    try:
        reads = _count_preads(monkeypatch)
        flats = [array("q", [k for o, n, p in rows for k in (0, o, n, p)]) for rows in streams]
        lengths = flat_lengths(rng.sample(flats, len(flats)))
        got = packs._read_ranges(fd, lengths)
        wanted = [(offset, length) for rows in streams for offset, length, _ in rows]
        assert lengths == dict(wanted)
        assert got == {o: data[o : o + n] for o, n in wanted}
        assert 1 < reads[0] < len(wanted)
        with pytest.raises(OSError, match="short read"):
            packs._read_ranges(fd, {len(data) - 10: 20})
    finally:
        os.close(fd)


@pytest.mark.parametrize("dense", [True, False])
def test_a_checkpoint_carries_a_dense_wal_files_records_as_one_read_as_a_record_at_a_time_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dense: bool
) -> None:
    """Issue 16: ``_carry_records`` reads a WAL file's packed records in one ``pread`` when they are
    most of its range and joins each stream's run at C speed; the entries (offsets, records bytes,
    sizes) are those of ``_read_ranges`` + ``_carried_entries`` a record at a time, with streams
    whose records leave a gap and streams with merged pack extents in front (step 2c), and the same
    when the records are sparse (the record-at-a-time path)."""
    rng = random.Random(16 + dense)
    monkeypatch.setattr(packs, "_READ_WINDOW", 64 << 10)
    data = rng.randbytes(2_000_000)
    path = tmp_path / "wal"
    path.write_bytes(data)
    records: dict[str, array] = {}
    heads: dict[str, tuple[int, list[bytes]]] = {}
    at = 0
    streams = [f"{s:032x}" for s in range(30)]
    positions = dict.fromkeys(streams, 100)
    for _ in range(6):  # rounds: each stream's records interleave with the others'
        for log_id in streams:
            length = rng.randint(1, 50)
            at += rng.randint(0, 30) if dense else rng.randint(3_000, 9_000)
            gap = rng.random() < 0.1
            flat = records.setdefault(log_id, array("q"))
            flat.extend((5, at, length, positions[log_id] + gap))
            positions[log_id] += gap + length
            at += length
    for log_id in streams[::3]:  # merged pack extents ending where its records start
        head = [rng.randbytes(rng.randint(1, 20)) for _ in range(2)]
        first = records[log_id][3]
        heads[log_id] = (first - sum(map(len, head)) - (log_id == streams[3]), head)
    reads = _count_preads(monkeypatch)
    fd = os.open(path, os.O_RDONLY)
    try:
        fast: list[wal.WalEntry] = []
        fast_sizes: list[int] = []
        packs._carry_records(fd, records, heads, fast, fast_sizes)
        assert (reads[0] == 1) is dense
        read = packs._read_ranges(fd, flat_lengths(records.values()))
    finally:
        os.close(fd)
    slow: list[wal.WalEntry] = []
    slow_sizes: list[int] = []
    for log_id, flat in records.items():
        rows = list(zip(flat[1::4], flat[2::4], flat[3::4], strict=True))
        packs._carried_entries(log_id, rows, read, slow, slow_sizes, heads.get(log_id))
    assert len(slow) > len(records)  # some gaps
    assert fast_sizes == slow_sizes
    assert [(e.log_id, e.offset, e.kind, b"".join(e.records)) for e in fast] == [
        (e.log_id, e.offset, e.kind, b"".join(e.records)) for e in slow
    ]
