"""The connector against ``durastream-server --workers 2`` (decision 0009, first step).

A worker serves only its shard; what spans streams is fanned out to every shard or answered 501
(subscriptions). The sink writes exactly once across a failed task attempt, with each row's stream
owned by either worker (so about half of the requests are forwarded); its targets are ensured in bulk
(``bulk-write`` is split by shard: shards/bulkwrite.py), and staged appends are served in each
stream's shard, so ``exactlyOnce=transactional`` (and ``auto``) stages and commits across both. The listing, the change feed and multi-range
reads are fanned out to every shard, so a ``pattern`` read finds every stream and reads them in packed
tasks, and a
streaming ``pattern`` query follows the change feed of both shards and waits on it when idle; the
rest answers 501 naming the flag.
"""

from __future__ import annotations

import sys
import threading

import pytest
import requests
from pyspark.sql import functions as F

from durastream_server.shards.layout import shard_of
from tests.server.workers.test_workers import paths_on_both_shards
from tests.spark.sink.probe import fail_first_attempt
from tests.spark.sink.support import assert_exactly_once, read_stream, unique
from tests.spark.source.support import BatchCollector, reader_of, run_available_now
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="--workers needs SO_REUSEPORT as Linux has it"
)

ROWS = 600
TARGETS = 12
PATTERN_STREAMS = 200  # small streams of a pattern read, on both shards


def _requests_of(server: ServerProcess, route: str) -> int:
    """Requests of ``route`` the whole server has answered (every shard's, from ``/metrics``)."""
    lines = requests.get(server.base_url + "/metrics").text.splitlines()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in lines
        if line.startswith("durastream_http_requests_total{") and f'route="{route}"' in line
    )


@pytest.fixture(scope="module")
def workers_server(tmp_path_factory):
    server = ServerProcess(
        tmp_path_factory.mktemp("workers") / "data", extra_args=("--workers", "2")
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _write_routed(spark, root: str, base: str, tmp_path, **options: str) -> None:
    """Write ``ROWS`` rows routed to ``TARGETS`` streams ``<base>/s<k>`` (``options`` added), in two
    partitions whose first attempt at one row fails."""
    markers = tmp_path / "markers"
    markers.mkdir()
    df = spark.range(0, ROWS, numPartitions=2).select(
        F.spark_partition_id().alias("p"),
        fail_first_attempt(F.col("id"), {ROWS - 7}, markers).alias("n"),
        F.concat(F.lit(f"{base}/s"), (F.col("id") % TARGETS).cast("string")).alias("stream"),
    )
    df.write.format("durastream").option("url", root).option("maxMessagesPerRequest", "10").options(
        **options
    ).mode("append").save()
    assert list(markers.iterdir()), "no attempt failed: nothing was tested"


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
    advertised = requests.get(workers_server.stream_url("__ds/x-durastream/extensions")).json()
    assert "bulk-write" in advertised["extensions"]  # the targets are ensured in bulk, both shards
    creates = _requests_of(workers_server, "create")
    _write_routed(spark, root, base, tmp_path)
    assert _requests_of(workers_server, "create") == creates, "a target was made by PUT, not ensure"

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


def _requests_of(server: ServerProcess, route: str) -> int:
    """The whole server's count of requests of ``route`` (every shard's, from /metrics)."""
    text = requests.get(server.base_url + "/metrics", timeout=30).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("durastream_http_requests_total{") and f'route="{route}"' in line
    )


def test_a_pattern_read_lists_every_shard_and_reads_each_row_once(
    sink_spark, workers_server, tmp_path
) -> None:
    """The listing is fanned out to every shard (shards/fanout.py) and so are multi-range reads
    (shards/multirange.py): a ``pattern`` batch read finds the streams of both workers and reads
    them in packed tasks, many ranges a request, not one request a stream."""
    root = workers_server.base_url + "/v1/stream"
    base = unique("pattern")
    streams = [f"{base}/s{k}" for k in range(PATTERN_STREAMS)]
    assert {shard_of(s, 2) for s in streams} == {0, 1}
    rows = [(f'{{"m":"{k}-{n}"}}', s) for k, s in enumerate(streams) for n in range(2)]
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
    single_reads = _requests_of(workers_server, "read")
    assert sorted((r.value, r.stream) for r in read.collect()) == expected
    # Packed: the rows came in multi-range requests ("discovery" route), not a read a stream.
    assert _requests_of(workers_server, "read") - single_reads < PATTERN_STREAMS // 10

    # streaming, Trigger.AvailableNow: the same rows, each once (the tracker lists, no change feed)
    collector = BatchCollector(
        lambda frame: frame.select("stream", F.col("value").cast("string").alias("value"))
    )
    run_available_now(
        sink_spark, {"url": root, "pattern": f"{base}/*"}, str(tmp_path / "cp"), collector
    )
    assert sorted((r["value"], r["stream"]) for r in collector.rows) == expected


