"""The routed sink's driver commit alone (no Spark): client CPU and server CPU of ``commit_batch``.

A batch of ``--partitions`` commit messages, each with one inline part per stream of ``--streams`` new
streams (ensured first, outside the timing), committed by ``sink.commit.commit_batch`` against a real
server: the driver's Python CPU (``time.process_time`` of this process, which builds the bulk bodies
and parses the answers) and the server's (``/proc``), per part. ``--profile`` prints the driver's
cProfile; ``--spy DIR`` records the server's stacks (py-spy, raw) during each run's commit. Compares nothing by itself: run it against two checkouts (``PYTHONPATH``) and alternate.

Run: ``python bench/sink_commit_cpu.py [--streams 10000] [--partitions 2] [--repeat 3] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from listing_bench import server_cpu_seconds  # noqa: E402
from sink_fanout_bench import spying  # noqa: E402


def inline_messages(streams: list[str], body: bytes, rows: int, partitions: int) -> list[Any]:
    """One transactional batch's commit messages, one a partition, each with ``body`` as the inline
    part of every stream (as a routed task hands its small parts to the driver)."""
    from durastream_spark.sink.messages import SinkCommitMessage, StreamPart

    writer = uuid.uuid4().hex[:8]
    return [
        SinkCommitMessage(
            mode="transactional",
            writer_key=writer,
            epoch=0,
            partition=p,
            attempt=0,
            producer_id=f"durastream-spark-{writer}-{p}",
            parts=tuple(StreamPart(s, rows, len(body), 0, inline=body) for s in streams),
        )
        for p in range(partitions)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=10, help="rows of ~100 B per part")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--server-args", default="", help="extra server arguments")
    parser.add_argument(
        "--spy", type=Path, help="py-spy the server during each commit (not timed: it slows it)"
    )
    args = parser.parse_args()

    from durastream_spark.protocol.bulk import BulkWrites
    from durastream_spark.protocol.client import StreamClient
    from durastream_spark.sink.commit import commit_batch
    from durastream_spark.sink.options import SinkOptions
    from tests.support.server_process import ServerProcess

    with tempfile.TemporaryDirectory(prefix="sink-commit-cpu-") as tmp:
        server = ServerProcess(Path(tmp) / "data", extra_args=args.server_args.split())
        server.start()
        try:
            url = server.base_url + "/v1/stream"
            options = SinkOptions.parse({"url": url, "contentType": "application/json"})
            client = StreamClient(options.connection)
            out = []
            for run in range(args.repeat):
                prefix = f"c{uuid.uuid4().hex[:6]}"
                streams = [f"{prefix}/s{i}" for i in range(args.streams)]
                BulkWrites(client, "application/json").ensure(streams, create=True)
                body = (
                    b"["
                    + b",".join([b'{"id":1,"name":"n1","pad":"' + b"x" * 70 + b'"}'] * args.rows)
                    + b"]"
                )
                messages = inline_messages(streams, body, args.rows, args.partitions)
                cpu0, srv0, wall0 = (
                    time.process_time(),
                    server_cpu_seconds(server.pid),
                    time.perf_counter(),
                )
                profiler = cProfile.Profile() if args.profile and run == args.repeat - 1 else None
                if profiler:
                    profiler.enable()
                with spying(args.spy, {"server": server.pid}):
                    commit_batch(client, options, messages, batch_id=None)
                if profiler:
                    profiler.disable()
                wall = time.perf_counter() - wall0
                cpu = time.process_time() - cpu0
                srv = server_cpu_seconds(server.pid) - srv0
                parts = args.streams * args.partitions
                row = {
                    "wall_s": round(wall, 3),
                    "client_cpu_s": round(cpu, 3),
                    "server_cpu_s": round(srv, 3),
                    "client_us_part": round(1e6 * cpu / parts, 1),
                    "server_us_part": round(1e6 * srv / parts, 1),
                }
                out.append(row)
                print(json.dumps(row), flush=True)
                if profiler:
                    pstats.Stats(profiler).sort_stats("cumulative").print_stats(35)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
