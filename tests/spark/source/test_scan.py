"""A task's read pipeline (``scan.py``): batches in offset order, errors passed on, threads stopped."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest

from durastream_spark.errors import RequestContext, StreamGone
from durastream_spark.protocol.extensions import Extensions
from durastream_spark.protocol.frames import encode_frames, offset_token
from durastream_spark.protocol.models import ReadChunk
from durastream_spark.source import scan
from durastream_spark.source.arrow import DEFAULT_SCHEMA, OutputLayout
from durastream_spark.source.data_loss import DataLossReporter
from durastream_spark.source.scan import FRAMES_ROUTE, RangePartition, RangeScanner

CHUNKS, PER_CHUNK = 20, 5
END = offset_token(CHUNKS * PER_CHUNK)


class FakeClient:
    """Serves ``[-1, END)`` as CHUNKS frames responses of PER_CHUNK messages ``{"id": n}``."""

    def __init__(self, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.fail_at = fail_at
        self.delay = delay
        self.reads: list[str] = []

    def read(self, path: str, offset: str, end: str | None, format: str) -> ReadChunk:
        self.reads.append(offset)
        first = 0 if offset == "-1" else int(offset.rsplit("_", 1)[1])
        index = first // PER_CHUNK
        if index == self.fail_at:
            raise StreamGone(
                f"stream '{path}' is gone",
                context=RequestContext("GET", "http://server/v1/stream/s", stream=path),
                status=410,
                code=None,
                headers={},
                server_message=None,
            )
        time.sleep(self.delay)
        ids = range(first, first + PER_CHUNK)
        body = encode_frames(
            list(ids), [0] * PER_CHUNK, [b'{"id": %d}' % n for n in ids], lines=True
        )
        following = offset_token(first + PER_CHUNK)
        return ReadChunk(
            path=path,
            offset=offset,
            end=end,
            format=format,
            body=body,
            next_offset=following,
            up_to_date=False,
            closed=False,
            end_reached=following == end,
            content_type="application/vnd.durastream.frames",
            etag=None,
        )


def partition() -> RangePartition:
    return RangePartition(
        stream="s",
        start="-1",
        end=END,
        content_type="application/json",
        route=FRAMES_ROUTE,
        extensions=Extensions(),
    )


def scanner(schema, fail_on_data_loss: bool = True) -> RangeScanner:
    return RangeScanner(None, OutputLayout.for_schema(schema), DataLossReporter(fail_on_data_loss))  # type: ignore[arg-type]


def typed_schema():
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("id", LongType())])


def pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("durastream-")]


def test_batches_come_out_in_offset_order_while_conversions_overlap(monkeypatch) -> None:
    layout = OutputLayout.for_schema(typed_schema())
    convert = layout.batch

    def slow_convert(stream, block):  # conversions finish out of order
        time.sleep(random.random() / 200)
        return convert(stream, block)

    monkeypatch.setattr(
        OutputLayout, "batch", lambda self, stream, block: slow_convert(stream, block)
    )
    reader = RangeScanner(None, layout, DataLossReporter(True))  # type: ignore[arg-type]
    client = FakeClient()
    ids = [
        n
        for batch in reader._bounded_batches(client, partition())
        for n in batch.column(0).to_pylist()
    ]
    assert ids == list(range(CHUNKS * PER_CHUNK))
    assert len(client.reads) == CHUNKS
    assert not pipeline_threads()


def test_default_schema_rows_keep_their_own_offsets() -> None:
    batches = list(scanner(DEFAULT_SCHEMA)._bounded_batches(FakeClient(), partition()))
    offsets = [o for batch in batches for o in batch.column(1).to_pylist()]
    assert offsets == [offset_token(n) for n in range(CHUNKS * PER_CHUNK)]


def test_a_read_error_reaches_the_consumer_after_the_earlier_batches() -> None:
    rows = []
    with pytest.raises(StreamGone):
        for batch in scanner(typed_schema())._bounded_batches(FakeClient(fail_at=3), partition()):
            rows += batch.column(0).to_pylist()
    assert rows == list(range(3 * PER_CHUNK))
    assert not pipeline_threads()


def test_closing_the_iterator_early_stops_the_reading_thread() -> None:
    client = FakeClient(delay=0.01)
    batches = scanner(typed_schema())._bounded_batches(client, partition())
    next(batches)
    batches.close()
    assert not pipeline_threads()
    assert len(client.reads) <= 1 + scan.READ_AHEAD + scan.CONVERT_THREADS + 1


def test_read_reports_gone_data_through_the_choke_point(monkeypatch) -> None:
    monkeypatch.setattr(scan, "StreamClient", lambda *args, **kwargs: FakeClient(fail_at=2))
    rows = [
        n
        for batch in scanner(typed_schema(), fail_on_data_loss=False).read(partition())
        for n in batch.column(0).to_pylist()
    ]
    assert rows == list(range(2 * PER_CHUNK))  # then logged as data loss, and the task ends


def test_a_packed_responses_stream_column_names_each_message_by_its_run() -> None:
    from durastream_spark.source.scan import stream_column

    column = stream_column([("a/1", 2), ("b/\u00e9", 0), ("c", 3), ("a/1", 1)])
    assert column.type == pa.string()
    assert column.to_pylist() == ["a/1", "a/1", "c", "c", "c", "a/1"]
    assert stream_column([]).to_pylist() == []


def test_a_packed_partition_unpickles_equal_to_itself() -> None:
    """Spark pickles a task's partition on the driver and unpickles it in the task: the compact
    (columnar) form must give back the same segments in the same order, as ``Segment`` tuples, with
    the route and extensions, so a task reads exactly the ranges that were planned."""
    import json
    import pickle

    from pyspark import cloudpickle

    from durastream_spark.source.scan import PackedPartition, Segment

    # Distinct string objects for equal texts, as a JSON listing gives them.
    rows = json.loads(
        json.dumps(
            [
                [f"ten/s{i:05d}", "-1" if i % 3 else f"{i:016d}_{i:016d}", f"{i:016d}_{i + 9:016d}"]
                for i in range(500)
            ]
        )
    )
    kinds = json.loads(json.dumps(["application/json", "application/octet-stream"] * 250))
    segments = tuple(
        Segment(stream, start, end, kind, i % 7, i * 13)
        for i, ((stream, start, end), kind) in enumerate(zip(rows, kinds, strict=True))
    )
    packed = PackedPartition.of(segments, FRAMES_ROUTE, Extensions((("multi-range", 1),)))
    for dumps in (pickle.dumps, cloudpickle.dumps):
        again = pickle.loads(dumps(packed))
        assert again == packed
        assert [type(segment) for segment in again.segments] == [Segment] * len(segments)
        assert again.route == FRAMES_ROUTE and again.extensions.multi_range
    empty = PackedPartition.of((), FRAMES_ROUTE, Extensions(()))
    assert pickle.loads(pickle.dumps(empty)) == empty
