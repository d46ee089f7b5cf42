"""Measure what a staged-append commit costs (docs/decisions/0003-staged-appends.md).

In one process, on a real data directory with fsync durability (the server's default; `--durability none`
to leave the disk out), for each round:

1. stage ``--mib`` MiB into one handle in 1 MiB stage requests (byte stream, one message per request);
2. commit the handle and time it: the commit re-reads the staging file (page-cache hot) and writes it
   into the stream's log as one record group, then fdatasyncs once;
3. for comparison, append the same bytes directly to another stream (1 MiB appends, one at a time).

Prints MiB/s for the commit (the figure the ADR records), for staging, and for the direct appends, plus
the peak RSS growth during the commit (the copy streams in bounded memory). Alternates rounds, since this
VM is noisy; reports the median.

``--handles N`` measures what a commit costs per handle instead (issue 15: a commit of up to 10,000
handles): N handles of one small JSON stage request each (what a Spark partition writing with
``maxMessagesPerRequest=1`` stages), committed in one request. It prints the commit's wall time per handle
and the longest the event loop went without running other work during the commit (a ticker task), with
the most CPU its thread spent in one such stall (the loop's own work; the rest of a stall is the host
not scheduling the process), next to the longest stall of an idle loop over as long (what a loaded host
alone causes).

Run: ``python bench/staged_commit_bench.py [--mib 64] [--rounds 5] [--dir DIR] [--handles N]
[--durability fsync|none]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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


async def _handles_round(engine: Engine, n: int, count: int) -> tuple[float, float, float, float]:
    """Commit ``count`` one-request handles; returns (µs per handle, the longest loop stall in ms
    during the commit, the most CPU the loop's thread spent in one stall, and the longest stall of an
    idle loop over as long)."""
    path = f"bench/handles-{n}"
    await engine.create(CreateRequest(path=path, content_type="application/json"))
    handles = tuple(f"spark-{n}-0-0-0123456789ab-{i}" for i in range(count))
    slots = asyncio.Semaphore(64)

    async def stage(index: int) -> None:
        async with slots:
            body = b'{"id":%d,"payload":"%s"}' % (index, b"p" * 64)
            await engine.stage(StageRequest(path, handles[index], "application/json", body))

    await asyncio.gather(*(stage(i) for i in range(count)))
    # As the server does once started (server.py): what exists now is out of the cyclic GC's reach,
    # so a collection during the commit walks what the commit and the staged handles allocated.
    gc.collect()
    gc.freeze()
    # (wall, CPU of this thread) between two turns of a task that only yields: the wall time is what
    # other requests wait, the CPU time what the loop itself did in that while (the rest is the host
    # not scheduling the process, which a loaded VM does for 100+ ms).
    stalls: list[tuple[float, float]] = []
    done = False

    async def ticker() -> None:
        while not done:
            began, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0)
            stalls.append((time.perf_counter() - began, time.thread_time() - cpu))

    ticking = asyncio.create_task(ticker())
    started = time.perf_counter()
    result = await engine.commit(CommitRequest(path, handles, ProducerTuple("c", 0, 0)))
    elapsed = time.perf_counter() - started
    done = True
    await ticking
    assert result.messages == count
    during = max(wall for wall, _ in stalls)
    during_cpu = max(cpu for _, cpu in stalls)
    # The same ticker with nothing else to do, as long: what the host alone does to the loop.
    stalls.clear()
    done = False
    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(elapsed)
    done = True
    await ticking
    idle = max(wall for wall, _ in stalls)
    return elapsed / count * 1e6, during * 1000, during_cpu * 1000, idle * 1000


async def main(args: argparse.Namespace) -> None:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="staged-bench-"))
    data = await DataDir.open(
        StorageConfig(root=root / "data", durability=Durability(args.durability))
    )
    engine = Engine(data, sweep_interval=0)
    await engine.start()
    if args.handles:
        try:
            await _main_handles(engine, args)
        finally:
            await engine.close()
            await data.close()
        return
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


async def _main_handles(engine: Engine, args: argparse.Namespace) -> None:
    rows = []
    for n in range(args.rounds):
        rows.append(await _handles_round(engine, n, args.handles))
        per_handle, stall, cpu, idle = rows[-1]
        print(
            f"round {n}: commit of {args.handles} handles {per_handle * args.handles / 1e6:6.2f} s, "
            f"{per_handle:6.1f} us per handle, longest loop stall {stall:6.1f} ms, most loop CPU in "
            f"one stall {cpu:5.1f} ms (idle loop: longest stall {idle:6.1f} ms)"
        )
    per_handle, stall, cpu, idle = (statistics.median(col) for col in zip(*rows, strict=True))
    print(
        f"median of {len(rows)} ({args.handles} handles): {per_handle:.1f} us per handle "
        f"({per_handle * args.handles / 1e6:.2f} s), longest loop stall {stall:.1f} ms, most loop CPU "
        f"in one stall {cpu:.1f} ms (idle loop: longest stall {idle:.1f} ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB per commit (default 64)")
    parser.add_argument(
        "--handles", type=int, default=0, help="measure a commit of this many one-request handles"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--durability",
        choices=[d.value for d in Durability],
        default=Durability.FSYNC.value,
        help="the data directory's durability (default fsync, the server's default)",
    )
    parser.add_argument("--dir", help="data directory parent (default: a temp dir)")
    asyncio.run(main(parser.parse_args()))
