"""The pack index's costs (decision 0010, "Step 2: the pack index"), in process, one server source per
run (``PYTHONPATH=<checkout>/server`` picks the baseline, e.g. ``git archive main server``):

- ``build DIR N``: a data directory of N packed creates, checkpointed into one pack (this tree writes
  its index; a baseline ignores it).
- ``open DIR``: ``DataDir.open(lazy=True)`` of it, wall and CPU seconds (start-up before serving).
- ``write_pack DIR N``: ``packs.write_pack`` of N packed creates with ``sync``: what a checkpoint that
  keeps them spends (this tree also builds and writes the index).

Run alternately, e.g.::

    python bench/pack_index_bench.py build /tmp/pi 100000
    for i in 1 2 3 4; do
      python bench/pack_index_bench.py open /tmp/pi
      PYTHONPATH=/tmp/base/server python bench/pack_index_bench.py open /tmp/pi
    done
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path

import durastream_server
from durastream_server.storage import DataDir, Durability, StorageConfig, codec, packs, wal
from durastream_server.storage.records import StreamHeader


def _header(path: str) -> StreamHeader:
    return StreamHeader(path=path, content_type="application/json", created_at_ms=1_700_000_000_000)


def _config(root: Path) -> StorageConfig:
    return StorageConfig(root=root, durability=Durability.FSYNC, packed_appends=True)


async def _build(root: Path, count: int) -> None:
    dd = await DataDir.open(_config(root))
    for start in range(0, count, 1000):
        stop = min(count, start + 1000)
        await asyncio.gather(
            *(dd.create_stream(_header(f"/b/{i}"), None) for i in range(start, stop))
        )
    await dd.close()


async def _open(root: Path) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    dd = await DataDir.open(_config(root), lazy=True)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await dd.close()
    return wall, cpu


def _write_pack(directory: Path, count: int) -> tuple[float, float]:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    entries = [
        wal.WalEntry(
            f"{i:032x}", 0, 0, [bytes(codec.encode_header(_header(f"/b/{i}")))], wal.Kind.PACKED
        )
        for i in range(count)
    ]
    wall, cpu = time.perf_counter(), time.process_time()
    packs.write_pack(directory, 5, entries, sync=True)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    mode, root = sys.argv[1], Path(sys.argv[2])
    source = durastream_server.__file__.split("/server/")[0]
    if mode == "build":
        asyncio.run(_build(root, int(sys.argv[3])))
        return
    wall, cpu = asyncio.run(_open(root)) if mode == "open" else _write_pack(root, int(sys.argv[3]))
    print(f"{source} {mode} wall {wall:.3f}s cpu {cpu:.3f}s")


if __name__ == "__main__":
    main()
