"""Creates ride the shared commit rounds (storage/committer.py, storage/wal.py): N creates in flight cost
about one WAL sync, not three syncs each, and a create acknowledged survives a power loss even when its
directory did not reach the disk.

A power loss is played as in ``test_wal.py``: the data directory is copied while the server runs (the
WAL not checkpointed), and in the copy what was never synced is taken away (a new stream's directory, or
its segment's bytes). Replaying the WAL and opening the copy must give every acknowledged create back,
whole, and never a stream whose delete (or failed create) was acknowledged.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path

import pytest

from durastream_server import errors
from durastream_server.engine.api import CreateRequest
from durastream_server.engine.engine import Engine
from durastream_server.errors import NotFound
from durastream_server.storage import AppendEntry, DataDir, catalog, committer, wal
from durastream_server.storage.segments import segment_name

from ._util import append, config, crash_copy, header, open_dd, read_all, run

JSON = "application/json"


@pytest.fixture(autouse=True)
def _no_idle_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    # The copies below must catch the WAL before the idle checkpoint syncs the new streams.
    monkeypatch.setattr(committer, "CHECKPOINT_IDLE_SECONDS", 3600.0)


def _initial(*messages: bytes) -> AppendEntry:
    return AppendEntry(position=0, messages=messages, timestamp_ms=1_700_000_000_001)


class _SyncCounter:
    """Counts every fsync and fdatasync (files and directories alike)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self._monkeypatch = monkeypatch

    def install(self) -> None:
        for name in ("fsync", "fdatasync"):
            real = getattr(os, name)

            def counting(fd: int, real=real) -> None:  # noqa: ANN001
                self.calls += 1
                real(fd)

            self._monkeypatch.setattr(os, name, counting)


def test_a_burst_of_64_creates_shares_its_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 creates in flight cost a few syncs, not three each (segment, staging dir, streams/)."""
    syncs = _SyncCounter(monkeypatch)

    async def go() -> None:
        dd = await open_dd(tmp_path)
        syncs.install()
        logs = await asyncio.gather(
            *(dd.create_stream(header(f"/burst/{i}"), _initial(b"%d" % i)) for i in range(64))
        )
        assert syncs.calls <= 16, syncs.calls  # one WAL sync per round (and its file's name)
        monkeypatch.undo()
        for i, log in enumerate(logs):
            assert await read_all(log) == [b"%d" % i]
        await dd.close()

    run(go)


def test_acknowledged_creates_come_back_after_a_power_loss(tmp_path: Path) -> None:
    """Directories lost whole, segments lost whole or cut: the replay makes them again from the WAL,
    with their header (path, TTL, Expires-At) and initial data, and appends after them. A create
    without data is packed (decision 0010): no directory, back from its WAL entry alone."""
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> dict[str, str]:
        dd = await open_dd(root)
        plain = await dd.create_stream(header("/plain"), None)
        ttl = await dd.create_stream(header("/ttl", ttl_seconds=60), _initial(b'{"a":1}'))
        expires = await dd.create_stream(
            header("/expires", expires_at="2030-01-01T00:00:00Z"), _initial(b'{"b":2}')
        )
        await append(ttl, b'{"a":2}')
        crash_copy(root, copy)
        await dd.close()
        return {"plain": plain.id, "ttl": ttl.id, "expires": expires.id}

    ids = run(write)
    streams = copy / "streams"
    assert not (streams / ids["plain"]).exists()  # packed: it never had a directory
    shutil.rmtree(streams / ids["ttl"])  # its name never reached the disk
    os.truncate(streams / ids["expires"] / segment_name(0), 7)  # half of its segment did
    report = wal.replay(copy, sync=True)
    assert report.creates == 2 and report.made == 1
    assert list(report.packed.live) == [ids["plain"]]

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert not dd.quarantined
        plain, ttl, expires = (dd.logs[ids[k]] for k in ("plain", "ttl", "expires"))
        assert plain.header.path == "/plain" and await read_all(plain) == []
        assert ttl.header.ttl_seconds == 60
        assert await read_all(ttl) == [b'{"a":1}', b'{"a":2}']
        assert expires.header.expires_at == "2030-01-01T00:00:00Z"
        assert await read_all(expires) == [b'{"b":2}']
        await append(plain, b'{"after":1}')
        assert await read_all(plain) == [b'{"after":1}']
        await dd.close()

    run(reopen)


def test_a_stream_deleted_right_after_its_create_is_not_made_again(tmp_path: Path) -> None:
    """The delete writes a drop entry before the directory goes: the replay of its create entry does
    not bring it back, whether its directory is gone or the trash was lost too."""
    root, copy = tmp_path / "live", tmp_path / "crashed"

    async def write() -> tuple[str, str, str]:
        dd = await open_dd(root)
        gone = await dd.create_stream(header("/gone"), _initial(b"1"))
        kept = await dd.create_stream(header("/kept"), _initial(b"2"))
        await dd.delete_stream(gone)
        assert not dd._committer.is_fresh(gone.id)
        again = await dd.create_stream(header("/gone"), _initial(b"3"))  # the path, re-created
        crash_copy(root, copy)
        await dd.close()
        return gone.id, kept.id, again.id

    gone_id, kept_id, again_id = run(write)
    report = wal.replay(copy, sync=True)
    assert report.made == 0 and not (copy / "streams" / gone_id).exists()

    async def reopen() -> None:
        dd = await DataDir.open(config(copy))
        assert gone_id not in dd.logs and await read_all(dd.logs[again_id]) == [b"3"]
        assert await read_all(dd.logs[kept_id]) == [b"2"]
        await dd.close()

    run(reopen)


def test_a_create_that_fails_after_its_round_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The WAL holds the create, then making its directory fails (out of space): the create fails
    with 507, nothing is left in streams/, and a restart does not make it from the WAL."""
    root, copy = tmp_path / "live", tmp_path / "crashed"
    real_open = os.open

    def no_space_for_segments(path, flags, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).endswith(segment_name(0)) and flags & os.O_EXCL:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    async def write() -> set[str]:
        dd = await open_dd(root)
        kept = await dd.create_stream(header("/kept"), _initial(b"k"))
        monkeypatch.setattr(os, "open", no_space_for_segments)
        with pytest.raises(errors.InsufficientStorage):
            await dd.create_stream(header("/failed"), _initial(b"x"))
        monkeypatch.undo()
        assert set(os.listdir(root / "streams")) == {kept.id}
        crash_copy(root, copy)
        await dd.close()
        return {kept.id}

    existing = run(write)
    report = wal.replay(copy, sync=True)
    assert report.creates == 2 and report.made == 0
    assert set(os.listdir(copy / "streams")) == existing


