"""Issue 16, the sink, through Spark: a streaming query routes its rows to many streams (a ``stream``
column), attempt 0 of each task fails part-way, and every stream holds its rows exactly once.

On durastream-server the routed write goes through ``bulk-write`` (one ``ensure`` and a bulk stage per task,
one bulk commit per batch; the request counts are tested in ``test_fanout.py``). The failing attempts have
created streams and staged handles that nothing commits; the retried attempts stage their own, the driver's
bulk commit names only theirs, and a second batch of the same query (next epoch) does it again.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol import extensions as ext
from durastream_spark.protocol.client import StreamClient
from tests.spark.sink.probe import fail_first_attempt
from tests.spark.sink.support import (
    assert_exactly_once,
    rate_rows,
    read_stream,
    spark_conf,
    unique,
)
from tests.support.hiding_proxy import ExtensionHidingProxy

ROWS_PER_BATCH = 2000
STREAMS = 200


def test_routed_fanout_with_failing_attempts_writes_each_row_once_per_stream(
    sink_spark, durastream_server, tmp_path
) -> None:
    spark = sink_spark
    root = durastream_server.base_url + "/v1/stream"
    base = unique("fanout-retry")
    markers = tmp_path / "markers"
    markers.mkdir()
    failing = {int(ROWS_PER_BATCH * 0.7), int(ROWS_PER_BATCH * 0.7) + 1}

    def run_once(checkpoint) -> None:
        df = rate_rows(
            spark, ROWS_PER_BATCH, lambda value: fail_first_attempt(value, failing, markers), pad=""
        ).withColumn("stream", F.concat(F.lit(base + "/s"), (F.col("n") % STREAMS).cast("string")))
        query = (
            df.writeStream.format("durastream")
            .option("url", root)
            .option("exactlyOnce", "transactional")
            .option("maxMessagesPerRequest", "3")  # full requests staged before the failure
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None

    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="50"):
        checkpoint = tmp_path / "checkpoint"
        run_once(checkpoint)  # batch 0 (values 0..1999)
        failing = {ROWS_PER_BATCH + v for v in failing}
        run_once(checkpoint)  # batch 1 (values 2000..3999), next epoch

    assert len(list(markers.iterdir())) >= 2, "no attempt failed: nothing was tested"
    for s in range(STREAMS):
        messages = read_stream(root, f"{base}/s{s}")
        assert_exactly_once(messages, range(s, 2 * ROWS_PER_BATCH, STREAMS))


@pytest.mark.parametrize("server_name", ["reference_server", "rakaia_server"])
def test_routed_fanout_falls_back_to_ordered_mode_on_servers_without_extensions(
    sink_spark, server_name, request, tmp_path
) -> None:
    """No ``bulk-write`` (nor staged appends): ``auto`` writes in ordered mode, one request per stream,
    and a failing first attempt still leaves each row once in its stream."""
    spark = sink_spark
    root = request.getfixturevalue(server_name).stream_root
    base = unique("fanout-ordered")
    markers = tmp_path / "markers"
    markers.mkdir()
    rows, streams = 400, 20
    df = rate_rows(
        spark, rows, lambda value: fail_first_attempt(value, {280, 281}, markers), pad=""
    ).withColumn("stream", F.concat(F.lit(base + "/s"), (F.col("n") % streams).cast("string")))
    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="10"):
        _run_available_now(df, root, tmp_path / "checkpoint", maxMessagesPerRequest="3")
    assert list(markers.iterdir()), "no attempt failed: nothing was tested"
    for s in range(streams):
        assert_exactly_once(read_stream(root, f"{base}/s{s}"), range(s, rows, streams))


@pytest.mark.parametrize("bulk_write", [2, 1])
def test_routed_inline_parts_with_failing_attempts_are_exactly_once_with_either_bulk_version(
    sink_spark, durastream_server, tmp_path, bulk_write
) -> None:
    """Small routed parts travel inline and the driver commits them: on ``bulk-write`` 2 a stream's
    parts of both partitions as one entry (decision 0011), behind a proxy advertising ``bulk-write``
    1 (an older server) one entry per part. Attempt 0 of a task fails after writing part of its rows;
    two batches of the same query; every row once in its stream either way."""
    spark = sink_spark
    base = unique(f"fanout-parts-{bulk_write}")
    markers = tmp_path / "markers"
    markers.mkdir()
    rows, streams = 600, 60
    failing = {450, 451}

    def run(root: str) -> None:
        df = rate_rows(
            spark, rows, lambda value: fail_first_attempt(value, failing, markers), pad=""
        ).withColumn("stream", F.concat(F.lit(base + "/s"), (F.col("n") % streams).cast("string")))
        _run_available_now(df, root, tmp_path / "checkpoint", exactlyOnce="transactional")

    direct = durastream_server.base_url + "/v1/stream"
    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="20"):
        if bulk_write == 2:
            run(direct)
            failing = {rows + v for v in failing}
            run(direct)
        else:
            with ExtensionHidingProxy(durastream_server.port, cap={"bulk-write": 1}) as proxy:
                seen = StreamClient(
                    ConnectionOptions(url=proxy.base_url + "/v1/stream")
                ).extensions()
                assert seen.version(ext.BULK_WRITE) == 1  # the older server's view
                run(proxy.base_url + "/v1/stream")
                failing = {rows + v for v in failing}
                run(proxy.base_url + "/v1/stream")
    assert len(list(markers.iterdir())) >= 2, "no attempt failed: nothing was tested"
    for s in range(streams):
        assert_exactly_once(read_stream(direct, f"{base}/s{s}"), range(s, 2 * rows, streams))


def _run_available_now(df, root: str, checkpoint, **options: str) -> None:
    """The routed ``df`` written by an AvailableNow query to the sink at ``root``; it must succeed."""
    query = (
        df.writeStream.format("durastream")
        .option("url", root)
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
