"""The classes Spark sees: batch and streaming writers, Arrow-based where the Spark version allows.

They are thin: ``write`` names the task (``identity.py``) and hands the input to ``PartitionWrite``;
``commit``/``abort`` hand the commit messages to ``commit.py``. Spark pickles a writer into every task and,
for streaming, builds a fresh one for every commit, so a writer holds only the (picklable) plan.

- ``df.write``: ``DurastreamBatchWriter`` (a ``DataSourceArrowWriter``, Spark >= 4.0). Its writer key is a
  job id minted in the plan, so the tasks and the commit agree on it.
- ``writeStream``: ``DurastreamStreamArrowWriter`` on Spark >= 4.1 (``DataSourceStreamArrowWriter``: record
  batches, vectorised encoding), else ``DurastreamStreamWriter`` (rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from durastream_spark.boundary import spark_entry_points
from durastream_spark.compat import HAS_STREAM_ARROW_WRITER
from durastream_spark.figures import record_sink
from durastream_spark.sink.commit import BatchFigures, abort_batch, commit_batch
from durastream_spark.sink.identity import TaskIdentity
from durastream_spark.sink.messages import SinkCommitMessage
from durastream_spark.sink.partition import PartitionWrite
from durastream_spark.sink.plan import SinkPlan


@spark_entry_points
class DurastreamBatchWriter(DataSourceArrowWriter):
    """``df.write.format("durastream").mode("append").save()``."""

    last_batch: BatchFigures | None = None  # the figures of the last commit (its INFO line)

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        assert self.plan.job_id is not None
        identity = TaskIdentity.of_batch_task(self.plan.job_id)
        return PartitionWrite(self.plan, identity).write_arrow(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        # The batch's figures (also one INFO line), for code that holds the writer.
        self.last_batch = commit_batch(self.plan.client, self.plan.options, messages, batch_id=None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        """Transactional: discards the staged data named in ``messages``; nothing became visible. Ordered:
        the full requests sent by successful tasks stay visible (a failed job is not replayed)."""
        abort_batch(self.plan.client, messages, batch_id=None)


@spark_entry_points
class _StreamingCommit:
    """``commit``/``abort`` of the streaming writers (one micro-batch, ``batchId`` = epoch)."""

    plan: SinkPlan
    last_batch: BatchFigures | None = None  # the figures of the last commit (its INFO line)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self.last_batch = commit_batch(
            self.plan.client, self.plan.options, messages, batch_id=batchId
        )
        figures = self.plan.options.figures
        if figures.directory is not None and self.last_batch.writer_key is not None:
            record_sink(  # keyed by the query's id and the batch (figures.py)
                figures,
                self.last_batch.writer_key,
                batchId,
                self.last_batch.totals(),
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Transactional: discards the staged data named in ``messages`` (handles of failed attempts
        expire with their TTL); nothing of the batch became visible. Ordered: full requests already sent
        stay visible until the batch is replayed from the checkpoint, which deduplicates them."""
        abort_batch(self.plan.client, messages, batch_id=batchId)


@spark_entry_points
class DurastreamStreamWriter(_StreamingCommit, DataSourceStreamWriter):
    """``writeStream`` on Spark 4.0: rows."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return PartitionWrite(self.plan, TaskIdentity.of_streaming_task()).write_rows(iterator)


if HAS_STREAM_ARROW_WRITER:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    @spark_entry_points
    class DurastreamStreamArrowWriter(_StreamingCommit, DataSourceStreamArrowWriter):
        """``writeStream`` on Spark >= 4.1: Arrow record batches."""

        def __init__(self, plan: SinkPlan) -> None:
            self.plan = plan

        def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
            return PartitionWrite(self.plan, TaskIdentity.of_streaming_task()).write_arrow(iterator)

    STREAM_WRITER: type = DurastreamStreamArrowWriter
else:  # pragma: no cover - Spark 4.0
    STREAM_WRITER = DurastreamStreamWriter