def test_a_checkpoint_makes_new_streams_durable_and_removes_the_wal(tmp_path: Path) -> None:
    """After the checkpoint, the new segments and directories are synced: the WAL file is gone and
    nothing is fresh (a delete then needs no drop entry)."""

    async def go() -> None:
        dd = await open_dd(tmp_path)
        logs = await asyncio.gather(
            *(dd.create_stream(header(f"/c{i}"), _initial(b"%d" % i)) for i in range(8))
        )
        assert all(dd._committer.is_fresh(log.id) for log in logs)
        await dd.close()
        assert not list((tmp_path / "wal").glob("*.wal"))
        dd = await DataDir.open(config(tmp_path))
        assert sorted(log.header.path for log in dd.logs.values()) == [f"/c{i}" for i in range(8)]
        await dd.close()

    run(go)


def test_a_bulk_ensure_of_200_streams_costs_a_few_rounds_of_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's creates, 64 at a time as ``http/bulk.py`` runs an ``ensure``: 200 new streams (one
    a fork of another, one with a TTL) cost a few syncs, not three per stream; a delete right after
    works."""
    syncs = _SyncCounter(monkeypatch)

    async def go() -> None:
        # Room for 200 pinned segments: no checkpoint runs during the burst (it is counted apart).
        data = await DataDir.open(config(tmp_path, max_open_files=4096))
        engine = Engine(data, sweep_interval=0)
        await engine.start()
        await engine.create(CreateRequest(path="source", content_type=JSON, body=b'[{"a":1}]'))
        gate = asyncio.Semaphore(64)

        async def ensure(i: int) -> None:
            async with gate:
                await engine.create(CreateRequest(path=f"ensure/{i}", content_type=JSON))

        syncs.install()
        await asyncio.gather(
            *(ensure(i) for i in range(197)),
            engine.create(CreateRequest(path="fork", content_type=JSON, forked_from="source")),
            engine.create(CreateRequest(path="ttl", content_type=JSON, ttl_seconds=60)),
        )
        assert syncs.calls <= 24, syncs.calls  # main: 3 per create, 597
        monkeypatch.undo()
        assert engine.head("fork").next_offset == engine.head("source").next_offset
        assert engine.head("ttl").ttl_seconds == 60
        await engine.delete("ensure/0")
        with pytest.raises(NotFound):
            engine.head("ensure/0")
        await engine.close()
        await data.close()

    run(go)


def test_a_burst_larger_than_the_pin_budget_waits_for_checkpoints(tmp_path: Path) -> None:
    """With --max-open-files 16 a WAL file pins at most 8 new segments: 100 creates in flight go
    through in many rounds and checkpoints, all made and readable after a restart."""

    async def go() -> list[str]:
        dd = await DataDir.open(config(tmp_path, max_open_files=16))
        logs = await asyncio.gather(
            *(dd.create_stream(header(f"/b{i}"), _initial(b"%d" % i)) for i in range(100))
        )
        assert dd._committer.rounds >= 100 // 8
        await dd.close()
        return [log.id for log in logs]

    ids = run(go)

    async def reopen() -> None:
        dd = await DataDir.open(config(tmp_path))
        for i, log_id in enumerate(ids):
            assert await read_all(dd.logs[log_id]) == [b"%d" % i]
        await dd.close()

    run(reopen)


def test_a_rounds_creates_write_their_catalog_lines_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 creates in flight append their catalog lines in a write per commit round, not one each (main:
    64 writes), and the catalog read at the next start names every one of them."""
    writes: list[int] = []

    async def go() -> None:
        dd = await open_dd(tmp_path)
        real = os.write

        def counting(fd: int, data: bytes) -> int:
            if fd == dd._catalog._fd:  # type: ignore[union-attr]
                writes.append(data.count(b"\n"))
            return real(fd, data)

        monkeypatch.setattr(os, "write", counting)
        logs = await asyncio.gather(
            *(dd.create_stream(header(f"/cat/{i}"), _initial(b"c")) for i in range(64))
        )
        monkeypatch.undo()
        assert sum(writes) == 64, writes
        assert len(writes) <= dd._committer.rounds <= 16, (writes, dd._committer.rounds)
        ids = {log.id for log in logs}
        await dd.close()
        entries = catalog.load(tmp_path).entries
        assert ids <= set(entries)
        assert {entries[i].path for i in ids} == {f"/cat/{i}" for i in range(64)}

    run(go)
