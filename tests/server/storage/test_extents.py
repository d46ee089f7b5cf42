"""A packed stream's extents (decision 0010 step 2, ``storage/extents.py``): lookups, merging, the move
of a retired WAL file's extents into its pack, and the memory an idle stream's extents take (issue 17:
<= 2 KiB RSS per idle stream)."""

from __future__ import annotations

import copy
import os
import random
import tracemalloc
from pathlib import Path

import pytest

from durastream_server.storage import codec, wal
from durastream_server.storage.extents import (
    IN_PACK,
    IN_WAL,
    Extents,
    Piece,
    coalesce,
    may_merge,
    merge_choice,
    records_offsets,
)
from durastream_server.storage.files import pread_exact, pwrite_all

from ._util import header

ID = "0123456789abcdef0123456789abcdef"


def _entry(position: int, data: bytes, log_id: str = ID) -> wal.WalEntry:
    return wal.WalEntry(log_id, 0, position, [data], wal.Kind.PACKED)


def test_extents_map_logical_positions_to_file_ranges() -> None:
    extents = Extents()
    extents.add(IN_PACK, 3, 100, 50, 0)  # the header record, in pack 3
    extents.add(IN_WAL, 7, 1000, 20, 50)
    extents.add(IN_WAL, 7, 2000, 30, 70)
    assert (extents.start, extents.end, len(extents)) == (0, 100, 3)
    assert extents.pieces(60, 80) == [
        Piece(IN_WAL, 7, 1010, 10, 60),
        Piece(IN_WAL, 7, 2000, 10, 70),
    ]
    assert extents.pieces(0, 10_000) == [
        Piece(IN_PACK, 3, 100, 50, 0),
        Piece(IN_WAL, 7, 1000, 20, 50),
        Piece(IN_WAL, 7, 2000, 30, 70),
    ]
    assert extents.pieces(100, 200) == []  # at the end: nothing to read yet
    assert extents.files() == {(IN_PACK, 3), (IN_WAL, 7)}


def test_an_extent_that_follows_the_last_in_its_file_is_merged() -> None:
    extents = Extents()
    extents.add(IN_PACK, 3, 100, 50, 0)
    extents.add(IN_PACK, 3, 150, 25, 50)
    assert len(extents) == 1
    assert extents.pieces(0, 75) == [Piece(IN_PACK, 3, 100, 75, 0)]
    # The same generation's WAL file is another file: not merged.
    extents.add(IN_WAL, 3, 175, 5, 75)
    assert len(extents) == 2


def test_extents_refuse_a_gap_an_overlap_or_an_empty_extent() -> None:
    extents = Extents()
    extents.add(IN_WAL, 1, 0, 10, 0)
    with pytest.raises(ValueError, match="end at 10"):
        extents.add(IN_WAL, 1, 50, 10, 12)
    with pytest.raises(ValueError, match="end at 10"):
        extents.add(IN_WAL, 1, 50, 10, 5)
    with pytest.raises(ValueError, match="0 bytes"):
        extents.add(IN_WAL, 1, 50, 0, 10)
    with pytest.raises(ValueError, match="before the stream's first extent"):
        _starting_at(40).pieces(10, 50)


def _starting_at(position: int) -> Extents:
    extents = Extents()
    extents.add(IN_WAL, 1, 0, 10, position)
    return extents


def test_relocate_moves_a_wal_files_extents_into_its_pack_and_checks_the_cover() -> None:
    extents = Extents()
    extents.add(IN_PACK, 2, 40, 50, 0)
    extents.add(IN_WAL, 5, 1000, 20, 50)
    extents.add(IN_WAL, 5, 2000, 30, 70)
    extents.add(IN_WAL, 6, 300, 10, 100)
    extents.relocate(IN_WAL, 5, [(80, 50, 50)], (IN_PACK, 5))
    assert extents.pieces(0, 110) == [
        Piece(IN_PACK, 2, 40, 50, 0),
        Piece(IN_PACK, 5, 80, 50, 50),
        Piece(IN_WAL, 6, 300, 10, 100),
    ]
    with pytest.raises(ValueError, match="do not cover"):
        extents.relocate(IN_WAL, 6, [(0, 9, 100)], (IN_PACK, 6))
    with pytest.raises(ValueError, match="do not cover"):
        extents.relocate(IN_WAL, 6, [(0, 10, 101)], (IN_PACK, 6))
    assert extents.pieces(100, 110) == [Piece(IN_WAL, 6, 300, 10, 100)]  # unchanged on refusal


def _relocated_whole(
    extents: Extents,
    where: int,
    generation: int,
    moved: list[tuple[int, int, int]],
    to: tuple[int, int],
) -> tuple[int, ...]:
    """What ``relocate`` made before it kept the extents ahead of the first moved one: every
    extent rebuilt in logical order (the reference the faster one must equal, extent for extent)."""
    rows = extents.rows()
    key = generation * 2 + where
    kept = [rows[i : i + 4] for i in range(0, len(rows), 4) if rows[i] != key]
    kept += [(to[1] * 2 + to[0], offset, length, position) for offset, length, position in moved]
    fresh = Extents()
    for k, offset, length, position in sorted(kept, key=lambda e: e[3]):
        fresh.add(k & 1, k >> 1, offset, length, position)
    return fresh.rows()


