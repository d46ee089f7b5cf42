"""Many small streams, the sink side (issue 16): ``df.write`` routing rows to many streams vs one stream.

The job: ``--rows`` rows (default 40,000) of ~100 B JSON each, in two partitions (``local[2]``), written
by ``df.write.format("durastream")`` in transactional mode (the default on durastream-server):

- ``one``: every row to one stream (the ``stream`` option);
- ``fan``: a ``stream`` column routes them to ``--streams`` streams (default 2,000, so 20 rows each);
  every target is new, so the sink creates it, as a job writing per-entity streams for a new day would.

Each is run with two connectors in the same run, against the same server (this branch's, fsync
durability, its default): ``branch`` (this checkout: ``bulk-write`` ensures, stages and commits) and
``base``, the connector of ``--base-ref`` (default ``merge16``, main before this work: a ``HEAD``, a
``PUT``, a stage and a commit per stream and partition), extracted with ``git archive`` and put first
on ``PYTHONPATH`` of a child process (Spark's Python workers inherit it). Rounds alternate the two.

Figures per run: wall seconds of ``save()`` and the server's CPU seconds during it (``/proc``; wall time
on this shared machine is noisy, CPU much less). Ratios: ``fan / one`` per connector (target <= 2x wall,
<= 3x server CPU) and ``base / branch`` for ``fan``. Each ``fan`` run is checked: every stream holds its
rows exactly once.

Run: ``python bench/sink_fanout_bench.py [--rows 40000] [--streams 2000] [--rounds 2] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import charts  # noqa: E402
from listing_bench import server_cpu_seconds  # noqa: E402

CODE_VARIABLE = "DURASTREAM_BENCH_CODE"  # a child runs the connector found there (the base)


def child(args: argparse.Namespace) -> None:
    """One connector's runs (``one`` then ``fan``) in this process; prints one JSON line."""
    if os.environ.get(CODE_VARIABLE):  # ahead of this checkout (the imports above put it first)
        sys.path.insert(0, os.environ[CODE_VARIABLE])
        for name in [n for n in sys.modules if n.split(".")[0] == "durastream_spark"]:
            del sys.modules[name]
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import durastream_spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.dataSource.register(durastream_spark.DurableStreamDataSource)
    rows = (
        spark.range(0, args.rows, numPartitions=2)
        .withColumn("name", F.concat(F.lit("n"), F.col("id").cast("string")))
        .withColumn("pad", F.lit("x" * 60))
    )
    rows.cache().count()

    def save(df, **options: str) -> tuple[float, float]:
        cpu = server_cpu_seconds(args.server_pid)
        started = time.perf_counter()
        df.write.format("durastream").option("url", args.url).options(**options).mode(
            "append"
        ).save()
        return time.perf_counter() - started, server_cpu_seconds(args.server_pid) - cpu

    save(rows.limit(200), stream=f"warm/{uuid.uuid4().hex[:8]}")  # Python workers, first requests
    out: dict[str, object] = {"code": str(Path(durastream_spark.__file__).parent.parent)}
    out["one"] = save(rows, stream=f"one/{uuid.uuid4().hex[:8]}")
    prefix = f"fan/{uuid.uuid4().hex[:8]}"
    routed = rows.withColumn(
        "stream", F.concat(F.lit(prefix + "/s"), (F.col("id") % args.streams).cast("string"))
    )
    out["fan"] = save(routed)
    out["prefix"] = prefix
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


