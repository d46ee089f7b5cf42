# Databricks notebook source
# MAGIC %md
# MAGIC # 02 · Exactly-once writes with the `durastream` sink
# MAGIC
# MAGIC A streaming query copies a table into a Durable Stream with `df.writeStream.format("durastream")`.
# MAGIC The notebook then reads the stream back and checks that every row is there exactly once, restarts the
# MAGIC query after more input arrived and checks again, and finally shows the one thing that breaks the
# MAGIC guarantee in practice: a new checkpoint.
# MAGIC
# MAGIC **Runtime.** Custom Python data sources need **Databricks Runtime 15.4 LTS or later**, or **serverless
# MAGIC environment 2 or later**. The exactly-once sink works on all of them. The query here reads files with
# MAGIC `Trigger.AvailableNow`, which Spark's file source supports on every runtime; admission control and
# MAGIC native `Trigger.AvailableNow` *for the durastream source* (Spark 4.2 or later) are not used.
# MAGIC
# MAGIC **Configuration.** Widgets `durastream_url`, `secret_scope`/`secret_key` (the `Authorization` header's
# MAGIC value, e.g. `Bearer eyJ...`, kept in a secret), `stream_prefix` and `work_dir` (a volume path for the
# MAGIC source files and checkpoints). Outside Databricks: the environment variables `DURASTREAM_URL`,
# MAGIC `DURASTREAM_AUTH_HEADER`, `DURASTREAM_STREAM_PREFIX` and `DURASTREAM_WORK_DIR`.

# COMMAND ----------

# MAGIC %md
# MAGIC ## What "exactly once" means here, and what breaks it
# MAGIC
# MAGIC Every row of every micro-batch Spark completes is in its target stream **once**: nothing lost, nothing
# MAGIC duplicated, and the rows of one input partition keep their order, through task retries, speculative
# MAGIC tasks, executor loss, driver crashes and restarts. Each task writes as an idempotent producer
# MAGIC (`<producerId>-<query id>-<partition>`, epoch = batch id), so a replayed batch is recognised by the server.
# MAGIC
# MAGIC | `exactlyOnce` | durastream-server | a server without its extensions (e.g. the Node reference server) |
# MAGIC | --- | --- | --- |
# MAGIC | `transactional` (what `auto` picks on durastream-server) | exactly once, whatever the row order of retries: tasks stage their rows, the driver commits the attempt Spark reports as successful | refused before any data is sent |
# MAGIC | `ordered` (what `auto` picks elsewhere) | exactly once if retries see their rows in the same order; otherwise the batch **fails loudly**, nothing lost or duplicated | exactly once if retries see their rows in the same order; otherwise rows can be **silently** lost and duplicated |
# MAGIC
# MAGIC The conditions, and what breaks them:
# MAGIC
# MAGIC 1. **Restart from the same checkpoint.** The query id, part of every producer id, lives in the
# MAGIC    checkpoint. A new checkpoint is a new query: replaying old input through it writes the rows again
# MAGIC    (shown at the end of this notebook). Never run two queries on one checkpoint.
# MAGIC 2. **A replayed batch has the same rows in the same partitions.** Replayable sources (files, tables,
# MAGIC    Kafka, durastream) and deterministic plans do this. A non-deterministic UDF, `rand()`-based routing
# MAGIC    or a source that returns other data for the same offsets breaks it, for any exactly-once sink.
# MAGIC 3. **The server keeps what it acknowledged and remembers producers.** Deleting and re-creating a target
# MAGIC    stream forgets its producers: a replay into the new stream is written again.
# MAGIC 4. **Use `writeStream.format("durastream")`**, not `foreachBatch` with `df.write` inside: each `df.write`
# MAGIC    is its own job with a fresh job id, so a retried batch is written again.
# MAGIC
# MAGIC In ordered mode, also keep `maxMessagesPerRequest`, `maxBytesPerRequest`, `contentType` and the payload
# MAGIC columns unchanged across restarts, and after a shuffle add `.sortWithinPartitions(<unique key>)` before
# MAGIC the sink (or use transactional mode). In transactional mode a batch must commit within `transactionTtl`
# MAGIC (default 1 h). The full statement, per mode and server: `docs/guarantees.md` in the connector's
# MAGIC repository.

# COMMAND ----------

# MAGIC %md
# MAGIC Install the connector and msgspec. `--no-deps`: the runtime already provides `pyspark`, `pyarrow` and `requests`,
# MAGIC and pip must not replace the runtime's own `pyspark`. To install a wheel you built yourself, upload it to
# MAGIC a volume and use `%pip install /Volumes/<catalog>/<schema>/<volume>/durastream_spark-<version>-py3-none-any.whl --no-deps`.

