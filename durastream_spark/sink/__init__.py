"""The durastream sink: ``df.writeStream``/``df.write.format("durastream")``, exactly once.

Usage::

    (df.writeStream.format("durastream")
        .option("url", "http://127.0.0.1:4437/v1/stream")
        .option("stream", "events/clicks")
        .option("checkpointLocation", "/checkpoints/clicks")
        .start())

    df.write.format("durastream").option("url", ...).option("stream", "events/daily").mode("append").save()

Payload: a ``value`` column (STRING or BINARY) is written as-is, one message per row; for JSON streams each
value must be one JSON text (a null value is written as JSON ``null``; for other content types it adds
nothing). Without a ``value`` column every row becomes one JSON object (see
``encoding.py`` for how each Spark type is rendered). A STRING ``stream`` column routes each row to the
stream it names and wins over the ``stream`` option (which stays the target of rows whose column is null);
it is not part of the payload. For non-JSON streams the protocol keeps no message boundaries inside one
request: values are concatenated, so end each with a delimiter (or set ``maxMessagesPerRequest=1``).

Options: ``stream``, ``contentType``, ``createStreams``, ``exactlyOnce``, ``producerId``,
``maxMessagesPerRequest``, ``maxBytesPerRequest``, ``maxInFlight``, ``transactionTtl``, and the connection
options shared with the source. Their defaults, accepted values and errors are in ``docs/options.md``,
generated from ``sink/options.py`` (``python -m durastream_spark.docs``), so they are not repeated here.

After each batch, the driver-side commit logs a summary per target stream (rows, bytes, partitions, final
offset) at INFO on the ``durastream_spark.sink.commit`` logger, in Spark's Python commit process.

How exactly-once works, and under which conditions: ``docs/guarantees.md``, ``transactional.py`` and
``ordered.py``; the writers Spark sees: ``writer.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from durastream_spark.sink.plan import BATCH, STREAMING, plan_write
from durastream_spark.sink.writer import STREAM_WRITER, DurastreamBatchWriter


def batch_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceWriter:
    return DurastreamBatchWriter(plan_write(options, schema, overwrite, kind=BATCH))


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceStreamWriter:
    return STREAM_WRITER(plan_write(options, schema, overwrite, kind=STREAMING))
