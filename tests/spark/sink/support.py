"""Helpers of the sink tests: read streams back over HTTP, check exactly-once, drive writers by hand."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.sink.identity import TaskIdentity
from durastream_spark.sink.messages import SinkCommitMessage
from durastream_spark.sink.partition import PartitionWrite
from durastream_spark.sink.plan import STREAMING, SinkPlan, plan_write

_names = itertools.count()

# The rows the writer-level tests write: (p: partition, n: unique key, pad), in Spark and Arrow terms.
ROW_SCHEMA = StructType(
    [StructField("p", LongType()), StructField("n", LongType()), StructField("pad", StringType())]
)
ROW_ARROW_SCHEMA = pa.schema([("p", pa.int64()), ("n", pa.int64()), ("pad", pa.string())])


def unique(prefix: str) -> str:
    """A stream path no other test uses (the session server is shared)."""
    return f"sink-tests/{prefix}-{os.getpid()}-{next(_names)}"


def client_for(root: str) -> StreamClient:
    return StreamClient(ConnectionOptions(url=root))


def read_bytes(root: str, path: str) -> bytes:
    """The whole body of a stream, read with plain catch-up GETs."""
    return b"".join(chunk.body for chunk in client_for(root).iter_range(path, "-1", None))


def read_stream(root: str, path: str, **loads: Any) -> list[Any]:
    """Every message of a JSON stream, in stream order (``loads``: ``json.loads`` keyword arguments)."""
    messages: list[Any] = []
    for chunk in client_for(root).iter_range(path, "-1", None):
        if chunk.body:
            messages.extend(json.loads(chunk.body, **loads))
    return messages


def assert_exactly_once(
    messages: Sequence[dict[str, Any]],
    expected: Iterable[Any],
    *,
    key: str = "n",
    partition: str | None = "p",
) -> None:
    """Each expected key exactly once (no loss, no duplicate), and each partition's keys increasing."""
    seen = [m[key] for m in messages]
    counts: dict[Any, int] = defaultdict(int)
    for value in seen:
        counts[value] += 1
    duplicates = sorted(v for v, n in counts.items() if n > 1)
    wanted = set(expected)
    missing = sorted(wanted - counts.keys())
    unexpected = sorted(counts.keys() - wanted)
    assert not duplicates, f"{len(duplicates)} duplicated rows, e.g. {duplicates[:10]}"
    assert not missing, f"{len(missing)} rows lost, e.g. {missing[:10]}"
    assert not unexpected, f"{len(unexpected)} unexpected rows, e.g. {unexpected[:10]}"
    if partition is not None:
        by_partition: dict[Any, list[Any]] = defaultdict(list)
        for message in messages:
            by_partition[message[partition]].append(message[key])
        for part, keys in by_partition.items():
            assert keys == sorted(keys), f"partition {part}: rows out of order"


@contextlib.contextmanager
def spark_conf(spark: Any, **settings: str) -> Iterator[None]:
    """Set SQL confs for one test and restore the previous values after it."""
    names = {name.replace("__", "."): value for name, value in settings.items()}
    previous = {name: spark.conf.get(name, None) for name in names}
    for name, value in names.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


class WriterHarness:
    """Runs the sink's task-side and driver-side code by hand, for what Spark cannot be made to do on
    demand (two concurrent attempts of one task, a zombie from an older batch, a reordered retry).

    Everything below ``write()``'s ``TaskContext`` lookup is the production path: ``PartitionWrite`` with an
    explicit ``TaskIdentity``, and ``commit_batch`` through the Spark writer's ``commit``.
    """

    def __init__(self, options: dict[str, str], schema: StructType, query_id: str) -> None:
        self.options = options
        self.schema = schema
        self.query_id = query_id
        self.plan: SinkPlan = plan_write(options, schema, False, kind=STREAMING)

    def write(
        self,
        batches: Iterable[pa.RecordBatch],
        *,
        epoch: int,
        partition: int,
        attempt: int,
    ) -> SinkCommitMessage:
        identity = TaskIdentity(self.query_id, epoch, partition, attempt)
        return PartitionWrite(self.plan, identity).write_arrow(batches)

    def write_rows(
        self, rows: Iterable[Sequence[Any]], *, epoch: int, partition: int, attempt: int
    ) -> SinkCommitMessage:
        """The row writer's path (Spark 4.0 streaming)."""
        identity = TaskIdentity(self.query_id, epoch, partition, attempt)
        return PartitionWrite(self.plan, identity).write_rows(iter(rows))

    def commit(self, messages: Sequence[SinkCommitMessage], epoch: int) -> None:
        from durastream_spark.sink import stream_writer

        # A fresh writer per commit, as Spark does.
        stream_writer(self.options, self.schema, False).commit(list(messages), epoch)


def record_batches(
    schema: pa.Schema, rows: Sequence[dict[str, Any]], size: int
) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_pylist(list(rows[i : i + size]), schema=schema)
        for i in range(0, len(rows), size)
    ]


def rate_rows(
    spark: Any, rows_per_batch: int, n: Callable[[Any], Any] | None = None, pad: str = "x"
):
    """Streaming input: ``rate-micro-batch`` batches of ``rows_per_batch`` rows in two partitions, as
    ``(p: partition id, n: the value, through ``n`` if given, pad: 1 KiB of ``pad``)``. Batches replay
    identically, and 1 KiB rows reach the writer long before a failure later in the partition."""
    from pyspark.sql import functions as F

    value = F.col("value")
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 2)
        .load()
        .select(
            F.spark_partition_id().alias("p"),
            (n(value) if n is not None else value).alias("n"),
            F.lit(pad * 1000).alias("pad"),
        )
    )
