"""Benchmark the durastream sink against Spark's JSON file sink and a naive foreachBatch + requests writer.

All writers get the same streaming input: one ``rate-micro-batch`` micro-batch of ``--rows`` rows in two
partitions, each row rendered as a ~1 KiB JSON object (``{"id": <long>, "payload": "<1000 chars>"}``), run
with ``trigger(availableNow=True)``. The figure is rows per second of wall time from ``start()`` to the
query's termination, so it includes what a user waits for: planning, the tasks and the commit.

Writers:

- ``durastream (transactional)`` / ``durastream (ordered)``: this sink against durastream-server (fsync
  durability, its default) on 127.0.0.1, both exactly-once modes;
- ``spark json file sink``: ``format("json")`` to a local directory, the practical upper bound;
- ``naive foreachBatch``: what a user would write without the sink: ``foreachBatch`` collecting
  ``toJSON()`` on the driver and POSTing JSON arrays of 1,000 rows with one ``requests.Session`` (plain
  appends: no idempotence, no retries, at-most-once on failure).

Each run also reports the CPU seconds of every process involved (this one, Spark's JVM and Python workers,
the server; from /proc), which a loaded machine inflates far less than wall time.

Each writer runs once to warm up (same input size), then ``--rounds`` times in alternation (who goes first
rotates by round). Before every run dirty pages are written back (``_settle``), so no writer pays for
the file sink's deferred writeback. This machine is shared and
noisy, so the headline ratios are the *median of the per-round ratios* (writers of one round
ran within seconds of each other), and the best round of each writer is shown beside them. The durastream
rounds are checked: the stream must hold exactly ``--rows`` messages afterwards. Every writer's output is
deleted after its run (the file sink's directory, the streams), so each run starts from the same state.

Run: ``python bench/sink_bench.py [--rows 200000] [--rounds 2] [--json FILE]``. Targets (issue 4): at least 3x
the naive writer, and at least 50% of the file sink.

``--value-column`` gives the durastream writers the same rows as a ready-made JSON ``value`` column
(``to_json(struct(id, payload))``, rendered by the JVM), which the sink writes as-is after checking that
each value is one JSON text (issue 15); ``--writers durastream`` runs only the writers whose name starts
with it. Such runs are variants: they never replace the recorded figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
PAYLOAD = "p" * 1000
NAIVE_ROWS_PER_POST = 1000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """durastream-server in a child process on a temporary data directory."""

    def __init__(self, root: Path) -> None:
        self.port = _free_port()
        self.data = root / "server-data"
        self.log = root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def stream_root(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/stream"

    def start(self) -> Server:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durastream_server",
                    "--data-dir",
                    str(self.data),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "WARNING",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"durastream-server did not start:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)


def _spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("durastream-sink-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DurableStreamDataSource)
    return spark


def _input(spark, rows: int, *, value_column: bool = False):
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", 2)
        .load()
        .select(F.col("value").alias("id"), F.lit(PAYLOAD).alias("payload"))
    )
    if value_column:
        df = df.select(F.to_json(F.struct("id", "payload")).alias("value"))
    return df


def _settle() -> None:
    """Write back dirty pages before the next run's clock starts.

    The file sink never fsyncs: it leaves its 300 MB in the page cache, and the kernel writes them back
    during whatever runs next, which then pays for them. The other writers fsync what they write. (A
    JVM garbage collection here as well was tried and left out: after a full collection the JVM gives
    memory back and has to fault it in again, which slowed the JVM-heavy writers by 20-40% on this
    machine.)
    """
    os.sync()


def _tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and every live descendant (Spark's JVM, its Python
    workers' daemon, the server), including what they spent in children they reaped (the daemon reaps
    each Python worker). Linux /proc only; 0 elsewhere."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    ours = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in ours and pid not in ours:
                ours.add(pid)
                grew = True
    return sum(times.get(pid, 0) for pid in ours) / ticks


CPU_SECONDS: dict[str, list[float]] = {}  # writer -> CPU seconds of each measured run


def _timed(start_query: Callable[[], object]) -> float:
    began = time.perf_counter()
    query = start_query()
    query.awaitTermination()  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - began
    if query.exception() is not None:  # type: ignore[attr-defined]
        raise RuntimeError(f"query failed: {query.exception()}")  # type: ignore[attr-defined]
    return elapsed


def run_durastream(
    spark, server: Server, work: Path, rows: int, mode: str, *, value_column: bool = False
) -> float:
    from durastream_spark.options import ConnectionOptions
    from durastream_spark.protocol.client import StreamClient

    stream = f"bench/sink-{mode}-{uuid.uuid4().hex[:8]}"
    elapsed = _timed(
        lambda: (
            _input(spark, rows, value_column=value_column)
            .writeStream.format("durastream")
            .option("url", server.stream_root)
            .option("stream", stream)
            .option("exactlyOnce", mode)
            .option("checkpointLocation", str(work / f"cp-{uuid.uuid4().hex}"))
            .trigger(availableNow=True)
            .start()
        )
    )
    client = StreamClient(ConnectionOptions(url=server.stream_root))
    written = client.lookup_limit(stream, "-1").messages
    if written != rows:
        raise RuntimeError(f"durastream ({mode}) wrote {written} messages, expected {rows}")
    # Deleted after the run, as the file sink's directory is, so every run starts from the same memory
    # state. Kept streams made the runs unequal on virtual machines: the file sink's next run got back
    # the 300 MB of page cache its directory freed, while the server took fresh memory from the host for
    # every batch (writing into it ran at about 0.45 GB/s instead of 4-5 GB/s here).
    client.delete(stream)
    return elapsed


def run_file_sink(spark, work: Path, rows: int) -> float:
    target = work / f"json-{uuid.uuid4().hex}"
    elapsed = _timed(
        lambda: (
            _input(spark, rows)
            .writeStream.format("json")
            .option("path", str(target))
            .option("checkpointLocation", str(work / f"cp-{uuid.uuid4().hex}"))
            .trigger(availableNow=True)
            .start()
        )
    )
    shutil.rmtree(target, ignore_errors=True)
    return elapsed


def run_naive(spark, server: Server, rows: int) -> float:
    import requests

    stream_url = f"{server.stream_root}/bench/naive-{uuid.uuid4().hex[:8]}"
    session = requests.Session()
    session.put(stream_url, headers={"Content-Type": "application/json"}).raise_for_status()

    def post(chunk: list[str]) -> None:
        body = ("[" + ",".join(chunk) + "]").encode()
        response = session.post(stream_url, data=body, headers={"Content-Type": "application/json"})
        response.raise_for_status()

    def write_batch(batch_df, _batch_id: int) -> None:
        chunk: list[str] = []
        for line in batch_df.toJSON().toLocalIterator():
            chunk.append(line)
            if len(chunk) == NAIVE_ROWS_PER_POST:
                post(chunk)
                chunk = []
        if chunk:
            post(chunk)

    work = Path(tempfile.mkdtemp(prefix="naive-cp-"))
    try:
        elapsed = _timed(
            lambda: (
                _input(spark, rows)
                .writeStream.foreachBatch(write_batch)
                .option("checkpointLocation", str(work))
                .trigger(availableNow=True)
                .start()
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    session.delete(stream_url).raise_for_status()  # as run_durastream deletes its stream
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows per measured run")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per writer")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--value-column", action="store_true", help="durastream writers get a JSON 'value' column"
    )
    parser.add_argument("--writers", help="run only the writers whose name starts with this")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="sink-bench-"))
    server = Server(work).start()
    spark = _spark()
    value = args.value_column
    writers: dict[str, Callable[[int], float]] = {
        "durastream (transactional)": lambda n: run_durastream(
            spark, server, work, n, "transactional", value_column=value
        ),
        "durastream (ordered)": lambda n: run_durastream(
            spark, server, work, n, "ordered", value_column=value
        ),
        "spark json file sink": lambda n: run_file_sink(spark, work, n),
        "naive foreachBatch": lambda n: run_naive(spark, server, n),
    }
    if args.writers:
        writers = {name: run for name, run in writers.items() if name.startswith(args.writers)}
    try:
        # Warm-up at the measured size: JIT, Python workers, connections, and the memory a run of this
        # size allocates and later runs reuse (JVM heap, worker and server buffers). After a 20,000-row
        # warm-up, the first measured run of either durastream mode was 15-20% slower than the rest.
        for name, run in writers.items():
            _settle()
            run(args.rows)
            print(f"warmed up {name}", flush=True)
        rounds: list[dict[str, float]] = []
        names = list(writers)
        for round_number in range(1, args.rounds + 1):
            rounds.append({})
            # Who goes first rotates by round. Dirty pages are written back before every run
            # (_settle), so no writer pays for the file sink's deferred writeback.
            shift = (round_number - 1) % len(names)
            for name in names[shift:] + names[:shift]:
                run = writers[name]
                _settle()
                cpu_before = _tree_cpu_seconds()
                elapsed = run(args.rows)
                cpu = _tree_cpu_seconds() - cpu_before
                CPU_SECONDS.setdefault(name, []).append(cpu)
                rate = args.rows / elapsed
                rounds[-1][name] = rate
                print(
                    f"round {round_number}: {name:<28} {elapsed:7.2f} s  {rate:>10,.0f} rows/s  "
                    f"{cpu:5.2f} CPU s (all processes)",
                    flush=True,
                )
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    best = {name: max(r[name] for r in rounds) for name in writers}
    median = {name: statistics.median(r[name] for r in rounds) for name in writers}

    def ratio(name: str, baseline: str) -> float:
        return statistics.median(r[name] / r[baseline] for r in rounds)

    cpu = {name: statistics.median(CPU_SECONDS[name]) for name in writers}
    print()
    print(f"{'writer':<28} {'rows/s median':>14} {'rows/s best':>12} {'CPU s median':>13}")
    for name in writers:
        print(f"{name:<28} {median[name]:>14,.0f} {best[name]:>12,.0f} {cpu[name]:>13.2f}")
    if set(writers) != {
        "durastream (transactional)",
        "durastream (ordered)",
        "spark json file sink",
        "naive foreachBatch",
    }:
        # A variant run of some writers: no ratios, nothing recorded.
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "rows": args.rows,
                        "value_column": args.value_column,
                        "rows_per_second_median": median,
                        "rows_per_second_best": best,
                        "cpu_seconds": CPU_SECONDS,
                        "rounds": rounds,
                    },
                    indent=2,
                )
            )
        return 0
    print()
    print("median of the per-round ratios:")
    ratios = {}
    for name in ("durastream (transactional)", "durastream (ordered)"):
        ratios[name] = {
            "vs_naive": ratio(name, "naive foreachBatch"),
            "vs_file_sink": ratio(name, "spark json file sink"),
        }
        print(
            f"{name:<28} {ratios[name]['vs_naive']:5.2f}x the naive writer (target >= 3x), "
            f"{ratios[name]['vs_file_sink']:4.0%} of the file sink (target >= 50%)"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": args.rows,
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                    f"{platform.python_version()}",
                    "rows_per_second_median": median,
                    "rows_per_second_best": best,
                    "ratios_median": ratios,
                    "rounds": rounds,
                },
                indent=2,
            )
        )
    import charts  # bench/charts.py: bench/results/sink.json and docs/img/bench-sink.png

    # The size docs/benchmarks.md records, of the plain input.
    full = args.rows >= 300_000 and args.rounds >= 5 and not args.value_column
    charts.record("sink", charts.sink_figures(median, best, ratios, args.rows), full=full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
