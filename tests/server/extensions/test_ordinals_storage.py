"""Storage: message ordinals in the sparse index (``storage/ordinals.py``) against a model, across
index points, staged entries, restarts with and without a snapshot, and a snapshot from before
ordinals existed."""

from __future__ import annotations

import json
import os
import random
import struct
import zlib
from pathlib import Path

import pytest

from durastream_server.storage import DataDir, Durability, StorageConfig, StreamLog
from durastream_server.storage.log import InvalidPosition
from durastream_server.storage.snapshot import SNAPSHOT_NAME, decode_snapshot
from tests.server.storage._util import append, entry, header, run


def config(root: Path, **overrides: object) -> StorageConfig:
    values: dict = {
        "root": root,
        "durability": Durability.NONE,
        "index_interval_bytes": 64,
        "snapshot_interval_entries": 8,
    }
    values.update(overrides)
    return StorageConfig(**values)


def build_model(rng: random.Random, records: int) -> list[list[bytes]]:
    out = []
    for _ in range(records):
        n = rng.choice([1, 1, 2, 3, 7])
        out.append([b'"' + b"m" * rng.randint(0, 30) + b'"' for _ in range(n)])
    return out


def message_table(records: list[list[bytes]]) -> list[tuple[int, int]]:
    table = []
    at = 0
    for record in records:
        for message in record:
            table.append((at, len(message)))
            at += len(message)
    return table


def expected_floor(table: list[tuple[int, int]], position: int) -> tuple[int, int]:
    floor, ordinal = 0, 0
    for i, (start, length) in enumerate(table):
        if start <= position:
            floor, ordinal = start, i
        if start + length <= position:
            floor, ordinal = start + length, i + 1
    return floor, ordinal


async def check_ordinals(log: StreamLog, table: list[tuple[int, int]]) -> None:
    tail = table[-1][0] + table[-1][1]
    assert log.durable_tail == tail and log.durable_messages == len(table)
    positions = list(range(tail + 1))
    assert await log.message_floors(positions) == [expected_floor(table, p) for p in positions]
    ordinals = list(range(len(table) + 1))
    starts = [start for start, _ in table] + [tail]
    assert await log.message_starts(ordinals) == starts


def test_ordinals_match_the_model_and_survive_restarts(tmp_path: Path) -> None:
    rng = random.Random(7)
    records = build_model(rng, 120)
    table = message_table(records)

    async def go() -> None:
        dd = await DataDir.open(config(tmp_path))
        log = await dd.create_stream(header(), None)
        for record in records:
            await append(log, *record)
        assert len(log._index.sparse) > 10  # the scans really start from many index points
        await check_ordinals(log, table)
        log_id = log.id
        await dd.close()  # clean shutdown: snapshot with ordinals
        dd = await DataDir.open(config(tmp_path))
        assert dd.logs[log_id]._snapshot_end > 0  # recovered from the snapshot's ordinals
        await check_ordinals(dd.logs[log_id], table)
        await dd.close()
        os.unlink(tmp_path / "streams" / log_id / SNAPSHOT_NAME)  # full replay
        dd = await DataDir.open(config(tmp_path))
        assert dd.logs[log_id]._snapshot_end == 0
        await check_ordinals(dd.logs[log_id], table)
        await dd.close()

    run(go)


def legacy_snapshot(path: Path, key: str = "index_messages", arrays: int = 2) -> None:
    """Rewrite ``path`` in an older format: without meta ``key`` (``index_messages``: from before
    ordinals) and with only the first ``arrays`` index arrays."""
    data = path.read_bytes()
    payload = data[20:]
    (meta_len,) = struct.unpack_from("<I", payload, 0)
    meta = json.loads(payload[4 : 4 + meta_len])
    count = meta["index_count"]
    del meta[key]
    kept = payload[4 + meta_len : 4 + meta_len + 8 * arrays * count]
    new_meta = json.dumps(meta, separators=(",", ":")).encode()
    new_payload = struct.pack("<I", len(new_meta)) + new_meta + kept
    head = struct.pack("<8sIQ", data[:8], zlib.crc32(new_payload), len(new_payload))
    path.write_bytes(head + new_payload)


def test_a_snapshot_without_ordinals_is_replayed_over(tmp_path: Path) -> None:
    records = build_model(random.Random(3), 40)
    table = message_table(records)

    async def go() -> None:
        dd = await DataDir.open(config(tmp_path))
        log = await dd.create_stream(header(), None)
        for record in records:
            await append(log, *record)
        log_id = log.id
        await dd.close()
        snapshot = tmp_path / "streams" / log_id / SNAPSHOT_NAME
        decode_snapshot(snapshot.read_bytes())  # the current format decodes
        legacy_snapshot(snapshot)
        with pytest.raises(ValueError, match="predates message ordinals"):
            decode_snapshot(snapshot.read_bytes())
        dd = await DataDir.open(config(tmp_path))
        assert dd.logs[log_id]._snapshot_end == 0  # ignored: the whole log was replayed
        await check_ordinals(dd.logs[log_id], table)
        await dd.close()

    run(go)


def test_boundaries_with_staged_entries_and_fork_base(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await DataDir.open(config(tmp_path))
        log = await dd.create_stream(header(fork_position=100), None)
        for i in range(20):
            await append(log, b'"%02d"' % i, b"[1]")  # 4 + 3 bytes
        staged = log.stage(entry(log, b'"s1"', b'"s2"'))  # not durable yet
        assert await log.message_floors([100, 104, 105, 107, 240]) == [
            (100, 0),
            (104, 1),
            (104, 1),
            (107, 2),
            (240, 40),
        ]
        assert await log.boundary_after(100, 40, messages=True) == 240
        assert await log.boundary_after(100, 41, messages=True) == 244  # into staged data
        assert await log.boundary_after(240, 2, messages=True) == 248
        assert await log.boundary_after(237, 1, messages=False) == 238
        with pytest.raises(InvalidPosition):
            await log.boundary_after(100, 43, messages=True)
        with pytest.raises(InvalidPosition):
            await log.message_floors([99])
        await staged
        await dd.close()

    run(go)


def test_boundary_checks_read_headers_not_payloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A boundary lookup deep inside a large stream reads about one index interval of headers."""

    async def go() -> None:
        dd = await DataDir.open(config(tmp_path, index_interval_bytes=64 * 1024))
        log = await dd.create_stream(header(content_type="text/plain"), None)
        block = b"p" * (1 << 20)
        for _ in range(64):
            await append(log, block)
        for _ in range(2000):
            await append(log, b"small")
        read_sizes: list[int] = []
        real = os.pread

        def pread(fd: int, n: int, off: int) -> bytes:
            data = real(fd, n, off)
            read_sizes.append(len(data))
            return data

        monkeypatch.setattr(os, "pread", pread)
        assert await log.is_boundary(40 << 20) and not await log.is_boundary((40 << 20) + 1)
        assert await log.boundary_after(10 << 20, 1, messages=True) == 11 << 20
        floors = await log.message_floors([(64 << 20) + 5 * 1000 + 3])
        assert floors == [((64 << 20) + 5000, 64 + 1000)]
        assert sum(read_sizes) < 512 * 1024, read_sizes
        monkeypatch.undo()
        await dd.close()

    run(go)
