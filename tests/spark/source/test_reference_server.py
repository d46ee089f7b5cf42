"""The source against the Node reference server (npm), which advertises none of our extensions.

Batches stay replay-deterministic through forks pinned at each batch's end (``source/fallback.py``);
``pattern`` lists streams through the protocol's subscriptions (section 6). Per-trigger limits run as one
batch under AvailableNow and are refused otherwise, instants are refused, each with an error that says why
(docs/compatibility.md).
"""

from __future__ import annotations

import json

import pytest
from pyspark.errors import StreamingQueryException

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from durastream_spark.errors import StreamNotFound
from durastream_spark.source import stream_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from durastream_spark.source.fallback import ReplayNotGuaranteed, ensure_pin, pin_path
from durastream_spark.source.scan import PINNED_ROUTE
from durastream_spark.source.tracker import PollingTracker
from tests.spark.source.support import (
    BatchCollector,
    Streams,
    docs,
    encoded,
    options_for,
    reader_of,
    run_available_now,
    unique,
)


@pytest.fixture
def streams(reference_server) -> Streams:
    return Streams(reference_server)


def read_all(reader, partitions) -> list[dict]:
    return [r for p in partitions for batch in reader.read(p) for r in batch.to_pylist()]


def test_pinned_ranges_replay_identically_and_pins_go_away_on_commit(
    reference_server, streams
) -> None:
    base = unique("refreplay")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b", "text/plain")
    streams.append_json(a, docs(0, 20))
    streams.append_raw(b, b"abc", "text/plain")
    reader = stream_reader(options_for(reference_server, streams=f"{a},{b}"), DEFAULT_SCHEMA)
    start = reader.initialOffset()
    if HAS_ADMISSION_CONTROL:
        from durastream_spark.compat import ReadAllAvailable

        end = reader.latestOffset(start, ReadAllAvailable())
    else:  # Spark 4.0/4.1: no limit, no start offset
        end = reader.latestOffset()
    partitions = reader.partitions(start, end)
    assert {p.route for p in partitions} == {PINNED_ROUTE}
    first = read_all(reader, partitions)

    streams.append_json(a, docs(20, 5))
    streams.append_raw(b, b"def", "text/plain")
    assert read_all(reader, reader.partitions(start, end)) == first
    assert [r["value"] for r in first if r["stream"] == a] == encoded(docs(0, 20))
    assert [r["value"] for r in first if r["stream"] == b] == [b"abc"]
    assert all(r["timestamp"] is None for r in first)

    reader.commit(end)
    with pytest.raises(StreamNotFound):
        streams.client.head(pin_path("__durastream_pins", a, end[a]))


def test_batch_read_and_typed_schema(spark, reference_server, streams) -> None:
    path = streams.create(unique("refbatch"))
    streams.append_json(path, docs(0, 4))
    options = options_for(reference_server, streams=path)
    rows = reader_of(spark, options, stream=False).collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(encoded(docs(0, 4)))
    typed = reader_of(spark, options, schema="id INT, name STRING", stream=False)
    assert sorted((r.id, r.name) for r in typed.collect()) == [(i, f"n{i}") for i in range(4)]


def test_available_now_and_restart_read_each_message_once(
    spark, reference_server, streams, tmp_path
) -> None:
    path = streams.create(unique("refstream"))
    streams.append_json(path, docs(0, 6))
    options = options_for(reference_server, streams=path)
    collector = BatchCollector()
    checkpoint = str(tmp_path / "chk")
    run_available_now(spark, options, checkpoint, collector)
    streams.append_json(path, docs(6, 4))
    run_available_now(spark, options, checkpoint, collector)
    assert [json.loads(bytes(r["value"]))["id"] for r in collector.rows] == list(range(10))


@pytest.mark.skipif(not HAS_ADMISSION_CONTROL, reason="admission control needs Spark >= 4.2")
def test_limits_are_refused_for_continuous_triggers(
    spark, reference_server, streams, tmp_path
) -> None:
    """Without limit lookups nothing can count what waits or find where a limited batch ends."""
    path = streams.create(unique("reflimit"))
    streams.append_json(path, docs(0, 5))
    options = options_for(reference_server, streams=path, maxMessagesPerTrigger=2)
    query = (
        reader_of(spark, options)
        .writeStream.foreachBatch(BatchCollector())
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", str(tmp_path / "continuous"))
        .start()
    )
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    text = str(caught.value)
    assert "maxMessagesPerTrigger" in text and "limit-lookup" in text and "AvailableNow" in text


