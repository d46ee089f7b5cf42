"""Issue 4, test 8: the same sink against the Node reference server (``@durable-streams/server``) and
rakaia (``rakaia-streams``), servers that advertise no durastream extensions.

``exactlyOnce=auto`` writes in ordered mode there, with the base protocol's idempotent producers only. What
holds on each (docs/compatibility.md): task failures, retried and truncated attempts are **exactly once**
(tested here); transactional mode is **refused** (tested here); a retry that sends other bytes under the
same producer tuple is accepted silently there, because neither keeps payload digests
(``tests/compat/test_servers.py``).
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from tests.spark.sink.probe import attempts, fail_first_attempt
from tests.spark.sink.support import assert_exactly_once, read_stream, spark_conf, unique

ROWS = 2000


@pytest.mark.parametrize("server_name", ["reference_server", "rakaia_server"])
def test_ordered_mode_is_exactly_once_on_servers_without_extensions(
    sink_spark, server_name, request, tmp_path
) -> None:
    spark = sink_spark
    root = request.getfixturevalue(server_name).stream_root
    stream = unique("reference")
    records, markers = tmp_path / "records", tmp_path / "markers"
    records.mkdir()
    markers.mkdir()
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .load()
        .select(
            F.spark_partition_id().alias("p"),
            fail_first_attempt(F.col("value"), {1400, 1401}, markers).alias("n"),
            F.lit("w" * 1000).alias("pad"),
        )
    )
    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="10"):
        query = (
            df.writeStream.format("durastream_probe")
            .option("url", root)
            .option("stream", stream)
            .option("maxMessagesPerRequest", "50")
            .option("probe.dir", str(records))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    assert query.exception() is None
    assert list(markers.iterdir()), "no attempt failed: nothing was tested"
    assert any(a["attempt"] == 0 and a["requests"] > 0 for a in attempts(records))
    assert_exactly_once(read_stream(root, stream), range(ROWS))


@pytest.mark.parametrize("server_name", ["reference_server", "rakaia_server"])
def test_transactional_mode_is_refused_by_servers_without_extensions(
    sink_spark, server_name, request
) -> None:
    df = sink_spark.range(0, 1).select(F.col("id").alias("n"))
    with pytest.raises(Exception, match="does not advertise the 'staged-append'"):
        (
            df.write.format("durastream")
            .option("url", request.getfixturevalue(server_name).stream_root)
            .option("stream", unique("reference-txn"))
            .option("exactlyOnce", "transactional")
            .mode("append")
            .save()
        )