def test_relocate_keeps_the_extents_ahead_and_equals_a_whole_rebuild() -> None:
    """Issue 16: a stream carried at every checkpoint gains a pack extent each time; relocating its
    retired WAL file's extents rebuilds only from the first of them, with the same result as the
    whole rebuild: a stream with many packs, the WAL file's extents among or after others, merged
    with a neighbour in the same pack, a pack's rewrite moving extents in the middle, none moved."""
    rng = random.Random(16)
    for case in range(300):
        extents = Extents()
        position = 0
        for _ in range(rng.randint(1, 30)):
            where, generation = rng.choice(
                [(IN_PACK, g) for g in range(1, 6)] + [(IN_WAL, 7), (IN_WAL, 8)]
            )
            length = rng.randint(1, 9)
            extents.add(where, generation, rng.randint(0, 1 << 20), length, position)
            position += length
        where, generation = rng.choice([(IN_WAL, 7), (IN_PACK, 3), (IN_WAL, 9)])
        gone = extents.in_file(where, generation)
        to = (IN_PACK, generation)
        at = rng.choice([0, 500])
        moved = []
        cursor = at
        for _, length, pos in gone:  # back to back in the new file (merged) or spaced apart
            moved.append((cursor, length, pos))
            cursor += length if at else 10
        expected = _relocated_whole(extents, where, generation, moved, to)
        before = extents.rows()
        other = copy.deepcopy(extents)  # a rewrite's void entry (an unknown start) is left out
        other.relocate(where, generation, [*moved, (1 << 30, 5, 1 << 40)], to, known_only=True)
        assert other.rows() == (expected if gone else before), case
        extents.relocate(where, generation, moved, to)
        assert extents.rows() == expected, case
        assert extents.in_file(where, generation) == [] or to == (where, generation)


def test_a_checkpoints_fast_paths_equal_the_general_ones() -> None:
    """Issue 16 (h69): a checkpoint's per-stream work on the loop takes C-level slices when a file's
    extents are one run (``in_file``, ``relocate`` and ``merge``), and skips ``merge_choice`` for a
    stream with too few extents (``may_merge``). Each must give what the general path gives: the
    extents in a file built one by one, a merge equal to the whole rebuild, and no stream that
    ``may_merge`` rules out for which ``merge_choice`` would choose something."""
    rng = random.Random(69)
    runs = merges = 0
    for case in range(400):
        extents = Extents()
        position = 0
        for _ in range(rng.randint(1, 14)):
            where, generation = rng.choice(
                [(IN_PACK, g) for g in range(1, 5)] + [(IN_WAL, 7), (IN_WAL, 7), (IN_WAL, 8)]
            )
            length = rng.randint(1, 9)
            extents.add(where, generation, rng.randint(0, 1 << 20), length, position)
            position += length
        rows = extents.rows()
        for where, generation in [(IN_WAL, 7), (IN_PACK, 2), (IN_WAL, 9)]:
            key = generation * 2 + where
            expected = [
                (rows[i + 1], rows[i + 2], rows[i + 3])
                for i in range(0, len(rows), 4)
                if rows[i] == key
            ]
            assert extents.in_file(where, generation) == expected, case
        news = extents.in_file(IN_WAL, 7)
        if news:
            for first, length, _ in [(news[0][2], news[0][1], 0), (rows[-1], rows[-2], 0)]:
                chosen = merge_choice(rows, 1, first, length)
                assert may_merge(extents, first) or chosen == [], case
                merges += bool(chosen)
        # A merge of the WAL file's extents with a pack's: the files' extents, one entry in pack 9.
        files = {(IN_WAL, 7), (IN_PACK, rng.randint(1, 4))}
        keys = {g * 2 + w for w, g in files}
        gone = [(rows[i + 3], rows[i + 2]) for i in range(0, len(rows), 4) if rows[i] in keys]
        if not gone:
            continue
        moved = [(100, sum(length for _, length in gone), gone[0][0])]
        kept = [rows[i : i + 4] for i in range(0, len(rows), 4) if rows[i] not in keys]
        kept += [(9 * 2 + IN_PACK, *moved[0][:2], moved[0][2])]
        whole = Extents()
        try:
            for k, offset, length, pos in sorted(kept, key=lambda e: e[3]):
                whole.add(k & 1, k >> 1, offset, length, pos)
        except ValueError:  # the files' extents are not one logical run: the merge refuses
            with pytest.raises(ValueError):
                extents.merge(files, moved, (IN_PACK, 9))
            assert extents.rows() == rows, case
            continue
        runs += 1
        extents.merge(files, moved, (IN_PACK, 9))
        assert extents.rows() == whole.rows(), case
    assert runs > 50  # the fast path was taken, not only the refusals
    assert merges > 0  # and ``may_merge`` let merges through


