"""Where the event loop's CPU of a create goes: the real server under ``cProfile``, driven like
``create_bench.py`` (``PUT`` alone, ``PUT`` + ``POST``, one bulk ``ensure``, or ``sink``: that ensure
then a bulk ``commits`` of each new stream's first data).

``cProfile`` profiles the thread that enables it, which is the server's main thread, the event loop's
(uvicorn, the app, the engine); the commit thread and the I/O threads are not in the profile. Its
overhead inflates every call (about 2x here), so read the figures as shares and relative costs, and take
absolute CPU per create from ``create_bench.py``.

Run: ``python bench/create_profile.py put|putpost|ensure|sink [--count 3000] [--durability none|fsync]
[--top 40] [--sort tottime|cumulative]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from create_bench import COMMITS, ENSURE, inline_commits, run_one  # noqa: E402
from scale_bench import ScaleServer, raw_request, run_clients  # noqa: E402


async def drive(server: ScaleServer, args: argparse.Namespace) -> float:
    async def put(conn, i: int) -> None:  # noqa: ANN001
        status, _ = await conn.request(
            raw_request("PUT", f"p/s{i:06d}", content_type="application/json")
        )
        assert status == 201, status

    async def put_post(conn, i: int) -> None:  # noqa: ANN001
        await put(conn, i)
        body = b'{"i":%d,"pad":"0123456789abcdef"}' % i
        status, _ = await conn.request(raw_request("POST", f"p/s{i:06d}", body, "application/json"))
        assert status in (200, 204), status

    if args.workload in ("ensure", "sink"):
        body = json.dumps(
            {
                "streams": [f"e/s{i:06d}" for i in range(args.count)],
                "content_type": "application/json",
            }
        ).encode()
        started = time.perf_counter()
        status, text = await run_one(
            server.port, raw_request("POST", ENSURE, body, "application/json")
        )
        assert status == 200, (status, text[:200])
        if args.workload == "sink":  # then each new stream's first data, as create_bench does
            body = inline_commits([f"e/s{i:06d}" for i in range(args.count)], "profile", 0)
            status, _ = await run_one(
                server.port, raw_request("POST", COMMITS, body, "application/json")
            )
            assert status == 200, status
        return time.perf_counter() - started
    work = put if args.workload == "put" else put_post
    return await run_clients(server.port, args.clients, range(args.count), work)


def spawn_under(server: ScaleServer, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Spawn ``server`` as ``sys.executable *argv SERVER-ARGS`` (with ``env`` added) instead of
    ``sys.executable -m durastream_server SERVER-ARGS``: under a profiler or a wrapper script."""
    real, popen = sys.executable, subprocess.Popen

    def wrapped(cmd, *a, **k):  # noqa: ANN001, ANN002, ANN003
        if cmd[:3] == [real, "-m", "durastream_server"]:
            cmd = [real, *argv, *cmd[3:]]
            if env:
                k["env"] = {**k.get("env", os.environ), **env}
        return popen(cmd, *a, **k)

    subprocess.Popen = wrapped  # type: ignore[misc]
    try:
        server.spawn()
    finally:
        subprocess.Popen = popen  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=("put", "putpost", "ensure", "sink"))
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--durability", choices=("fsync", "none"), default="none")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--stats", type=Path, help="keep the cProfile stats file here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="create-profile-") as workdir:
        stats = args.stats or Path(workdir) / "server.prof"
        server = ScaleServer(Path(workdir) / "data", None, ["--durability", args.durability])
        spawn_under(server, ["-m", "cProfile", "-o", str(stats), "-m", "durastream_server"])
        try:
            server.wait_healthy()
            elapsed = asyncio.run(drive(server, args))
        finally:
            server.stop()
        print(f"{args.workload}: {args.count} in {elapsed:.2f} s (profiled)")
        report = pstats.Stats(str(stats))
        report.sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
