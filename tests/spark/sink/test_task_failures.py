"""Issue 4, test 1: a task attempt fails after some of its requests were sent, and Spark retries it.

The failure is injected upstream of the writer (a UDF that raises on attempt 0), which is exactly the case
where Spark can end the writer's input iterator *cleanly* with a truncated partition. The probe records
every attempt's ``write()`` result, so the tests assert that the failing attempt really saw a truncated
input and really sent requests, and then that the stream holds every row exactly once, each partition's
rows in order.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from tests.spark.sink.probe import attempts, fail_first_attempt
from tests.spark.sink.support import (
    assert_exactly_once,
    rate_rows,
    read_stream,
    spark_conf,
    unique,
)

ROWS_PER_BATCH = 2000
PAD = "x" * 1000  # 1 KiB rows: the JVM flushes rows to the writer long before the failure


@pytest.mark.parametrize("mode", ["transactional", "ordered"])
def test_truncated_then_retried_attempt_writes_each_row_once(
    sink_spark, durastream_server, tmp_path, mode
) -> None:
    spark = sink_spark
    root = durastream_server.base_url + "/v1/stream"
    stream = unique(f"retry-{mode}")
    records, markers = tmp_path / "records", tmp_path / "markers"
    records.mkdir()
    markers.mkdir()
    # Attempt 0 of each partition fails at 70% of its rows (values are spread over both partitions).
    failing = {int(ROWS_PER_BATCH * 0.7), int(ROWS_PER_BATCH * 0.7) + 1}

    def run_once(checkpoint) -> None:
        df = rate_rows(
            spark, ROWS_PER_BATCH, lambda value: fail_first_attempt(value, failing, markers)
        )
        query = (
            df.writeStream.format("durastream_probe")
            .option("url", root)
            .option("stream", stream)
            .option("exactlyOnce", mode)
            .option("maxMessagesPerRequest", "50")
            .option("probe.dir", str(records))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None

    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="10"):
        checkpoint = tmp_path / "checkpoint"
        run_once(checkpoint)  # batch 0 (values 0..1999)
        failing = {ROWS_PER_BATCH + v for v in failing}
        run_once(checkpoint)  # batch 1 (values 2000..3999), same query id, next epoch

    assert sorted(p.name for p in markers.iterdir()), "no attempt failed: nothing was tested"
    seen = attempts(records)
    truncated = [a for a in seen if a["attempt"] == 0 and a["rows"] < ROWS_PER_BATCH // 2]
    assert truncated, f"no attempt saw a truncated input: {seen}"
    assert any(a["requests"] > 0 for a in truncated), f"truncated attempts sent nothing: {seen}"
    assert_exactly_once(read_stream(root, stream), range(2 * ROWS_PER_BATCH))


@pytest.mark.parametrize("mode", ["transactional", "ordered"])
def test_batch_write_with_a_failing_attempt_writes_each_row_once(
    sink_spark, durastream_server, tmp_path, mode
) -> None:
    spark = sink_spark
    root = durastream_server.base_url + "/v1/stream"
    stream = unique(f"batch-retry-{mode}")
    df = spark.range(0, 3000, numPartitions=3).select(
        F.spark_partition_id().alias("p"),
        fail_first_attempt(F.col("id"), {700, 1700, 2700}, tmp_path).alias("n"),
        F.lit(PAD).alias("pad"),
    )
    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="10"):
        (
            df.write.format("durastream")
            .option("url", root)
            .option("stream", stream)
            .option("exactlyOnce", mode)
            .option("maxMessagesPerRequest", "40")
            .mode("append")
            .save()
        )
    assert list(tmp_path.iterdir()), "no attempt failed: nothing was tested"
    assert_exactly_once(read_stream(root, stream), range(3000))