# COMMAND ----------

# MAGIC %pip install durastream-spark msgspec --no-deps

# COMMAND ----------

# MAGIC %run ./_setup

# COMMAND ----------

from durastream_spark import DurableStreamDataSource
from durastream_spark.compat import HAS_ADMISSION_CONTROL

spark.dataSource.register(DurableStreamDataSource)
print(
    f"Spark {spark.version}; admission control and native AvailableNow: "
    + ("yes" if HAS_ADMISSION_CONTROL else "no (needs Spark >= 4.2)")
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## A source table
# MAGIC
# MAGIC 1,000 sensor readings in four parquet files. Any replayable streaming source works the same way, e.g.
# MAGIC `spark.readStream.table("catalog.schema.readings")` for a Delta table.

# COMMAND ----------

from pyspark.sql import functions as F

BASE = f"{WORK_DIR}/02_exactly_once_sink-{RUN_ID}"
SOURCE_DIR = f"{BASE}/source"
CHECKPOINT = f"{BASE}/checkpoints/readings"
TARGET_STREAM = f"{STREAM_PREFIX}/readings-{RUN_ID}"
SOURCE_SCHEMA = "id BIGINT, sensor INT, reading DOUBLE"


def add_source_rows(first, count, files):
    """Append `count` readings, ids from `first`, to the source table as `files` parquet files."""
    rows = spark.range(first, first + count, 1, files).selectExpr(
        "id", "CAST(id % 10 AS INT) AS sensor", "ROUND(SIN(id) * 100, 2) AS reading"
    )
    rows.write.mode("append").parquet(SOURCE_DIR)


add_source_rows(0, 1000, files=4)
print(f"source: {SOURCE_DIR}\ntarget stream: {TARGET_STREAM}\ncheckpoint: {CHECKPOINT}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## What each batch did, as figures your code can use
# MAGIC
# MAGIC The sink logs one INFO line per micro-batch on the driver: streams, rows, bytes, requests, retries,
# MAGIC commit time and mode (the durastream source logs what it read: streams, messages, bytes, tasks, planning
# MAGIC time, lag). With option `batchFiguresPath`, a directory on the driver, each direction also records
# MAGIC those figures, and `durastream_spark.figures.for_batch(path, event.progress)` returns them as dicts to a
# MAGIC `StreamingQueryListener`. Without the option nothing is recorded. The directory must be on the
# MAGIC driver's local disk: the listener runs in this notebook's process, the connector in Spark's Python
# MAGIC workers on the driver (over Spark Connect the client must run on the server's machine).

# COMMAND ----------

import tempfile

from pyspark.sql.streaming import StreamingQueryListener

from durastream_spark import figures

FIGURES_DIR = tempfile.mkdtemp(prefix="durastream-figures-")  # on the driver


class SinkFigures(StreamingQueryListener):
    """The sink's figures of every batch, by (query id, batch id), as the queries report progress."""

    def __init__(self):
        self.by_batch = {}

    def onQueryStarted(self, event):
        pass

    def onQueryProgress(self, event):
        found = figures.for_batch(FIGURES_DIR, event.progress)
        if found["sink"] is not None:
            self.by_batch[(found["queryId"], found["batchId"])] = found["sink"]

    def onQueryIdle(self, event):
        pass

    def onQueryTerminated(self, event):
        pass


sink_figures = SinkFigures()
spark.streams.addListener(sink_figures)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Write it with the exactly-once sink
# MAGIC
# MAGIC A streaming query with a checkpoint. `Trigger.AvailableNow` processes what is there and stops
# MAGIC (`maxFilesPerTrigger=1`: one micro-batch per file, to have several batches); a long-running query would
# MAGIC use `.trigger(processingTime="1 minute")` or no trigger at all. `exactlyOnce=auto` is the default.

# COMMAND ----------


def write_to_stream(target, checkpoint, max_files_per_trigger=None):
    """Copy the source table into `target`; returns the finished query."""
    source = spark.readStream.schema(SOURCE_SCHEMA)
    if max_files_per_trigger:
        source = source.option("maxFilesPerTrigger", max_files_per_trigger)
    query = (
        source.parquet(SOURCE_DIR)
        .writeStream.format("durastream")
        .options(**CONN)
        .option("stream", target)
        .option("exactlyOnce", "auto")
        .option("batchFiguresPath", FIGURES_DIR)  # for the listener above
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def batches_of(query):
    """(batch id, rows) of the micro-batches that had rows.

    Rows are summed over the sources: over Spark Connect, progress["numInputRows"] is None.
    """
    batches = []
    for progress in query.recentProgress:
        rows = sum(source["numInputRows"] for source in progress["sources"])
        if rows:
            batches.append((progress["batchId"], rows))
    return batches


query = write_to_stream(TARGET_STREAM, CHECKPOINT, max_files_per_trigger=1)
first_run_batches = len(batches_of(query))
print("(batch id, rows) written:", batches_of(query))

# COMMAND ----------

# MAGIC %md
# MAGIC The listener's dicts for the batches of this run. Listener events arrive shortly after the query
# MAGIC reports progress, so the cell waits for them (up to a minute).

# COMMAND ----------

import time

wanted = [(str(query.id), batch_id) for batch_id, _ in batches_of(query)]
deadline = time.monotonic() + 60
while not all(key in sink_figures.by_batch for key in wanted) and time.monotonic() < deadline:
    time.sleep(0.1)
spark.streams.removeListener(sink_figures)
first_run_figures = [sink_figures.by_batch[key] for key in wanted]
for (batch_id, rows), sink in zip(batches_of(query), first_run_figures):
    print(
        f"batch {batch_id}: {sink['rows']} rows, {sink['bytes']} bytes into {sink['streams']} stream(s); "
        f"{sink['task_requests']} task and {sink['commit_requests']} commit requests "
        f"({sink['task_retries'] + sink['commit_retries']} retries); commit {sink['commit_ms']:.0f} ms, "
        f"{sink['mode']}"
    )
    assert sink["rows"] == rows, (batch_id, sink, rows)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Verify: read the stream back
# MAGIC
# MAGIC Every source id exactly once: as many rows as ids, no id missing, none unexpected.

# COMMAND ----------


def verify(target):
    written = (
        spark.read.format("durastream")
        .options(**CONN)
        .option("streams", target)
        .schema(SOURCE_SCHEMA)
        .load()
    )
    source_ids = spark.read.schema(SOURCE_SCHEMA).parquet(SOURCE_DIR).select("id")
    counts = written.agg(F.count("*").alias("rows"), F.countDistinct("id").alias("ids")).first()
    result = {
        "rows": counts["rows"],
        "distinct_ids": counts["ids"],
        "duplicates": counts["rows"] - counts["ids"],
        "missing": source_ids.subtract(written.select("id")).count(),
    }
    unexpected = written.select("id").subtract(source_ids).count()
    assert unexpected == 0, f"{unexpected} ids in the stream are not in the source"
    return result


first_run = verify(TARGET_STREAM)
print(first_run)
assert first_run["duplicates"] == 0 and first_run["missing"] == 0

# COMMAND ----------

# MAGIC %md
# MAGIC ## More input, and a restart from the same checkpoint
# MAGIC
# MAGIC The source grows by 500 rows. Restarted on its checkpoint, the query writes exactly those: Spark resumes
# MAGIC after the last committed batch, and a batch that was interrupted half-way would be replayed under the
# MAGIC same producer ids, which the server recognises.

# COMMAND ----------

add_source_rows(1000, 500, files=2)
query = write_to_stream(TARGET_STREAM, CHECKPOINT, max_files_per_trigger=1)
print("(batch id, rows) written:", batches_of(query))
second_run = verify(TARGET_STREAM)
print(second_run)
assert second_run["duplicates"] == 0 and second_run["missing"] == 0

# COMMAND ----------

display(
    spark.read.format("durastream")
    .options(**CONN)
    .option("streams", TARGET_STREAM)
    .schema(SOURCE_SCHEMA)
    .load()
    .groupBy("sensor")
    .agg(F.count("*").alias("readings"), F.round(F.avg("reading"), 2).alias("avg_reading"))
    .orderBy("sensor")
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## What breaks it: a new checkpoint
# MAGIC
# MAGIC The same input through a query with a *new* checkpoint is a new query, with new producer ids: the
# MAGIC server cannot know that these rows were written before, and writes them again. Here into a scratch
# MAGIC stream: the second copy doubles it. Likewise, a target stream deleted and re-created has forgotten its
# MAGIC producers, so a batch replayed into it is written again, and a `foreachBatch` that re-runs a `df.write`
# MAGIC writes again. Keep the checkpoint with the query; to start over on purpose, start over with an empty
# MAGIC target as well.

# COMMAND ----------

SCRATCH_STREAM = f"{STREAM_PREFIX}/readings-scratch-{RUN_ID}"
write_to_stream(SCRATCH_STREAM, f"{BASE}/checkpoints/scratch-a")
write_to_stream(SCRATCH_STREAM, f"{BASE}/checkpoints/scratch-b")  # a new checkpoint
broken = verify(SCRATCH_STREAM)
broken_rows, broken_distinct_ids = broken["rows"], broken["distinct_ids"]
print(f"scratch stream: {broken_rows} rows for {broken_distinct_ids} ids: every row written twice")