def check(url: str, prefix: str, streams: int, rows: int) -> None:
    """Every routed stream holds its rows exactly once."""
    from durastream_spark.options import ConnectionOptions
    from durastream_spark.protocol.client import StreamClient

    client = StreamClient(ConnectionOptions.parse({"url": url}))
    for s in range(0, streams, max(1, streams // 50)):  # a sample of 50 streams, every one checked
        chunk = client.read(f"{prefix}/s{s}", "-1")
        ids = sorted(m["id"] for m in json.loads(chunk.body))
        assert ids == list(range(s, rows, streams)), f"{prefix}/s{s}: {len(ids)} rows"


def run_child(args: argparse.Namespace, url: str, pid: int, code: Path | None) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    if code is not None:
        # This process's sys.path (CODE_VARIABLE) and the Python workers' (PYTHONPATH, ahead of the
        # editable install's finder); the workers start in the child's directory, not this checkout.
        env[CODE_VARIABLE] = str(code)
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")])
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--url",
        url,
        "--server-pid",
        str(pid),
        "--rows",
        str(args.rows),
        "--streams",
        str(args.streams),
    ]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, cwd=code or REPO
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit(f"child failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--streams", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base-ref", default="merge16")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--url")
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--replot", type=Path, help="record the chart of a saved --json run")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.replot:
        charts.record("sink_fanout", figures(json.loads(args.replot.read_text())["summary"]))
        return

    from tests.support.server_process import ServerProcess

    with tempfile.TemporaryDirectory(prefix="sink-fanout-") as tmp:
        base_code = Path(tmp) / "base"
        base_code.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.base_ref, "durastream_spark"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base_code)], input=archive, check=True)
        server = ServerProcess(Path(tmp) / "data")
        server.start()
        url = server.base_url + "/v1/stream"
        runs: dict[str, list[dict]] = {"branch": [], "base": []}
        try:
            for round_ in range(args.rounds):
                order = ("base", "branch") if round_ % 2 == 0 else ("branch", "base")
                for name in order:
                    result = run_child(args, url, server.pid, base_code if name == "base" else None)
                    check(url, result["prefix"], args.streams, args.rows)
                    runs[name].append(result)
                    print(name, json.dumps(result), flush=True)
        finally:
            server.stop()
    load = os.getloadavg()
    summary = {"rows": args.rows, "streams": args.streams, "load": [round(x, 2) for x in load]}
    for name, results in runs.items():
        one_wall = statistics.median(r["one"][0] for r in results)
        one_cpu = statistics.median(r["one"][1] for r in results)
        fan_wall = statistics.median(r["fan"][0] for r in results)
        fan_cpu = statistics.median(r["fan"][1] for r in results)
        summary[name] = {
            "one_s": round(one_wall, 2),
            "one_server_cpu_s": round(one_cpu, 2),
            "fan_s": round(fan_wall, 2),
            "fan_server_cpu_s": round(fan_cpu, 2),
            "fan_over_one_wall": round(fan_wall / one_wall, 2),
            "fan_over_one_cpu": round(fan_cpu / max(one_cpu, 0.01), 2),
        }
    summary["fan_base_over_branch_wall"] = round(
        summary["base"]["fan_s"] / summary["branch"]["fan_s"], 2
    )
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))
    full = args.rows == 40_000 and args.streams == 2_000 and args.rounds >= 2
    charts.record("sink_fanout", figures(summary), full=full)


def figures(summary: dict) -> dict:
    """The chart of docs/benchmarks.md: both connectors, one stream and routed, in one run."""
    ours, base = "bulk-write (this branch)", "main's connector (per-stream requests)"
    streams, rows = summary["streams"], summary["rows"]
    groups = {"one stream": "one", f"{streams:,} streams x {rows // streams}": "fan"}

    def panel(title: str, suffix: str) -> dict:
        return {
            "title": title,
            "unit": "s",
            "higher_is_better": False,
            "ours": [ours],
            "baselines": [base],
            "groups": [
                {
                    "label": label,
                    "values": {
                        ours: summary["branch"][key + suffix],
                        base: summary["base"][key + suffix],
                    },
                }
                for label, key in groups.items()
            ],
        }

    return {
        "title": f"df.write of {rows:,} rows: routed to {streams:,} streams vs one stream "
        f"(load {summary['load'][0]})",
        "panels": [
            panel("wall time of save()", "_s"),
            panel("server CPU during save()", "_server_cpu_s"),
        ],
    }


if __name__ == "__main__":
    main()
