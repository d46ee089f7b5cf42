"""The event loop's CPU of one create in the engine alone (no HTTP), for one or more checkouts.

For each ``--server-src`` (this checkout when none is given), in a fresh process on a fresh data
directory: ``--count`` creates through ``Engine.create`` (64 in flight, as a bulk ``ensure`` runs
them), on uvloop as the server runs, then the same paths again (existing streams). The figure is the loop thread's
CPU (``time.thread_time``) per create: the engine's Python (registry, header record, ``StreamLog``,
tasks and locks); the commit thread's system calls are not in it. Checkouts alternate ``--repeat``
times; compare them in the same run.

Run: ``python bench/engine_create_cpu.py --server-src /work/main --server-src . [--count 5000]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import asyncio, json, sys, tempfile, time
from pathlib import Path
from durastream_server.engine.engine import Engine
from durastream_server.engine.api import CreateRequest
from durastream_server.storage.datadir import DataDir, StorageConfig, Durability

COUNT, DURABILITY = int(sys.argv[1]), sys.argv[2]

async def main():
    figures = {}
    with tempfile.TemporaryDirectory(prefix="engine-create-") as root:
        config = StorageConfig(root=Path(root), durability=Durability(DURABILITY))
        data = await DataDir.open(config)
        engine = Engine(data, sweep_interval=0)
        await engine.start()
        try:
            for name in ("create", "create again"):
                queue = iter(range(COUNT))

                async def worker():
                    for i in queue:
                        await engine.create(CreateRequest(path=f"c/s{i:06d}", content_type="application/json"))

                t0, c0 = time.perf_counter(), time.thread_time()
                await asyncio.gather(*(worker() for _ in range(64)))
                cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
                figures[name] = {"loop_cpu_us": round(1e6 * cpu / COUNT, 1), "seconds": round(wall, 2)}
        finally:
            await engine.close()
            await data.close()
    print(json.dumps(figures))

import uvloop
uvloop.install()  # as the server runs
asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-src", action="append")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--durability", choices=("fsync", "none"), default="fsync")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sources = args.server_src or [str(Path(__file__).resolve().parents[1])]
    for rep in range(args.repeat):
        for src in sources if rep % 2 == 0 else sources[::-1]:
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve() / "server"))
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.count), args.durability],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            print(src, json.dumps(json.loads(out)), f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
