"""Test instruments that run inside Spark: a probing variant of the sink, and fault-injecting UDFs.

They live in an importable module (not in a test file) because Spark's Python workers unpickle them by
reference.

- ``ProbeDataSource`` (format ``durastream_probe``): the real sink, plus two test-only options that are
  removed before the sink parses its options:
  - ``probe.dir``: every task attempt's ``write()`` result (batch, partition, attempt, rows, requests) is
    recorded there as a JSON file, *including attempts whose commit message Spark then discards*; this is
    how a test proves that an attempt saw a truncated input and still sent requests.
  - ``probe.block`` = ``before:<batch>`` or ``after:<batch>`` with ``probe.markers`` = a directory: the
    driver's ``commit`` of that batch writes ``<markers>/blocked-<batch>`` and then blocks (before or after
    the real commit) until the test kills the driver. Bounded, and ends if the driver dies.
- ``fail_first_attempt``: a UDF that raises on attempt 0 when it meets one of the given values.
- ``fail_while``: a UDF that raises on every attempt at the given values while a file exists.
- ``gate``: a UDF that, on attempt 0 at a given value, announces itself and waits for the test to open
  the gate (to kill a server exactly in the middle of a batch).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.column import Column
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from durastream_spark import DurableStreamDataSource, sink
from durastream_spark.sink.messages import SinkCommitMessage
from durastream_spark.sink.writer import STREAM_WRITER

BLOCK_LIMIT_SECONDS = 180.0  # a blocked commit gives up after this (the test kills it long before)


class ProbeDataSource(DurableStreamDataSource):
    @classmethod
    def name(cls) -> str:
        return "durastream_probe"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = dict(self.options)
        record_dir = options.pop("probe.dir", None)
        block = options.pop("probe.block", None)
        markers = options.pop("probe.markers", None)
        inner = sink.stream_writer(options, schema, overwrite)
        return ProbeStreamWriter(inner.plan, record_dir, block, markers)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = {k: v for k, v in self.options.items() if not k.startswith("probe.")}
        return sink.batch_writer(options, schema, overwrite)


class ProbeStreamWriter(STREAM_WRITER):  # type: ignore[misc,valid-type]
    def __init__(
        self, plan: Any, record_dir: str | None, block: str | None, markers: str | None
    ) -> None:
        super().__init__(plan)
        self.record_dir = record_dir
        self.block = block
        self.markers = markers

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        message = super().write(iterator)
        if self.record_dir:
            record = {
                "epoch": message.epoch,
                "partition": message.partition,
                "attempt": message.attempt,
                "rows": message.rows,
                "requests": sum(part.requests for part in message.parts),
            }
            name = f"{message.epoch}-{message.partition}-{message.attempt}.json"
            Path(self.record_dir, name).write_text(json.dumps(record))
        return message

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        when, _, batch = (self.block or "").partition(":")
        blocked = batch != "" and int(batch) == batchId
        if blocked and when == "before":
            self._block(batchId)
        super().commit(messages, batchId)
        if blocked and when == "after":
            self._block(batchId)

    def _block(self, batch_id: int) -> None:
        assert self.markers is not None
        Path(self.markers, f"blocked-{batch_id}").write_text(str(os.getpid()))
        parent = os.getppid()
        deadline = time.monotonic() + BLOCK_LIMIT_SECONDS
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.05)
        raise RuntimeError(f"probe: commit of batch {batch_id} was blocked and nobody killed it")


def attempts(record_dir: str | Path) -> list[dict[str, Any]]:
    """What ``probe.dir`` recorded: one entry per task attempt whose ``write()`` returned."""
    return [json.loads(p.read_text()) for p in sorted(Path(record_dir).glob("*.json"))]


def fail_first_attempt(column: Column, values: Iterable[int], marker_dir: str | Path) -> Column:
    """``column`` unchanged, except that attempt 0 of a task raises when it meets one of ``values``."""
    targets = frozenset(values)
    markers = str(marker_dir)

    def check(value):  # no type hints: Spark would read them as a pandas UDF
        context = TaskContext.get()
        if context.attemptNumber() == 0 and value in targets:
            Path(markers, f"failed-{context.stageId()}-{context.partitionId()}").write_text("")
            raise RuntimeError(f"injected failure at value {value} on attempt 0")
        return value

    return F.udf(check, "long", useArrow=False)(column)


def fail_while(column: Column, values: Iterable[int], switch: str | Path) -> Column:
    """``column`` unchanged, except that every attempt raises at one of ``values`` while the file
    ``switch`` exists: a batch that fails for good, until the test removes the file."""
    targets = frozenset(values)
    path = str(switch)

    def check(value):  # no type hints: Spark would read them as a pandas UDF
        if value in targets and os.path.exists(path):
            raise RuntimeError(f"injected failure at value {value} (while {path} exists)")
        return value

    return F.udf(check, "long", useArrow=False)(column)


def gate(column: Column, value: int, gate_dir: str | Path) -> Column:
    """On attempt 0 at ``value``: create ``<gate_dir>/reached``, wait for ``<gate_dir>/open``."""
    directory = str(gate_dir)

    def wait(current):  # no type hints: Spark would read them as a pandas UDF
        if current == value and TaskContext.get().attemptNumber() == 0:
            Path(directory, "reached").write_text("")
            deadline = time.monotonic() + BLOCK_LIMIT_SECONDS
            while not Path(directory, "open").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("probe: the gate was never opened")
                time.sleep(0.02)
        return current

    return F.udf(wait, "long", useArrow=False)(column)