@pytest.mark.skipif(not HAS_ADMISSION_CONTROL, reason="admission control needs Spark >= 4.2")
def test_limits_are_one_batch_under_available_now(
    spark, reference_server, streams, tmp_path
) -> None:
    """AvailableNow must end: it reads up to its target in one batch (a warning names the option)."""
    path = streams.create(unique("reflimit-now"))
    streams.append_json(path, docs(0, 5))
    options = options_for(reference_server, streams=path, maxMessagesPerTrigger=2)
    collector = BatchCollector()
    run_available_now(spark, options, str(tmp_path / "now"), collector)
    assert [len(rows) for _, rows in collector.non_empty_batches] == [5]


def test_pattern_discovers_streams_through_protocol_subscriptions(
    spark, reference_server, streams, tmp_path
) -> None:
    """No listing extension, but the protocol's subscription globs (section 6): each snapshot links the
    matching streams with a short-lived subscription. Exactly once, new streams included."""
    base = unique("refpattern")
    a = streams.create(f"{base}/a")
    streams.append_json(a, docs(0, 3))
    streams.create(f"{base}-other/x")  # does not match
    options = options_for(reference_server, pattern=f"{base}/*")
    collector = BatchCollector()
    checkpoint = str(tmp_path / "chk")
    run_available_now(spark, options, checkpoint, collector)
    b = streams.create(f"{base}/b")
    streams.append_json(b, docs(100, 2))
    streams.append_json(a, docs(3, 1))
    run_available_now(spark, options, checkpoint, collector)
    assert sorted(json.loads(bytes(r["value"]))["id"] for r in collector.rows) == [
        0,
        1,
        2,
        3,
        100,
        101,
    ]


def test_deleted_stream_is_reported_as_data_loss(
    spark, reference_server, streams, tmp_path
) -> None:
    path = streams.create(unique("refloss"))
    streams.append_json(path, docs(0, 2))
    options = options_for(reference_server, streams=path)
    checkpoint = str(tmp_path / "chk")
    run_available_now(spark, options, checkpoint, BatchCollector())
    streams.client.delete(path)
    with pytest.raises(StreamingQueryException, match="Data loss in stream"):
        run_available_now(spark, options, checkpoint, BatchCollector())


class _ForkIgnoringClient:
    """A server that accepts the PUT but ignores the fork headers (creates an empty stream)."""

    class connection:  # noqa: N801 - mimics the attribute of StreamClient
        url = "http://example.invalid/v1/stream"

    def create(self, path, content_type, **kwargs):
        from durastream_spark.protocol.models import CreateResult

        return CreateResult(path, True, content_type, "0000000000000000_0000000000000000", False)

    def delete(self, path):
        self.deleted = path  # the stream the ignored fork created is removed again


def test_a_server_that_cannot_fork_is_refused_with_the_missing_guarantee() -> None:
    client = _ForkIgnoringClient()
    with pytest.raises(ReplayNotGuaranteed) as caught:
        ensure_pin(
            client,
            "pins",
            "s",
            "0000000000000000_0000000000000042",
            "application/json",
            60,
        )
    text = str(caught.value)
    assert "bounded-read" in text and "fork" in text and "re-read identically" in text
    assert client.deleted == pin_path("pins", "s", "0000000000000000_0000000000000042")


def test_without_the_change_feed_each_trigger_polls_and_plans_what_changed(
    reference_server, streams
) -> None:
    """No ``changes`` extension: the tracker polls each stream per trigger (a HEAD each, as before) and
    still plans only the streams whose tails moved; no multi-range request is sent either."""
    base = unique("refpoll")
    paths = [streams.create(f"{base}/s{i:02d}") for i in range(12)]
    for i, path in enumerate(paths):
        streams.append_json(path, docs(i * 10, 2))
    reader = stream_reader(options_for(reference_server, streams=",".join(paths)), DEFAULT_SCHEMA)
    assert isinstance(reader.driver.tracker, PollingTracker)
    start = reader.initialOffset()
    if HAS_ADMISSION_CONTROL:
        from durastream_spark.compat import ReadAllAvailable

        end = reader.latestOffset(start, ReadAllAvailable())
        streams.append_json(paths[5], docs(500, 3))
        later = reader.latestOffset(end, ReadAllAvailable())
    else:
        end = reader.latestOffset()
        streams.append_json(paths[5], docs(500, 3))
        later = reader.latestOffset()
    assert len(read_all(reader, reader.partitions(start, end))) == 24
    assert {path for path in paths if later[path] != end[path]} == {paths[5]}
    rows = read_all(reader, reader.partitions(end, later))
    assert [r["value"] for r in rows] == encoded(docs(500, 3))
    reader.commit(later)
