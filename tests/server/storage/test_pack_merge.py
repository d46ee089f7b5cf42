"""Merging a packed stream's pack extents (decision 0010, "Step 2c"; ``extents.merge_choice``).

A checkpoint adds one pack extent to every packed stream whose records it carries, so a stream
appended once a checkpoint grew one extent (one more file a read touches, memory, index rows) a
checkpoint forever. Past a bound that grows with the log of the stream's bytes, a checkpoint carries the
stream's last pack extents again, with its new records, into one entry of the new pack, and voids the
old entries (a sidecar line each) only once that pack is durable. Real files throughout; the crash
points are copies of the data directory taken at each step of a merge (fault injection by wrapping
the step, as ``test_packed_appends`` does)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durastream_server.storage import committer, packindex, packs, wal
from durastream_server.storage.extents import IN_PACK, IN_WAL, MERGE_BASE_EXTENTS, merge_choice

from ._util import append, checkpoint, crash_copy, header, open_dd, read_all, run

STREAMS = 6
ROUNDS = 24


@pytest.fixture(autouse=True)
def _no_idle_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer, "CHECKPOINT_IDLE_SECONDS", 3600.0)


def _rows(*extents: tuple[int, int, int, int]) -> tuple[int, ...]:
    """``Extents.rows()`` of (where, generation, length, position) extents (offsets made up)."""
    out: list[int] = []
    for where, generation, length, position in extents:
        out += [generation * 2 + where, 1000 + position, length, position]
    return tuple(out)


def _history(count: int, size: int = 10) -> list[tuple[int, int, int, int]]:
    """A header in pack 1, then ``count`` records extents in packs 2.. and one in WAL file 99."""
    extents = [(IN_PACK, 1, 50, 0)]
    for k in range(count):
        extents.append((IN_PACK, 2 + k, size, 50 + k * size))
    extents.append((IN_WAL, 99, size, 50 + count * size))
    return extents


def test_no_merge_below_the_bound_and_a_suffix_of_whole_packs_above_it() -> None:
    below = _history(MERGE_BASE_EXTENTS - 1)
    assert merge_choice(_rows(*below), 1, below[-1][3], 10) == []
    above = _history(MERGE_BASE_EXTENTS + 2)
    chosen = merge_choice(_rows(*above), 1, above[-1][3], 10)
    # The newest first, then each older one no larger than what is merged so far: all of equal size.
    assert [c[0] for c in chosen] == [2 + k for k in range(MERGE_BASE_EXTENTS + 2)]
    assert chosen[-1][3] + chosen[-1][2] == above[-1][3]  # they end where the new records start
    # The create's pack is never merged (its entry holds the header, void only by a drop).
    assert 1 not in {c[0] for c in chosen}


def test_a_large_old_extent_stays_and_a_pack_is_never_split() -> None:
    extents = [(IN_PACK, 1, 50, 0), (IN_PACK, 2, 5000, 50)]
    extents += [(IN_PACK, 3 + k, 10, 5050 + 10 * k) for k in range(10)]
    extents.append((IN_WAL, 99, 10, 5150))
    chosen = merge_choice(_rows(*extents), 1, 5150, 10)
    assert [c[0] for c in chosen] == list(range(3, 13))  # not the 5000 bytes of pack 2
    # Pack 5 holds two extents of the stream, the older one before the run of packs that could be
    # merged: merging the newer would void both (by id in its sidecar), so there is no merge.
    split = [(IN_PACK, 1, 50, 0), (IN_PACK, 5, 10, 50), (IN_PACK, 1, 10, 60)]
    split += [(IN_PACK, 5 + k, 10, 70 + 10 * k) for k in range(8)]
    split.append((IN_WAL, 99, 10, 150))
    assert merge_choice(_rows(*split), 1, 150, 10) == []


def test_the_bound_grows_with_the_log_of_the_streams_bytes() -> None:
    """A stream whose packed bytes are 2**13 times its new records may keep 6 more extents."""
    many = _history(MERGE_BASE_EXTENTS + 4, size=1024)
    assert merge_choice(_rows(*many), 1, many[-1][3], 1) == []


async def _logs(dd, ids: list[str]) -> list:  # noqa: ANN001
    """The logs of ``ids`` after a start-up: recovered by it (a WAL was replayed) or now."""
    pending = [i for i in ids if i not in dd.logs]
    if pending:
        await dd.recover(pending)
    return [dd.logs[i] for i in ids]


def _every(_stream: int, _round: int) -> bool:
    return True


def _staggered(stream: int, round_: int) -> bool:
    """Stream i is appended every (i % 3 + 1)th round: streams merge at different checkpoints, so
    a pack a merge took entries from still holds other streams' live ones."""
    return round_ % (stream % 3 + 1) == 0


