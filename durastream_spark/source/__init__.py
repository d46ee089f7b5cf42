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

Options (names are case-insensitive)
====================================

===========================  ===============  ==============================================================
option                       default          meaning
===========================  ===============  ==============================================================
``url``                      (required)       The stream root, e.g. ``http://127.0.0.1:4437/v1/stream``.
``streams``                  \\-               Comma-separated stream paths relative to ``url``. Exactly one
                                              of ``streams`` and ``pattern``.
``pattern``                  \\-               A glob over stream paths: ``*`` one segment, ``**`` any
                                              number, ``ev*`` inside a segment. Streams created while the
                                              query runs are picked up (from their first message). Needs
                                              the server's listing extension.
``startingOffsets``          ``earliest``     ``earliest``, ``latest``, or JSON ``{"path": "<offset>"}``
                                              (values may also be ``"earliest"``/``"latest"``; unlisted
                                              streams start at ``earliest``). Only for a new checkpoint.
``endingOffsets``            ``latest``       Batch reads only: ``latest`` or JSON (unlisted: ``latest``).
``startingTimestamp``        \\-               Start every stream at its first message appended at or after
                                              an instant (epoch ms, or ISO-8601 with a zone). Needs the
                                              server's time lookups.
``startingOffsetsBy          \\-               Per stream: ``{"path": <instant>}``; unlisted streams follow
Timestamp``                                   ``startingOffsets``.
``startingOffsetsBy          ``error``        A stream with no message that late: ``error`` fails the
TimestampStrategy``                           query, ``latest`` starts it at its tail.
``endingTimestamp``,         \\-               Batch reads only: end before the first message at or after
``endingOffsetsBy                             an instant (every stream, or per stream as JSON).
Timestamp``
``maxMessagesPerTrigger``    (none)           Spark >= 4.2: at most this many messages per micro-batch,
                                              shared across streams in proportion to their lag.
``maxBytesPerTrigger``       (none)           Spark >= 4.2: about this many payload bytes per micro-batch
                                              (``512k``, ``64m``, ``1g``); soft, like Spark's option of that
                                              name: a single larger message is still read whole.
``minMessagesPerTrigger``,   (none)           Spark >= 4.2: a trigger skips the batch until this many
``minBytesPerTrigger``                        messages (or bytes) wait, or ``maxTriggerDelay`` passed since
                                              the last batch. AvailableNow ignores them.
``maxTriggerDelay``          ``15m``          ... the longest wait after the last batch (its time is in the
                                              checkpoint, so restarts wait only what is left).
``failOnDataLoss``           ``true``         A deleted stream, a ``410 Gone`` or a stream now shorter than the
                                              checkpoint fails the query (naming stream and offsets). With
                                              ``false`` a warning is logged and the query continues.
``maxBytesPerPartition``     ``128m``         A stream's range in one batch is split into tasks of at most
                                              about this many bytes, at message boundaries.
``maxMessagesPerPartition``  (none)           ... and of at most this many messages.
``minPartitions``            (none)           At least this many tasks per batch (ranges are split further,
                                              in proportion to their size), like Kafka's option. Set it to
                                              the number of executor cores to let one stream use them all.
``fallback.pinPrefix``       ``__durastream   Servers without bounded reads only: where batch ranges are
                             _pins``          pinned as forks (see below).
``fallback.pinTtl``          ``24h``          ... and how long an unused pin lives.
``header.<Name>``,           \\-               Connection options shared with the sink (headers, bearer
``tokenFile``, ``tls.*``,                     token file, TLS, timeouts, retries): see
``retry.*``, ...                              ``durastream_spark.options``.
===========================  ===============  ==============================================================

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
the Python worker round trip), so tasks should be large: the default ``maxBytesPerPartition`` is 256 MiB,
twice Spark's file source's, and ``minPartitions`` (for example the executor core count) spreads a
smaller backlog over every core. Splits are found with the server's limit lookups, at message boundaries.

Spark versions
==============
Spark >= 4.2 has admission control for Python sources: ``maxMessagesPerTrigger``/``maxBytesPerTrigger`` and a
native ``Trigger.AvailableNow`` (several batches, each within the limits, up to the tails at start).
``progress.sources[].latestOffset`` shows every stream's tail, so lag is visible. On Spark 4.0/4.1 the source
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

from durastream_spark.source.options import SourceOptions

DEFAULT_SCHEMA = "stream STRING, offset STRING, value BINARY, timestamp TIMESTAMP"


def default_schema(options: Mapping[str, str]) -> str:
    """The schema of a read without a user schema. Validates the options, so bad ones fail ``load()``."""
    SourceOptions.parse(options)
    return DEFAULT_SCHEMA


def batch_reader(options: Mapping[str, str], schema: StructType) -> DataSourceReader:
    from durastream_spark.source.batch import DurableStreamBatchReader

    return DurableStreamBatchReader(SourceOptions.parse(options), schema)


def stream_reader(options: Mapping[str, str], schema: StructType) -> DataSourceStreamReader:
    from durastream_spark.source.stream import DurableStreamStreamReader

    return DurableStreamStreamReader(SourceOptions.parse(options), schema)
