"""The idle wait and packed tasks in real Spark queries (issue 16, the source).

A streaming query whose last trigger found nothing waits on the server's change feed (``wait=``) for
a selected stream to change. ``Trigger.AvailableNow`` runs and batch reads must end, so they never
ask the server to wait; what they sent is read from the server's own access log. ``query.stop()``
must not hang on a trigger parked on the server. Packed tasks are a pure function of the batch's
offsets: a batch replayed after a failure has the same tasks, observed as the partition that read
each stream. Without the change feed (the server behind a proxy that hides its extensions), a query
still reads every message once.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from durastream_spark.protocol.extensions import CHANGES_PATH
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
from tests.support.hiding_proxy import ExtensionHidingProxy
from tests.support.http import poll_until

DEADLINE_S = 60.0
STREAMS = 24
PER_STREAM = 3

pytestmark = pytest.mark.skipif(
    not HAS_ADMISSION_CONTROL, reason="the idle wait of latestOffset(start, limit): Spark >= 4.2"
)


def fill(streams: Streams, base: str, count: int = STREAMS) -> list[str]:
    paths = [streams.create(f"{base}/s{i:03d}") for i in range(count)]
    for i, path in enumerate(paths):
        streams.append_json(path, docs(i * 100, PER_STREAM))
    return paths


def feed_requests(log_path: Path) -> list[str]:
    """The change-feed request lines of the server's access log (``--access-log``)."""
    return [line for line in log_path.read_text().splitlines() if CHANGES_PATH in line]


def waiters(server) -> int:
    return int(requests.get(server.base_url + "/healthz", timeout=5).json()["waiters"])


def test_available_now_and_batch_reads_never_wait_on_the_change_feed(
    spark, server_factory, tmp_path: Path
) -> None:
    server = server_factory(extra_args=("--access-log",))
    streams = Streams(server)
    base = unique("nowait")
    paths = fill(streams, base)
    options = options_for(server, pattern=f"{base}/*")

    collector = BatchCollector()
    run_available_now(spark, options, str(tmp_path / "chk"), collector)
    assert len(collector.rows) == STREAMS * PER_STREAM
    # A second run finds nothing new: the case where a streaming trigger would wait.
    again = BatchCollector()
    run_available_now(spark, options, str(tmp_path / "chk"), again)
    assert again.rows == []
    assert spark.read.format("durastream").options(**options).load().count() == STREAMS * 3

    asked = feed_requests(server.log_path)
    assert asked, "the runs asked the change feed"
    assert not [line for line in asked if "wait=" in line], asked
    assert waiters(server) == 0
    assert all(path in {row["stream"] for row in collector.rows} for path in paths)


def test_stop_of_an_idle_query_returns_while_it_waits_on_the_server(
    spark, server_factory, tmp_path: Path
) -> None:
    server = server_factory(extra_args=("--access-log",))
    streams = Streams(server)
    base = unique("idlestop")
    fill(streams, base, 4)
    collector = BatchCollector()
    query = (
        reader_of(spark, options_for(server, pattern=f"{base}/*"))
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        poll_until(
            lambda: len(collector.rows) == 4 * PER_STREAM, "the backlog to be read", DEADLINE_S
        )
        poll_until(
            lambda: waiters(server) >= 1, "an idle trigger parked on the change feed", DEADLINE_S
        )
        stopper = threading.Thread(target=query.stop)
        stopper.start()
        stopper.join(DEADLINE_S)  # generous: the wait is at most a second
        assert not stopper.is_alive(), "query.stop() did not return"
        assert not query.isActive
    finally:
        if query.isActive:
            query.stop()
    poll_until(lambda: waiters(server) == 0, "the parked request to be released", DEADLINE_S)


def test_a_replayed_batch_has_the_same_packed_tasks(
    spark, durastream_server, tmp_path: Path
) -> None:
    from pyspark.sql.functions import spark_partition_id

    streams = Streams(durastream_server)
    base = unique("replaypack")
    paths = fill(streams, base)
    options = options_for(durastream_server, pattern=f"{base}/*", maxMessagesPerPartition=10)
    seen: list[dict[str, int]] = []
    failed = threading.Event()

    def tasks_then_fail_once(frame, batch_id: int) -> None:
        rows = frame.select("stream", spark_partition_id().alias("task")).collect()
        seen.append({row["stream"]: row["task"] for row in rows})
        if not failed.is_set():
            failed.set()
            raise RuntimeError("injected: the batch fails after reading, before its commit")

    checkpoint = str(tmp_path / "chk")
    query = (
        reader_of(spark, options)
        .writeStream.foreachBatch(tasks_then_fail_once)
        .trigger(availableNow=True)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    with pytest.raises(Exception, match="injected"):
        query.awaitTermination(DEADLINE_S * 2)
    collector = BatchCollector(lambda f: f.select("stream", spark_partition_id().alias("task")))
    run_available_now(spark, options, checkpoint, collector)

    replayed = {row["stream"]: row["task"] for row in collector.non_empty_batches[0][1]}
    assert sorted(replayed) == paths
    assert len(set(replayed.values())) >= 3  # 72 messages, at most 10 a task: packed, not one task
    assert replayed == seen[0]  # the same streams in the same tasks


class _Proxied:
    """A server seen through ``ExtensionHidingProxy``: what ``options_for`` needs of a server."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


def test_without_the_change_feed_spark_still_reads_everything_once(
    spark, durastream_server, tmp_path: Path
) -> None:
    """A base-protocol view of the server (no ``changes``, no ``multi-range``): triggers poll each
    stream and read every message once, including what arrives between two runs."""
    streams = Streams(durastream_server)
    base = unique("fallback")
    paths = fill(streams, base, 12)
    with ExtensionHidingProxy(durastream_server.port) as proxy:
        options = options_for(_Proxied(proxy.base_url), streams=",".join(paths))
        first = BatchCollector()
        run_available_now(spark, options, str(tmp_path / "chk"), first)
        streams.append_json(paths[4], docs(9000, 2))
        second = BatchCollector()
        run_available_now(spark, options, str(tmp_path / "chk"), second)
        total = spark.read.format("durastream").options(**options).load().count()
        assert proxy.hidden >= 1  # the connector asked for the extensions and was refused
    grouped: dict[str, list[bytes]] = {}
    for row in first.rows:
        grouped.setdefault(row["stream"], []).append(bytes(row["value"]))
    assert grouped == {path: encoded(docs(i * 100, PER_STREAM)) for i, path in enumerate(paths)}
    assert [bytes(r["value"]) for r in second.rows] == encoded(docs(9000, 2))
    assert total == 12 * PER_STREAM + 2