async def _rounds(  # noqa: ANN202
    dd,  # noqa: ANN001
    logs: list,
    rounds: int,
    expected: dict[str, bytes],
    root: Path,
    start: int = 0,
    schedule=_every,  # noqa: ANN001
):
    for r in range(start, start + rounds):
        for i, log in enumerate(logs):
            if schedule(i, r):
                await append(log, b'"r%d"' % r)
        for log in logs:
            expected[log.id] = packs.read_virtual(root, log.extents)
        await checkpoint(dd)


def _appended(stream: int, rounds: int, schedule=_staggered) -> list[bytes]:  # noqa: ANN001
    return [b'"r%d"' % r for r in range(rounds) if schedule(stream, r)]


def test_extents_stay_bounded_and_every_record_reads_back_across_restarts(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        logs = await dd.create_streams([header(f"/s{i}") for i in range(STREAMS)])
        await checkpoint(dd)
        expected: dict[str, bytes] = {}
        await _rounds(dd, logs, ROUNDS, expected, tmp_path)
        # One extent a checkpoint would be ROUNDS + 1; merged, a handful.
        assert max(len(log.extents) for log in logs) <= MERGE_BASE_EXTENTS + 4
        for log in logs:
            assert packs.read_virtual(tmp_path, log.extents) == expected[log.id]
            assert await read_all(log) == [b'"r%d"' % r for r in range(ROUNDS)]
        ids = [log.id for log in logs]
        # The packs merges emptied are removed; what is left is at most twice the live bytes.
        live = sum(len(v) for v in expected.values())
        assert dd.packs_bytes < 2 * live + 4096
        await dd.close()
        done = ROUNDS
        for _ in range(2):  # restarts: the same bytes, still few extents, and appends go on
            dd = await open_dd(tmp_path, packed_appends=True)
            logs = await _logs(dd, ids)
            for log in logs:
                assert await read_all(log) == [b'"r%d"' % r for r in range(done)]
            await _rounds(dd, logs, 6, expected, tmp_path, start=done)
            done += 6
            for log in logs:
                assert packs.read_virtual(tmp_path, log.extents) == expected[log.id]
                assert await read_all(log) == [b'"r%d"' % r for r in range(done)]
                assert len(log.extents) <= MERGE_BASE_EXTENTS + 4
            await dd.close()

    run(go)


def test_a_crash_at_every_step_of_a_merge_reads_every_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies of the data directory as a crash leaves it: once the merged pack is durable but
    before the old entries' sidecar lines, after them, and before the WAL file's removal. Each starts
    (twice: the first start-up rewrites packs) with every stream's bytes exactly as acknowledged."""
    root = tmp_path / "live"
    copies: list[tuple[Path, dict[str, bytes]]] = []
    expected: dict[str, bytes] = {}
    append_dead, finish = packs.append_dead, packs.PackBook.finish

    def snapshot(step: str) -> None:
        if not any(step in path.name for path, _ in copies):
            into = tmp_path / f"{step}-{len(copies)}"
            crash_copy(root, into)
            copies.append((into, dict(expected)))

    def copy_around_sidecar(directory, generation, ids, *, sync):  # noqa: ANN001, ANN202
        snapshot("before-sidecar")
        append_dead(directory, generation, ids, sync=sync)
        snapshot("after-sidecar")

    def copy_then_finish(book: packs.PackBook, plan: packs.Retirement, w) -> None:  # noqa: ANN001
        if plan.merges:
            snapshot("before-wal-removal")
        finish(book, plan, w)

    monkeypatch.setattr(packs, "append_dead", copy_around_sidecar)
    monkeypatch.setattr(packs.PackBook, "finish", copy_then_finish)

    async def go() -> list[str]:
        dd = await open_dd(root, packed_appends=True)
        logs = await dd.create_streams([header(f"/s{i}") for i in range(STREAMS)])
        await checkpoint(dd)
        await _rounds(dd, logs, 24, expected, root, schedule=_staggered)
        await dd.close()
        return [log.id for log in logs]

    ids = run(go)
    assert {path.name.split("-")[0] for path, _ in copies} == {"before", "after"}
    assert len(copies) == 3
    for path, wanted in copies:
        for _ in range(2):
            settled = wal.replay(path, sync=True).packed
            assert not settled.gaps and not settled.lost
            for log_id in ids:
                assert packs.read_virtual(path, settled.extents[log_id]) == wanted[log_id], path
            _assert_void_where_not_served(path, settled, ids)

        async def serve(path: Path = path) -> None:
            dd = await open_dd(path, packed_appends=True)
            logs = await _logs(dd, ids)
            # The round the copy was taken in: the first stream is appended every round.
            done = len(await read_all(logs[0]))
            for i, log in enumerate(logs):
                assert await read_all(log) == _appended(i, done), i  # once each, in order
            more: dict[str, bytes] = {}
            # Merges again, from the recovered packs.
            await _rounds(dd, logs, 12, more, path, start=done, schedule=_staggered)
            for i, log in enumerate(logs):
                assert await read_all(log) == _appended(i, done + 12), i
            await dd.close()
            settled = wal.replay(path, sync=True).packed
            for log_id in ids:
                assert packs.read_virtual(path, settled.extents[log_id]) == more[log_id]
            _assert_void_where_not_served(path, settled, ids)

        run(serve)


def _assert_void_where_not_served(path: Path, settled: packs.Settled, ids: list[str]) -> None:
    """A pack holding none of a stream's bytes served names it void in its sidecar (a crash before
    a merge's sidecar lines: the start-up writes them), or holds no entry of it any more."""
    directory = path / packs.PACKS_DIR
    for generation in packs.pack_generations(directory):
        dead = packs.read_dead(directory, generation)
        size = (directory / packs.pack_name(generation)).stat().st_size
        rows = packindex.read(directory, generation, size)
        assert rows is not None
        for row in rows:
            if row.log_id not in ids or settled.live[row.log_id][0] == generation:
                continue
            files = {g for where, g in settled.extents[row.log_id].files() if where == IN_PACK}
            if generation not in files:
                assert row.log_id in dead, (path, generation)


def test_a_stream_dropped_after_merges_stays_dropped_once_its_packs_are_compacted(
    tmp_path: Path,
) -> None:
    """The ordering trap (decision 0010): the merged entries' old packs and the DROP's WAL file go;
    no pack brings the stream back."""

    async def go() -> tuple[str, list[str]]:
        dd = await open_dd(tmp_path, packed_appends=True)
        logs = await dd.create_streams([header(f"/s{i}") for i in range(STREAMS)])
        await checkpoint(dd)
        await _rounds(dd, logs, 12, {}, tmp_path)
        gone = logs[0]
        await dd.delete_stream(gone)
        await _rounds(dd, logs[1:], 12, {}, tmp_path, start=12)
        await dd.close()
        return gone.id, [log.id for log in logs[1:]]

    gone, kept = run(go)
    for _ in range(2):
        settled = wal.replay(tmp_path, sync=True).packed
        assert gone not in settled.live and gone not in settled.extents
        assert set(kept) <= set(settled.live)
        for log_id in kept:
            assert len(packs.read_virtual(tmp_path, settled.extents[log_id])) > 0


def test_reads_during_merging_checkpoints_return_the_same_records(tmp_path: Path) -> None:
    """Reads of every stream run beside each checkpoint (merges, then the removal of the packs
    they emptied): a read planned on the old extents reads the old entries (kept until a later
    checkpoint) or is planned again (``packview.Replan``); it never reads other bytes."""

    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        logs = await dd.create_streams([header(f"/s{i}") for i in range(STREAMS)])
        await checkpoint(dd)
        merged = 0
        for r in range(ROUNDS):
            for log in logs:
                await append(log, b'"r%d"' % r)
            wanted = [b'"r%d"' % k for k in range(r + 1)]
            before = sum(len(log.extents) for log in logs)
            reads = [read_all(log) for log in logs for _ in range(3)]
            _, *got = await asyncio.gather(checkpoint(dd), *reads)
            assert all(g == wanted for g in got), r
            merged += sum(len(log.extents) for log in logs) < before
            assert [await read_all(log) for log in logs] == [wanted] * STREAMS
        assert merged >= 3  # the checkpoints merged several times
        await dd.close()

    run(go)


def test_a_checkpoint_merges_up_to_its_budget_and_the_rest_at_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams created and appended together reach their bound in the same checkpoint; past
    ``MERGE_BYTES_PER_CHECKPOINT`` (here: one stream's merge) the others merge at the next ones, so
    a checkpoint's merge holds a bounded number of old bytes. Every stream still gets merged."""
    monkeypatch.setattr(packs, "MERGE_BYTES_PER_CHECKPOINT", 1)
    plan = packs.PackBook.plan
    merges: list[int] = []

    def counting_plan(book: packs.PackBook, generation: int) -> packs.Retirement:
        planned = plan(book, generation)
        merges.append(len(planned.merges))
        return planned

    monkeypatch.setattr(packs.PackBook, "plan", counting_plan)

    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        logs = await dd.create_streams([header(f"/s{i}") for i in range(STREAMS)])
        await checkpoint(dd)
        await _rounds(dd, logs, ROUNDS, {}, tmp_path)
        for log in logs:
            assert await read_all(log) == [b'"r%d"' % r for r in range(ROUNDS)]
            assert len(log.extents) <= MERGE_BASE_EXTENTS + 4 + STREAMS
        await dd.close()

    run(go)
    assert max(merges) == 1 and sum(merges) >= STREAMS
