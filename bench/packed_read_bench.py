"""Storage CPU per range of a multi-range read of many small streams, in process: directory streams
against packed streams holding the same records (decision 0010 step 2, reads through extents).

Builds ``--streams`` streams of one small record each, once as directory streams and once as packed
streams (packed creates, then their records as packed records entries in two WAL files, carried into
two packs by the start-up), then reads every stream as the multi-range read does
(``StreamLog.plan_read`` on the loop, ``DiskRead.run(evict=False)`` in a worker thread, ``GROUP``
ranges per trip), ``--rounds`` times, and prints the process CPU per range.

The directory-stream part alone runs against another checkout's storage with ``--only directory``
and ``PYTHONPATH=<checkout>/server`` (e.g. main's, from ``git archive``), to compare the read path of
directory streams before and after.

Run: ``python bench/packed_read_bench.py --streams 10000 --rounds 3``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from durastream_server.storage import codec, packs, wal
from durastream_server.storage.datadir import DataDir, Durability, StorageConfig
from durastream_server.storage.records import AppendEntry, StreamHeader

GROUP = 64  # ranges per worker-thread trip, as engine/multiread.py


def _header(i: int) -> StreamHeader:
    return StreamHeader(path=f"/s{i}", content_type="application/json", created_at_ms=1)


def _append(payload: bytes) -> AppendEntry:
    return AppendEntry(position=0, messages=(payload,), timestamp_ms=2)


async def _make_directory(root: Path, n: int) -> None:
    dd = await DataDir.open(StorageConfig(root=root, durability=Durability.NONE))
    for i in range(n):
        log = await dd.create_stream(_header(i), None)
        await log.stage(_append(b'{"row":%d,"pad":"%s"}' % (i, b"x" * 40)))
    await dd.close()


async def _make_packed(root: Path, n: int) -> None:
    dd = await DataDir.open(StorageConfig(root=root))
    made = []
    for start in range(0, n, 1000):
        made += await asyncio.gather(
            *(dd.create_stream(_header(i), None) for i in range(start, min(n, start + 1000)))
        )
    await dd.close()
    generation = max(packs.pack_generations(root / packs.PACKS_DIR)) + 1
    directory = root / wal.WAL_DIR
    for half in range(2):
        entries = []
        for log in made[half * n // 2 : (half + 1) * n // 2]:
            i = int(log.header.path[2:])
            record = bytes(codec.encode_append(_append(b'{"row":%d,"pad":"%s"}' % (i, b"x" * 40))))
            head = len(codec.encode_header(log.header))
            entries.append(wal.WalEntry(log.id, 0, head, [record], wal.Kind.PACKED_RECORDS))
        wal_file = wal.WalFile.create(directory, generation + half)
        wal_file.append(entries)
        wal_file.close()


async def _read_all(root: Path, rounds: int, packed: bool) -> list[float]:
    config = StorageConfig(
        root=root,
        durability=Durability.FSYNC if packed else Durability.NONE,
        **({"packed_appends": True} if packed else {}),
    )
    dd = await DataDir.open(config)
    try:
        logs = list(dd.logs.values())
        loop = asyncio.get_running_loop()

        def run(plans: list) -> int:  # type: ignore[type-arg]
            return sum(p.run(1 << 20, True, True, 16, evict=False)[2] for p in plans)

        per_range = []
        for _ in range(rounds + 1):
            cpu = time.process_time()
            got = 0
            for i in range(0, len(logs), GROUP):
                plans = [log.plan_read(0, log.durable_tail) for log in logs[i : i + GROUP]]
                got += await loop.run_in_executor(dd.read_executor, run, plans)
            assert got == len(logs), got
            per_range.append((time.process_time() - cpu) / len(logs) * 1e6)
        return per_range[1:]  # the first round warms the caches
    finally:
        await dd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["directory", "packed"], default=None)
    parser.add_argument("--dir", default=None, help="where to build (default: a temporary dir)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="packed-read-"))
    kinds = [args.only] if args.only else ["directory", "packed"]
    print("| streams | kind | storage CPU per range (us), median | rounds | load |")
    print("| ---: | --- | ---: | --- | --- |")
    for kind in kinds:
        root = base / kind
        if not root.exists():
            maker = _make_packed if kind == "packed" else _make_directory
            asyncio.run(maker(root, args.streams))
        rounds = asyncio.run(_read_all(root, args.rounds, kind == "packed"))
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        shown = ", ".join(f"{r:.1f}" for r in rounds)
        print(f"| {args.streams} | {kind} | {statistics.median(rounds):.1f} | {shown} | {load} |")


if __name__ == "__main__":
    main()
