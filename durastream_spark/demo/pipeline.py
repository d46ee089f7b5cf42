"""The demo pipeline: events from ``rate`` -> exactly-once sink -> stream -> source -> counts and parquet.

Queries (each with its own checkpoint under the demo's work directory):

- ``writer``: ``rate`` (ids 0, 1, 2, ...) -> ``{"id", "key", "ts"}`` for ids below ``rows`` ->
  ``writeStream.format("durastream")``. The rate source is replayable (a batch's rows are a function of its
  offsets), so the sink's exactly-once conditions hold (docs/guarantees.md).
- ``live``: ``readStream.format("durastream")`` -> ``groupBy("key").count()`` -> memory table, every second,
  while the writer runs.
- ``ingest``: ``readStream.format("durastream")`` with ``Trigger.AvailableNow`` -> parquet (Spark's file
  sink is exactly-once too). Run once while the writer is half way, and once after it finished: the second
  run starts from the first run's checkpoint and reads only what is new.

``Proof`` compares what the writer committed with what the readers saw: the ids read must be exactly
0..rows-1, each once.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durastream_spark.compat import HAS_ADMISSION_CONTROL

log = logging.getLogger(__name__)

KEYS = 8
MAX_RESTARTS = 3
EVENT_SCHEMA = "id BIGINT, key STRING, ts TIMESTAMP, _offset STRING"
LIVE_TABLE = "durastream_demo_live_counts"
_SERVER_OFFSET = re.compile(
    r"^\d{16}_(\d{16})$"
)  # durastream-server offsets: <generation>_<position>


def new_stream_name() -> str:
    """A fresh stream per run, so reruns against a long-lived server (docker compose) never mix."""
    return f"demo/events-{uuid.uuid4().hex[:10]}"


def build_session(master: str, app_name: str = "durastream-demo") -> Any:
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataProgressEventInterval", "1000")
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(DurableStreamDataSource)
    return session


@dataclass
class QueryStats:
    """What one query's progress reports said, folded per batch id (Spark keeps only recent ones)."""

    name: str
    batches: dict[int, int] = field(default_factory=dict)  # batch id -> input rows
    lag_bytes: int | None = None
    finished: bool = False

    @property
    def rows(self) -> int:
        return sum(self.batches.values())

    @property
    def batch_count(self) -> int:
        return sum(1 for rows in self.batches.values() if rows)

    def update(self, query: Any) -> None:
        for progress in query.recentProgress:
            report = json.loads(progress.json)
            batch = int(report["batchId"])
            rows = int(report.get("numInputRows") or 0)
            self.batches[batch] = max(rows, self.batches.get(batch, 0))
            lag = source_lag_bytes(report)
            if lag is not None:
                self.lag_bytes = lag


def source_lag_bytes(report: dict[str, Any]) -> int | None:
    """Bytes between where the last batch ended and the stream's tail, from ``latestOffset``.

    Offsets are opaque protocol tokens; durastream-server's encode the byte position, so the difference
    is the lag in (stored) bytes. ``None`` for other servers' offsets, or before the first report.
    """
    total = None
    for source in report.get("sources") or []:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        if latest is None:
            continue
        for stream, tail in latest.items():
            tail_position = _position(tail)
            end_position = _position((end or {}).get(stream, "-1"))
            if tail_position is None or end_position is None:
                return None
            total = (total or 0) + max(0, tail_position - end_position)
    return total


def _offsets(text: Any) -> dict[str, str] | None:
    if not text:
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _position(offset: Any) -> int | None:
    if offset == "-1":
        return 0
    match = _SERVER_OFFSET.match(str(offset))
    return int(match.group(1)) if match else None


