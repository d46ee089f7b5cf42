"""``spark.read.format("durastream")`` through a real SparkSession against the real server."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from chispa import assert_df_equality
from pyspark.errors import PySparkException
from pyspark.sql import Row

from tests.spark.source.support import docs, encoded, options_for, reader_of, unique


def test_default_schema_rows_of_json_and_byte_streams(spark, durastream_server, streams) -> None:
    base = unique("batch")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b", "application/octet-stream")
    streams.append_json(a, docs(0, 3))
    streams.append_raw(b, b"\x00\x01", "application/octet-stream")
    frame = reader_of(spark, options_for(durastream_server, pattern=f"{base}/*"), stream=False)
    assert (
        frame.schema.simpleString()
        == "struct<stream:string,offset:string,value:binary,timestamp:timestamp>"
    )
    rows = frame.orderBy("stream", "offset").collect()
    assert [(r.stream, bytes(r.value)) for r in rows] == [(a, v) for v in encoded(docs(0, 3))] + [
        (b, b"\x00\x01")
    ]
    assert [r.offset for r in rows[:3]] == sorted(r.offset for r in rows[:3])
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    assert all(abs((now - r.timestamp).total_seconds()) < 600 for r in rows)


def test_starting_and_ending_offsets(spark, durastream_server, streams) -> None:
    base = unique("bounds")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    after_two = streams.append_json(a, docs(0, 2))
    after_five = streams.append_json(a, docs(2, 3))
    streams.append_json(a, docs(5, 2))
    streams.append_json(b, docs(100, 2))
    both = f"{a},{b}"

    def ids(**options) -> list[tuple[str, int]]:
        frame = reader_of(
            spark, options_for(durastream_server, streams=both, **options), stream=False
        )
        return sorted((r.stream, json.loads(bytes(r.value))["id"]) for r in frame.collect())

    assert ids() == [(a, i) for i in range(7)] + [(b, 100), (b, 101)]
    assert ids(startingOffsets="latest") == []
    assert ids(startingOffsets=json.dumps({a: after_two, b: "latest"})) == [
        (a, i) for i in range(2, 7)
    ]
    assert ids(
        startingOffsets=json.dumps({a: after_two}),
        endingOffsets=json.dumps({a: after_five, b: "latest"}),
    ) == [(a, 2), (a, 3), (a, 4), (b, 100), (b, 101)]


def test_a_closed_stream_is_read_to_its_end(spark, durastream_server, streams) -> None:
    path = streams.create(unique("closed"))
    streams.append_json(path, docs(0, 4), close=True)
    frame = reader_of(spark, options_for(durastream_server, streams=path), stream=False)
    assert frame.count() == 4


def test_typed_schema_with_metadata_columns(spark, durastream_server, streams) -> None:
    path = streams.create(unique("typed"))
    streams.append_json(
        path,
        [
            {
                "id": 1,
                "name": "a",
                "at": "2024-05-01T12:00:00Z",
                "tags": ["x"],
                "geo": {"lat": 1.5},
            },
            {"id": 2, "extra": "ignored"},
        ],
    )
    schema = "id INT, name STRING, at TIMESTAMP, tags ARRAY<STRING>, geo STRUCT<lat: DOUBLE>, _stream STRING"
    actual = reader_of(
        spark, options_for(durastream_server, streams=path), schema=schema, stream=False
    )
    expected = spark.createDataFrame(
        [
            Row(
                id=1,
                name="a",
                at=dt.datetime(2024, 5, 1, 12, 0),
                tags=["x"],
                geo=Row(lat=1.5),
                _stream=path,
            ),
            Row(id=2, name=None, at=None, tags=None, geo=None, _stream=path),
        ],
        schema,
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_large_stream_is_read_by_several_tasks(spark, durastream_server, streams) -> None:
    path = streams.create(unique("tasks"))
    for first in range(0, 3000, 1000):
        streams.append_json(path, docs(first, 1000, pad="y" * 300))
    frame = reader_of(
        spark,
        options_for(durastream_server, streams=path, maxBytesPerPartition="128k"),
        stream=False,
    )
    assert frame.rdd.getNumPartitions() >= 6
    ids = [json.loads(bytes(r.value))["id"] for r in frame.orderBy("offset").collect()]
    assert ids == list(range(3000))


def test_bad_options_fail_at_load_naming_the_option(spark, durastream_server) -> None:
    with pytest.raises(PySparkException) as caught:
        reader_of(
            spark,
            options_for(durastream_server, streams="x", maxBytesPerPartition="lots"),
            stream=False,
        )
    assert "maxBytesPerPartition" in str(caught.value) and "'lots'" in str(caught.value)


def test_a_missing_stream_fails_the_batch_read_by_name(spark, durastream_server) -> None:
    missing = unique("missing")
    frame = reader_of(spark, options_for(durastream_server, streams=missing), stream=False)
    with pytest.raises(PySparkException, match=missing):
        frame.collect()
