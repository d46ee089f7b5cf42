"""The hand-over of a routed save (issue 16, Run 18c): from the last task's end to ``commit()``'s start.

A routed task's small streams commit inline: their rows travel to the driver inside the task's
commit message. This script measures what that hand-over costs and whether it follows the inline
bytes: ``df.write`` of ``--rows`` rows to ``--streams`` existing streams (``--partitions`` tasks), the
rows padded by each ``--pads`` width in turn (so more or fewer inline bytes per task), alternating
with a one-stream save of the same rows, ``--rounds`` times. Per save, from the phase stamps
(``bench/phase_hook``, with ``DURASTREAM_PHASE_PICKLES``): each task's commit message pickled (size,
time), the commit worker's fork from Spark's daemon, its unpickling of the writer and the messages,
and ``commit start``; from Spark's status API each write task's ``resultSize``,
``gettingResultTime`` (the driver fetching an indirect result from the block manager) and
``resultSerializationTime``.

Run: ``PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python bench/sink_handover.py [--pads 0,60,200]
[--rounds 3] [--max-direct BYTES] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from sink_fanout_bench import phase_split  # noqa: E402


def stage_tasks(spark) -> list[dict]:
    """The last completed stage's tasks: result size and Spark's result times (ms)."""
    sc = spark.sparkContext
    port = sc.uiWebUrl.rsplit(":", 1)[1]
    base = f"http://127.0.0.1:{port}/api/v1/applications/{sc.applicationId}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base}/stages?status=complete", timeout=30) as answer:
        stage = max(json.load(answer), key=lambda s: s["stageId"])
    url = f"{base}/stages/{stage['stageId']}/{stage['attemptId']}/taskList"
    with opener.open(url, timeout=30) as answer:
        tasks = json.load(answer)
    return [
        {
            "result_bytes": t["taskMetrics"]["resultSize"],
            "getting_result_ms": t.get("gettingResultTime", 0),
            "result_serialization_ms": t["taskMetrics"]["resultSerializationTime"],
            "scheduler_delay_ms": t.get("schedulerDelay", 0),
        }
        for t in tasks
    ]


def hand_over(stamps: list[list]) -> dict[str, object]:
    """The stamps between the last task's end and ``commit start``, relative to the task's end."""
    ends = [at for at, message in stamps if message.startswith("task ") and message.endswith("end")]
    starts = [at for at, message in stamps if message == "commit start"]
    if not ends or not starts:
        return {}
    end, commit = max(ends), starts[0]
    out: dict[str, object] = {"gap_s": round(commit - end, 3)}
    out["dumps"] = [
        (int(m.split()[2]), round(float(m.split()[3]), 4))
        for at, m in stamps
        if m.startswith("pickle dumps") and at >= min(ends) - 0.5
    ]
    between = [(at, m) for at, m in stamps if end <= at <= commit]
    forks = [at for at, m in between if m == "worker forked"]
    loads = [(at, m) for at, m in between if m.startswith("pickle loads")]
    if forks:
        out["fork_at"] = round(forks[-1] - end, 3)
    out["loads"] = [
        (round(at - end, 3), int(m.split()[2]), round(float(m.split()[3]), 4)) for at, m in loads
    ]
    return out


def summarize(results: dict[str, list[dict]]) -> dict[str, dict]:
    """Per save kind, medians (and ranges) over its runs: the gap, its part before the commit worker
    read the writer (the tasks' pickling and Spark's JVM side), the tasks' pickling (the slower task),
    the commit worker's unpickling of the messages, and the task results' sizes."""

    def spread(values: list[float]) -> list[float]:
        values = sorted(values)
        return [round(statistics.median(values), 3), values[0], values[-1]] if values else []

    summary: dict[str, dict] = {}
    for name, runs in results.items():
        overs = [r["hand_over"] for r in runs if r["hand_over"].get("loads")]
        summary[name] = {
            "runs": len(runs),
            "wall_s": spread([r["wall_s"] for r in runs]),
            "gap_s": spread([h["gap_s"] for h in overs]),
            "to_writer_read_s": spread([h["loads"][0][0] for h in overs]),
            "task_pickle_s": spread([max((d[1] for d in h["dumps"]), default=0.0) for h in overs]),
            "messages_unpickle_s": spread([sum(x[2] for x in h["loads"][1:]) for h in overs]),
            "getting_result_ms": spread(
                [max(t["getting_result_ms"] for t in r["tasks"]) for r in runs]
            ),
            "result_bytes": runs[-1]["tasks"] and [t["result_bytes"] for t in runs[-1]["tasks"]],
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--pads", default="0,60,200")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-direct", help="spark.task.maxDirectResultSize (default Spark's 1m)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--summarize", type=Path, help="print the summary of a saved --json run")
    args = parser.parse_args()
    if args.summarize:
        runs = json.loads(args.summarize.read_text())["runs"]
        print(json.dumps(summarize(runs), indent=1))
        return

    from tests.support.server_process import ServerProcess

    log = Path(tempfile.mkdtemp(prefix="sink-handover-")) / "phases.log"
    os.environ["DURASTREAM_PHASE_LOG"] = str(log)
    os.environ["DURASTREAM_PHASE_PICKLES"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "phase_hook"), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    )
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import durastream_spark

    builder = (
        SparkSession.builder.master(f"local[{args.partitions}]")
        .config("spark.ui.port", "0")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if args.max_direct:
        builder = builder.config("spark.task.maxDirectResultSize", args.max_direct)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="sink-handover-data-") as tmp:
        server = ServerProcess(Path(tmp) / "data").start()
        spark = builder.getOrCreate()
        try:
            spark.dataSource.register(durastream_spark.DurableStreamDataSource)
            url = server.base_url + "/v1/stream"
            prefix = f"fan/{uuid.uuid4().hex[:8]}"
            frames = {}
            for pad in [int(p) for p in args.pads.split(",")]:
                rows = (
                    spark.range(0, args.rows, numPartitions=args.partitions)
                    .withColumn("name", F.concat(F.lit("n"), F.col("id").cast("string")))
                    .withColumn("pad", F.lit("x" * pad))
                )
                rows.cache().count()
                routed = rows.withColumn(
                    "stream",
                    F.concat(F.lit(prefix + "/s"), (F.col("id") % args.streams).cast("string")),
                )
                frames[pad] = (rows, routed)

            def save(df, **options: str) -> dict:
                started, started_at = time.perf_counter(), time.time()
                df.write.format("durastream").option("url", url).options(**options).mode(
                    "append"
                ).save()
                wall = time.perf_counter() - started
                time.sleep(0.3)  # the workers' last stamps reach the file
                split = phase_split(log, started_at, time.time())
                stamps = split.pop("stamps", [])
                return {
                    "wall_s": round(wall, 3),
                    "tasks": stage_tasks(spark),
                    "hand_over": hand_over(stamps),
                    "phases": split,
                }

            rows0, routed0 = frames[min(frames)]
            save(routed0)  # creates the streams; warms workers and server
            save(rows0, stream=f"one/{uuid.uuid4().hex[:8]}")
            for round_ in range(args.rounds):
                pads = list(frames) if round_ % 2 == 0 else list(frames)[::-1]
                for pad in pads:
                    rows, routed = frames[pad]
                    one = save(rows, stream=f"one/{uuid.uuid4().hex[:8]}")
                    fan = save(routed)
                    for name, figures in ((f"one pad {pad}", one), (f"fan pad {pad}", fan)):
                        results.setdefault(name, []).append(figures)
                        print(name, json.dumps(figures), flush=True)
        finally:
            spark.stop()
            server.stop()
    summary = summarize(results)
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "runs": results, "load": os.getloadavg()}, indent=2)
        )


if __name__ == "__main__":
    main()
