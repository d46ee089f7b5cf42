"""Append -> first micro-batch containing it (``foreachBatch``), one stream, default trigger (issue 16).

An idle streaming query waits on the server's change feed (``wait=``, up to a second) for a selected
stream to change, instead of polling. This measures what that costs the latency a user sees: a writer
appends one message every ``--interval`` seconds to one stream (each message carries its send time), a
``readStream`` query with the default trigger hands each micro-batch to ``foreachBatch``, which notes when
it saw each message. Figures: p50/p99/max of (seen - sent), with the change feed (what durastream-server
advertises) and ``polling``: the same server behind a proxy that hides its extensions
(``tests/support/hiding_proxy.py``; what other servers get: a sleep of up to 0.5 s and a fresh snapshot
per idle trigger), in the same run. ``local[2]``, a real server process on loopback.

Run: ``python bench/latency_bench.py [--messages 60] [--interval 0.4]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from durastream_spark.options import ConnectionOptions  # noqa: E402
from durastream_spark.protocol.client import StreamClient  # noqa: E402
from tests.support.hiding_proxy import ExtensionHidingProxy  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return (
        ordered[len(ordered) // 2],
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        ordered[-1],
    )


def measure(
    spark, url: str, write_url: str, path: str, messages: int, interval: float
) -> list[float]:
    """Seconds from sending each append to the foreachBatch call that holds it (the query reads
    through ``url``, the writer appends to the server directly at ``write_url``)."""
    writer = StreamClient(ConnectionOptions.parse({"url": write_url}))
    writer.create(path, "application/json")
    seen: dict[int, float] = {}
    lock = threading.Lock()

    def note(frame, batch_id: int) -> None:
        now = time.time()
        for row in frame.select("value").collect():
            sent = json.loads(bytes(row["value"]))
            with lock:
                seen.setdefault(sent["i"], now - sent["t"])

    query = (
        spark.readStream.format("durastream")
        .options(url=url, streams=path)
        .load()
        .writeStream.foreachBatch(note)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="latency-chk-"))
        .start()
    )
    try:
        # A warm-up message, seen once the query is in its trigger loop (not part of the figures).
        writer.append(path, json.dumps([{"i": -1, "t": time.time()}]).encode(), "application/json")
        deadline = time.monotonic() + 300
        while -1 not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(3.0)  # idle for a while: triggers now wait on the server (or poll)
        for i in range(messages):
            body = json.dumps([{"i": i, "t": time.time()}]).encode()
            writer.append(path, body, "application/json")
            time.sleep(interval)
        deadline = time.monotonic() + 60
        while len(seen) < messages + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        query.stop()
    return [seen[i] for i in sorted(seen) if i >= 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.4)
    parser.add_argument("--plain-first", action="store_true", help="measure polling first")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    root = Path(tempfile.mkdtemp(prefix="latency-bench-"))
    server = ServerProcess(root / "data")
    server.start()
    url = server.base_url + "/v1/stream"
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.authenticate.socketTimeout", "120s")  # a loaded machine: as the tests
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(DurableStreamDataSource)
    print(f"load before: {os.getloadavg()}")
    print("| path | messages | p50 ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    proxy = ExtensionHidingProxy(server.port).start()
    try:
        columns = [("extensions", url), ("plain", proxy.base_url + "/v1/stream")]
        if args.plain_first:  # the first column also warms the JVM up: swap to see its share
            columns.reverse()
        for name, base in columns:
            found = measure(spark, base, url, f"lat/{name}", args.messages, args.interval)
            p50, p99, top = percentiles(found)
            label = "change feed (idle wait)" if name == "extensions" else "polling (no feed)"
            print(
                f"| {label} | {len(found)}/{args.messages} | {p50 * 1000:.0f} | {p99 * 1000:.0f} "
                f"| {top * 1000:.0f} |"
            )
    finally:
        spark.stop()
        proxy.stop()
        server.stop()
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
