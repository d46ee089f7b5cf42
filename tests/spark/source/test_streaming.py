"""``spark.readStream.format("durastream")``: micro-batches end to end, against the real server.

Queries are short: AvailableNow runs, or continuous queries driven with ``processAllAvailable``. A restart
is a new query on the same checkpoint directory, in the same SparkSession.
"""

from __future__ import annotations

import json
import threading

import pytest
from pyspark.errors import StreamingQueryException

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from tests.spark.source.support import (
    BatchCollector,
    Streams,
    docs,
    encoded,
    ids_of,
    offsets_increase,
    options_for,
    reader_of,
    run_available_now,
    unique,
)


def test_memory_sink_while_a_writer_appends_concurrently(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("concurrent")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 10))
    name = base.replace("-", "_").replace("/", "_")
    query = (
        reader_of(spark, options_for(durastream_server, streams=f"{a},{b}"))
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:

        def write(path: str, first: int) -> None:
            for start in range(first, first + 400, 20):
                streams.append_json(path, docs(start, 20))

        writers = [
            threading.Thread(target=write, args=(a, 10)),
            threading.Thread(target=write, args=(b, 1000)),
        ]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        query.processAllAvailable()
        rows = [
            r.asDict() for r in spark.sql(f"SELECT * FROM {name} ORDER BY stream, offset").collect()
        ]
    finally:
        query.stop()
    assert [r["value"] for r in rows if r["stream"] == a] == encoded(docs(0, 410))
    assert [r["value"] for r in rows if r["stream"] == b] == encoded(docs(1000, 400))
    assert len(query.recentProgress) >= 1


def test_restart_from_the_checkpoint_reads_each_message_once(
    spark, durastream_server, streams, tmp_path
) -> None:
    path = streams.create(unique("restart"))
    options = options_for(durastream_server, streams=path)
    checkpoint = str(tmp_path / "chk")
    collector = BatchCollector()
    streams.append_json(path, docs(0, 5))
    run_available_now(spark, options, checkpoint, collector)
    streams.append_json(path, docs(5, 5))

    # Second run: a continuous query on the same checkpoint, stopped mid-way, then a third run.
    query = (
        reader_of(spark, options)
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    query.processAllAvailable()
    query.stop()
    streams.append_json(path, docs(10, 5))
    run_available_now(spark, options, checkpoint, collector)

    assert ids_of(collector.rows) == list(range(15))
    assert offsets_increase(collector.rows)


@pytest.mark.skipif(not HAS_ADMISSION_CONTROL, reason="admission control needs Spark >= 4.2")
def test_available_now_honours_max_messages_per_trigger(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("limit")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 7))
    streams.append_json(b, docs(100, 3))
    collector = BatchCollector()
    query = run_available_now(
        spark,
        options_for(durastream_server, streams=f"{a},{b}", maxMessagesPerTrigger=3),
        str(tmp_path / "chk"),
        collector,
    )
    batches = collector.non_empty_batches
    assert [len(rows) for _, rows in batches] == [3, 3, 3, 1]
    assert sorted(ids_of(collector.rows)) == list(range(7)) + [100, 101, 102]
    assert offsets_increase(collector.rows)
    # progress shows each stream's tail as latestOffset, so lag is visible while the query catches up.
    first = query.recentProgress[0]["sources"][0]
    assert json.loads(first["latestOffset"]) == {a: streams.tail(a), b: streams.tail(b)}
    assert json.loads(first["endOffset"]) != json.loads(first["latestOffset"])


def test_a_closed_stream_ends_available_now_and_a_running_query_keeps_serving_others(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("closed")
    done, live = streams.create(f"{base}/done"), streams.create(f"{base}/live")
    streams.append_json(done, docs(0, 4), close=True)
    streams.append_json(live, docs(100, 2))
    options = options_for(durastream_server, pattern=f"{base}/*")
    collector = BatchCollector()
    run_available_now(spark, options, str(tmp_path / "once"), collector)
    assert sorted(ids_of(collector.rows)) == [0, 1, 2, 3, 100, 101]

    running = BatchCollector()
    query = (
        reader_of(spark, options)
        .writeStream.foreachBatch(running)
        .option("checkpointLocation", str(tmp_path / "live"))
        .start()
    )
    try:
        query.processAllAvailable()
        streams.append_json(live, docs(102, 3))
        query.processAllAvailable()
        assert query.isActive
    finally:
        query.stop()
    assert sorted(ids_of(running.rows)) == [0, 1, 2, 3, 100, 101, 102, 103, 104]


def test_starting_latest_skips_existing_data_and_reads_new_appends(
    spark, durastream_server, streams, tmp_path
) -> None:
    path = streams.create(unique("latest"))
    streams.append_json(path, docs(0, 5))
    collector = BatchCollector()
    query = (
        reader_of(spark, options_for(durastream_server, streams=path, startingOffsets="latest"))
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.processAllAvailable()
        streams.append_json(path, docs(5, 3))
        query.processAllAvailable()
    finally:
        query.stop()
    assert ids_of(collector.rows) == [5, 6, 7]
    assert collector.batches[0][1] == []  # batch 0 records the resolved tails and reads nothing


def test_pattern_discovers_streams_created_while_running(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("pattern")
    first = streams.create(f"{base}/x/1")
    streams.append_json(first, docs(0, 2))
    collector = BatchCollector()
    query = (
        reader_of(spark, options_for(durastream_server, pattern=f"{base}/**"))
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.processAllAvailable()
        second = streams.create(f"{base}/y/deeper/2")
        streams.append_json(second, docs(10, 3))
        streams.append_json(first, docs(2, 1))
        query.processAllAvailable()
    finally:
        query.stop()
    by_stream = {}
    for row in collector.rows:
        by_stream.setdefault(row["stream"], []).append(json.loads(bytes(row["value"]))["id"])
    assert by_stream == {first: [0, 1, 2], second: [10, 11, 12]}


def test_data_loss_fails_the_query_naming_stream_and_offset(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("loss")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 3))
    streams.append_json(b, docs(100, 3))
    options = options_for(durastream_server, streams=f"{a},{b}")
    checkpoint = str(tmp_path / "chk")
    run_available_now(spark, options, checkpoint, BatchCollector())
    reached = streams.tail(a)
    streams.client.delete(a)
    streams.append_json(b, docs(103, 1))

    with pytest.raises(StreamingQueryException) as caught:
        run_available_now(spark, options, checkpoint, BatchCollector())
    message = str(caught.value)
    assert "Data loss in stream" in message and a in message and reached in message
    assert "failOnDataLoss=false" in message


def test_data_loss_with_fail_on_data_loss_false_continues(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("lossok")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 5))
    streams.append_json(b, docs(100, 1))
    options = options_for(durastream_server, streams=f"{a},{b}", failOnDataLoss="false")
    checkpoint = str(tmp_path / "chk")
    run_available_now(spark, options, checkpoint, BatchCollector())

    # a is re-created shorter than the checkpoint; b gets new data.
    streams.client.delete(a)
    streams.create(a)
    streams.client.append(a, b'{"id": 50}', "application/json")
    streams.append_json(b, docs(101, 1))
    collector = BatchCollector()
    run_available_now(spark, options, checkpoint, collector)
    assert sorted(ids_of(collector.rows)) == [50, 101]


def test_no_loss_no_duplicates_across_a_server_crash(spark, server_factory, tmp_path) -> None:
    server = server_factory()
    streams = Streams(server, **{"retry.maxElapsedMs": "60000"})
    path = streams.create(unique("crash"))
    streams.append_json(path, docs(0, 50))
    collector = BatchCollector()
    options = options_for(server, streams=path, **{"retry.maxElapsedMs": "60000"})
    query = (
        reader_of(spark, options)
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.processAllAvailable()
        streams.append_json(path, docs(50, 50))
        server.kill()  # SIGKILL while the query is polling
        server.restart()
        streams.append_json(path, docs(100, 50))
        query.processAllAvailable()
    finally:
        query.stop()
    assert ids_of(collector.rows) == list(range(150))
