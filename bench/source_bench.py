"""Benchmark the durastream source against Spark's own JSON file source, in one run.

N JSON messages of about 1 KiB each are written once to one stream of a local durastream-server (file
backed, fsync durability) and once to local NDJSON files. Spark (``local[*]``) then reads them into
``format("noop")``:

- ``file json (typed)``: ``spark.read.schema(S).json(dir)``, the practical limit for parsing JSON;
- ``durastream (typed)``: ``spark.read.format("durastream").schema(S)``, the same typed columns parsed
  from the stream (Arrow JSON reader, split reads);
- ``file text (raw)``: ``spark.read.text(dir)``, lines as strings, no parsing;
- ``durastream (raw)``: the default schema (``value`` bytes plus stream, offset and timestamp);
- ``durastream stream AvailableNow (typed)``: the typed read as a streaming query with
  ``Trigger.AvailableNow`` and ``maxMessagesPerTrigger`` = N/4 (four micro-batches), to show the cost of
  micro-batch planning.

Each kind runs once to warm up, then ``--repeats`` interleaved rounds run every kind once; the best run of
each kind counts (the machine is shared, and the best run is the one least disturbed); the
ratio of every round is printed too, with its median (the kinds of one round ran within a minute). The durastream reads
set ``minPartitions`` to the core count, as docs/source.md recommends for using every core. Printed: rows/s, MB/s of message bytes, each
durastream figure as a ratio of its file-source counterpart (the target is a typed ratio of at least 0.5),
and the CPU seconds the durastream server process used during the run: on a small machine the server
competes with Spark for the same cores, which a deployment with the server on its own host does not.

Run: ``python bench/source_bench.py [--messages N] [--repeats R] [--json FILE]``.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SCHEMA = "id BIGINT, kind STRING, at TIMESTAMP, score DOUBLE, tags ARRAY<STRING>, payload STRING"
KINDS = ("click", "view", "purchase", "signup")
APPEND_MESSAGES = 1000  # messages per append request when loading the stream
FILES = 16  # NDJSON files for the file source (Spark splits them further by size)


def message(i: int) -> bytes:
    """About 1 KiB of JSON, deterministic in ``i``."""
    document = {
        "id": i,
        "kind": KINDS[i % len(KINDS)],
        "at": f"2024-01-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}Z",
        "score": (i % 1000) / 10,
        "tags": [f"t{i % 7}", f"u{i % 13}"],
        "payload": "",
    }
    base = len(json.dumps(document, separators=(",", ":")))
    document["payload"] = ("abcdefghij" * 103)[: 1024 - base]
    return json.dumps(document, separators=(",", ":")).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """durastream-server on a temporary data directory (127.0.0.1 only)."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "durastream_server", "--data-dir", str(data_dir)]
            + ["--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("durastream-server did not start")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def load(url: str, stream: str, files_dir: Path, count: int) -> int:
    """Write the messages to the stream and to NDJSON files; return the message bytes."""
    from durastream_spark.options import ConnectionOptions
    from durastream_spark.protocol.client import StreamClient

    client = StreamClient(ConnectionOptions.parse({"url": url + "/v1/stream"}))
    client.create(stream, "application/json")
    files = [open(files_dir / f"part-{n:03d}.json", "wb") for n in range(FILES)]  # noqa: SIM115
    total = 0
    try:
        per_file = -(-count // FILES)
        for seq, first in enumerate(range(0, count, APPEND_MESSAGES)):
            batch = [message(i) for i in range(first, min(count, first + APPEND_MESSAGES))]
            total += sum(len(m) for m in batch)
            client.append(
                stream,
                b"[" + b",".join(batch) + b"]",
                "application/json",
                producer=("bench", 0, seq),
            )
            for i, value in zip(range(first, first + len(batch)), batch, strict=True):
                files[i // per_file].write(value + b"\n")
    finally:
        for handle in files:
            handle.close()
    return total


@dataclass
class Result:
    name: str
    seconds: float
    rows: int
    rows_per_s: float
    mb_per_s: float
    server_cpu_s: float | None  # CPU the durastream server used during that run (Linux /proc)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, or None where /proc is not available."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interleaved(
    runs: list[tuple[str, Callable[[], None]]], rows: int, size: int, repeats: int, server_pid: int
) -> tuple[list[Result], list[dict[str, float]]]:
    """Best of ``repeats`` rounds, and every round's seconds per kind. Each round runs every kind once
    (in reverse order every other round), so load on this shared machine hits all kinds alike instead of
    whichever happened to run during a busy minute."""
    best: dict[str, tuple[float, float | None]] = {name: (float("inf"), None) for name, _ in runs}
    rounds: list[dict[str, float]] = []
    for number in range(repeats):
        rounds.append({})
        for name, run in runs if number % 2 == 0 else runs[::-1]:
            cpu_before = cpu_seconds(server_pid)
            started = time.perf_counter()
            run()
            elapsed = time.perf_counter() - started
            cpu_after = cpu_seconds(server_pid)
            server_cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
            rounds[-1][name] = elapsed
            if elapsed < best[name][0]:
                best[name] = (elapsed, server_cpu)
    results = [
        Result(name, seconds, rows, rows / seconds, size / seconds / 1e6, server_cpu)
        for name, (seconds, server_cpu) in best.items()
    ]
    return results, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--partition-bytes",
        help="maxBytesPerPartition for the durastream reads (default: the source's)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="source-bench-"))
    server = Server(work / "data")
    try:
        files_dir = work / "files"
        files_dir.mkdir()
        started = time.perf_counter()
        size = load(server.url, "bench/events", files_dir, args.messages)
        print(
            f"loaded {args.messages} messages ({size / 1e6:.0f} MB) in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
        results, rounds = run_spark(
            server.url + "/v1/stream", files_dir, work, args, size, server.process.pid
        )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    by_name = {r.name: r for r in results}
    print(
        f"\n{'read':42} {'seconds':>8} {'rows/s':>10} {'MB/s':>8} {'ratio':>6} {'server cpu s':>13}"
    )
    pairs = {
        "durastream (typed)": "file json (typed)",
        "durastream stream AvailableNow (typed)": "file json (typed)",
        "durastream (raw)": "file text (raw)",
    }
    for result in results:
        base = by_name.get(pairs.get(result.name, ""))
        ratio = f"{result.rows_per_s / base.rows_per_s:6.2f}" if base else ""
        server_cpu = "" if result.server_cpu_s is None else f"{result.server_cpu_s:.2f}"
        print(
            f"{result.name:42} {result.seconds:8.2f} {result.rows_per_s:10,.0f} "
            f"{result.mb_per_s:8.1f} {ratio:>6} {server_cpu:>13}"
        )
    # The kinds of one round ran within a minute of each other: their ratio is the least disturbed by
    # the load of a shared machine.
    print("\nratio per round (file seconds / durastream seconds):")
    for name, base in pairs.items():
        ratios = [r[base] / r[name] for r in rounds if name in r and base in r]
        if ratios:
            print(
                f"  {name:40} "
                + " ".join(f"{x:.2f}" for x in ratios)
                + f"   median {statistics.median(ratios):.2f}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "messages": args.messages,
                    "bytes": size,
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "results": [asdict(r) for r in results],
                    "rounds": rounds,
                },
                indent=2,
            )
        )
    import charts  # bench/charts.py: bench/results/source.json and docs/img/bench-source.png

    full = args.messages >= 400_000 and args.repeats >= 5  # the size docs/benchmarks.md records
    charts.record("source", charts.source_figures(results, args.messages, size), full=full)


def run_spark(
    url: str, files_dir: Path, work: Path, args: argparse.Namespace, size: int, server_pid: int
) -> tuple[list[Result], list[dict[str, float]]]:
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    spark = (
        SparkSession.builder.master("local[*]")
        .appName("source-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DurableStreamDataSource)
    # minPartitions = cores: one stream split into at least one task per core (docs/source.md, "Tasks").
    options = {"url": url, "streams": "bench/events", "minPartitions": str(os.cpu_count() or 2)}
    if args.partition_bytes:
        options["maxBytesPerPartition"] = args.partition_bytes
    n = args.messages
    counter = iter(range(1_000_000))

    def noop(frame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def file_json() -> None:
        noop(spark.read.schema(SCHEMA).json(str(files_dir)))

    def file_text() -> None:
        noop(spark.read.text(str(files_dir)))

    def ours_typed() -> None:
        noop(spark.read.format("durastream").options(**options).schema(SCHEMA).load())

    def ours_raw() -> None:
        noop(spark.read.format("durastream").options(**options).load())

    def ours_stream() -> None:
        checkpoint = work / f"chk-{next(counter)}"
        query = (
            spark.readStream.format("durastream")
            .options(**options, maxMessagesPerTrigger=str(-(-n // 4)))
            .schema(SCHEMA)
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        query.awaitTermination()

    runs = [
        ("file json (typed)", file_json),
        ("durastream (typed)", ours_typed),
        ("file text (raw)", file_text),
        ("durastream (raw)", ours_raw),
        ("durastream stream AvailableNow (typed)", ours_stream),
    ]
    try:
        for _, run in runs:  # warm-up: JIT, Python workers, page cache
            run()
        return interleaved(runs, n, size, args.repeats, server_pid)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
