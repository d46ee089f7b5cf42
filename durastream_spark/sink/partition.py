"""One task attempt's write: route rows to target streams, check the targets, drive the mode's writer.

``PartitionWrite.write_arrow`` / ``write_rows`` consume Spark's input, encode it (``encoding.py``), split it by
target stream (the ``stream`` column, else the ``stream`` option), make sure each target is usable
(``targets.py``) and hand the encoded rows to the mode's partition writer (``transactional.py`` or
``ordered.py``). They return the commit message only after every request of the attempt succeeded; on any
failure they stop, let the mode writer clean up what it can, and re-raise.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from durastream_spark.errors import BadRequest
from durastream_spark.sink.encoding import (
    ArrowPayloadEncoder,
    EncodedRows,
    RowPayloadEncoder,
)
from durastream_spark.sink.errors import InvalidPayload, UnsupportedWrite
from durastream_spark.sink.identity import TaskIdentity
from durastream_spark.sink.messages import SinkCommitMessage
from durastream_spark.sink.mode_writer import ModeWriter
from durastream_spark.sink.options import TRANSACTIONAL
from durastream_spark.sink.ordered import OrderedPartitionWriter
from durastream_spark.sink.plan import SinkPlan
from durastream_spark.sink.producer import RequestPool
from durastream_spark.sink.targets import TargetStreams
from durastream_spark.sink.transactional import TransactionalPartitionWriter
from durastream_spark.worker_heap import freeze_startup_heap

log = logging.getLogger(__name__)

ROW_CHUNK = 4096  # rows encoded together on the row path


class PartitionWrite:
    """Writes one task attempt's input. Use once."""

    def __init__(self, plan: SinkPlan, identity: TaskIdentity) -> None:
        freeze_startup_heap()
        self._plan = plan
        self._identity = identity
        self._targets = TargetStreams(plan.client, plan.options)
        self._paths: dict[str | None, str] = {}

    def write_arrow(self, batches: Iterable[pa.RecordBatch]) -> SinkCommitMessage:
        encoder = ArrowPayloadEncoder(self._plan.layout)

        def feed(writer: ModeWriter) -> None:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                payloads = encoder.encode(batch)
                streams = encoder.streams(batch)
                if streams is None:
                    self._add(writer, None, payloads)
                else:
                    self._route(writer, payloads, streams)

        return self._run(feed)

    def write_rows(self, rows: Iterator[Sequence[Any]]) -> SinkCommitMessage:
        encoder = RowPayloadEncoder(self._plan.layout)
        separator = self._plan.layout.separator

        def feed(writer: ModeWriter) -> None:
            # Rows keep their order per stream; chunks only amortise the per-call overhead.
            pending: dict[str | None, list[bytes]] = {}
            count = 0
            for row in rows:
                pending.setdefault(encoder.stream_of(row), []).append(encoder.encode(row))
                count += 1
                if count == ROW_CHUNK:
                    self._flush_rows(writer, pending, separator)
                    pending, count = {}, 0
            self._flush_rows(writer, pending, separator)

        return self._run(feed)

    # ---- internals ---------------------------------------------------------------------------------------

    def _run(self, feed: Any) -> SinkCommitMessage:
        plan, identity = self._plan, self._identity
        sent_before, retried_before = plan.client.counts.snapshot()
        pool = RequestPool(plan.options.max_in_flight)
        json_framing = plan.layout.json_stream
        writer_class = (
            TransactionalPartitionWriter if plan.mode == TRANSACTIONAL else OrderedPartitionWriter
        )
        writer: ModeWriter = writer_class(
            plan.client, plan.options, identity, pool, json_framing=json_framing
        )
        try:
            feed(writer)
            parts = writer.finish()
        except BaseException as error:
            pool.shutdown()
            try:
                writer.discard()
            except Exception:  # the original failure is what matters; discard is best effort
                log.exception("cleaning up after a failed write of %s", identity.describe())
            if isinstance(error, BadRequest) and plan.layout.value_index is not None:
                raise InvalidPayload(
                    f"{error} The 'value' column is written as-is: for contentType "
                    f"'{plan.options.content_type}' every value must be one complete JSON text (e.g. "
                    "built with to_json), or write to a stream of another content type."
                ) from error
            raise
        pool.shutdown()
        sent, retried = plan.client.counts.snapshot()
        message = SinkCommitMessage(
            mode=plan.mode,
            writer_key=identity.writer_key,
            epoch=identity.epoch,
            partition=identity.partition,
            attempt=identity.attempt,
            producer_id=writer.producer_id,
            parts=parts,
            requests=sent - sent_before,
            retries=retried - retried_before,
        )
        log.info(
            "%s wrote %d rows to %d stream(s) in %s mode",
            identity.describe(),
            message.rows,
            len(parts),
            plan.mode,
        )
        return message

    def _flush_rows(
        self, writer: ModeWriter, pending: dict[str | None, list[bytes]], separator: int
    ) -> None:
        for stream, payloads in pending.items():
            writer.add(self._path(stream), EncodedRows.from_payloads(payloads, separator))

    def _add(self, writer: ModeWriter, stream: str | None, payloads: pa.Array) -> None:
        writer.add(
            self._path(stream), EncodedRows.from_arrow(payloads, self._plan.layout.separator)
        )

    def _route(self, writer: ModeWriter, payloads: pa.Array, streams: pa.Array) -> None:
        distinct = pc.unique(streams)
        if len(distinct) == 1:
            self._add(writer, distinct[0].as_py(), payloads)
            return
        for value in distinct.to_pylist():
            mask = pc.is_null(streams) if value is None else pc.equal(streams, value)
            self._add(writer, value, payloads.filter(mask))

    def _path(self, stream: str | None) -> str:
        """The validated target path of a ``stream`` value (None: the ``stream`` option)."""
        path = self._paths.get(stream)
        if path is not None:
            return path
        options = self._plan.options
        if stream is None:
            if options.stream is None:
                raise UnsupportedWrite(
                    "A row has a null 'stream' column and the option 'stream' is not set, so it has no "
                    "target. Filter such rows out, or set the option as the default target."
                )
            path = options.stream
        else:
            path = stream.strip().strip("/")
            if not path or any(seg in ("", ".", "..") for seg in path.split("/")):
                raise UnsupportedWrite(
                    f"Column 'stream' holds {stream!r}, which is not a stream path (non-empty segments "
                    "other than '.' and '..', relative to 'url')."
                )
        self._targets.ensure(path)
        self._paths[stream] = path
        return path
