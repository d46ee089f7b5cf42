"""Measure what a staged-append commit costs (docs/decisions/0003-staged-appends.md).

In one process, on a real data directory with fsync durability (the server's default), for each round:

1. stage ``--mib`` MiB into one handle in 1 MiB stage requests (byte stream, one message per request);
2. commit the handle and time it: the commit re-reads the staging file (page-cache hot) and writes it
   into the stream's log as one record group, then fdatasyncs once;
3. for comparison, append the same bytes directly to another stream (1 MiB appends, one at a time).

Prints MiB/s for the commit (the figure the ADR records), for staging, and for the direct appends, plus
the peak RSS growth during the commit (the copy streams in bounded memory). Alternates rounds, since this
VM is noisy; reports the median.

Run: ``python bench/staged_commit_bench.py [--mib 64] [--rounds 5] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path

from durastream_server.engine.api import AppendRequest, CreateRequest
from durastream_server.engine.engine import Engine
from durastream_server.engine.txnapi import CommitRequest, StageRequest
from durastream_server.storage import DataDir, Durability, StorageConfig
from durastream_server.storage.records import ProducerTuple

MIB = 1024 * 1024
CONTENT_TYPE = "application/octet-stream"


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / MIB


async def _round(engine: Engine, n: int, mib: int) -> tuple[float, float, float, float]:
    chunk = bytes(range(256)) * (MIB // 256)
    staged_path, direct_path = f"bench/staged-{n}", f"bench/direct-{n}"
    for path in (staged_path, direct_path):
        await engine.create(CreateRequest(path=path, content_type=CONTENT_TYPE))
    handle = f"h{n}"
    started = time.perf_counter()
    for seq in range(mib):
        await engine.stage(
            StageRequest(staged_path, handle, CONTENT_TYPE, chunk, ProducerTuple("s", 0, seq))
        )
    stage_s = time.perf_counter() - started
    rss_before = _rss_mib()
    peak = rss_before
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _rss_mib())
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    started = time.perf_counter()
    await engine.commit(CommitRequest(staged_path, (handle,), ProducerTuple("c", 0, 0)))
    commit_s = time.perf_counter() - started
    stop.set()
    await sampler
    started = time.perf_counter()
    for seq in range(mib):
        await engine.append(
            AppendRequest(direct_path, CONTENT_TYPE, chunk, producer=ProducerTuple("d", 0, seq))
        )
    direct_s = time.perf_counter() - started
    return mib / commit_s, mib / stage_s, mib / direct_s, peak - rss_before


async def main(args: argparse.Namespace) -> None:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="staged-bench-"))
    data = await DataDir.open(StorageConfig(root=root / "data", durability=Durability.FSYNC))
    engine = Engine(data, sweep_interval=0)
    await engine.start()
    rows = []
    try:
        for n in range(args.rounds):
            rows.append(await _round(engine, n, args.mib))
            commit, stage, direct, rss = rows[-1]
            print(
                f"round {n}: commit {commit:7.1f} MiB/s  stage {stage:7.1f} MiB/s  "
                f"direct append {direct:7.1f} MiB/s  commit RSS growth {rss:5.1f} MiB"
            )
    finally:
        await engine.close()
        await data.close()
    commit, stage, direct, rss = (statistics.median(col) for col in zip(*rows, strict=True))
    print(
        f"median of {len(rows)} ({args.mib} MiB): commit {commit:.1f} MiB/s "
        f"({args.mib / commit * 1000:.0f} ms), stage {stage:.1f} MiB/s, "
        f"direct append {direct:.1f} MiB/s, commit RSS growth {rss:.1f} MiB"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB per commit (default 64)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", help="data directory parent (default: a temp dir)")
    asyncio.run(main(parser.parse_args()))
