"""Reads of packed streams through their extents, and their adoption at start-up (decision 0010 step
2, pieces 2 and 5).

Each test builds a packed stream the way ``test_packed_records.py`` does: the records of a real
directory stream, written by the real writer, cut at their record boundaries into a packed create and
packed records entries in WAL files (as step 2's rounds write them; that writer is built separately).
A real ``DataDir`` then starts over them: the replay carries them into packs, the start-up adopts the
stream (folded through its extents, no directory made), and every read API must answer exactly as the
directory stream with the same records does."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durastream_server.storage import codec, packs, wal
from durastream_server.storage.datadir import DataDir
from durastream_server.storage.extents import IN_PACK, IN_WAL, records_offsets
from durastream_server.storage.log import InvalidPosition, StreamLog
from durastream_server.storage.packview import PackedView, Replan
from durastream_server.storage.segments import segment_name

from ._util import crash_copy, entry, header, open_dd, run

_INTERVAL = 256  # a sparse-index point every 256 bytes: reads start from points mid-stream
_T0 = 1_700_000_000_000


def _messages(seed: int, records: int) -> list[tuple[list[bytes], int]]:
    """``records`` appends of 1-6 JSON messages each, of varied sizes, at rising times."""
    rnd = random.Random(seed)
    out = []
    for i in range(records):
        batch = [
            b'"' + bytes([97 + rnd.randrange(26)]) * rnd.randrange(1, 120) + b'"'
            for _ in range(rnd.randrange(1, 7))
        ]
        out.append((batch, _T0 + 10 * i + rnd.randrange(5)))
    return out


def _directory_stream(root: Path, path: str, appends: list[tuple[list[bytes], int]]) -> str:
    async def go() -> str:
        dd = await open_dd(root, index_interval_bytes=_INTERVAL)
        log = await dd.create_stream(header(path), None)
        for batch, ts in appends:
            await log.stage(entry(log, *batch, ts=ts))
        await dd.close()
        return log.id

    return run(go)


def _boundaries(segment: bytes) -> list[int]:
    out = [0]
    while out[-1] < len(segment):
        out.append(out[-1] + codec.parse_frame(segment, out[-1]).record_len)
    return out


def _round(root: Path, generation: int, entries: list[wal.WalEntry]) -> int:
    """One synced round in WAL file ``generation`` (made if needed); returns where it starts."""
    directory = root / wal.WAL_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / wal.wal_name(generation)
    if path.exists():
        wal_file = wal.WalFile(directory, generation, os.open(path, os.O_WRONLY))
        wal_file.end = path.stat().st_size
    else:
        wal_file = wal.WalFile.create(directory, generation)
    try:
        start = wal_file.end
        wal_file.append(entries)
    finally:
        wal_file.close()
    return start


def _pack_twin(
    packed: Path, log_id: str, segment: bytes, files: int = 2, rounds_per_file: int = 3
) -> None:
    """The records of ``segment`` (a directory stream's segment 0) as a packed create and packed
    records entries, spread over ``files`` WAL files (so over as many packs after start-up)."""
    cuts = _boundaries(segment)
    (packed / "streams").mkdir(parents=True, exist_ok=True)
    _round(packed, 0, [wal.WalEntry(log_id, 0, 0, [segment[: cuts[1]]], wal.Kind.PACKED)])
    records = list(zip(cuts[1:-1], cuts[2:], strict=True))
    per_file = max(1, -(-len(records) // files))
    for f in range(files):
        mine = records[f * per_file : (f + 1) * per_file]
        per_round = max(1, -(-len(mine) // rounds_per_file))
        for r in range(0, len(mine), per_round):
            chunk = mine[r : r + per_round]
            blobs = [segment[a:b] for a, b in chunk]
            _round(
                packed, f, [wal.WalEntry(log_id, 0, chunk[0][0], blobs, wal.Kind.PACKED_RECORDS)]
            )


def _twins(tmp_path: Path, seed: int = 1, records: int = 40) -> tuple[Path, Path, str]:
    directory = tmp_path / "directory"
    log_id = _directory_stream(directory, "chat", _messages(seed, records))
    segment = (directory / "streams" / log_id / segment_name(0)).read_bytes()
    packed = tmp_path / "packed"
    _pack_twin(packed, log_id, segment)
    return directory, packed, log_id


async def _open_both(
    directory: Path, packed: Path, log_id: str, **packed_options: Any
) -> tuple[DataDir, DataDir]:
    a = await open_dd(directory, index_interval_bytes=_INTERVAL)
    b = await open_dd(packed, index_interval_bytes=_INTERVAL, packed_appends=True, **packed_options)
    return a, b


def _answer(fn: Any) -> Any:
    """What a read API answers: its value, or the type and message of its error."""

    async def go() -> Any:
        try:
            result = await fn()
        except (InvalidPosition, ValueError) as exc:
            return ("error", type(exc).__name__, str(exc))
        if hasattr(result, "slices"):
            return (list(result.slices), result.next_position, result.messages)
        return result

    return go()


async def _compare(a: StreamLog, b: StreamLog, positions: list[int], sizes: list[int]) -> None:
    """Every read API of ``a`` (a directory stream) and ``b`` (its packed twin) at ``positions``."""
    assert (a.durable_tail, a.durable_messages, a.id) == (b.durable_tail, b.durable_messages, b.id)
    for pos in positions:
        for size in sizes:
            for whole, runs in ((True, True), (True, False), (False, False)):
                for end in (None, min(a.durable_tail, pos + size)):

                    def read(
                        log: StreamLog,
                        p: int = pos,
                        s: int = size,
                        e: int | None = end,
                        w: bool = whole,
                        r: bool = runs,
                    ) -> Any:
                        return log.read(p, s, e, whole_messages=w, runs=r, overhead=3 if r else 0)

                    assert await _answer(lambda: read(a)) == await _answer(lambda: read(b)), (
                        pos,
                        size,
                        whole,
                        runs,
                        end,
                    )
            plans = []
            for log in (a, b):
                try:
                    plan = log.plan_read(pos, min(a.durable_tail, pos + size))
                except InvalidPosition as exc:
                    plans.append(str(exc))
                    continue
                if plan is None or not hasattr(plan, "run"):
                    plans.append(plan)
                    continue
                try:
                    plans.append(plan.run(size, True, True, 3, evict=False))
                except Exception as exc:  # noqa: BLE001 - compared, not swallowed
                    plans.append(("error", type(exc).__name__, str(exc)))
            assert plans[0] == plans[1], (pos, size)
        for log_pair_answer in [
            (lambda log, p=pos: log.message_floors([p])),
            (lambda log, p=pos: log.is_boundary(p)),
            (lambda log, p=pos: log.boundary_after(p, 2, messages=True)),
            (lambda log, p=pos: log.boundary_after(p, 1, messages=False)),
        ]:
            assert await _answer(lambda f=log_pair_answer: f(a)) == await _answer(
                lambda f=log_pair_answer: f(b)
            ), pos
    count = a.durable_messages
    ordinals = sorted({0, 1, count // 3, count // 2, count - 1, count})
    assert await a.message_starts(ordinals) == await b.message_starts(ordinals)
    for at in (0, _T0, _T0 + 55, _T0 + 200, _T0 + 399, _T0 + 10**6):
        assert await a.first_at_time(at) == await b.first_at_time(at)


def test_a_packed_stream_is_adopted_at_start_up_and_reads_as_its_directory_twin(
    tmp_path: Path,
) -> None:
    directory, packed, log_id = _twins(tmp_path)

    async def go() -> None:
        a, b = await _open_both(directory, packed, log_id)
        try:
            la, lb = a.logs[log_id], b.logs[log_id]
            assert lb.packed and lb.extents is not None and la.extents is None
            assert len(lb.extents.files()) == 2  # the records' two packs (the header's is pack 0)
            assert not (packed / "streams" / log_id).exists()  # no directory made
            assert lb.header == la.header and lb.state == la.state
            tail = la.durable_tail
            rnd = random.Random(7)
            positions = sorted({0, 1, tail // 2, tail - 1, tail, *rnd.sample(range(tail), 25)})
            await _compare(la, lb, positions, [1, 50, 400, 1 << 20])
        finally:
            await a.close()
            await b.close()

    run(go)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_packed_reads_equal_directory_reads_at_any_position_and_size(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    tmp_path = tmp_path_factory.mktemp("twins")
    seed = data.draw(st.integers(0, 1000))
    directory, packed, log_id = _twins(tmp_path, seed=seed, records=data.draw(st.integers(1, 30)))

    async def go() -> None:
        a, b = await _open_both(directory, packed, log_id)
        try:
            la, lb = a.logs[log_id], b.logs[log_id]
            tail = la.durable_tail
            positions = data.draw(st.lists(st.integers(0, tail), min_size=1, max_size=4))
            sizes = data.draw(st.lists(st.integers(1, 3000), min_size=1, max_size=2))
            await _compare(la, lb, positions, sizes)
        finally:
            await a.close()
            await b.close()

    run(go)


def test_reads_span_a_wal_file_and_a_pack(tmp_path: Path) -> None:
    """Records still in a WAL file (a round not yet carried by a checkpoint) and records in a pack,
    read in one window: the stream's second pack's records are put into a live WAL file, byte for
    byte, and its extents relocated there (``Extents.relocate``, as a round's extents are)."""
    directory, packed, log_id = _twins(tmp_path)

    async def go() -> None:
        a, b = await _open_both(directory, packed, log_id)
        try:
            la, lb = a.logs[log_id], b.logs[log_id]
            assert lb.extents is not None
            pieces = lb.extents.pieces(lb.extents.start, lb.extents.end)
            last = pieces[-1]
            assert last.where == IN_PACK
            with open(packed / packs.PACKS_DIR / packs.pack_name(last.generation), "rb") as fh:
                fh.seek(last.offset)
                blob = fh.read(last.length)
            generation = 10_000  # a WAL file of its own, beside the committer's
            records = wal.WalEntry(log_id, 0, last.position, [blob], wal.Kind.PACKED_RECORDS)
            at = _round(packed, generation, [records])
            [offset] = records_offsets([records], at)
            lb.extents.relocate(
                IN_PACK,
                last.generation,
                [(offset, last.length, last.position)],
                (IN_WAL, generation),
            )
            assert (IN_WAL, generation) in lb.extents.files()
            tail = la.durable_tail
            positions = sorted({0, last.position - 1, last.position, last.position + 1, tail - 1})
            await _compare(la, lb, positions, [10, 300, 1 << 20])
        finally:
            await a.close()
            await b.close()

    run(go)


def test_a_read_planned_before_a_checkpoint_moved_its_files_is_planned_again(
    tmp_path: Path,
) -> None:
    """A pack rewritten under its name moves records to other offsets: a read planned from the old
    extents must never read the new file at the old offsets. The checkpoint's move is announced
    (``PackFiles.moving``): a planned read then raises ``Replan``, and ``StreamLog.read`` plans it
    again once the move is done, with the right bytes."""
    directory, packed, log_id = _twins(tmp_path)

    async def go() -> None:
        a, b = await _open_both(directory, packed, log_id)
        try:
            la, lb = a.logs[log_id], b.logs[log_id]
            files = b._pack_files
            plan = lb.plan_read(0, lb.durable_tail)
            assert plan is not None and isinstance(plan.segments, PackedView)
            files.moving([(IN_PACK, 99_999)])  # a move of another file: this read goes on
            assert plan.run(1 << 20, True, True, 0)[2] == la.durable_messages
            files.moved()
            plan = lb.plan_read(0, lb.durable_tail)
            assert plan is not None
            files.moving(lb.extents.files())  # a move of its files: it must be planned again
            with pytest.raises(Replan):
                plan.run(1 << 20, True, True, 0)
            want = await la.read(0, 1 << 20, whole_messages=True)
            mid = [la.durable_tail // 2 + 1]
            reading = asyncio.ensure_future(lb.read(0, 1 << 20, whole_messages=True))
            scanning = asyncio.ensure_future(lb.message_floors(mid))  # a header scan too
            await asyncio.sleep(0.01)
            assert not reading.done() and not scanning.done()  # they wait for the move
            files.moved()
            got = await reading
            assert (got.slices, got.next_position) == (want.slices, want.next_position)
            assert await scanning == await la.message_floors(mid)
        finally:
            await a.close()
            await b.close()

    run(go)


def test_reading_1000_packed_streams_in_two_packs_opens_two_files(tmp_path: Path) -> None:
    """One fd per pack, not per stream: the records of 1,000 packed streams in two packs, each
    stream read as a multi-range read reads it (``DiskRead.run`` with ``evict=False``)."""
    root = tmp_path / "packed"

    async def create() -> list[tuple[str, bytes]]:
        dd = await open_dd(root)
        made = await asyncio.gather(
            *(dd.create_stream(header(f"/s{i}"), None) for i in range(1000))
        )
        await dd.close()
        return [(log.id, bytes(codec.encode_header(log.header))) for log in made]

    made = run(create)
    generation = max(packs.pack_generations(root / packs.PACKS_DIR)) + 1
    payloads = {}
    for half in range(2):
        entries = []
        for i, (log_id, head) in enumerate(made[half * 500 : (half + 1) * 500]):
            payload = b'"m%d"' % (half * 500 + i)
            record = bytes(
                codec.encode_append(entry_at(0, payload, _T0 + 1))  # position 0: no fork
            )
            entries.append(wal.WalEntry(log_id, 0, len(head), [record], wal.Kind.PACKED_RECORDS))
            payloads[log_id] = payload
        _round(root, generation + half, entries)

    async def go() -> None:
        dd = await open_dd(root, packed_appends=True)
        try:
            cache = dd._ctx.cache
            before = {k for k in cache._open}
            fds_before = len(os.listdir("/proc/self/fd"))
            for log_id, _ in made:
                log = dd.logs[log_id]
                plan = log.plan_read(0, log.durable_tail)
                slices, _, count = plan.run(1 << 20, True, True, 0, evict=False)
                assert count == 1 and bytes(slices[0].data) == payloads[log_id]
            opened = {k for k in cache._open if k not in before}
            assert len(opened) == 2 and {k[0] for k in opened} == {"pack"}
            assert len(os.listdir("/proc/self/fd")) - fds_before <= 2
        finally:
            await dd.close()

    run(go)


def entry_at(position: int, payload: bytes, ts: int) -> Any:
    from durastream_server.storage.records import AppendEntry

    return AppendEntry(position=position, messages=(payload,), timestamp_ms=ts)


def test_a_packed_stream_cut_by_a_damaged_pack_entry_is_quarantined_not_served_short(
    tmp_path: Path,
) -> None:
    """Hazard 32: the stream whose records stop at a gap is never served as if it ended there (its
    path is reserved, ``/healthz`` lists it, its entries stay in ``packs/``); a stream whose entry
    follows the damage is served whole."""
    directory = tmp_path / "directory"
    appends = _messages(3, 6)
    ida = _directory_stream(directory, "/a", appends)
    idb = _directory_stream(tmp_path / "directory-b", "/b", appends)
    seg_a = (directory / "streams" / ida / segment_name(0)).read_bytes()
    seg_b = (tmp_path / "directory-b" / "streams" / idb / segment_name(0)).read_bytes()
    packed = tmp_path / "packed"
    cut_a, cut_b = _boundaries(seg_a), _boundaries(seg_b)
    (packed / "streams").mkdir(parents=True)
    _round(
        packed,
        0,
        [
            wal.WalEntry(ida, 0, 0, [seg_a[: cut_a[1]]], wal.Kind.PACKED),
            wal.WalEntry(idb, 0, 0, [seg_b[: cut_b[1]]], wal.Kind.PACKED),
        ],
    )
    _round(
        packed,
        1,
        [
            wal.WalEntry(ida, 0, cut_a[1], [seg_a[cut_a[1] : cut_a[3]]], wal.Kind.PACKED_RECORDS),
            wal.WalEntry(idb, 0, cut_b[1], [seg_b[cut_b[1] :]], wal.Kind.PACKED_RECORDS),
        ],
    )
    _round(
        packed, 2, [wal.WalEntry(ida, 0, cut_a[3], [seg_a[cut_a[3] :]], wal.Kind.PACKED_RECORDS)]
    )
    wal.replay(packed, sync=True)
    pack = packed / packs.PACKS_DIR / packs.pack_name(1)
    data = bytearray(pack.read_bytes())
    data[data.index(ida.encode()) + 4] ^= 0xFF  # A's entry in pack 1 (its id, under the CRC)
    pack.write_bytes(bytes(data))

    async def go() -> None:
        dd = await open_dd(packed, packed_appends=True)
        try:
            assert ida not in dd.logs
            assert "/a" in dd.corrupt and "gap" in dd.corrupt["/a"]
            [quarantined] = [q for q in dd.quarantined.values() if q.id == ida]
            assert quarantined.path == "/a"
            ref = await open_dd(tmp_path / "directory-b")
            try:
                want = await ref.logs[idb].read(0, 1 << 20, whole_messages=True)
            finally:
                await ref.close()
            got = await dd.logs[idb].read(0, 1 << 20, whole_messages=True)
            assert (got.slices, got.next_position) == (want.slices, want.next_position)
        finally:
            await dd.close()
        # Its entries are kept: the next start-up finds the same gap and quarantines it again.
        again = await open_dd(packed, packed_appends=True)
        try:
            assert ida not in again.logs and "/a" in again.corrupt
        finally:
            await again.close()

    run(go)


def test_restarts_serve_the_same_bytes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """300 records: more than a clean shutdown snapshots a directory log at (a packed one has no
    directory to hold a snapshot: none is written, none is needed)."""
    directory, packed, log_id = _twins(tmp_path, records=300)
    seen = []

    async def read_once() -> None:
        dd = await open_dd(packed, index_interval_bytes=_INTERVAL, packed_appends=True)
        try:
            log = dd.logs[log_id]
            got = await log.read(0, 1 << 20, whole_messages=True)
            seen.append((got.slices, got.next_position, log.durable_messages))
        finally:
            await dd.close()

    for _ in range(3):
        run(read_once)
        assert not (packed / "streams" / log_id).exists()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert seen[0] == seen[1] == seen[2]
    assert seen[0][1] > 0


def test_an_append_promotes_an_adopted_packed_stream_with_its_records(tmp_path: Path) -> None:
    """A write that promotes a packed stream with records found at start-up (here every write: the
    packed threshold is 0) promotes it with its whole virtual segment 0 (the CREATE entry and the
    directory's segment 0 hold its records, then the write's): reads answer as the directory twin's
    after the same append, in this process and after a power loss (the data directory copied with
    the WAL live) and a restart."""
    directory, packed, log_id = _twins(tmp_path)

    async def go() -> None:
        a, b = await _open_both(directory, packed, log_id, packed_threshold=0)
        try:
            la, lb = a.logs[log_id], b.logs[log_id]
            for log in (la, lb):
                await log.stage(entry(log, b'"new"', b'"newer"', ts=_T0 + 10**6))
            assert not lb.packed and lb.extents is None
            # Their just-committed tails are served from memory until they expire: compare disk
            # reads (plan_read answers None while a tail is kept).
            deadline = asyncio.get_running_loop().time() + 10
            while not (la.idle and lb.idle):
                assert asyncio.get_running_loop().time() < deadline, "the hot tails never expired"
                await asyncio.sleep(0.02)
            assert (packed / "streams" / log_id / segment_name(0)).exists()
            tail = la.durable_tail
            await _compare(la, lb, [0, tail // 2, tail - 5, tail], [64, 1 << 20])
            copy = crash_copy(packed, tmp_path / "power-loss")
            c = await open_dd(copy, index_interval_bytes=_INTERVAL)
            try:
                await _compare(la, c.logs[log_id], [0, tail // 2, tail - 5, tail], [64, 1 << 20])
            finally:
                await c.close()
        finally:
            await a.close()
            await b.close()
        b = await open_dd(packed, index_interval_bytes=_INTERVAL)
        a = await open_dd(directory, index_interval_bytes=_INTERVAL)
        try:
            assert not b.logs[log_id].packed
            await _compare(a.logs[log_id], b.logs[log_id], [0, 1, tail], [1 << 20])
        finally:
            await a.close()
            await b.close()

    run(go)


def test_check_reports_packed_records_and_their_gaps(tmp_path: Path) -> None:
    """``check``/``inspect`` fold a packed stream's records as the start-up does (its tail and
    messages, the directory twin's), and name a gap as damage."""
    from durastream_server import datacheck

    directory, packed, log_id = _twins(tmp_path)

    async def twin() -> tuple[int, int]:
        dd = await open_dd(directory, index_interval_bytes=_INTERVAL)
        try:
            return dd.logs[log_id].durable_tail, dd.logs[log_id].durable_messages
        finally:
            await dd.close()

    tail, messages = run(twin)
    wal.replay(packed, sync=True)
    report = datacheck.verify_dir(packed)
    [stream] = [s for s in report.streams if s.id == log_id]
    assert (stream.tail, stream.messages) == (tail, messages)
    assert report.packed == 1 and not stream.findings
    # Its first records entry (after its header's, in pack 0): the records in pack 1 follow the gap.
    # (Damage to a stream's *last* entry leaves no trace in the stream: its id is under the CRC; the
    # pack's damage is reported for the directory. Decision 0010: the pack index would name it.)
    pack = packed / packs.PACKS_DIR / packs.pack_name(0)
    data = bytearray(pack.read_bytes())
    second = data.index(log_id.encode(), data.index(log_id.encode()) + 1)
    data[second + 4] ^= 0xFF
    pack.write_bytes(bytes(data))
    report = datacheck.verify_dir(packed)
    [stream] = [s for s in report.streams if s.id == log_id]
    assert any("gap" in f.message for f in stream.findings), stream.findings
