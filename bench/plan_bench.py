"""Driver planning of ``spark.read`` with ``pattern`` over many small streams (issue 16), two connector
trees against one server, alternating: how long ``DurableStreamBatchReader.partitions()`` takes (the
listing, sizing and packing; no Spark, no task reads), and the server's CPU while it ran.

    .venv/bin/python bench/plan_bench.py --dir /tmp/plan-bench --trees /work/main . --rounds 5
    .venv/bin/python bench/plan_bench.py --dir /tmp/plan-bench --trees . --profile   # cProfile, this tree

Each measurement runs in a child process with the tree first on ``sys.path`` (``--trees``: connector
checkouts; the server is this tree's), so the two trees' code never mixes. The data directory is made
once (``--small`` streams of ``--per-stream`` JSON messages under ``ten/``, as ``fanout_bench.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fanout_bench import populate  # noqa: E402
from listing_bench import server_cpu_seconds  # noqa: E402

from tests.support import server_process  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402

CHILD = r"""
import cProfile, json, pstats, sys, time
tree, url, repeats, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
sys.path.insert(0, tree)
from durastream_spark.source import batch_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
import durastream_spark
assert durastream_spark.__file__.startswith(tree), durastream_spark.__file__
times, tasks = [], 0
reader = batch_reader({"url": url, "pattern": "ten/*"}, DEFAULT_SCHEMA)
reader.partitions()  # warm: imports, connection, extension discovery
profiler = cProfile.Profile() if profile else None
for _ in range(repeats):
    reader = batch_reader({"url": url, "pattern": "ten/*"}, DEFAULT_SCHEMA)
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    tasks = len(reader.partitions())
    if profiler:
        profiler.disable()
    times.append(time.perf_counter() - started)
if profiler:
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(45)
print(json.dumps({"times": times, "tasks": tasks}))
"""


def measure(
    tree: Path, url: str, repeats: int, pid: int, profile: bool
) -> tuple[list[float], int, float]:
    cpu = server_cpu_seconds(pid)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), url, str(repeats), "1" if profile else "0"],
        check=True,
        capture_output=True,
        text=True,
    )
    cpu = server_cpu_seconds(pid) - cpu
    if profile:
        print(done.stderr)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return found["times"], found["tasks"], cpu / (repeats + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="data directory (made on the first run)")
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--per-stream", type=int, default=10)
    parser.add_argument("--trees", nargs="+", default=["."], help="connector checkouts to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="plannings per child process")
    parser.add_argument("--profile", action="store_true", help="print cProfile of the planning")
    args = parser.parse_args()
    data_dir = Path(args.dir) / "data"
    if not (data_dir / "streams").exists():
        started = time.perf_counter()
        asyncio.run(populate(data_dir, 0, args.small, args.per_stream))
        print(f"created the streams via the engine in {time.perf_counter() - started:.0f} s")
    server_process.STARTUP_TIMEOUT_SECONDS = 900.0
    server = ServerProcess(data_dir, extra_args=("--durability", "none"))
    server.start()
    url = server.base_url + "/v1/stream"
    trees = [Path(tree).resolve() for tree in args.trees]
    found: dict[Path, list[float]] = {tree: [] for tree in trees}
    cpus: dict[Path, list[float]] = {tree: [] for tree in trees}
    try:
        for round_ in range(args.rounds):
            for tree in trees if round_ % 2 == 0 else reversed(trees):
                times, tasks, cpu = measure(tree, url, args.repeats, server.pid, args.profile)
                found[tree] += times
                cpus[tree].append(cpu)
                print(
                    f"round {round_} {tree}: {tasks} tasks, planning "
                    + ", ".join(f"{t:.3f}" for t in times)
                    + f" s; server CPU {cpu:.3f} s a planning; load {os.getloadavg()[0]:.1f}"
                )
    finally:
        server.stop()
    print("\n| tree | plannings | min s | median s | server CPU s a planning (median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for tree in trees:
        times = found[tree]
        print(
            f"| {tree} | {len(times)} | {min(times):.3f} | {statistics.median(times):.3f} | "
            f"{statistics.median(cpus[tree]):.3f} |"
        )
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
