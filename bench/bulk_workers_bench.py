"""Bulk writes of ``--workers 2`` against one process (decision 0009, "What is left" 2; ``shards/bulkwrite.py``).

With ``--workers N`` the worker that receives a bulk ``ensure`` or ``commits`` request checks every
entry, serves its own shard's and sends every other shard its entries over the Unix sockets. This
measures what that costs, as a routed sink's driver and tasks send them: for each of a ``--workers 1``
and a ``--workers 2`` server (fsync durability, the default), rounds alternating which goes first, one
``ensure`` of ``--streams`` new paths (``r<round>/s<NNNNN>``) and one ``commits`` request holding an
inline commit of ``--bytes`` bytes to each (one producer, as one Spark partition's parts). Figures per
request: wall seconds and the CPU seconds of the whole server (the parent and its workers, from
``/proc``), medians over ``--rounds`` with their spread. The machine is shared and has 2 cores: the
ratio of the two servers in the same minutes is the figure, not the absolute times.

Run: ``python bench/bulk_workers_bench.py [--streams 10000] [--bytes 100] [--rounds 4]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from durastream_server.http.bulk import encode_requests  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402

NS = "__ds/x-durastream"
TEXT = "text/plain"


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its live children (the workers of ``--workers N``)."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(child) for child in children.read_text().split()]
    total = 0
    for one in pids:
        with open(f"/proc/{one}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def timed(server: ServerProcess, resource: str, **kwargs: object) -> tuple[float, float, dict]:
    cpu = tree_cpu_seconds(server.pid)
    started = time.perf_counter()
    response = requests.post(server.stream_url(f"{NS}/{resource}"), timeout=600, **kwargs)
    wall = time.perf_counter() - started
    used = tree_cpu_seconds(server.pid) - cpu
    response.raise_for_status()
    return wall, used, response.json()


def one_round(server: ServerProcess, round_: int, streams: int, size: int) -> dict[str, tuple]:
    paths = [f"r{round_}/s{n:05d}" for n in range(streams)]
    ensure = timed(server, "ensure", json={"streams": paths, "content_type": TEXT})
    assert all(r.get("created") for r in ensure[2]["results"]), "an ensure entry failed"
    producer = {"Producer-Id": f"p{round_}", "Producer-Epoch": "0", "Producer-Seq": "0"}
    headers = {"Content-Type": TEXT, "Durastream-Commit-Key": f"k{round_}", **producer}
    body = encode_requests([(p, headers, b"x" * size) for p in paths])
    commits = timed(server, "commits", data=body)
    assert all(r["status"] == 200 for r in commits[2]["results"]), "a commit entry failed"
    return {"ensure": ensure[:2], "commits": commits[:2]}


def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bulk-workers-"))
    servers = {
        n: ServerProcess(root / f"w{n}" / "data", extra_args=("--workers", str(n))).start()
        for n in (1, 2)
    }
    results: dict[int, list[dict[str, tuple]]] = {1: [], 2: []}
    try:
        for round_ in range(args.rounds):
            order = (1, 2) if round_ % 2 == 0 else (2, 1)
            for n in order:
                results[n].append(one_round(servers[n], round_, args.streams, args.bytes))
                print(f"round {round_} --workers {n}: {results[n][-1]}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print(f"{args.streams} streams, {args.bytes} B each, {args.rounds} rounds (median [min-max])")
    for resource in ("ensure", "commits"):
        medians = {}
        for n in (1, 2):
            for k, what in ((0, "wall"), (1, "server CPU")):
                values = [r[resource][k] for r in results[n]]
                medians[n, k] = statistics.median(values)
                print(
                    f"  {resource:8s} --workers {n} {what:10s} {medians[n, k]:.3f} s "
                    f"[{min(values):.3f}-{max(values):.3f}]"
                )
        print(
            f"  {resource:8s} workers 2 / 1: wall {medians[2, 0] / medians[1, 0]:.2f}x, "
            f"server CPU {medians[2, 1] / medians[1, 1]:.2f}x"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    main(parser.parse_args())