@dataclass
class Pipeline:
    """The demo's three queries against one stream; ``workdir`` holds checkpoints and the parquet output."""

    spark: Any
    url: str
    stream: str
    rows: int
    seconds: float
    workdir: Path
    headers: dict[str, str] = field(default_factory=dict)  # header.<Name> options (auth)
    writer: Any = None
    live: Any = None
    ingest: Any = None
    ingest_runs: list[QueryStats] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)  # query role -> restarts so far

    @property
    def rows_per_second(self) -> int:
        return max(1, math.ceil(self.rows / max(self.seconds, 1.0)))

    def _source(self, max_per_trigger: int | None) -> Any:
        reader = (
            self.spark.readStream.format("durastream")
            .option("url", self.url)
            .option("streams", self.stream)
            .option("startingOffsets", "earliest")
            .options(**self.headers)
        )
        if max_per_trigger and HAS_ADMISSION_CONTROL:  # Spark >= 4.2; older ones refuse the option
            reader = reader.option("maxMessagesPerTrigger", str(max_per_trigger))
        return reader.schema(EVENT_SCHEMA).load()

    def start_writer(self) -> Any:
        from pyspark.sql import functions as F

        events = (
            self.spark.readStream.format("rate")
            .option("rowsPerSecond", str(self.rows_per_second))
            .option("numPartitions", "2")
            .load()
            .where(F.col("value") < F.lit(self.rows))
            .select(
                F.col("value").alias("id"),
                F.concat(F.lit("key-"), (F.col("value") % KEYS).cast("string")).alias("key"),
                F.col("timestamp").alias("ts"),
            )
        )
        self.writer = (
            events.writeStream.format("durastream")
            .queryName("demo_writer")
            .option("url", self.url)
            .option("stream", self.stream)
            .options(**self.headers)
            .option("checkpointLocation", str(self.workdir / "checkpoints" / "writer"))
            .trigger(processingTime="1 second")
            .start()
        )
        return self.writer

    def start_live(self) -> Any:
        counts = self._source(max(100, 2 * self.rows_per_second)).groupBy("key").count()
        self.live = (
            counts.writeStream.format("memory")
            .queryName(LIVE_TABLE)
            .outputMode("complete")
            .option("checkpointLocation", str(self.workdir / "checkpoints" / "live"))
            .trigger(processingTime="1 second")
            .start()
        )
        return self.live

    def start_ingest(self) -> Any:
        """One ``Trigger.AvailableNow`` run: everything in the stream now, in several batches, then stop."""
        self.ingest_runs.append(QueryStats(f"ingest run {len(self.ingest_runs) + 1}"))
        return self._start_ingest_query()

    def _start_ingest_query(self) -> Any:
        self.ingest = (
            self._source(max(100, self.rows // 4))
            .select("id", "key", "_offset")
            .writeStream.format("parquet")
            .queryName(f"demo_ingest_{len(self.ingest_runs)}")
            .option("path", str(self.output_dir))
            .option("checkpointLocation", str(self.workdir / "checkpoints" / "ingest"))
            .trigger(availableNow=True)
            .start()
        )
        return self.ingest

    @property
    def output_dir(self) -> Path:
        return self.workdir / "ingested"

    def queries(self) -> list[Any]:
        return [q for q in (self.writer, self.live, self.ingest) if q is not None]

    def restart_failed(self) -> list[str]:
        """Restart each failed query from its checkpoint, at most ``MAX_RESTARTS`` times per query.

        A restart resumes from the last batch Spark recorded; a batch that failed midway is replayed, and
        the exactly-once sink, source and file sink make the replay add nothing twice. This is also what
        keeps the demo going on an overloaded machine, where Spark can give up on a Python worker that
        took more than its fixed 10 s to start. Returns one message per restart; raises ``DemoError``
        when a query fails once more than that.
        """
        from durastream_spark.demo.server import DemoError

        messages = []
        roles = (
            ("writer", self.writer, self.start_writer),
            ("live", self.live, self.start_live),
            ("ingest", self.ingest, self._start_ingest_query),
        )
        for role, query, start in roles:
            error = None if query is None or query.isActive else query.exception()
            if error is None:
                continue
            reason = (str(error).strip().splitlines() or ["(no message)"])[0]
            if self.restarts.get(role, 0) >= MAX_RESTARTS:
                raise DemoError(f"query {query.name} failed {MAX_RESTARTS + 1} times: {error}")
            self.restarts[role] = self.restarts.get(role, 0) + 1
            log.warning(
                "query %s failed, restarting it from its checkpoint: %s", query.name, reason
            )
            log.debug("query %s failed with: %s", query.name, error)
            messages.append(
                f"Query {query.name} failed ({reason}); restarted it from its checkpoint."
            )
            start()
        return messages

    def stop_all(self) -> None:
        for query in self.queries():
            try:
                if query.isActive:
                    query.stop()
            except Exception:  # best effort on the way out
                log.warning("could not stop query %s", query.name, exc_info=True)


@dataclass(frozen=True)
class Proof:
    """The exactly-once evidence. ``ok`` is the demo's exit status."""

    expected: int  # events the generator emits: ids 0..expected-1
    produced: int  # events the writer committed (its batches' input rows, capped by the id filter)
    read: int  # rows the AvailableNow runs ingested (parquet, Spark's exactly-once file sink)
    distinct: int  # distinct ids among them
    in_range: int  # distinct ids within 0..expected-1
    live: int  # events counted by the live query (sum of its per-key counts)
    live_matches: bool  # the live per-key counts equal the ingested per-key counts
    restarts: int = 0  # queries restarted from their checkpoints after a failure

    @property
    def duplicates(self) -> int:
        return self.read - self.distinct

    @property
    def missing(self) -> int:
        return self.produced - self.in_range

    @property
    def ok(self) -> bool:
        return (
            self.produced == self.expected
            and self.read == self.produced
            and self.duplicates == 0
            and self.missing == 0
            and self.distinct == self.in_range
            and self.live == self.produced
            and self.live_matches
        )

    def line(self) -> str:
        verdict = "EXACTLY-ONCE" if self.ok else "FAILED"
        return (
            f"durastream-demo: {verdict} produced={self.produced} read={self.read} "
            f"live={self.live} duplicates={self.duplicates} missing={self.missing} "
            f"restarts={self.restarts}"
        )


def prove(pipeline: Pipeline, produced: int) -> tuple[Proof, dict[str, tuple[int, int]]]:
    """Read the parquet output and the live counts; returns the proof and per-key (ingested, live)."""
    from pyspark.sql import functions as F

    spark = pipeline.spark
    ingested = spark.read.parquet(str(pipeline.output_dir))
    totals = ingested.agg(
        F.count("*").alias("read"),
        F.countDistinct("id").alias("distinct"),
        F.countDistinct(
            F.when((F.col("id") >= 0) & (F.col("id") < pipeline.rows), F.col("id"))
        ).alias("in_range"),
    ).collect()[0]
    per_key_ingested = {r["key"]: r["count"] for r in ingested.groupBy("key").count().collect()}
    per_key_live = {r["key"]: r["count"] for r in spark.table(LIVE_TABLE).collect()}
    keys = sorted(set(per_key_ingested) | set(per_key_live))
    per_key = {k: (per_key_ingested.get(k, 0), per_key_live.get(k, 0)) for k in keys}
    proof = Proof(
        expected=pipeline.rows,
        produced=produced,
        read=int(totals["read"]),
        distinct=int(totals["distinct"]),
        in_range=int(totals["in_range"]),
        live=sum(per_key_live.values()),
        live_matches=per_key_ingested == per_key_live,
        restarts=sum(pipeline.restarts.values()),
    )
    return proof, per_key
