"""Helpers of the source tests: streams with known content, and queries that collect what they read."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient

JSON = "application/json"


def stream_root(server: Any) -> str:
    """The stream root of a durastream-server or Node reference server fixture."""
    return server.base_url + "/v1/stream"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def docs(first: int, count: int, **extra: Any) -> list[dict]:
    return [{"id": i, "name": f"n{i}", **extra} for i in range(first, first + count)]


def ids_of(rows: list[dict]) -> list[int]:
    """The ``id`` of each row's JSON message (rows of the default schema)."""
    return [json.loads(bytes(row["value"]))["id"] for row in rows]


def encoded(documents: Iterable[dict]) -> list[bytes]:
    """How the server stores JSON messages appended by ``Streams.append_json`` (compact, as sent)."""
    return [json.dumps(d, separators=(",", ":")).encode() for d in documents]


class Streams:
    """Creates streams and appends to them with an idempotent producer (safe to retry across crashes)."""

    def __init__(self, server: Any, **options: str) -> None:
        self.url = stream_root(server)
        self.client = StreamClient(ConnectionOptions.parse({"url": self.url, **options}))
        self._seq: dict[str, int] = {}
        self._lock = threading.Lock()

    def create(self, path: str, content_type: str = JSON) -> str:
        self.client.create(path, content_type)
        return path

    def append_json(self, path: str, documents: list[dict], *, close: bool = False) -> str:
        body = b"[" + b",".join(encoded(documents)) + b"]"
        return self._append(path, body, JSON, close=close)

    def append_raw(self, path: str, body: bytes, content_type: str) -> str:
        return self._append(path, body, content_type)

    def _append(self, path: str, body: bytes, content_type: str, *, close: bool = False) -> str:
        with self._lock:
            seq = self._seq.get(path, 0)
            self._seq[path] = seq + 1
        result = self.client.append(
            path, body, content_type, producer=(f"test-{path}", 0, seq), close=close
        )
        assert result.next_offset is not None
        return result.next_offset

    def tail(self, path: str) -> str:
        return self.client.head(path).next_offset


def options_for(server: Any, **options: Any) -> dict[str, str]:
    return {"url": stream_root(server), **{k: str(v) for k, v in options.items()}}


def reader_of(spark: Any, options: dict[str, str], schema: str | None = None, stream: bool = True):
    builder = (spark.readStream if stream else spark.read).format("durastream").options(**options)
    if schema is not None:
        builder = builder.schema(schema)
    return builder.load()


class BatchCollector:
    """A ``foreachBatch`` function that keeps every micro-batch's rows (driver side, thread-safe)."""

    def __init__(self, project: Callable[[Any], Any] | None = None) -> None:
        self.batches: list[tuple[int, list[dict]]] = []
        self._lock = threading.Lock()
        self._project = project

    def __call__(self, frame: Any, batch_id: int) -> None:
        if self._project is not None:
            frame = self._project(frame)
        rows = [row.asDict(recursive=True) for row in frame.collect()]
        with self._lock:
            self.batches.append((batch_id, rows))

    @property
    def rows(self) -> list[dict]:
        with self._lock:
            return [row for _, rows in sorted(self.batches, key=lambda b: b[0]) for row in rows]

    @property
    def non_empty_batches(self) -> list[tuple[int, list[dict]]]:
        with self._lock:
            return [batch for batch in sorted(self.batches, key=lambda b: b[0]) if batch[1]]


def run_available_now(
    spark: Any,
    options: dict[str, str],
    checkpoint: str,
    collector: BatchCollector,
    schema: str | None = None,
    timeout: float = 120.0,
) -> Any:
    """One ``Trigger.AvailableNow`` run (a new query on ``checkpoint``), waiting for it to finish."""
    query = (
        reader_of(spark, options, schema)
        .writeStream.foreachBatch(collector)
        .trigger(availableNow=True)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    finished = query.awaitTermination(timeout)
    if not finished:
        query.stop()
        raise AssertionError(f"the AvailableNow query did not finish within {timeout} s")
    return query


def offsets_increase(rows: list[dict]) -> bool:
    """Per stream, offsets strictly increase (no duplicate, order kept)."""
    last: dict[str, str] = {}
    for row in rows:
        previous = last.get(row["stream"])
        if previous is not None and not row["offset"] > previous:
            return False
        last[row["stream"]] = row["offset"]
    return True
