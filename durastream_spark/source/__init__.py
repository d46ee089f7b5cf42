"""The durastream source: ``spark.readStream`` / ``spark.read`` ``.format("durastream")``.

Stream offsets become replay-deterministic micro-batch offsets: each batch is an exact range ``[start, end)``
of every stream, re-read identically after any failure or restart, with admission control, Trigger.AvailableNow
and one large stream split across tasks.

Example
=======
::

    from durastream_spark import DurableStreamDataSource
    spark.dataSource.register(DurableStreamDataSource)

    events = (
        spark.readStream.format("durastream")
        .option("url", "http://127.0.0.1:4437/v1/stream")
        .option("pattern", "events/*")                 # or .option("streams", "events/a,events/b")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", 100000)       # Spark >= 4.2
        .schema("id BIGINT, kind STRING, at TIMESTAMP, _offset STRING")  # optional: typed JSON columns
        .load()
    )
    events.writeStream.trigger(availableNow=True).option("checkpointLocation", "/chk/events") \\
        .toTable("bronze.events")

    # A bounded batch read of the same streams:
    snapshot = spark.read.format("durastream").option("url", ...).option("streams", "events/a").load()

Options
=======
Every option (names are case-insensitive), its default, accepted values and the error a bad value gets:
``docs/options.md``, generated from ``source/options.py`` and ``durastream_spark/options.py``. In short:
``url`` and one of ``streams``/``pattern`` are required; ``startingOffsets``/``endingOffsets`` and
``startingTimestamp``/``endingTimestamp`` (with their per-stream ``...ByTimestamp`` forms) as in Kafka;
``maxMessagesPerTrigger``/``maxBytesPerTrigger``, ``minMessagesPerTrigger``/``minBytesPerTrigger`` and
``maxTriggerDelay`` (Spark >= 4.2), ``failOnDataLoss``, task sizing
(``maxBytesPerPartition``, ``maxMessagesPerPartition``, ``minPartitions``) and the connection options
(headers, token file, TLS, timeouts, retries) shared with the sink.

Rows
====
The default schema is ``stream STRING, offset STRING, value BINARY, timestamp TIMESTAMP``:

- ``stream``: the stream's path; ``offset``: the message's own offset (as a ``startingOffsets`` value it
  starts a query at this message); ``timestamp``: the server's append time (null where it gives none).
- JSON streams (``application/json``): one row per message (one JSON value, bytes as stored).
- Other content types: one row per append request (its body, as the server stored it). Deterministic: the
  boundaries are the appends, not the read chunks.

With a user schema (``.schema(...)``), each message must be a JSON object: its top-level keys fill the columns
of the same name, parsed by Arrow's JSON reader into typed columns (faster than ``from_json``). Reserved
column names give the metadata instead: ``_stream STRING``, ``_offset STRING``, ``_timestamp TIMESTAMP`` and
``_value BINARY`` (the raw message). Supported JSON column types and the error for others are described in
``durastream_spark.source.arrow``.

Offsets in the checkpoint
=========================
Readable JSON ``{"<stream path>": "<offset>", ...}`` (``"-1"``: nothing read yet). See
``durastream_spark.source.offsets``, which also explains why ``startingOffsets=latest`` gives an empty first
batch: Python sources get no checkpoint directory, so the first batch is what records the resolved tails.

Tasks
=====
Each stream's range is at least one task. Every Python task costs Spark a fixed ~50-100 ms (scheduling,
the Python worker round trip), so tasks should be large: ``maxBytesPerPartition`` defaults to 256 MiB,
twice Spark's file source's 128 MiB, and ``minPartitions`` (for example the executor core count) spreads a
smaller backlog over every core. Splits are found with the server's limit lookups, at message boundaries.

Spark versions
==============
Spark >= 4.2 has admission control for Python sources: ``maxMessagesPerTrigger``/``maxBytesPerTrigger`` and a
native ``Trigger.AvailableNow`` (several batches, each within the limits, up to the tails at start).
``progress.sources[].latestOffset`` shows every stream's tail; ``docs/source.md`` ("Lag") says how to read
lag in messages and bytes. On Spark 4.0/4.1 the source
works without limits (the options are refused at start), and AvailableNow runs as one batch.

Servers without the extensions
==============================
Against the Node reference server (no ``Durastream-Extensions``), batches stay replay-deterministic by
reading each range through a closed fork pinned at the batch's end (``durastream_spark.source.fallback``).
Rows then have a null ``timestamp`` and, as ``offset``, the offset their read started from. ``pattern`` lists
streams through the protocol's subscriptions (section 6) when the server has them; per-trigger limits run
as one batch under AvailableNow and are refused otherwise; instants and task splitting need the
extensions. A server that cannot fork either (rakaia) is refused. See docs/compatibility.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from durastream_spark.source import arrow
from durastream_spark.source.options import SourceOptions

# The default schema as users read it in the docs; ``arrow.DEFAULT_SCHEMA`` is the same columns, with the
# ``stream`` column marked as the source's (``columns.SOURCE_STREAM_MARK``: the sink refuses to route by it).
DEFAULT_SCHEMA = "stream STRING, offset STRING, value BINARY, timestamp TIMESTAMP"


def default_schema(options: Mapping[str, str]) -> StructType:
    """The schema of a read without a user schema (``DEFAULT_SCHEMA``, the ``stream`` column marked).
    Validates the options, so bad ones fail ``load()``."""
    SourceOptions.parse(options)
    return arrow.DEFAULT_SCHEMA


def batch_reader(options: Mapping[str, str], schema: StructType) -> DataSourceReader:
    from durastream_spark.source.batch import DurableStreamBatchReader

    parsed = SourceOptions.parse(options)
    parsed.figures.refuse_outside_streaming("a batch read (spark.read)")
    return DurableStreamBatchReader(parsed, schema)


def stream_reader(options: Mapping[str, str], schema: StructType) -> DataSourceStreamReader:
    from durastream_spark.errors import DurastreamError
    from durastream_spark.source.stream import DurableStreamStreamReader, RefusedStreamReader

    try:
        return DurableStreamStreamReader(SourceOptions.parse(options), schema)
    except DurastreamError as error:  # raised here, Spark would report an UnboundLocalError instead
        return RefusedStreamReader(error)
