"""``python -m durastream_spark.demo``: command line, orchestration and the exactly-once summary.

Exit codes: 0 when the summary proves exactly once, 1 when it does not or the demo could not run (the
message says why), 2 for a usage error, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from durastream_spark.demo.display import Display, Snapshot
from durastream_spark.demo.pipeline import (
    Pipeline,
    Proof,
    QueryStats,
    build_session,
    new_stream_name,
    prove,
)
from durastream_spark.demo.server import BundledServer, DemoError

log = logging.getLogger("durastream_spark.demo")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
POLL_SECONDS = 0.5
WRITER_STOP_WAIT_SECONDS = 10.0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m durastream_spark.demo",
        description="Write events exactly once with the durastream sink, read them back with the "
        "durastream source (live and Trigger.AvailableNow), and prove that nothing was lost or "
        "duplicated.",
    )
    parser.add_argument(
        "--url",
        help="stream root of a running server, e.g. http://server:4437/v1/stream (default: start "
        "the bundled durastream-server on a free port, data in a temporary directory)",
    )
    parser.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    parser.add_argument(
        "--rows",
        type=_positive_int,
        default=20_000,
        help="events to generate (default: 20000)",
    )
    parser.add_argument(
        "--seconds",
        type=_positive_float,
        default=20.0,
        help="spread the events over about this many seconds of writing (default: 20)",
    )
    parser.add_argument(
        "--no-live",
        action="store_true",
        help="print a progress line every few seconds instead of redrawing a live display",
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="send this request header to the server (repeatable), e.g. Authorization='Bearer ...'",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="parent directory for checkpoints and output (default: the system temp dir); on a "
        "multi-node cluster it must be shared by the driver and every executor",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=300.0,
        help="give up (exit 1) after this many seconds (default: 300)",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="level of the demo's own log messages on stderr (default: WARNING)",
    )
    return parser


def _headers(pairs: Sequence[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise DemoError(f"--header {pair!r}: expected NAME=VALUE")
        headers[f"header.{name.strip()}"] = value
    return headers


def create_stream(url: str, stream: str, headers: dict[str, str]) -> None:
    """Create the JSON stream up front, so the readers can start before the writer's first batch."""
    from durastream_spark.errors import DurastreamError
    from durastream_spark.options import ConnectionOptions
    from durastream_spark.protocol.client import StreamClient

    try:
        client = StreamClient(
            ConnectionOptions.parse({"url": url, "retry.maxElapsedMs": "60000", **headers})
        )
        client.create(stream, "application/json")
    except DurastreamError as error:
        raise DemoError(f"cannot create the demo stream at {url}: {error}") from error


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Spark's Python workers (on executors too) must run this interpreter: it has the connector.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    display = Display(live=not args.no_live)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="durastream-demo-", dir=args.workdir) as tmp:
        workdir = Path(tmp)
        server: BundledServer | None = None
        try:
            headers = _headers(args.header)
            if args.url:
                url = args.url.rstrip("/")
            else:
                server = BundledServer(workdir)
                url = server.start()
                display.message(f"Started the bundled durastream-server: {url}")
            return run(args, url, headers, workdir, display)
        except DemoError as error:
            print(f"durastream-demo: error: {error}", file=sys.stderr)
            return EXIT_FAILED
        except KeyboardInterrupt:
            print("durastream-demo: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            if server is not None:
                server.stop()
                display.message("Stopped the bundled server.")


def run(
    args: argparse.Namespace, url: str, headers: dict[str, str], workdir: Path, display: Display
) -> int:
    stream = new_stream_name()
    create_stream(url, stream, headers)
    display.message(f"Stream: {url}/{stream}")
    display.message(f"Starting Spark (master {args.master}) ...")
    started = time.monotonic()
    spark = build_session(args.master)
    display.message(f"Spark {spark.version} is up after {time.monotonic() - started:.1f} s.")
    pipeline = Pipeline(
        spark=spark,
        url=url,
        stream=stream,
        rows=args.rows,
        seconds=args.seconds,
        workdir=workdir,
        headers=headers,
    )
    try:
        produced, writer = drive(pipeline, display, started + args.timeout)
        proof, per_key = prove(pipeline, produced)
    finally:
        pipeline.stop_all()
        stop_quietly(spark)
    summary(proof, per_key, writer, pipeline.ingest_runs, time.monotonic() - started)
    return EXIT_OK if proof.ok else EXIT_FAILED


def stop_quietly(spark: Any) -> None:
    """``spark.stop()`` without PySpark's accumulator-server traceback.

    Stopping the JVM closes the socket on which PySpark's accumulator server is waiting; its handler then
    hits end-of-file and ``socketserver`` prints an ``EOFError`` traceback to stderr, harmless but alarming
    at the end of a demo. Silence that one handler's error report, then stop.
    """
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda request, client_address: None
    spark.stop()


def drive(pipeline: Pipeline, display: Display, deadline: float) -> tuple[int, QueryStats]:
    """Run the queries through their phases, showing progress. Returns the rows the writer committed."""
    begin = time.monotonic()
    writer, live = QueryStats("writer"), QueryStats("live")
    pipeline.start_writer()
    pipeline.start_live()
    phase = "writing"
    produced = 0
    idle_since: float | None = None
    while True:
        # Fold the progress of every query first, a failed one included: its last completed batches
        # count, and a restart does not run them again.
        writer.update(pipeline.writer)
        live.update(pipeline.live)
        running = pipeline.ingest_runs[-1] if pipeline.ingest_runs else None
        if running is not None and not running.finished:
            running.update(pipeline.ingest)
            if not pipeline.ingest.isActive and pipeline.ingest.exception() is None:
                running.finished = True
        for message in pipeline.restart_failed():
            display.message(message)
        produced = min(writer.rows, pipeline.rows)

        if phase == "writing":
            if not pipeline.ingest_runs and produced >= pipeline.rows // 2:
                pipeline.start_ingest()
            if produced >= pipeline.rows:
                # Every id below `rows` is committed; later batches filter everything out, so stopping
                # cannot cut a batch that carries data. Stop between triggers if we can: stopping an
                # empty batch midway only makes Spark log that it aborted it.
                idle_since = idle_since or time.monotonic()
                active = pipeline.writer.status.get("isTriggerActive", False)
                if not active or time.monotonic() - idle_since > WRITER_STOP_WAIT_SECONDS:
                    pipeline.writer.stop()
                    phase = "live query catching up"
        elif phase == "live query catching up":
            if live.rows >= produced and not live.lag_bytes:
                pipeline.live.stop()
                phase = "final AvailableNow run"
        elif phase == "final AvailableNow run":
            if len(pipeline.ingest_runs) < 2 and (running is None or running.finished):
                pipeline.start_ingest()
            elif len(pipeline.ingest_runs) == 2 and pipeline.ingest_runs[-1].finished:
                break

        display.show(
            Snapshot(
                elapsed=time.monotonic() - begin,
                phase=phase,
                expected=pipeline.rows,
                produced=produced,
                writer=writer,
                live=live,
                ingest_runs=list(pipeline.ingest_runs),
            )
        )
        if time.monotonic() > deadline:
            raise DemoError(
                f"timed out in phase '{phase}' (written {produced}/{pipeline.rows}, read live "
                f"{live.rows}); raise --timeout on a slow machine"
            )
        time.sleep(POLL_SECONDS)
    display.show(
        Snapshot(
            elapsed=time.monotonic() - begin,
            phase="done",
            expected=pipeline.rows,
            produced=produced,
            writer=writer,
            live=live,
            ingest_runs=list(pipeline.ingest_runs),
        ),
        force=True,
    )
    display.finish()
    return produced, writer


def summary(
    proof: Proof,
    per_key: dict[str, tuple[int, int]],
    writer: QueryStats,
    ingest_runs: list[QueryStats],
    elapsed: float,
) -> None:
    runs = ", ".join(f"{run.name}: {run.rows}" for run in ingest_runs)
    rows = [
        ("events generated (ids 0..rows-1)", proof.expected, ""),
        ("committed by the exactly-once sink", proof.produced, f"{writer.batch_count} batches"),
        ("read back with AvailableNow -> parquet", proof.read, runs),
        ("distinct event ids read", proof.distinct, ""),
        ("duplicates", proof.duplicates, "rows read - distinct ids"),
        ("missing", proof.missing, "committed ids never read"),
        (
            "counted by the live query",
            proof.live,
            "per-key counts " + ("match" if proof.live_matches else "DIFFER from") + " parquet",
        ),
    ]
    print()
    print("Exactly-once check")
    for label, value, note in rows:
        print(f"  {label:<40} {value:>9,}   {note}")
    print(
        "  per key (parquet / live): " + ", ".join(f"{k} {a}/{b}" for k, (a, b) in per_key.items())
    )
    if proof.restarts:
        print(f"  queries restarted from their checkpoints after a failure: {proof.restarts}")
    print(f"  total time {elapsed:.1f} s")
    print(proof.line(), flush=True)
