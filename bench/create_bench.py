"""Stream creation rate (issue 17: >= 5,000 creates/s), for one or more servers in the same run.

For each server (``--server-src DIR`` repeated; this checkout when none is given), on a fresh data directory
with fsync durability (the defaults), driven over loopback by ``scale_bench``'s lean client:

``put``       ``--streams`` creates with ``PUT`` alone, by ``--clients`` connections, one request in flight each;
``put+post``  ``--streams`` more, each created with ``PUT`` and given one small message with ``POST`` (the
              issue's method);
``post_again`` one more ``POST`` to each of the ``put+post`` streams, which now have data: a later append
              with the same load, so ``put+post`` minus ``put`` minus this is what a first append costs extra;
``ensure``    one bulk ``ensure`` request creating ``--ensure`` streams (docs/extensions.md section 11), as
              the connector's routed sink does; reported as creates/s of that request; then one bulk
              ``commits`` request giving each of those new streams its first data (an inline commit of
              10 rows), the sink's next request, and another one to the same streams, which now have
              data (``later_commits``).

Figures: creates/s and the server's CPU per create (user + system of the server process: robust under
load), and the part of it spent by the event loop's thread (HTTP, protocol, engine; the rest is the commit
thread's round and the I/O threads' checkpoint syncs, nearly all system calls); and the CPU of this
benchmark's own client (``client_cpu_us_per_create``, the same process's 16 connections), which shares the
machine's cores with the server: on a 2-core machine it is part of why a rate stops growing. Compare
servers by their ratio in the same run, and note ``uptime`` beside the figures.

Run: ``python bench/create_bench.py --server-src /work/main --server-src . [--streams 4000] [--ensure 2000]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from scale_bench import ScaleServer, raw_request, run_clients  # noqa: E402

from durastream_server.http.bulk import encode_requests  # noqa: E402
from durastream_server.offsets import format_offset  # noqa: E402

ENSURE = "__ds/x-durastream/ensure"  # under /v1/stream/ (raw_request)
COMMITS = "__ds/x-durastream/commits"


async def measure(server: ScaleServer, args: argparse.Namespace) -> dict:
    figures: dict = {}

    async def put(conn, i: int) -> None:  # noqa: ANN001
        status, _ = await conn.request(
            raw_request("PUT", f"put/s{i:06d}", content_type="application/json")
        )
        if status != 201:
            raise RuntimeError(f"PUT: HTTP {status}")

    async def put_post(conn, i: int) -> None:  # noqa: ANN001
        path = f"pp/s{i:06d}"
        status, _ = await conn.request(raw_request("PUT", path, content_type="application/json"))
        if status != 201:
            raise RuntimeError(f"PUT: HTTP {status}")
        body = b'{"i":%d,"pad":"0123456789abcdef"}' % i
        status, _ = await conn.request(raw_request("POST", path, body, "application/json"))
        if status not in (200, 204):
            raise RuntimeError(f"POST: HTTP {status}")

    async def post(conn, path: str, i: int) -> None:  # noqa: ANN001
        body = b'{"i":%d,"pad":"0123456789abcdef"}' % i
        status, _ = await conn.request(raw_request("POST", path, body, "application/json"))
        if status not in (200, 204):
            raise RuntimeError(f"POST {path}: HTTP {status}")

    async def post_again(conn, i: int) -> None:  # noqa: ANN001
        await post(conn, f"pp/s{i:06d}", i)

    async def put_body(conn, i: int) -> None:  # noqa: ANN001
        body = b'{"i":%d,"pad":"0123456789abcdef"}' % i
        status, _ = await conn.request(raw_request("PUT", f"pb/s{i:06d}", body, "application/json"))
        if status != 201:
            raise RuntimeError(f"PUT with data: HTTP {status}")

    async def first_post(conn, i: int) -> None:  # noqa: ANN001
        await post(conn, f"put/s{i:06d}", i)

    phases = (
        ("put", put),
        ("put+post", put_post),
        ("put_body", put_body),
        ("first_post", first_post),
        ("post_again", post_again),
    )
    for name, work in phases if args.streams else ():
        cpu0, loop0, client0 = server.cpu(), loop_cpu(server.pid), time.process_time()
        elapsed = await run_clients(server.port, args.clients, range(args.streams), work)
        cpu, loop = server.cpu() - cpu0, loop_cpu(server.pid) - loop0
        client = time.process_time() - client0
        figures[name] = {
            "creates_per_s": round(args.streams / elapsed),
            "server_cpu_us_per_create": round(1e6 * cpu / args.streams),
            "loop_cpu_us_per_create": round(1e6 * loop / args.streams),
            "client_cpu_us_per_create": round(1e6 * client / args.streams),
        }
    if args.ensure:
        body = json.dumps(
            {
                "streams": [f"ensure/s{i:06d}" for i in range(args.ensure)],
                "content_type": "application/json",
            }
        ).encode()
        cpu0, loop0 = server.cpu(), loop_cpu(server.pid)
        started = time.perf_counter()
        status, text = await run_one(
            server.port, raw_request("POST", ENSURE, body, "application/json")
        )
        elapsed = time.perf_counter() - started
        cpu, loop = server.cpu() - cpu0, loop_cpu(server.pid) - loop0
        if status != 200:
            raise RuntimeError(f"ensure: HTTP {status}")
        figures["ensure"] = {
            "streams": args.ensure,
            "seconds": round(elapsed, 3),
            "creates_per_s": round(args.ensure / elapsed),
            "server_cpu_us_per_create": round(1e6 * cpu / args.ensure),
            "loop_cpu_us_per_create": round(1e6 * loop / args.ensure),
        }
        # The sink's next requests: each new stream's first data, an inline commit (10 rows) in one
        # bulk ``commits`` request (docs/extensions.md section 11), as a routed batch sends it; then
        # another to each (streams that have data: a later batch, or a second partition's part).
        paths = [f"ensure/s{i:06d}" for i in range(args.ensure)]
        for phase, key, seq in (("first_commits", "b0", 0), ("later_commits", "b1", 1)):
            cpu0, loop0 = server.cpu(), loop_cpu(server.pid)
            started = time.perf_counter()
            status, text = await run_one(
                server.port,
                raw_request("POST", COMMITS, inline_commits(paths, key, seq), "application/json"),
            )
            elapsed = time.perf_counter() - started
            cpu, loop = server.cpu() - cpu0, loop_cpu(server.pid) - loop0
            if status != 200:
                raise RuntimeError(f"commits: HTTP {status}")
            for i in (0, args.ensure - 1):  # the entries were committed (each answered on its own)
                status, tail = await run_one(server.port, raw_request("HEAD", f"ensure/s{i:06d}"))
                if status != 200 or tail == format_offset(0):
                    raise RuntimeError(f"commits: stream {i} has no data (HTTP {status}, {tail})")
            figures[phase] = {
                "streams": args.ensure,
                "seconds": round(elapsed, 3),
                "server_cpu_us_per_stream": round(1e6 * cpu / args.ensure),
                "loop_cpu_us_per_stream": round(1e6 * loop / args.ensure),
            }
    return figures


def inline_commits(paths: list[str], key: str, seq: int) -> bytes:
    """A bulk ``commits`` body giving each stream an inline commit of 10 rows under ``key``."""
    return encode_requests(
        [
            (
                path,
                {
                    "Content-Type": "application/json",
                    "Durastream-Commit-Key": key,
                    "Producer-Id": f"w{i}",
                    "Producer-Epoch": "0",
                    "Producer-Seq": str(seq),
                },
                json.dumps([{"i": i, "n": n} for n in range(10)]).encode(),
            )
            for i, path in enumerate(paths)
        ]
    )


def loop_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the server's main thread, which runs the event loop (Linux)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_one(port: int, raw: bytes) -> tuple[int, str]:
    from scale_bench import connect

    conn = await connect(port)
    try:
        return await conn.request(raw)
    finally:
        conn.transport.close()


async def run(args: argparse.Namespace) -> dict:
    results: dict = {"load_before": os.getloadavg(), "runs": []}
    servers = [
        (src, variant) for src in args.server_src or [None] for variant in args.variant or [""]
    ]
    order = [
        one for rep in range(args.repeat) for one in (servers if rep % 2 == 0 else servers[::-1])
    ]
    for src, variant in order:
        with tempfile.TemporaryDirectory(prefix="create-bench-") as workdir:
            server = ScaleServer(
                Path(workdir) / "data",
                src and str(Path(src).resolve()),
                ["--durability", args.durability, *shlex.split(variant)],
            )
            try:
                server.spawn()
                await asyncio.to_thread(server.wait_healthy)
                figures = await measure(server, args)
            finally:
                server.stop()
        figures["load"] = os.getloadavg()[0]
        name = f"{src or 'this checkout'} {variant}".strip()
        results["runs"].append({"server": name, **figures})
        print(name, json.dumps(figures), flush=True)
    results["load_after"] = os.getloadavg()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--server-src", action="append", help="checkout whose server to run (repeatable)"
    )
    parser.add_argument(
        "--streams", type=int, default=4000, help="streams per phase (put, put+post; 0: skip)"
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--ensure", type=int, default=2000, help="streams in the bulk ensure (0: skip)"
    )
    parser.add_argument(
        "--durability",
        choices=("fsync", "none"),
        default="fsync",
        help="the servers' --durability (none: the Python alone, no syncs)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the servers this many times, alternating"
    )
    parser.add_argument(
        "--variant",
        action="append",
        help="extra server arguments, one run of each server per --variant (repeatable; e.g. "
        "--variant '' --variant=--no-packed-appends; packed appends are the default)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
