# Databricks notebook source
# MAGIC %md
# MAGIC # 01 · Quickstart: read a Durable Stream into Spark
# MAGIC
# MAGIC This notebook registers the `durastream` data source, writes a few orders into a new stream (with the
# MAGIC connector's sink and with one plain HTTP request), reads them back with a batch read, and parses the
# MAGIC JSON messages into typed columns with a schema.
# MAGIC
# MAGIC **Runtime.** Custom Python data sources need **Databricks Runtime 15.4 LTS or later**, or **serverless
# MAGIC environment 2 or later**. Everything in this notebook (batch reads and batch writes) works on all of
# MAGIC them. Admission control (`maxMessagesPerTrigger`, `maxBytesPerTrigger`) and native
# MAGIC `Trigger.AvailableNow` need a Spark 4.2 or later runtime; this notebook uses neither.
# MAGIC
# MAGIC **Configuration.** Set the widgets at the top: `durastream_url` is the stream root
# MAGIC (e.g. `https://streams.example.com/v1/stream`). If the server needs an `Authorization` header, store
# MAGIC its whole value (e.g. `Bearer eyJ...`) in a secret and set `secret_scope` and `secret_key`. Run outside
# MAGIC Databricks, the notebook reads the environment variables `DURASTREAM_URL`,
# MAGIC `DURASTREAM_AUTH_HEADER`, `DURASTREAM_STREAM_PREFIX` and `DURASTREAM_WORK_DIR` instead.

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

# MAGIC %md
# MAGIC ## Register the data source
# MAGIC
# MAGIC Once per Spark session. After this, `format("durastream")` works for `spark.read`, `spark.readStream`,
# MAGIC `df.write` and `df.writeStream`.

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
# MAGIC ## Write a few messages
# MAGIC
# MAGIC With the sink: a DataFrame without a `value` column becomes one JSON object per row. The sink creates the
# MAGIC stream (`application/json`) and writes exactly once (see notebook 02).

# COMMAND ----------

import datetime as dt

STREAM = f"{STREAM_PREFIX}/quickstart-{RUN_ID}"
UTC = dt.timezone.utc
orders = spark.createDataFrame(
    [
        (1, "alice", "book", 12.50, dt.datetime(2024, 5, 1, 10, 0, tzinfo=UTC)),
        (2, "bob", "pen", 1.20, dt.datetime(2024, 5, 1, 10, 5, tzinfo=UTC)),
        (3, "alice", "lamp", 30.00, dt.datetime(2024, 5, 1, 11, 0, tzinfo=UTC)),
        (4, "carol", "book", 12.50, dt.datetime(2024, 5, 1, 11, 30, tzinfo=UTC)),
    ],
    "id BIGINT, customer STRING, item STRING, amount DOUBLE, at TIMESTAMP",
)
orders.write.format("durastream").options(**CONN).option("stream", STREAM).mode("append").save()
print(f"wrote {orders.count()} orders to {STREAM}")

# COMMAND ----------

# MAGIC %md
# MAGIC Any other producer can append too. The Durable Streams protocol is plain HTTP: a `POST` of a JSON array
# MAGIC to a JSON stream appends each element as one message.

# COMMAND ----------

import json

import requests

headers = {"Content-Type": "application/json"}
if AUTH_HEADER:
    headers["Authorization"] = AUTH_HEADER
more_orders = [
    {"id": 5, "customer": "bob", "item": "book", "amount": 12.5, "at": "2024-05-01T12:00:00Z"},
    {"id": 6, "customer": "dave", "item": "pen", "amount": 1.2, "at": "2024-05-01T12:10:00Z"},
]
response = requests.post(
    f"{DURASTREAM_URL}/{STREAM}", data=json.dumps(more_orders), headers=headers, timeout=30
)
response.raise_for_status()
print("appended; the stream's tail is now", response.headers.get("Stream-Next-Offset"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Read it back
# MAGIC
# MAGIC Without a schema, every message is one row: `stream`, `offset` (the message's offset), `value` (the JSON
# MAGIC bytes) and `timestamp` (the server's append time). A batch read takes everything up to the tails at the
# MAGIC time of the read (`endingOffsets=latest`).

# COMMAND ----------

raw = spark.read.format("durastream").options(**CONN).option("streams", STREAM).load()
raw.printSchema()
display(raw.selectExpr("stream", "offset", "CAST(value AS STRING) AS value", "timestamp"))
raw_count = raw.count()

# COMMAND ----------

# MAGIC %md
# MAGIC ## Parse with a schema
# MAGIC
# MAGIC With `.schema(...)`, each message must be a JSON object; its keys fill the columns of the same name,
# MAGIC parsed straight into typed columns (no `from_json`). The reserved columns `_stream`, `_offset`,
# MAGIC `_timestamp` and `_value` give the metadata.

# COMMAND ----------

typed = (
    spark.read.format("durastream")
    .options(**CONN)
    .option("streams", STREAM)
    .schema(
        "id BIGINT, customer STRING, item STRING, amount DOUBLE, at TIMESTAMP, "
        "_offset STRING, _timestamp TIMESTAMP"
    )
    .load()
)
display(typed.orderBy("id"))
typed_rows = [row.asDict() for row in typed.orderBy("id").collect()]

# COMMAND ----------

# MAGIC %md
# MAGIC It is an ordinary DataFrame from here on:

# COMMAND ----------

from pyspark.sql import functions as F

per_customer = (
    typed.groupBy("customer")
    .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total"))
    .orderBy("customer")
)
display(per_customer)
totals = {row["customer"]: row["total"] for row in per_customer.collect()}
print(f"{raw_count} messages in {STREAM}; totals per customer: {totals}")

# COMMAND ----------

# MAGIC %md
# MAGIC **Next:** `02_exactly_once_sink` writes a stream exactly once from a streaming query, and
# MAGIC `03_incremental_ingest` ingests a stream into a table incrementally with `Trigger.AvailableNow`.