def test_coalesced_entries_written_to_a_file_are_read_back_through_their_extents(
    tmp_path: Path,
) -> None:
    """The checkpoint's path, on a real file: one stream's rounds of a WAL file become one entry of
    its pack; ``records_offsets`` says where its records are; a pread there gives the same bytes."""
    other = "f" * 32
    rounds = [
        _entry(0, b"H" * 40),
        _entry(40, b"a" * 7),
        _entry(47, b"b" * 9),
        _entry(0, b"x" * 3, other),
    ]
    merged = coalesce(rounds[:3]) + coalesce(rounds[3:])
    assert [(e.log_id, e.offset) for e in merged] == [(ID, 0), (other, 0)]
    path = tmp_path / "pack"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        buffers = []
        for entry in merged:
            buffers += wal.encode_entry(9, entry)
        pwrite_all(fd, buffers, 0)
        offsets = records_offsets(merged)
        extents = Extents()
        extents.add(IN_PACK, 9, offsets[0], 56, 0)
        got = b"".join(pread_exact(fd, p.length, p.offset) for p in extents.pieces(30, 56))
        assert got == b"H" * 10 + b"a" * 7 + b"b" * 9
        assert pread_exact(fd, 3, offsets[1]) == b"xxx"
    finally:
        os.close(fd)
    # And the file scans as the WAL entries it claims to be (the generation check passes).
    scanned = wal.scan(path, 9, resync=True)
    assert [(log_id, offset) for log_id, _s, offset, _r, _k in scanned.entries] == [
        (ID, 0),
        (other, 0),
    ]


def test_coalesce_keeps_entries_apart_that_do_not_follow_each_other() -> None:
    a, b = _entry(0, b"1" * 4), _entry(10, b"2" * 4)
    assert coalesce([a, b]) == [a, b]
    assert coalesce([_entry(0, b""), a]) == [a]


def test_coalesce_merges_long_runs_whole_and_in_order() -> None:
    """A stream written in many rounds of one WAL file (a hot stream between checkpoints): one entry
    per run of following records, every record in order, an empty entry merged in place, another
    log's entry or a gap starting a new run."""
    rounds = [_entry(i * 3, bytes([65 + i % 26]) * 3) for i in range(2000)]
    gap = _entry(2000 * 3 + 5, b"zz")
    other = _entry(2000 * 3 + 7, b"yy", log_id="other")
    merged = coalesce([*rounds[:10], _entry(30, b""), *rounds[10:], gap, other])
    assert [(e.log_id, e.offset) for e in merged] == [(ID, 0), (ID, 6005), ("other", 6007)]
    assert b"".join(merged[0].records) == b"".join(r.records[0] for r in rounds)
    assert merged[1] is gap and merged[2] is other


def test_an_idle_packed_streams_extents_take_well_under_issue_17s_budget() -> None:
    """Issue 17: <= 2 KiB RSS per idle stream, all of it. The extents of 10,000 streams of 3 extents
    each (a pack, two WAL files not yet retired) are measured with tracemalloc (their allocations,
    not a timing): under 256 bytes a stream, leaving the rest of the budget to the ``StreamLog``."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        streams = []
        for i in range(10_000):
            extents = Extents()
            extents.add(IN_PACK, 1, i * 300, 200, 0)
            extents.add(IN_WAL, 4, i * 64, 30, 200)
            extents.add(IN_WAL, 5, i * 64, 30, 230)
            streams.append(extents)
        per_stream = (tracemalloc.get_traced_memory()[0] - before) / len(streams)
    finally:
        tracemalloc.stop()
    assert per_stream < 256, per_stream
    assert streams[0].nbytes < 256


def test_a_packed_streams_header_entry_is_its_first_extent() -> None:
    """The virtual segment 0 starts with the header record, as a promoted stream's segment 0 does."""
    frame = codec.encode_header(header("/x"))
    extents = Extents()
    extents.add(IN_WAL, 0, records_offsets([_entry(0, frame)])[0], len(frame), 0)
    assert extents.start == 0 and extents.end == len(frame)


def test_a_hot_stream_keeps_one_growing_buffer_and_an_idle_one_an_exact_one() -> None:
    """A stream appended to in every round gets an extent per round until the checkpoint coalesces
    them: past a few extents ``add`` no longer copies the array each time (that was quadratic), and
    the buffer stays within a few percent of its rows; a handful of extents stay exact."""
    small = Extents()
    for i in range(5):
        small.add(IN_WAL, 1, i * 100, 10, i * 10)
    assert small.nbytes == Extents().nbytes + 5 * 4 * 8  # exact: no spare room

    hot = Extents()
    copies = 0
    for i in range(3000):
        before = hot._a
        hot.add(IN_WAL, 1, i * 100, 10, i * 10)  # never adjacent: a new row per round
        copies += hot._a is not before
    assert len(hot) == 3000
    assert copies <= 16  # copied only while small
    assert hot.nbytes <= 1.1 * (Extents().nbytes + 3000 * 4 * 8)
    assert hot.pieces(29_985, 29_995) == [
        Piece(IN_WAL, 1, 299_805, 5, 29_985),
        Piece(IN_WAL, 1, 299_900, 5, 29_990),
    ]
