"""Server CPU of change queries that wait and time out (h60: uvloop's timer re-arm spin).

For each server (``--server-src DIR`` repeated; this checkout when none is given), alternating round by
round, on a fresh data directory (``--durability none``: nothing is written during the measurement):
``--waiters`` keep-alive connections each ask ``--waits-each`` change queries one after the other,
``GET {root}/__ds/x-durastream/changes?since=<cursor>&wait=<--wait-ms>``, with nothing changing, so every
one parks and answers empty at its timeout. The figure is the server process's CPU (user + system, all
threads, in clock ticks, and the event loop's thread alone, to the nanosecond) per wait over that phase. Before ``server/durastream_server/
timers.py`` a wait whose timer fired on its deadline's millisecond with ``loop.time()`` a few ulps short
of the deadline re-armed a 0 ms timer every loop pass until uvloop's clock ticked.

Run: ``python bench/wait_timer_bench.py --server-src /work/main --server-src . --repeat 4``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_bench import ScaleServer, connect  # noqa: E402
from server_bench import cpu_seconds  # noqa: E402

CHANGES = "/v1/stream/__ds/x-durastream/changes"


def loop_cpu(pid: int) -> float:
    """On-CPU seconds of the server's main thread, which runs the event loop, in nanoseconds'
    resolution (``schedstat``; ``stat``'s clock ticks are 10 ms, too coarse for a few us per wait)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def cursor_of(port: int) -> str:
    """The feed's cursor now (a snapshot query)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{CHANGES}", timeout=30) as response:
        return json.loads(response.read())["cursor"]  # type: ignore[no-any-return]


async def measure(server: ScaleServer, args: argparse.Namespace) -> dict:
    cursor = await asyncio.to_thread(cursor_of, server.port)
    raw = (
        f"GET {CHANGES}?since={cursor}&wait={args.wait_ms} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    ).encode()
    conns = [await connect(server.port) for _ in range(args.waiters)]

    async def waits(conn) -> None:  # noqa: ANN001
        for _ in range(args.waits_each):
            status, _ = await conn.request(raw)
            assert status == 200, status

    try:
        cpu, loop, started = cpu_seconds(server.pid), loop_cpu(server.pid), time.perf_counter()
        await asyncio.gather(*(waits(conn) for conn in conns))
        elapsed = time.perf_counter() - started
        cpu, loop = cpu_seconds(server.pid) - cpu, loop_cpu(server.pid) - loop
    finally:
        for conn in conns:
            conn.transport.close()
    n = args.waiters * args.waits_each
    return {
        "waits": n,
        "elapsed_s": round(elapsed, 3),
        "cpu_us_per_wait": round(cpu / n * 1e6, 1),
        "loop_us_per_wait": round(loop / n * 1e6, 1),
    }


async def run(args: argparse.Namespace) -> dict:
    results: dict = {"load_before": os.getloadavg(), "runs": []}
    servers = args.server_src or [None]
    order = [s for rep in range(args.repeat) for s in (servers if rep % 2 == 0 else servers[::-1])]
    for src in order:
        with tempfile.TemporaryDirectory(prefix="wait-timer-bench-") as workdir:
            server = ScaleServer(
                Path(workdir) / "data", src and str(Path(src).resolve()), ["--durability", "none"]
            )
            try:
                server.spawn()
                await asyncio.to_thread(server.wait_healthy)
                figures = await measure(server, args)
            finally:
                server.stop()
        figures["load"] = round(os.getloadavg()[0], 2)
        name = src or "this checkout"
        results["runs"].append({"server": name, **figures})
        print(name, json.dumps(figures), flush=True)
    for name in dict.fromkeys(run["server"] for run in results["runs"]):
        for key in ("cpu_us_per_wait", "loop_us_per_wait"):
            values = [r[key] for r in results["runs"] if r["server"] == name]
            print(f"{name}: {key} median {statistics.median(values)} {sorted(values)}")
    results["load_after"] = os.getloadavg()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--server-src", action="append", help="checkout whose server to run (repeatable)"
    )
    parser.add_argument("--waiters", type=int, default=200, help="concurrent connections")
    parser.add_argument("--waits-each", type=int, default=10, help="waits per connection, in turn")
    parser.add_argument("--wait-ms", type=int, default=100, help="the change query's wait")
    parser.add_argument("--repeat", type=int, default=4, help="rounds, servers alternating")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
