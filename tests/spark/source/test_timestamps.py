"""Reading from (and, in batch reads, to) an instant: streaming and batch, against the real server, and
the refusal on a server without time lookups. Option parsing is in ``test_timestamp_options.py``, the
server's lookup against a model in ``tests/server/extensions/test_time_lookup.py``."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
from pyspark.errors import StreamingQueryException

from durastream_spark.errors import ExtensionNotSupported
from durastream_spark.protocol.frames import decode_frames
from durastream_spark.source import batch_reader, stream_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from tests.spark.source.support import (
    BatchCollector,
    Streams,
    docs,
    ids_of,
    options_for,
    reader_of,
    run_available_now,
    unique,
)
from tests.spark.source.test_reader_api import all_available, read_all


def last_time(streams: Streams, path: str) -> int:
    """The latest append time of ``path`` as the server reports it (frames read to the tail)."""
    latest = 0
    for chunk in streams.client.iter_range(path, "-1", streams.tail(path), "frames"):
        times = decode_frames(chunk.body).timestamps.cast("int64").to_pylist()
        latest = max([latest, *times])
    return latest


def instant_after(streams: Streams, *paths: str) -> int:
    """An instant later than every message of ``paths`` so far, once the wall clock has passed it (the
    server runs on this machine), so every later append is at or after it."""
    instant = max(last_time(streams, path) for path in paths) + 1
    deadline = time.monotonic() + 10
    while time.time() * 1000 < instant:
        assert time.monotonic() < deadline, "the wall clock did not advance"
        time.sleep(0.001)
    return instant


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def test_streaming_from_an_instant_reads_exactly_the_later_messages_and_continues(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("ts-stream")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 3))
    streams.append_json(b, docs(100, 2))
    instant = instant_after(streams, a, b)
    streams.append_json(a, docs(3, 3))
    streams.append_json(b, docs(102, 1))
    options = options_for(durastream_server, streams=f"{a},{b}", startingTimestamp=iso(instant))
    collector = BatchCollector()
    checkpoint = str(tmp_path / "chk")
    run_available_now(spark, options, checkpoint, collector)
    assert sorted(ids_of(collector.rows)) == [3, 4, 5, 102]
    streams.append_json(a, docs(6, 2))
    run_available_now(
        spark, options, checkpoint, collector
    )  # a restart continues from the checkpoint
    assert sorted(ids_of(collector.rows)) == [3, 4, 5, 6, 7, 102]


def test_a_pattern_starts_every_stream_at_the_instant(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("ts-pattern")
    a = streams.create(f"{base}/a")
    streams.append_json(a, docs(0, 2))
    instant = instant_after(streams, a)
    streams.append_json(a, docs(2, 2))
    b = streams.create(f"{base}/b")
    streams.append_json(b, docs(100, 1))
    collector = BatchCollector()
    run_available_now(
        spark,
        options_for(durastream_server, pattern=f"{base}/*", startingTimestamp=str(instant)),
        str(tmp_path / "chk"),
        collector,
    )
    assert sorted(ids_of(collector.rows)) == [2, 3, 100]


def test_the_first_batch_replays_identically_from_a_symbolic_start(
    durastream_server, streams
) -> None:
    path = streams.create(unique("ts-replay"))
    streams.append_json(path, docs(0, 4))
    instant = instant_after(streams, path)
    streams.append_json(path, docs(4, 4))
    options = options_for(durastream_server, streams=path, startingTimestamp=str(instant))
    reader = stream_reader(options, DEFAULT_SCHEMA)
    start = reader.initialOffset()
    assert start == {path: f"timestamp {instant}"}
    end = all_available(reader, start)
    first = read_all(reader, reader.partitions(start, end))
    streams.append_json(path, docs(8, 4))
    # After a restart Spark asks initialOffset() again and replays batch 0 with the logged end.
    again = stream_reader(options, DEFAULT_SCHEMA)
    assert again.initialOffset() == start
    assert read_all(again, again.partitions(again.initialOffset(), end)) == first
    assert ids_of(first) == [4, 5, 6, 7]


def test_a_stream_without_a_later_message_fails_or_starts_at_its_tail(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("ts-strategy")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(b, docs(100, 2))
    instant = instant_after(streams, b)
    streams.append_json(a, docs(0, 2))
    options = options_for(durastream_server, streams=f"{a},{b}", startingTimestamp=str(instant))
    with pytest.raises(StreamingQueryException) as caught:
        run_available_now(spark, options, str(tmp_path / "error"), BatchCollector())
    text = str(caught.value)
    assert "startingTimestamp" in text and repr(b) in text
    assert "startingOffsetsByTimestampStrategy=latest" in text

    options["startingOffsetsByTimestampStrategy"] = "latest"
    collector = BatchCollector()
    checkpoint = str(tmp_path / "latest")
    run_available_now(spark, options, checkpoint, collector)
    assert sorted(ids_of(collector.rows)) == [0, 1]  # b starts at its tail
    streams.append_json(b, docs(102, 1))
    run_available_now(spark, options, checkpoint, collector)
    assert sorted(ids_of(collector.rows)) == [0, 1, 102]


def test_batch_reads_between_two_instants(spark, durastream_server, streams) -> None:
    base = unique("ts-batch")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 2))
    streams.append_json(b, docs(100, 1))
    start = instant_after(streams, a, b)
    streams.append_json(a, docs(2, 2))
    streams.append_json(b, docs(101, 1))
    end = instant_after(streams, a, b)
    streams.append_json(a, docs(4, 2))
    streams.append_json(b, docs(102, 1))
    between = reader_of(
        spark,
        options_for(
            durastream_server,
            streams=f"{a},{b}",
            startingTimestamp=iso(start),
            endingTimestamp=str(end),
        ),
        stream=False,
    )
    assert sorted(ids_of([r.asDict() for r in between.collect()])) == [2, 3, 101]
    # Per stream: a ends at the second instant, b (not named) at its tail.
    by_stream = reader_of(
        spark,
        options_for(
            durastream_server,
            streams=f"{a},{b}",
            startingOffsetsByTimestamp=json.dumps({a: start}),
            endingOffsetsByTimestamp=json.dumps({a: iso(end)}),
        ),
        stream=False,
    )
    assert sorted(ids_of([r.asDict() for r in by_stream.collect()])) == [2, 3, 100, 101, 102]


def test_ending_instants_are_refused_for_streaming_queries(durastream_server) -> None:
    options = options_for(durastream_server, streams="x", endingTimestamp="5")
    reader = stream_reader(
        options, DEFAULT_SCHEMA
    )  # refuses at Spark's first call (RefusedStreamReader)
    with pytest.raises(Exception, match="endingTimestamp only for batch reads"):
        reader.initialOffset()


def test_servers_without_time_lookups_refuse_naming_the_server_and_extension(
    spark, reference_server, tmp_path
) -> None:
    ref = Streams(reference_server)
    path = ref.create(unique("ts-ref"))
    ref.append_json(path, docs(0, 2))
    options = options_for(reference_server, streams=path, startingTimestamp="0")
    with pytest.raises(ExtensionNotSupported) as caught:
        batch_reader(options, DEFAULT_SCHEMA).partitions()
    text = str(caught.value)
    assert reference_server.stream_root in text and "'time-lookup'" in text
    assert "startingTimestamp" in text and "startingOffsets" in text
    with pytest.raises(StreamingQueryException, match="time-lookup"):
        run_available_now(spark, options, str(tmp_path / "chk"), BatchCollector())
