"""Multi-range reads and lookups of ``--workers 2`` against one process (decision 0009, "Fan-out" 2).

With ``--workers N`` the worker that receives a multi-range request reads its own shard's ranges and
asks every other worker for theirs (``shards/multirange.py``), then assembles one answer. This
measures what that costs: the same ``--streams`` small streams (one append of ~60 bytes each, created
over HTTP by 16 clients; ``--durability none``) in a ``--workers 1`` and a ``--workers 2`` server,
then, alternating between the two for ``--rounds`` rounds, ``--requests`` times each: every stream's
range read in ``format=frames`` (one request of all ranges, asked again from where the chunk cut it,
as a packed task does) and every stream's limit lookup (one request); and once a round, every
stream read with its own GET (what the connector fell back to before multi-range was served with
workers). Figures: wall time of one walk (median) and the server's CPU for it (every process of the
server, from /proc), per range.

Run: ``python bench/workers_multirange_bench.py [--streams 2000] [--requests 20] [--rounds 4]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server_process import ServerProcess  # noqa: E402

NS = "__ds/x-durastream"
TICK = os.sysconf("SC_CLK_TCK")


def stream_path(n: int) -> str:
    return f"small/stream-{n:05d}"


def create_all(server: ServerProcess, count: int) -> dict[str, str]:
    """Every stream with one small append; its tail by path."""

    def create(first: int) -> dict[str, str]:
        tails = {}
        with requests.Session() as session:
            for n in range(first, count, 16):
                path = stream_path(n)
                body = json.dumps([{"n": n, "pad": "x" * 40}]).encode()
                response = session.put(
                    server.stream_url(path), data=body, headers={"Content-Type": "application/json"}
                )
                response.raise_for_status()
                tails[path] = response.headers["Stream-Next-Offset"]
        return tails

    with ThreadPoolExecutor(16) as pool:
        found: dict[str, str] = {}
        for part in pool.map(create, range(16)):
            found.update(part)
    return dict(sorted(found.items()))


def server_cpu(server: ServerProcess) -> float:
    """CPU seconds of the server's processes (the parent and its workers) so far."""
    pids = [server.pid]
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children")
    pids += [int(pid) for pid in children.read_text().split()]
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def walk_reads(session: requests.Session, url: str, ranges: list[dict[str, str]]) -> int:
    """Every range read to its end (one request of all, asked again from each cut); messages."""
    messages = 0
    pending = ranges
    while pending:
        response = session.post(url, json={"ranges": pending, "format": "frames"})
        assert response.status_code == 200, response.text
        size = int.from_bytes(response.content[4:8], "little")
        entries = json.loads(response.content[8 : 8 + size])["ranges"]
        messages += sum(entry["messages"] for entry in entries)
        last = entries[-1]
        rest = pending[len(entries) :]
        if not last["end_reached"]:
            rest = [{**pending[len(entries) - 1], "offset": last["next_offset"]}, *rest]
        pending = rest
    return messages


def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="workers-multirange-"))
    servers: dict[int, ServerProcess] = {}
    ranges: dict[int, list[dict[str, str]]] = {}
    for workers in (1, 2):
        extra = ("--durability", "none") + (("--workers", "2") if workers == 2 else ())
        server = ServerProcess(root / f"w{workers}", extra_args=extra).start()
        tails = create_all(server, args.streams)
        ranges[workers] = [{"path": p, "offset": "-1", "end": t} for p, t in tails.items()]
        servers[workers] = server
    assert ranges[1] == ranges[2]
    results: dict[int, dict[str, list[float]]] = {1: {}, 2: {}}
    try:
        for _ in range(args.rounds):
            for workers, server in servers.items():
                figures = results[workers]
                with requests.Session() as session:
                    for name, resource in (("reads", "reads"), ("lookups", "lookups")):
                        url = server.stream_url(f"{NS}/{resource}")
                        took = []
                        cpu = server_cpu(server)
                        for _ in range(args.requests):
                            started = time.perf_counter()
                            if name == "reads":
                                assert walk_reads(session, url, ranges[workers]) == args.streams
                            else:
                                body = {"lookups": ranges[workers]}
                                response = session.post(url, json=body)
                                assert response.status_code == 200
                            took.append(time.perf_counter() - started)
                        cpu = server_cpu(server) - cpu
                        figures.setdefault(name, []).append(statistics.median(took))
                        figures.setdefault(name + "_cpu", []).append(cpu / args.requests)
                    # What the connector did under --workers before: one read a stream.
                    cpu = server_cpu(server)
                    started = time.perf_counter()
                    for item in ranges[workers]:
                        params = {"offset": item["offset"], "end": item["end"]}
                        response = session.get(server.stream_url(item["path"]), params=params)
                        assert response.status_code == 200
                    figures.setdefault("single", []).append(time.perf_counter() - started)
                    figures.setdefault("single_cpu", []).append(server_cpu(server) - cpu)
    finally:
        for server in servers.values():
            server.stop()
    print(
        f"\n{args.streams} streams, {args.requests} requests x {args.rounds} rounds alternating; "
        f"load {os.getloadavg()}"
    )
    print("| figure | --workers 1 | --workers 2 | ratio | spread (w1; w2) |")
    print("| --- | ---: | ---: | ---: | --- |")
    per = 1000 / args.streams * 1000  # us per range
    for key, label, scale, unit in (
        ("reads", "reads of every stream, wall per walk", 1000, "ms"),
        ("reads_cpu", "reads: server CPU per range", per, "us"),
        ("lookups", "lookups of every stream, wall per request", 1000, "ms"),
        ("lookups_cpu", "lookups: server CPU per range", per, "us"),
        ("single", "one read a stream (the fallback), wall per walk", 1000, "ms"),
        ("single_cpu", "one read a stream: server CPU per range", per, "us"),
    ):
        one = [value * scale for value in results[1][key]]
        two = [value * scale for value in results[2][key]]
        a, b = statistics.median(one), statistics.median(two)
        spread = f"{min(one):.1f}-{max(one):.1f}; {min(two):.1f}-{max(two):.1f}"
        print(f"| {label} ({unit}) | {a:.1f} | {b:.1f} | {b / a:.2f}x | {spread} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    main(parser.parse_args())
