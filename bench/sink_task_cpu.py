"""The routed sink's task and driver work alone (no Spark): CPU per phase of one routed save.

What ``sink_fanout_bench.py`` times as a whole (a ``df.write`` routed to many streams), taken apart in
one process against a real server: ``--partitions`` task writes (``PartitionWrite.write_arrow`` of one
Arrow batch each, as Spark's Python worker gets it: ``id``, ``name``, ``pad``, ``stream`` columns,
``--rows`` rows in all routed to ``--streams`` streams, in batches of 10,000 rows as Spark sends them), then the driver's ``commit_batch`` of their
messages. Each round writes to new streams (``new``) and then the same rows to the same, now existing,
streams (``again``: what a daily job or a later micro-batch pays). Figures per phase: this process's
CPU (``time.process_time``), the server's CPU (``/proc``), and, from cProfile's cumulative times of
the task writes, the shares of the phases: encoding, the routing split, ``ensure`` requests, the
batcher and staging, and waits on the server. ``--profile`` prints the top of the task profile.

The tasks' worker-process memory of ensured targets (``sink/targets.py``) is cleared before each round
so ``new`` starts as a fresh Python worker would.

Run: ``python bench/sink_task_cpu.py [--rows 100000] [--streams 10000] [--partitions 2] [--rounds 3]``
Compare two checkouts with ``PYTHONPATH=<tree>:<tree>/server`` (alternate them).
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from listing_bench import server_cpu_seconds  # noqa: E402

SPARK_BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
# Functions whose cumulative time names a phase of the task's write (matched on "file:function").
PHASES = {
    "encode": ("encoding.py", "encode"),
    "split": ("routing.py", "_grouped"),
    "ensure": ("targets.py", "ensure_all"),
    "add (batcher, stage submit)": ("mode_writer.py", "add"),
    "finish (bulk stage, waits)": ("transactional.py", "finish"),
}


def batches(rows: int, streams: int, partitions: int, prefix: str) -> list:
    """One Arrow batch per partition, as ``spark.range(...).withColumn(...)`` gives the writer."""
    import pyarrow as pa

    out = []
    per = rows // partitions
    for part in range(partitions):
        ids = list(range(part * per, (part + 1) * per))
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "id": pa.array(ids, pa.int64()),
                    "name": pa.array([f"n{i}" for i in ids]),
                    "pad": pa.array(["x" * 60] * len(ids)),
                    "stream": pa.array([f"{prefix}/s{i % streams}" for i in ids]),
                }
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print the task profile's top")
    parser.add_argument("--no-profile", action="store_true", help="tasks without cProfile")
    parser.add_argument("--json", type=Path, help="write the rounds' figures here")
    args = parser.parse_args()

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    import durastream_spark
    from durastream_spark.sink import targets
    from durastream_spark.sink.commit import commit_batch
    from durastream_spark.sink.identity import TaskIdentity, new_job_id
    from durastream_spark.sink.partition import PartitionWrite
    from durastream_spark.sink.plan import BATCH, plan_write
    from durastream_spark.sink.transactional import TransactionalPartitionWriter
    from tests.support.server_process import ServerProcess

    finish_cpu = [0.0]
    finish = TransactionalPartitionWriter.finish

    def timed_finish(self: TransactionalPartitionWriter) -> tuple:
        start = time.process_time()
        try:
            return finish(self)
        finally:
            finish_cpu[0] += time.process_time() - start

    TransactionalPartitionWriter.finish = timed_finish  # type: ignore[method-assign]

    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("name", StringType()),
            StructField("pad", StringType()),
            StructField("stream", StringType()),
        ]
    )
    print(f"connector: {Path(durastream_spark.__file__).parent}", file=sys.stderr)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="sink-task-cpu-") as tmp:
        server = ServerProcess(Path(tmp) / "data")
        server.start()
        try:
            url = server.base_url + "/v1/stream"
            for _ in range(args.rounds):
                prefix = f"t{uuid.uuid4().hex[:6]}"
                data = batches(args.rows, args.streams, args.partitions, prefix)
                with targets._lock:  # a fresh worker process: nothing remembered
                    targets._queries.clear()
                figures = {}
                for name in ("new", "again"):
                    plan = plan_write({"url": url}, schema, False, kind=BATCH)
                    assert plan.job_id is not None
                    job = new_job_id()
                    profile = cProfile.Profile()
                    cpu0, srv0, wall0 = (
                        time.process_time(),
                        server_cpu_seconds(server.pid),
                        time.perf_counter(),
                    )
                    finish_cpu[0] = 0.0
                    if not args.no_profile:
                        profile.enable()
                    messages = [  # in Spark's Arrow batches (maxRecordsPerBatch, 10,000 rows)
                        PartitionWrite(plan, TaskIdentity(job, 0, part, 0)).write_arrow(
                            batch.slice(first, SPARK_BATCH_ROWS)
                            for first in range(0, batch.num_rows, SPARK_BATCH_ROWS)
                        )
                        for part, batch in enumerate(data)
                    ]
                    profile.disable()
                    cpu1, srv1, wall1 = (
                        time.process_time(),
                        server_cpu_seconds(server.pid),
                        time.perf_counter(),
                    )
                    commit_batch(plan.client, plan.options, messages, batch_id=None)
                    cpu2, srv2, wall2 = (
                        time.process_time(),
                        server_cpu_seconds(server.pid),
                        time.perf_counter(),
                    )
                    shares = {}
                    stats = None if args.no_profile else pstats.Stats(profile)
                    for phase, (file, function) in PHASES.items() if stats else ():
                        cumulative = sum(
                            row[3]
                            for (path, _, func), row in stats.stats.items()  # type: ignore[attr-defined]
                            if path.endswith(file) and func == function
                        )
                        shares[phase] = round(cumulative, 3)
                    figures[name] = {
                        "tasks_wall_s": round(wall1 - wall0, 3),
                        "tasks_cpu_s": round(cpu1 - cpu0, 3),
                        "tasks_server_cpu_s": round(srv1 - srv0, 3),
                        "finish_cpu_s": round(finish_cpu[0], 3),
                        "commit_wall_s": round(wall2 - wall1, 3),
                        "commit_cpu_s": round(cpu2 - cpu1, 3),
                        "commit_server_cpu_s": round(srv2 - srv1, 3),
                        "task_phases_cum_s (profiled)": shares,
                    }
                    if args.profile and stats:
                        print(f"--- {name}: task profile", file=sys.stderr)
                        stats.sort_stats("tottime").print_stats(25)
                rounds.append(figures)
                print(json.dumps(figures), flush=True)
        finally:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
