"""Issue 15, item 1, through Spark: an ``AvailableNow`` query changes ``exactlyOnce`` across a restart.

The reported run: an ordered query's second batch failed for good after its tasks had sent their full
requests; the query was restarted from its checkpoint with ``exactlyOnce=transactional`` (what the old
``ReorderedRetryError`` advised). The transactional replay took the ordered requests for its own earlier
commit, discarded the rest of those partitions, and reported success: 568 of 600 rows.

Now the transactional replay fails, naming the batch, both modes and what to do, without making anything
of the conflicting parts visible; the restart it asks for (``exactlyOnce=ordered``) finishes the batch, and
the next batch runs transactional again.
"""

from __future__ import annotations

from pyspark.errors import StreamingQueryException

from tests.spark.sink.probe import fail_while
from tests.spark.sink.support import (
    assert_exactly_once,
    rate_rows,
    read_stream,
    spark_conf,
    unique,
)

ROWS_PER_BATCH = 300


def test_available_now_query_switching_modes_across_a_failed_batch(
    sink_spark, durastream_server, tmp_path
) -> None:
    spark = sink_spark
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("spark-mode-switch")
    checkpoint = tmp_path / "checkpoint"
    switch = tmp_path / "fail-batch-1"
    # Batch 1 holds values 300..599; these fail on every attempt while the switch file exists.
    failing = {ROWS_PER_BATCH + 210, ROWS_PER_BATCH + 211}

    def run(mode: str):
        df = rate_rows(spark, ROWS_PER_BATCH, lambda value: fail_while(value, failing, switch))
        query = (
            df.writeStream.format("durastream")
            .option("url", root)
            .option("stream", stream)
            .option("exactlyOnce", mode)
            .option("maxMessagesPerRequest", "20")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
        except StreamingQueryException as failure:
            return failure
        return query.exception()

    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="10"):
        assert run("ordered") is None  # batch 0
        switch.write_text("")
        assert run("ordered") is not None  # batch 1 fails for good, after sending full requests
        switch.unlink()
        visible = [m["n"] for m in read_stream(root, stream)]
        assert ROWS_PER_BATCH < len(visible) < 2 * ROWS_PER_BATCH, "batch 1 left nothing visible"

        failure = run("transactional")  # the replay of batch 1 must not report success
        assert failure is not None, "a transactional replay 'committed' an ordered batch"
        text = str(failure)
        assert "Batch 1, partition" in text and "ordered mode" in text
        assert "restart the query from its checkpoint with exactlyOnce=ordered" in text
        # Nothing of the conflicting parts became visible, nothing was lost from what was there.
        after = [m["n"] for m in read_stream(root, stream)]
        assert after[: len(visible)] == visible
        assert len(set(after)) == len(after)

        # Finishes batch 1 exactly once (and, AvailableNow, runs the batch the source offers next).
        assert run("ordered") is None
        assert_exactly_once(read_stream(root, stream), range(3 * ROWS_PER_BATCH))
        assert run("transactional") is None  # the next batch, transactional again
    assert_exactly_once(read_stream(root, stream), range(4 * ROWS_PER_BATCH))
