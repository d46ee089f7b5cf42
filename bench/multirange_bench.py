"""Multi-range reads over many idle streams (issue 17): what a packed source task costs the server.

The Spark source's packed tasks read the new data of thousands of small streams in one
``POST .../__ds/x-durastream/reads`` (``multi-range=1``, docs/extensions.md section 10). Each range starts
where the previous batch stopped, after older records of the stream, and by the time a batch runs the
streams have been idle for a while. This measures that read for each server checkout given (``--src``,
``-`` for this tree), in the same run:

- ``--streams`` JSON streams, each created with ``--old`` messages of ``--message-bytes`` (the data a
  previous batch read) and then given ``--new`` more (this batch's range: from the offset after the
  old messages to the tail), over ``--clients`` connections;
- after ``--idle`` seconds (every log idle): ``--rounds`` passes of multi-range reads of every range (10,000
  ranges per request, continued from where each answer stopped), each checked against the expected
  message count; wall seconds and the server's CPU seconds per pass (the robust figure on a loaded
  machine), then (after ``--idle`` again) a multi-range limit lookup of every range (what the source's
  planning asks to size a batch) and its server CPU; the same after a SIGKILL and restart.

Run: ``python bench/multirange_bench.py --src /tmp/base - [--streams 10000]``
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from restart_bench import Server  # noqa: E402
from server_bench import cpu_seconds  # noqa: E402

READS = "/v1/stream/__ds/x-durastream/reads"
LOOKUPS = "/v1/stream/__ds/x-durastream/lookups"
JSON_HEADERS = {"Content-Type": "application/json"}
MAX_RANGES = 10_000


def stream_path(i: int) -> str:
    return f"mr/s{i:06d}"


def _batch(count: int, size: int, first: int) -> bytes:
    return (
        b"["
        + b",".join(b'{"n":%d,"pad":"%s"}' % (first + k, b"x" * size) for k in range(count))
        + b"]"
    )


def populate(port: int, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """Create the streams; returns each one's range (path, offset after the old messages, tail)."""

    def one(indices: range) -> list[tuple[str, str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        found = []
        for i in indices:
            path = f"/v1/stream/{stream_path(i)}"
            headers = {"Content-Type": "application/json"}
            conn.request("PUT", path, _batch(args.old, args.message_bytes, 0), headers)
            response = conn.getresponse()
            response.read()
            assert response.status == 201, response.status
            start = response.getheader("Stream-Next-Offset")
            conn.request("POST", path, _batch(args.new, args.message_bytes, args.old), headers)
            response = conn.getresponse()
            response.read()
            assert response.status in (200, 204), response.status
            found.append((stream_path(i), start, response.getheader("Stream-Next-Offset")))
        conn.close()
        return found

    step = -(-args.streams // args.clients)
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        parts = pool.map(
            one, [range(s, min(args.streams, s + step)) for s in range(0, args.streams, step)]
        )
        return [r for part in parts for r in part]


def read_all(port: int, ranges: list[tuple[str, str, str]], expected: int) -> int:
    """Every range through multi-range reads; returns the requests it took."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    todo = [{"path": p, "offset": o, "end": e} for p, o, e in ranges]
    messages = requests = 0
    while todo:
        body = json.dumps({"ranges": todo[:MAX_RANGES]}).encode()
        conn.request("POST", READS, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        requests += 1
        assert response.status == 200, (response.status, data[:300])
        size = int.from_bytes(data[4:8], "little")
        entries = json.loads(data[8 : 8 + size])["ranges"]
        for entry in entries:
            assert "error" not in entry, entry
            messages += entry["messages"]
        last = entries[-1]
        done = len(entries) if last["end_reached"] else len(entries) - 1
        if not last["end_reached"]:
            todo[len(entries) - 1]["offset"] = last["next_offset"]
        todo = todo[done:]
    conn.close()
    assert messages == expected, (messages, expected)
    return requests


def lookup_all(port: int, ranges: list[tuple[str, str, str]], expected: int) -> None:
    """A limit lookup of every range (as the source's planning sizes a batch), 10,000 per request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    messages = 0
    for first in range(0, len(ranges), MAX_RANGES):
        part = [
            {"path": p, "offset": o, "end": e} for p, o, e in ranges[first : first + MAX_RANGES]
        ]
        conn.request("POST", LOOKUPS, json.dumps({"lookups": part}).encode(), JSON_HEADERS)
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, (response.status, data[:300])
        messages += sum(found["messages"] for found in json.loads(data)["results"])
    conn.close()
    assert messages == expected, (messages, expected)


def passes(server: Server, ranges: list, args: argparse.Namespace) -> dict:
    pid = server.proc.pid  # type: ignore[union-attr]
    walls, cpus, lookup_cpus = [], [], []
    for _ in range(args.rounds):
        time.sleep(args.idle)
        cpu, started = cpu_seconds(pid), time.perf_counter()
        requests = read_all(server.port, ranges, args.new * len(ranges))
        walls.append(time.perf_counter() - started)
        cpus.append(cpu_seconds(pid) - cpu)
        time.sleep(args.idle)
        cpu = cpu_seconds(pid)
        lookup_all(server.port, ranges, args.new * len(ranges))
        lookup_cpus.append(cpu_seconds(pid) - cpu)
    return {
        "wall_s": statistics.median(walls),
        "server_cpu_s": statistics.median(cpus),
        "server_cpu_us_per_range": statistics.median(cpus) / len(ranges) * 1e6,
        "lookup_cpu_us_per_range": statistics.median(lookup_cpus) / len(ranges) * 1e6,
        "requests": requests,
        "load": os.getloadavg()[0],
    }


def bench(src: str | None, work: Path, args: argparse.Namespace) -> dict:
    data_dir = work / f"data-{len(list(work.iterdir()))}"
    data_dir.mkdir()
    server = Server(src, data_dir)
    server.start()
    try:
        server.wait(lambda h: not h.get("recovering"))
        ranges = populate(server.port, args)
        live = passes(server, ranges, args)
        server.kill()
        server.start()
        server.wait(lambda h: not h.get("recovering"))
        restarted = passes(server, ranges, args)
    finally:
        server.kill()
        shutil.rmtree(data_dir, ignore_errors=True)
    result = {"src": src or "this tree", "live": live, "after_restart": restarted}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", nargs="+", default=["-"], help="server checkouts; - is this tree")
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--old", type=int, default=100, help="messages before the range")
    parser.add_argument("--new", type=int, default=5, help="messages in the range")
    parser.add_argument("--message-bytes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=1.0, help="seconds idle before each pass")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="multirange-bench-") as tmp:
        results = [bench(None if src == "-" else src, Path(tmp), args) for src in args.src]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
