"""The connector against ``durastream-server --workers 2`` (decision 0009, first step).

A worker serves only its shard and answers what spans streams (staged appends, bulk writes, multi-range
reads, the change feed) 501, and does not advertise those extensions. The connector must then do what it does
on a server without them: the sink writes in ordered mode, exactly once across a failed task attempt,
with each row's stream owned by either worker (so about half of the requests are forwarded); a batch
read of explicit streams reads them one at a time; the listing is fanned out to every shard, so a
``pattern`` read finds every stream; the rest answers 501 naming the flag.
"""

from __future__ import annotations

import sys

import pytest
import requests
from pyspark.sql import functions as F

from durastream_server.shards.layout import shard_of
from tests.spark.sink.probe import fail_first_attempt
from tests.spark.sink.support import assert_exactly_once, read_stream, unique
from tests.spark.source.support import BatchCollector, run_available_now
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="--workers needs SO_REUSEPORT as Linux has it"
)

ROWS = 600
TARGETS = 12


@pytest.fixture(scope="module")
def workers_server(tmp_path_factory):
    server = ServerProcess(
        tmp_path_factory.mktemp("workers") / "data", extra_args=("--workers", "2")
    ).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_routed_write_with_a_failed_attempt_is_exactly_once_and_reads_back(
    sink_spark, workers_server, tmp_path
) -> None:
    spark = sink_spark
    root = workers_server.base_url + "/v1/stream"
    base = unique("workers")
    streams = [f"{base}/s{k}" for k in range(TARGETS)]
    assert {shard_of(s, 2) for s in streams} == {0, 1}, (
        "every target on one shard: nothing forwarded"
    )
    markers = tmp_path / "markers"
    markers.mkdir()
    df = spark.range(0, ROWS, numPartitions=2).select(
        F.spark_partition_id().alias("p"),
        fail_first_attempt(F.col("id"), {ROWS - 7}, markers).alias("n"),
        F.concat(F.lit(f"{base}/s"), (F.col("id") % TARGETS).cast("string")).alias("stream"),
    )
    df.write.format("durastream").option("url", root).option("maxMessagesPerRequest", "10").mode(
        "append"
    ).save()
    assert list(markers.iterdir()), "no attempt failed: nothing was tested"

    for k, stream in enumerate(streams):  # no loss, no duplicate, each partition's rows in order
        assert_exactly_once(read_stream(root, stream), range(k, ROWS, TARGETS))

    read = (
        spark.read.format("durastream")
        .option("url", root)
        .option("streams", ",".join(streams))
        .load()
        .select(F.get_json_object(F.col("value").cast("string"), "$.n").cast("long").alias("n"))
    )
    assert sorted(r.n for r in read.collect()) == list(range(ROWS))


def test_a_pattern_read_lists_every_shard_and_reads_each_row_once(
    sink_spark, workers_server, tmp_path
) -> None:
    """The listing is fanned out to every shard (shards/fanout.py): a ``pattern`` batch read finds the
    streams of both workers and reads them with the fallbacks of a server without multi-range."""
    root = workers_server.base_url + "/v1/stream"
    base = unique("pattern")
    streams = [f"{base}/s{k}" for k in range(TARGETS)]
    assert {shard_of(s, 2) for s in streams} == {0, 1}
    rows = [(f'{{"m":"{k}-{n}"}}', s) for k, s in enumerate(streams) for n in range(5)]
    sink_spark.createDataFrame(rows, "value string, stream string").write.format(
        "durastream"
    ).option("url", root).mode("append").save()
    read = (
        sink_spark.read.format("durastream")
        .option("url", root)
        .option("pattern", f"{base}/*")
        .load()
        .select(F.col("stream"), F.col("value").cast("string").alias("value"))
    )
    expected = sorted((value, stream) for value, stream in rows)
    assert sorted((r.value, r.stream) for r in read.collect()) == expected

    # streaming, Trigger.AvailableNow: the same rows, each once (the tracker lists, no change feed)
    collector = BatchCollector(
        lambda frame: frame.select("stream", F.col("value").cast("string").alias("value"))
    )
    run_available_now(
        sink_spark, {"url": root, "pattern": f"{base}/*"}, str(tmp_path / "cp"), collector
    )
    assert sorted((r["value"], r["stream"]) for r in collector.rows) == expected


def test_what_spans_streams_and_is_not_built_is_refused_naming_the_flag(workers_server) -> None:
    response = requests.get(workers_server.stream_url("__ds/x-durastream/changes"))
    assert response.status_code == 501
    assert "--workers 2" in response.json()["error"]["message"]
