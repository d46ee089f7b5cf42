"""One task attempt's write: check the payloads, route rows to target streams, drive the mode's writer.

``PartitionWrite.write_arrow`` / ``write_rows`` consume Spark's input, encode it (``encoding.py``), check
that each JSON ``value`` is one JSON text (``json_values.py``: a batch is checked before any of its rows go
into a request), split it by target stream (``routing.py``: the ``stream`` option, else the normalised
``stream`` column, each target's rows in input order), make sure each target is usable (``targets.py``)
and hand the encoded rows to the mode's partition writer (``transactional.py`` or ``ordered.py``). They
return the commit message only after every request of the attempt succeeded; on any failure they stop,
let the mode writer clean up what it can, and re-raise.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from durastream_spark.errors import BadRequest, StreamNotFound
from durastream_spark.protocol.bulk import BulkWrites
from durastream_spark.sink import json_values, routing
from durastream_spark.sink.encoding import (
    VALUE_COLUMN,
    ArrowPayloadEncoder,
    EncodedRows,
    RowPayloadEncoder,
)
from durastream_spark.sink.errors import InvalidPayload
from durastream_spark.sink.identity import TaskIdentity
from durastream_spark.sink.messages import SinkCommitMessage
from durastream_spark.sink.mode_writer import ModeWriter
from durastream_spark.sink.options import TRANSACTIONAL
from durastream_spark.sink.ordered import OrderedPartitionWriter
from durastream_spark.sink.plan import STREAMING, SinkPlan
from durastream_spark.sink.producer import RequestPool
from durastream_spark.sink.targets import BATCH_JOBS, TargetStreams, forget_query, query_targets
from durastream_spark.sink.transactional import TransactionalPartitionWriter
from durastream_spark.worker_heap import collections_held, freeze_startup_heap

log = logging.getLogger(__name__)
# Phase stamps of a task at DEBUG (its write's start, the input split and encoded, ``finish`` done): the
# record's own time is the stamp. Off unless a handler enables this logger (bench/sink_fanout_bench.py
# --phases), so a routed save's wall can be split by phase across Spark's Python workers.
phases = logging.getLogger("durastream_spark.phases")

ROW_CHUNK = 4096  # rows encoded together on the row path
# Routed Arrow input: consecutive batches are split by target together, up to this many payload bytes.
ROUTE_BYTES = 16 * 1024 * 1024


class _Pending:
    """Routed input batches not yet split: their routing values and payloads, in input order.

    Why: Spark hands a task its rows in batches of ``maxRecordsPerBatch`` (10,000) rows; routed to
    10,000 streams, each batch gave every stream one row, so the per-target work (a group, the
    batcher, the writer's bookkeeping) ran once per (batch, target) instead of once per target. The
    requests are the same either way: each stream's batcher gets the same rows in the same order.
    """

    def __init__(self) -> None:
        self._values: list[pa.Array] = []
        self._payloads: list[pa.Array] = []
        self._first = 0
        self.bytes = 0

    def add(self, values: pa.Array, payloads: pa.Array, position: int) -> None:
        if not self._values:
            self._first = position
        self._values.append(values)
        self._payloads.append(payloads)
        self.bytes += payloads.nbytes

    def take(self) -> tuple[pa.Array, pa.Array, int] | None:
        """The pending rows as one batch (routing values, payloads, the partition's row number of the
        first), and start afresh; None if there are none."""
        values, payloads, first = self._values, self._payloads, self._first
        self._values, self._payloads, self.bytes = [], [], 0
        if not values:
            return None
        return _concat(values), _concat(payloads), first


def _concat(arrays: list[pa.Array]) -> pa.Array:
    if len(arrays) == 1:
        return arrays[0]
    if len({array.type for array in arrays}) > 1:  # string and large_string (or binary): one type
        binary = any(pa.types.is_binary(a.type) or pa.types.is_large_binary(a.type) for a in arrays)
        wide = pa.large_binary() if binary else pa.large_string()
        arrays = [array.cast(wide) for array in arrays]
    return pa.concat_arrays(arrays)


class PartitionWrite:
    """Writes one task attempt's input. Use once."""

    def __init__(self, plan: SinkPlan, identity: TaskIdentity) -> None:
        freeze_startup_heap()
        self._plan = plan
        self._identity = identity
        # Whose ensured targets this task shares: a streaming query's (its earlier batches'), or every
        # df.write job's of this worker process (a daily job writing the same 10,000 streams again
        # ensured them all again: ~13% of its tasks' CPU). A target deleted meanwhile is answered 404
        # and ensured again (the stage here, the inline commit on the driver), exactly once.
        owner = identity.writer_key if plan.kind == STREAMING else BATCH_JOBS
        self._query = (plan.client.connection.url, owner, plan.options.content_type)
        known = None  # the targets this query's earlier tasks ensured (routed, bulk-write servers)
        routed_in_bulk = (
            plan.mode == TRANSACTIONAL
            and plan.routing.column is not None
            and BulkWrites(plan.client, plan.options.content_type).supported()
        )
        if routed_in_bulk:
            known = query_targets(self._query)
        self._targets = TargetStreams(plan.client, plan.options, known)
        self._checked: set[str] = set()
        # JSON values are checked to be one JSON text each; other payloads the sink renders itself.
        self._check_values = plan.layout.value_index is not None and plan.layout.json_stream
        self._position = 0  # rows of this partition seen so far (for errors)

    def write_arrow(self, batches: Iterable[pa.RecordBatch]) -> SinkCommitMessage:
        encoder = ArrowPayloadEncoder(self._plan.layout)
        column = self._plan.routing.column
        separator = self._plan.layout.separator

        def feed(writer: ModeWriter) -> None:
            pending = _Pending()  # routed: input batches split together (see ROUTE_BYTES)
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                payloads = encoder.encode(batch)
                if self._check_values:
                    self._raise_if_invalid(json_values.check_arrow(payloads), batch)
                if column is None:
                    self._position += batch.num_rows
                    self._add(writer, self._fixed(), payloads)
                    continue
                if pending.bytes and pending.bytes + payloads.nbytes > ROUTE_BYTES:
                    self._route(writer, pending.take(), separator)
                pending.add(batch.column(column), payloads, self._position)
                self._position += batch.num_rows
            self._route(writer, pending.take(), separator)

        return self._run(feed)

    def write_rows(self, rows: Iterator[Sequence[Any]]) -> SinkCommitMessage:
        encoder = RowPayloadEncoder(self._plan.layout)
        column = self._plan.routing.column

        def feed(writer: ModeWriter) -> None:
            # Rows keep their order per stream; chunks only amortise the per-call overhead.
            chunk: list[tuple[Sequence[Any], bytes]] = []
            for row in rows:
                chunk.append((row, encoder.encode(row)))
                if len(chunk) == ROW_CHUNK:
                    self._flush_rows(writer, chunk, column)
                    chunk = []
            self._flush_rows(writer, chunk, column)

        return self._run(feed)

    # ---- internals ---------------------------------------------------------------------------------------

    def _run(self, feed: Any) -> SinkCommitMessage:
        """The write, the collector held when routed: a task routing to 10,000 streams keeps a
        batcher, state and part per stream alive to its end, and the collections walking them again
        were about a quarter of its CPU (docs/benchmarks.md, sink "Run 18b"). What it leaves is
        collected after (PySpark collects after every task)."""
        if self._plan.routing.column is None:
            return self._write(feed)
        with collections_held():
            return self._write(feed)

    def _write(self, feed: Any) -> SinkCommitMessage:
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
        if isinstance(writer, TransactionalPartitionWriter):
            writer.targets = self._targets
        stamps = phases.isEnabledFor(logging.DEBUG)
        if stamps:
            phases.debug("task %d start", identity.partition)
        try:
            feed(writer)
            if stamps:
                phases.debug("task %d fed", identity.partition)
            parts = writer.finish()
        except BaseException as error:
            if isinstance(error, StreamNotFound):  # a remembered target is gone: the retry ensures
                forget_query(self._query)
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
        if stamps:
            phases.debug("task %d end", identity.partition)
        log.info(
            "%s wrote %d rows to %d stream(s) in %s mode",
            identity.describe(),
            message.rows,
            len(parts),
            plan.mode,
        )
        return message

    def _flush_rows(
        self,
        writer: ModeWriter,
        chunk: list[tuple[Sequence[Any], bytes]],
        column: int | None,
    ) -> None:
        if not chunk:
            return
        separator = self._plan.layout.separator
        if self._check_values:
            encoded = EncodedRows.from_payloads([payload for _, payload in chunk], separator)
            problem = json_values.check(encoded.data, encoded.offsets)
            if problem is not None:
                self._raise_invalid(problem, chunk[problem.index][1][:-1])
        self._position += len(chunk)
        if column is None:
            payloads = [payload for _, payload in chunk]
            writer.add(self._fixed(), EncodedRows.from_payloads(payloads, separator))
            return
        by_target: dict[str, list[bytes]] = {}  # insertion order; each target's rows in input order
        for row, payload in chunk:
            by_target.setdefault(routing.target_of(row[column]), []).append(payload)
        self._ensure_all(by_target)
        for path, payloads in by_target.items():
            writer.add(path, EncodedRows.from_payloads(payloads, separator))

    def _route(
        self, writer: ModeWriter, pending: tuple[pa.Array, pa.Array, int] | None, separator: int
    ) -> None:
        """Split the pending rows by target, ensure the new targets together, hand each its rows."""
        if pending is None:
            return
        values, payloads, first = pending
        groups = list(routing.split_rows(values, payloads, separator, first=first))
        self._ensure_all(path for path, _ in groups)
        for path, rows in groups:  # every target ensured above
            writer.add(path, rows)

    def _add(self, writer: ModeWriter, path: str, payloads: pa.Array) -> None:
        self._ensure(path)
        writer.add(path, EncodedRows.from_arrow(payloads, self._plan.layout.separator))

    def _fixed(self) -> str:
        path = self._plan.routing.fixed
        assert path is not None  # routing by the option
        self._ensure(path)
        return path

    def _ensure(self, path: str) -> None:
        """The target exists with the sink's content type and is open (checked once per task)."""
        if path not in self._checked:
            self._targets.ensure(path)
            self._checked.add(path)

    def _ensure_all(self, paths: Iterable[str]) -> None:
        """``_ensure`` for the targets of one input batch, the new ones together."""
        new = [path for path in paths if path not in self._checked]
        if new:
            self._targets.ensure_all(new)
            self._checked.update(new)

    def _raise_if_invalid(
        self, problem: json_values.NotOneText | None, batch: pa.RecordBatch
    ) -> None:
        if problem is not None:
            value = batch.column(self._plan.layout.value_index)[problem.index].as_py()
            self._raise_invalid(problem, value)

    def _raise_invalid(self, problem: json_values.NotOneText, value: bytes | str) -> None:
        identity = self._identity
        raise InvalidPayload(
            f"Column '{VALUE_COLUMN}', {identity.describe()}: the value of row "
            f"{self._position + problem.index} of this partition (counting from 0) is not exactly one "
            f"JSON text: {problem.reason}. It begins {json_values.describe(value)}. For contentType "
            f"'{self._plan.options.content_type}' every value must be one complete JSON text (one row, "
            "one message; build it with to_json), or write to a stream of another content type. Nothing "
            "of the request that would have held this row was sent."
        )
