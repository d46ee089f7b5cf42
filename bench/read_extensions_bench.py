"""Read-side extension throughput: plain catch-up reads vs bounded reads vs ``format=frames`` /
``format=frames-lines`` over one JSON stream, plus limit-lookup and time-lookup latency.

Usage: ``.venv/bin/python bench/read_extensions_bench.py [--mb 100] [--message-bytes 1024]``

Starts its own durastream-server (``--durability none``: only reads are measured) on a temporary data
directory, fills one JSON stream, then reads it start to end several times per mode over one
keep-alive connection and prints payload MB/s (the stored JSON bytes, not the response bytes).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server_process import ServerProcess  # noqa: E402


def fill(conn: http.client.HTTPConnection, path: str, total: int, size: int) -> None:
    conn.request("PUT", path, b"", {"Content-Type": "application/json"})
    conn.getresponse().read()
    message = json.dumps({"pad": "x" * (size - 12)}).encode()
    batch = b"[" + b",".join([message] * 64) + b"]"
    written = 0
    while written < total:
        conn.request("POST", path, batch, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 204, response.status
        written += 64 * len(message)


def read_through(conn: http.client.HTTPConnection, path: str, query: str, tail: str) -> int:
    offset = "-1"
    received = 0
    while True:
        conn.request("GET", f"{path}?offset={offset}{query}")
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:200])
        received += len(body)
        offset = response.getheader("Stream-Next-Offset")
        if offset == tail:
            return received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(
            Path(tmp) / "data", extra_args=("--durability", "none", "--log-level", "WARNING")
        )
        with server:
            host, port = server.host, server.port
            conn = http.client.HTTPConnection(host, port, timeout=120)
            path = "/v1/stream/bench/read-ext"
            filled_from = int(time.time() * 1000)
            fill(conn, path, args.mb * 1_000_000, args.message_bytes)
            filled_to = int(time.time() * 1000)
            conn.request("HEAD", path)
            response = conn.getresponse()
            response.read()
            tail = response.getheader("Stream-Next-Offset")
            payload = int(tail.split("_")[1])
            print(f"stream: {payload / 1e6:.1f} MB of JSON, {args.message_bytes} B messages")
            # The last message boundary before the tail: a bounded read to it checks the boundary
            # on every chunk (the tail itself needs no check).
            conn.request("GET", f"{path}?offset=-1&lookup=limit&max_bytes={payload - 1}")
            response = conn.getresponse()
            last = json.loads(response.read())["end"]
            modes = {
                "plain": ("", tail),
                "bounded (end=tail)": (f"&end={tail}", tail),
                "bounded (end=last msg)": (f"&end={last}", last),
                "format=frames": ("&format=frames", tail),
                "format=frames-lines": ("&format=frames-lines", tail),
                "frames + end=last msg": (f"&format=frames&end={last}", last),
            }
            for name, (query, target) in modes.items():
                rates = []
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    read_through(conn, path, query, target)
                    rates.append(payload / 1e6 / (time.perf_counter() - started))
                print(f"{name:22s} {statistics.median(rates):8.1f} MB/s (median of {args.rounds})")
            span = filled_to - filled_from
            for label, query in (
                ("lookup from start, max_messages=50000", "&lookup=limit&max_messages=50000"),
                ("lookup from start, max_bytes=64MB", "&lookup=limit&max_bytes=64000000"),
                ("lookup to the tail (no limit)", "&lookup=limit"),
                (
                    "time lookup, 10% into the fill",
                    f"&lookup=time&timestamp={filled_from + span // 10}",
                ),
                (
                    "time lookup, 90% into the fill",
                    f"&lookup=time&timestamp={filled_to - span // 10}",
                ),
                (
                    "time lookup, after the last message",
                    f"&lookup=time&timestamp={filled_to + 1000}",
                ),
            ):
                times = []
                for _ in range(50):
                    started = time.perf_counter()
                    conn.request("GET", f"{path}?offset=-1{query}")
                    response = conn.getresponse()
                    response.read()
                    assert response.status == 200
                    times.append((time.perf_counter() - started) * 1000)
                print(f"{label:40s} median {statistics.median(times):6.2f} ms")
            conn.close()


if __name__ == "__main__":
    main()
