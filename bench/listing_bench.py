"""Stream listing with 100,000 streams (issue 14, item 4): what a page costs, and what listing costs the others.

Set-up: ``--streams`` streams (default 100,000: 100 tenants of 1,000, ``tenant-TT/stream-NNNNN``) are created
directly through the engine (``Engine.create`` in this process, ``--durability none``), not over HTTP: 100k
PUTs would take about 10 minutes and measure creates, not listings. Then a real server process starts on that
data directory and everything measured is HTTP from this machine's loopback:

1. page latency (median and p99 of ``--requests`` pages): a prefix pattern (``tenant-42/*``, limit 1000), a
   pattern that matches nothing (``**/nomatch``, limit 1), and a full walk of every stream (``**``, limit
   1000, following ``next`` to the end: total time and pages);
2. the latency of other requests (``HEAD`` of one stream, one client) alone, and while 4 client processes
   loop on ``pattern=**/nomatch&limit=1``;
3. in this process, the index itself at that size: add and remove one path in the server's ``SortedList``,
   against ``bisect.insort`` and ``del`` on a plain sorted list.

``--walks N`` (with ``--walks-only`` alone): the connector's walk, N times: every stream in pages of 1,000
by ``prefix`` (what ``list_stream_columns`` asks for a batch read), the server's CPU a walk and the sha256
of every page's bytes (the same on both sides of a change: answers must not change).

``--server-src DIR`` runs the server from another checkout (``PYTHONPATH=DIR/server``), e.g. ``/work/main``
before the change, for a before/after comparison on the same data directory.

Run: ``python bench/listing_bench.py [--streams 100000] [--requests 200] [--server-src DIR] [--dir DIR]
[--walks N [--walks-only] [--prefix P]] [--data NAME] [--packed]``; ``--dir`` of ``fanout_bench.py`` with
``--prefix ten/`` and ``--data data1 --packed`` walks its packed streams.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hashlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
from sortedcontainers import SortedList

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from durastream_server.engine.api import CreateRequest  # noqa: E402
from durastream_server.engine.engine import Engine  # noqa: E402
from durastream_server.storage import DataDir, Durability, StorageConfig  # noqa: E402
from tests.support import server_process  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402

LISTING = "/v1/stream/__ds/x-durastream/streams"
PER_TENANT = 1000
LOOPERS = 4


def stream_path(n: int) -> str:
    return f"tenant-{n // PER_TENANT:02d}/stream-{n:05d}"


async def populate(root: Path, count: int) -> None:
    """Create ``count`` empty streams through the engine, 64 at a time."""
    data = await DataDir.open(StorageConfig(root=root, durability=Durability.NONE))
    engine = Engine(data, sweep_interval=0)
    await engine.start()
    try:
        for start in range(0, count, 64):
            await asyncio.gather(
                *(
                    engine.create(CreateRequest(path=stream_path(n), content_type="text/plain"))
                    for n in range(start, min(count, start + 64))
                )
            )
    finally:
        await engine.close()
        await data.close()


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered) * 1000:7.2f} ms  p99 {p99 * 1000:7.2f} ms"


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU the server process used so far: what requests cost it, whatever else the
    machine runs (wall-clock latencies on a shared 2-core VM are dominated by the neighbours)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_pages(
    session: requests.Session, url: str, params: dict, n: int, pid: int
) -> tuple[list[float], float]:
    """Wall-clock latency of ``n`` pages, and the server's CPU seconds per page."""
    samples = []
    cpu = server_cpu_seconds(pid)
    for _ in range(n):
        started = time.perf_counter()
        response = session.get(url, params=params, timeout=120)
        samples.append(time.perf_counter() - started)
        response.raise_for_status()
    return samples, (server_cpu_seconds(pid) - cpu) / n


def full_walk(session: requests.Session, url: str) -> tuple[float, int, int]:
    started = time.perf_counter()
    after, pages, found = None, 0, 0
    while True:
        params = {"pattern": "**", "limit": 1000, **({"after": after} if after else {})}
        page = session.get(url, params=params, timeout=120).json()
        pages += 1
        found += len(page["streams"])
        if page["next"] is None:
            return time.perf_counter() - started, pages, found
        after = page["next"]


def connector_walks(
    session: requests.Session, url: str, walks: int, pid: int, prefix: str = "tenant-"
) -> None:
    """Print the server CPU a walk (all ``walks`` together over their number: the kernel counts CPU in
    10 ms ticks) of every stream by ``prefix`` in pages of 1,000 (the batch read's listing), the
    median wall time of one, and the sha256 of the pages' bytes."""

    def walk() -> str:
        digest, after = hashlib.sha256(), None
        while True:
            params = {"prefix": prefix, "limit": 1000, **({"after": after} if after else {})}
            response = session.get(url, params=params, timeout=120)
            response.raise_for_status()
            digest.update(response.content)
            after = response.json()["next"]
            if after is None:
                return digest.hexdigest()

    digests = {walk()}  # warm-up
    walls = []
    cpu = server_cpu_seconds(pid)
    for _ in range(walks):
        started = time.perf_counter()
        digests.add(walk())
        walls.append(time.perf_counter() - started)
    cpu = server_cpu_seconds(pid) - cpu
    print(
        f"connector walk (prefix, limit 1000) x{walks}: server CPU {cpu / walks * 1000:.1f} ms a "
        f"walk, wall median {statistics.median(walls) * 1000:.1f} ms; sha256 {' '.join(digests)}"
    )


