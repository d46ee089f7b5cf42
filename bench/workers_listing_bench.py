"""The listing and the change feed of ``--workers 2`` against one process (decision 0009, "Fan-out";
issue 17).

With ``--workers N`` the worker that receives a listing asks every other worker for its shard's page
and merges them (``shards/fanout.py``). This measures what that costs a client: the same ``--streams``
streams (``tenant-TT/stream-NNNNN``, 100 per tenant, created over HTTP by 16 clients) in a
``--workers 1`` and a ``--workers 2`` server (``--durability none``: creates are not measured), then,
alternating between the two for ``--rounds`` rounds, ``--requests`` pages of one tenant
(``prefix=tenant-07/``, limit 1,000) and a full walk of every stream (limit 1,000, following ``next``);
then the change feed (``shards/changefeed.py``): ``--requests`` / 10 snapshot pages of every stream
(``limit`` = ``--streams``, one page holding them all) and ``--waits`` idle waits
(``since`` = the tail, ``wait=10000``), each woken by one append to a stream (alternating over the
shards): the wake latency is from sending the append to the wait's answer.

Run: ``python bench/workers_listing_bench.py [--streams 10000] [--requests 100] [--waits 20] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server_process import ServerProcess  # noqa: E402

PER_TENANT = 100


def stream_path(n: int) -> str:
    return f"tenant-{n // PER_TENANT:02d}/stream-{n:05d}"


def create_all(server: ServerProcess, count: int) -> None:
    def create(first: int) -> None:
        with requests.Session() as session:
            for n in range(first, count, 16):
                response = session.put(
                    server.stream_url(stream_path(n)), headers={"Content-Type": "text/plain"}
                )
                response.raise_for_status()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(16)))


def page_times(session: requests.Session, url: str, requests_: int) -> list[float]:
    took = []
    for _ in range(requests_):
        started = time.perf_counter()
        response = session.get(url, params={"prefix": "tenant-07/", "limit": "1000"})
        took.append(time.perf_counter() - started)
        assert response.status_code == 200 and len(response.json()["streams"]) == PER_TENANT
    return took


def full_walk(session: requests.Session, url: str, count: int) -> float:
    started = time.perf_counter()
    seen, after = 0, None
    while True:
        params = {"limit": "1000", **({"after": after} if after else {})}
        page = session.get(url, params=params).json()
        seen += len(page["streams"])
        after = page["next"]
        if after is None:
            break
    assert seen == count, seen
    return time.perf_counter() - started


def snapshot_times(session: requests.Session, url: str, count: int, requests_: int) -> list[float]:
    """One change page holding every stream (no ``since``: a snapshot), ``requests_`` times."""
    took = []
    for _ in range(requests_):
        started = time.perf_counter()
        page = session.get(url, params={"limit": str(count)}).json()
        took.append(time.perf_counter() - started)
        assert len(page["changes"]) + (1 if page["more"] else 0) > 0.9 * count, len(page["changes"])
    return took


def _parked(server: ServerProcess) -> bool:
    return requests.get(server.base_url + "/healthz").json()["waiters"] >= 1


def wake_times(server: ServerProcess, count: int, waits: int) -> list[float]:
    """Idle waits on the tail of the feed, each woken by one append: send-append to answer."""
    url = server.stream_url("__ds/x-durastream/changes")
    took = []
    with requests.Session() as waiter, requests.Session() as writer:
        cursor = None
        while True:  # the tail: walk the feed to its end
            page = waiter.get(
                url, params={"limit": "10000", **({"since": cursor} if cursor else {})}
            ).json()
            cursor = page["cursor"]
            if not page["more"]:
                break
        for k in range(waits):
            answered: list[tuple[float, dict]] = []

            def wait(since: str = cursor, answered: list = answered) -> None:
                page = waiter.get(url, params={"since": since, "wait": "10000"}).json()
                answered.append((time.perf_counter(), page))

            thread = threading.Thread(target=wait)
            thread.start()
            deadline = time.monotonic() + 10
            while not _parked(server) and time.monotonic() < deadline:
                time.sleep(0.005)  # a benchmark: the wait must be parked before the append
            path = stream_path((k * 37) % count)
            sent = time.perf_counter()
            writer.post(server.stream_url(path), data=b"x", headers={"Content-Type": "text/plain"})
            thread.join(15)
            woke, page = answered[0]
            assert [c["path"] for c in page["changes"]] == [path], page
            took.append(woke - sent)
            cursor = page["cursor"]
    return took


def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="workers-listing-"))
    servers = {}
    for workers in (1, 2):
        extra = ("--durability", "none") + (("--workers", "2") if workers == 2 else ())
        server = ServerProcess(root / f"w{workers}", extra_args=extra).start()
        started = time.perf_counter()
        create_all(server, args.streams)
        print(
            f"--workers {workers}: {args.streams} creates in {time.perf_counter() - started:.1f} s"
        )
        servers[workers] = server
    results: dict[int, dict[str, list[float]]] = {1: {}, 2: {}}
    try:
        for _ in range(args.rounds):
            for workers, server in servers.items():
                url = server.stream_url("__ds/x-durastream/streams")
                with requests.Session() as session:
                    pages = page_times(session, url, args.requests)
                    walk = full_walk(session, url, args.streams)
                figures = results[workers]
                figures.setdefault("page", []).append(statistics.median(pages))
                figures.setdefault("p99", []).append(sorted(pages)[int(0.99 * len(pages)) - 1])
                figures.setdefault("walk", []).append(walk)
                changes_url = server.stream_url("__ds/x-durastream/changes")
                with requests.Session() as session:
                    snapshots = snapshot_times(
                        session, changes_url, args.streams, max(1, args.requests // 10)
                    )
                figures.setdefault("snapshot", []).append(statistics.median(snapshots))
                wakes = wake_times(server, args.streams, args.waits)
                figures.setdefault("wake", []).append(statistics.median(wakes))
                figures.setdefault("wake_max", []).append(max(wakes))
    finally:
        for server in servers.values():
            server.stop()
    print(f"\n{args.streams} streams, {args.rounds} rounds alternating; load {os.getloadavg()}")
    print("| figure | --workers 1 | --workers 2 | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for key, label in (
        ("page", "one tenant's page (100 streams), median ms"),
        ("p99", "one tenant's page, p99 ms"),
        ("walk", f"full walk ({args.streams} streams, limit 1,000), ms"),
        ("snapshot", f"change feed: one page of all {args.streams} streams, median ms"),
        ("wake", "change feed: idle wait woken by an append, median ms"),
        ("wake_max", "change feed: idle wait woken by an append, max ms"),
    ):
        one = statistics.median(results[1][key]) * 1000
        two = statistics.median(results[2][key]) * 1000
        print(f"| {label} | {one:.1f} | {two:.1f} | {two / one:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--waits", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    main(parser.parse_args())
