"""The batch read of many small streams at the reader API (no Spark), split by phase and process:
the driver's planning (``partitions()``: the listing pages and the packing) and the packed task's read,
each with its wall time, this process's CPU and the server's CPU, and how much of the read the task
spent waiting for multi-range answers (issue 16).

The Spark job adds its fixed cost around these (``read_breakdown.py`` splits the whole job); this script
says whether the read is the server's work or the client's: when the waits are most of the read and the
server's CPU is most of the waits, the task is waiting for the server, and sending it more requests at
once only makes them queue (docs/benchmarks.md, Run 15).

    .venv/bin/python bench/read_split.py --dir /tmp/fan --rounds 4            # this tree
    DURASTREAM_TREE=/work/main /work/main/.venv/bin/python bench/read_split.py --dir /tmp/fan
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# DURASTREAM_TREE: measure another checkout (its connector, its server, with its own venv's python).
REPO = Path(os.environ.get("DURASTREAM_TREE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from listing_bench import server_cpu_seconds  # noqa: E402

from durastream_spark.protocol.client import StreamClient  # noqa: E402
from durastream_spark.source import batch_reader  # noqa: E402
from durastream_spark.source.arrow import DEFAULT_SCHEMA  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="data directory root of fanout_bench.py")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds (after one warm-up)")
    parser.add_argument("--pattern", default="ten/*")
    args = parser.parse_args()

    waits: list[float] = []
    unwrapped = StreamClient.read_ranges

    def timed(self: StreamClient, ranges, format="frames"):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return unwrapped(self, ranges, format)
        finally:
            waits.append(time.perf_counter() - started)

    StreamClient.read_ranges = timed  # type: ignore[method-assign]
    server = ServerProcess(Path(args.dir) / "data", extra_args=("--durability", "none"))
    server.start()
    rows: dict[str, list[float]] = {}
    try:
        url = server.base_url + "/v1/stream"
        print(f"tree: {REPO}; load before: {os.getloadavg()}")
        for round_ in range(args.rounds + 1):
            waits.clear()
            reader = batch_reader({"url": url, "pattern": args.pattern}, DEFAULT_SCHEMA)
            marks = [(time.perf_counter(), time.process_time(), server_cpu_seconds(server.pid))]
            tasks = reader.partitions()
            marks.append((time.perf_counter(), time.process_time(), server_cpu_seconds(server.pid)))
            count = sum(batch.num_rows for task in tasks for batch in reader.read(task))
            marks.append((time.perf_counter(), time.process_time(), server_cpu_seconds(server.pid)))
            (w0, c0, s0), (w1, c1, s1), (w2, c2, s2) = marks
            figures = {
                "plan: wall": w1 - w0,
                "plan: client CPU": c1 - c0,
                "plan: server CPU": s1 - s0,
                "read: wall": w2 - w1,
                "read: client CPU": c2 - c1,
                "read: server CPU": s2 - s1,
                "read: waiting for multi-range answers": sum(waits),
            }
            print(
                f"round {round_}{' (warm-up)' if not round_ else ''}: {count} rows, "
                f"{len(tasks)} task(s), {len(waits)} multi-range request(s); "
                + ", ".join(f"{k} {v:.3f}" for k, v in figures.items())
            )
            if round_:
                for key, value in figures.items():
                    rows.setdefault(key, []).append(value)
        print(f"\n| figure, median of {args.rounds} (s) | value |\n| --- | ---: |")
        for key, values in rows.items():
            print(f"| {key} | {statistics.median(values):.3f} |")
        print(f"load after: {os.getloadavg()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
