# Databricks notebook source
# MAGIC %md
# MAGIC # 03 · Incremental ingest with `Trigger.AvailableNow`
# MAGIC
# MAGIC The batch-job way to ingest a stream: a streaming query with `Trigger.AvailableNow` and a checkpoint reads
# MAGIC everything appended since its last run, writes it to a table, and stops. Schedule the notebook as a job
# MAGIC and every run picks up exactly the new messages: the checkpoint holds each stream's offset, and a run
# MAGIC that fails half-way is resumed by the next one without duplicates (the table sink is exactly-once).
# MAGIC
# MAGIC The table is **Delta** where Delta Lake is available (always on Databricks), **parquet** otherwise.
# MAGIC
# MAGIC **Runtime.** Custom Python data sources need **Databricks Runtime 15.4 LTS or later**, or **serverless
# MAGIC environment 2 or later**. Admission control (`maxMessagesPerTrigger`, `maxBytesPerTrigger`) and native
# MAGIC `Trigger.AvailableNow` for Python sources need a **Spark 4.2 or later** runtime: there a run is split
# MAGIC into micro-batches of at most `maxMessagesPerTrigger` messages, up to the tails the run saw when it
# MAGIC started. On older runtimes the notebook leaves `maxMessagesPerTrigger` out (the source refuses it there)
# MAGIC and `Trigger.AvailableNow` still works, through Spark's generic wrapper: each run is **one** micro-batch
# MAGIC up to the tails at its start. Same result, same exactly-once, just without the bound on batch size.
# MAGIC
# MAGIC **Configuration.** Widgets `durastream_url`, `secret_scope`/`secret_key` (the `Authorization` header's
# MAGIC value, e.g. `Bearer eyJ...`, kept in a secret), `stream_prefix` and `work_dir` (a volume path for the
# MAGIC table and its checkpoint). Outside Databricks: the environment variables `DURASTREAM_URL`,
# MAGIC `DURASTREAM_AUTH_HEADER`, `DURASTREAM_STREAM_PREFIX` and `DURASTREAM_WORK_DIR`.

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
# MAGIC ## A stream with some events
# MAGIC
# MAGIC In production another system appends to the stream; here the notebook does it with the sink.

# COMMAND ----------

STREAM = f"{STREAM_PREFIX}/events-{RUN_ID}"
EVENT_SCHEMA = "id BIGINT, device STRING, temperature DOUBLE, at TIMESTAMP"


def append_events(first, count):
    """Append `count` events with ids from `first` to the stream."""
    events = spark.range(first, first + count, 1, 2).selectExpr(
        "id",
        "CONCAT('device-', id % 5) AS device",
        "ROUND(20 + (id % 7) * 0.5, 1) AS temperature",
        "TIMESTAMP_SECONDS(1714521600 + id) AS at",
    )
    events.write.format("durastream").options(**CONN).option("stream", STREAM).mode("append").save()


append_events(0, 500)
print(f"stream: {STREAM}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Where to ingest: Delta if available, parquet otherwise
# MAGIC
# MAGIC To ingest into a Unity Catalog table instead of a path, replace `.start(TABLE_PATH)` below with
# MAGIC `.toTable("<catalog>.<schema>.<table>")` and read it back with `spark.read.table(...)`.

# COMMAND ----------


def delta_available():
    """Delta Lake is always there on Databricks; elsewhere only if the session was set up for it."""
    if ON_DATABRICKS:
        return True
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return "DeltaSparkSessionExtension" in extensions


TABLE_FORMAT = "delta" if delta_available() else "parquet"
BASE = f"{WORK_DIR}/03_incremental_ingest-{RUN_ID}"
TABLE_PATH = f"{BASE}/events"
CHECKPOINT = f"{BASE}/checkpoints/events"
print(f"table: {TABLE_FORMAT} at {TABLE_PATH}\ncheckpoint: {CHECKPOINT}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The ingest job
# MAGIC
# MAGIC `run_ingest` is what a scheduled job would run. `ingest_run` only labels the rows of each run, to show
# MAGIC what each run added. (To keep runs of this demo apart, every run of the notebook uses a new stream, table
# MAGIC and checkpoint, and the reruns happen below in the same notebook; a real job keeps `STREAM`, `TABLE_PATH`
# MAGIC and `CHECKPOINT` fixed from one run to the next.)

# COMMAND ----------

from pyspark.sql import functions as F


def run_ingest(run_number):
    """One AvailableNow run: everything appended since the last run, into the table. Returns the query."""
    reader = (
        spark.readStream.format("durastream")
        .options(**CONN)
        .option("streams", STREAM)
        .schema(EVENT_SCHEMA + ", _offset STRING")
    )
    if HAS_ADMISSION_CONTROL:  # Spark >= 4.2: bounded micro-batches; refused on older runtimes
        reader = reader.option("maxMessagesPerTrigger", 200)
    query = (
        reader.load()
        .withColumn("ingest_run", F.lit(run_number))
        .writeStream.format(TABLE_FORMAT)
        .option("checkpointLocation", CHECKPOINT)
        .trigger(availableNow=True)
        .start(TABLE_PATH)
    )
    query.awaitTermination()
    batches = []  # (batch id, rows) of the batches that had rows
    for progress in query.recentProgress:
        # Summed over the sources: over Spark Connect, progress["numInputRows"] is None.
        rows = sum(source["numInputRows"] for source in progress["sources"])
        if rows:
            batches.append((progress["batchId"], rows))
    batches_by_run[run_number] = batches
    print(f"run {run_number}: (batch id, rows) = {batches}")
    return query


batches_by_run = {}


def table():
    return spark.read.format(TABLE_FORMAT).load(TABLE_PATH)


run_ingest(1)
first_run_rows = table().count()
print(f"the table has {first_run_rows} rows")

# COMMAND ----------

display(
    table()
    .groupBy("ingest_run")
    .agg(F.count("*").alias("rows"), F.min("id"), F.max("id"))
    .orderBy("ingest_run")
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## New data arrives; run the job again
# MAGIC
# MAGIC 300 more events. The second run starts at the offsets in the checkpoint and reads only those.

# COMMAND ----------

append_events(500, 300)
run_ingest(2)

new_rows = table().where("ingest_run = 2")
second_run_new_rows = new_rows.count()
new_ids = tuple(new_rows.agg(F.min("id"), F.max("id")).first())
total_rows = table().count()
duplicate_ids = total_rows - table().select("id").distinct().count()
print(
    f"run 2 added {second_run_new_rows} rows (ids {new_ids[0]}..{new_ids[1]}); total {total_rows}"
)
assert second_run_new_rows == 300 and duplicate_ids == 0

# COMMAND ----------

display(
    table()
    .groupBy("ingest_run")
    .agg(F.count("*").alias("rows"), F.min("id"), F.max("id"))
    .orderBy("ingest_run")
)

# COMMAND ----------

# MAGIC %md
# MAGIC Nothing new: a run finds nothing to do and adds nothing.

# COMMAND ----------

run_ingest(3)
third_run_new_rows = table().where("ingest_run = 3").count()
print(f"run 3 added {third_run_new_rows} rows")