def test_a_streaming_pattern_query_follows_both_shards_change_feed_each_row_once(
    sink_spark, workers_server, tmp_path
) -> None:
    """Default trigger: the source's tracker follows the fanned-out change feed (``changes`` is
    advertised), its idle triggers wait on it in both workers, and rows appended to streams of both
    shards while it runs (a new stream included) arrive each once; ``stop()`` ends it while it waits."""
    root = workers_server.base_url + "/v1/stream"
    advertised = requests.get(workers_server.stream_url("__ds/x-durastream/extensions")).json()
    assert "changes" in advertised["extensions"]
    base = unique("follow")
    streams = paths_on_both_shards(f"{base}/s", each=2)
    late = paths_on_both_shards(f"{base}/late", each=1)  # new streams, one per shard

    def write(rows: list[tuple[str, str]]) -> None:
        sink_spark.createDataFrame(rows, "value string, stream string").write.format(
            "durastream"
        ).option("url", root).mode("append").save()

    first = [(f'{{"m":"a{k}"}}', s) for k, s in enumerate(streams)]
    write(first)
    collector = BatchCollector(
        lambda frame: frame.select("stream", F.col("value").cast("string").alias("value"))
    )
    query = (
        reader_of(sink_spark, {"url": root, "pattern": f"{base}/*"})
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )

    def seen() -> list[tuple[str, str]]:
        return sorted((r["value"], r["stream"]) for r in collector.rows)

    try:
        poll_until(lambda: seen() == sorted(first), "the first rows read", timeout=120)
        poll_until(
            lambda: requests.get(workers_server.base_url + "/healthz").json()["waiters"] >= 1,
            "an idle trigger parked on the change feed",
            timeout=60,
        )
        second = [(f'{{"m":"b{k}"}}', s) for k, s in enumerate([*streams, *late])]
        write(second)
        poll_until(lambda: len(collector.rows) >= len(first) + len(second), "the rows", 120)
        assert seen() == sorted(first + second)  # every row once, from both shards
        stopper = threading.Thread(target=query.stop)
        stopper.start()
        stopper.join(60)  # generous: an idle wait is at most a second
        assert not stopper.is_alive(), "query.stop() did not return"
    finally:
        if query.isActive:
            query.stop()


def test_what_spans_streams_and_is_not_built_is_refused_naming_the_flag(workers_server) -> None:
    response = requests.get(workers_server.stream_url("__ds/x-durastream"))
    assert response.status_code == 501
    assert "--workers 2" in response.json()["error"]["message"]
    # Subscriptions are served by their owning worker (h59): an unknown one is the spec's 404.
    assert requests.get(workers_server.stream_url("__ds/subscriptions/s1")).status_code == 404


def test_a_transactional_routed_write_with_a_failed_attempt_is_exactly_once(
    sink_spark, workers_server, tmp_path
) -> None:
    """Staged appends are served by each stream's shard and bulk ``stages``/``commits`` are split by
    shard (decision 0009): ``exactlyOnce=transactional`` writes rows routed to streams of both
    shards (full requests staged one by one, the remainders in bulk, committed in bulk by the
    driver); the failed first attempt's handles are never committed, and each row is read back
    once."""
    spark = sink_spark
    root = workers_server.base_url + "/v1/stream"
    advertised = requests.get(workers_server.stream_url("__ds/x-durastream/extensions")).json()
    assert "staged-append" in advertised["extensions"]
    base = unique("workers-txn")
    streams = [f"{base}/s{k}" for k in range(TARGETS)]
    assert {shard_of(s, 2) for s in streams} == {0, 1}
    stages_before = _requests_of(workers_server, "stage")
    appends_before = _requests_of(workers_server, "append")
    _write_routed(spark, root, base, tmp_path, exactlyOnce="transactional")
    # Transactional: full requests were staged (in both shards' streams), nothing appended.
    assert _requests_of(workers_server, "stage") > stages_before
    assert _requests_of(workers_server, "append") == appends_before

    for k, stream in enumerate(streams):  # no loss, no duplicate, each partition's rows in order
        assert_exactly_once(read_stream(root, stream), range(k, ROWS, TARGETS))