def loop_listing(url: str, stop: multiprocessing.Event) -> None:  # type: ignore[valid-type]
    with requests.Session() as session:
        while not stop.is_set():  # type: ignore[attr-defined]
            session.get(url, params={"pattern": "**/nomatch", "limit": 1}, timeout=120)


def time_heads(session: requests.Session, url: str, seconds: float) -> list[float]:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        session.head(url, timeout=120).raise_for_status()
        samples.append(time.perf_counter() - started)
    return samples


def index_costs(count: int) -> tuple[float, float]:
    """Microseconds for one add + remove at ``count`` paths: SortedList, and a list with bisect."""
    paths = [stream_path(n) for n in range(count)]
    probes = [
        f"tenant-{n % 100:02d}/stream-{n:05d}x" for n in range(0, count, max(1, count // 2000))
    ]
    index = SortedList(paths)
    started = time.perf_counter()
    for probe in probes:
        index.add(probe)
        index.remove(probe)
    sorted_us = (time.perf_counter() - started) / len(probes) * 1e6
    plain = sorted(paths)
    started = time.perf_counter()
    for probe in probes:
        bisect.insort(plain, probe)
        del plain[bisect.bisect_left(plain, probe)]
    plain_us = (time.perf_counter() - started) / len(probes) * 1e6
    return sorted_us, plain_us


def main(args: argparse.Namespace) -> None:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="listing-bench-"))
    data_dir = root / args.data
    if not (data_dir / "streams").exists():
        started = time.perf_counter()
        asyncio.run(populate(data_dir, args.streams))
        print(
            f"created {args.streams} streams via the engine in {time.perf_counter() - started:.0f} s"
        )
    if args.server_src:
        os.environ["PYTHONPATH"] = str(Path(args.server_src) / "server")
    server_process.STARTUP_TIMEOUT_SECONDS = 900.0
    extra = ("--packed-appends",) if args.packed else ("--durability", "none")
    server = ServerProcess(data_dir, extra_args=extra)
    started = time.perf_counter()
    server.start()
    print(
        f"server ({args.server_src or 'this checkout'}) up in {time.perf_counter() - started:.0f} s"
    )
    url = server.base_url + LISTING
    try:
        with requests.Session() as session:
            if args.walks:
                connector_walks(session, url, args.walks, server.pid, args.prefix)
                if args.walks_only:
                    return
            for name, params in (
                (
                    "prefix pattern tenant-42/*, limit 1000",
                    {"pattern": "tenant-42/*", "limit": 1000},
                ),
                ("no-match pattern **/nomatch, limit 1", {"pattern": "**/nomatch", "limit": 1}),
            ):
                time_pages(session, url, params, 5, server.pid)  # warm-up
                samples, cpu = time_pages(session, url, params, args.requests, server.pid)
                print(f"page, {name:40s} {_ms(samples)}  server CPU {cpu * 1000:6.2f} ms/page")
            cpu = server_cpu_seconds(server.pid)
            total, pages, found = full_walk(session, url)
            cpu = server_cpu_seconds(server.pid) - cpu
            print(
                f"full walk (**, limit 1000): {found} streams in {pages} pages, {total:.2f} s "
                f"({total / pages * 1000:.1f} ms per page), server CPU {cpu:.2f} s"
            )
            head_url = server.stream_url(stream_path(args.streams // 2))
            time_heads(session, head_url, 1.0)
            print(
                f"HEAD alone:                          {_ms(time_heads(session, head_url, 10.0))}"
            )
            stop = multiprocessing.Event()
            loopers = [
                multiprocessing.Process(target=loop_listing, args=(url, stop))
                for _ in range(LOOPERS)
            ]
            for looper in loopers:
                looper.start()
            try:
                time.sleep(1.0)  # let them get going
                heads = time_heads(session, head_url, 10.0)
            finally:
                stop.set()
                for looper in loopers:
                    looper.join(60)
            print(f"HEAD while {LOOPERS} clients loop on no-match: {_ms(heads)}")
    finally:
        server.stop()
    sorted_us, plain_us = index_costs(args.streams)
    print(
        f"index add+remove at {args.streams} paths: SortedList {sorted_us:.1f} us, "
        f"list + bisect.insort {plain_us:.1f} us"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200, help="pages timed per pattern")
    parser.add_argument("--server-src", help="run the server from this checkout (e.g. /work/main)")
    parser.add_argument("--dir", help="reuse this directory (its data/ is created once)")
    parser.add_argument("--walks", type=int, default=0, help="connector walks to time")
    parser.add_argument("--walks-only", action="store_true", help="time the walks alone")
    parser.add_argument("--prefix", default="tenant-", help="the walks' prefix")
    parser.add_argument("--data", default="data", help="the data directory under --dir")
    parser.add_argument("--packed", action="store_true", help="serve with --packed-appends")
    main(parser.parse_args())
