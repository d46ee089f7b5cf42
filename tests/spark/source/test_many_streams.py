"""Many small streams (issue 16, the source): costs follow the data that moved, not the number of streams.

Called at the API Spark drives, against the real durastream-server, with a spy on the client's HTTP
exchanges to count what each step sends: packed tasks replay identically, planning asks the change feed
(never one ``HEAD`` per stream), an idle trigger waits on the server instead of polling, and offsets of
many streams stay compact in the checkpoint.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.extensions import (
    BYTE_POSITIONS,
    CHANGES_PATH,
    LISTING_PATH,
    LOOKUPS_PATH,
    READS_PATH,
)
from durastream_spark.source import batch_reader, scan, stream_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from durastream_spark.source.scan import PackedPartition
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
from tests.spark.source.test_reader_api import all_available, read_all
from tests.support.hiding_proxy import ExtensionHidingProxy

STREAMS = 240
PER_STREAM = 3
DEADLINE_S = 30.0


@pytest.fixture
def streams(durastream_server) -> Streams:
    return Streams(durastream_server)


@pytest.fixture
def exchanges(monkeypatch) -> Iterator[list[tuple[str, str]]]:
    """Every HTTP exchange of every client in this process, as ``(method, url)``: a spy that calls the
    real method."""
    seen: list[tuple[str, str]] = []
    real = StreamClient._exchange

    def spy(self, method, url, *args, **kwargs):
        seen.append((method, url))
        return real(self, method, url, *args, **kwargs)

    monkeypatch.setattr(StreamClient, "_exchange", spy)
    yield seen


def fill(streams: Streams, base: str, count: int = STREAMS) -> list[str]:
    paths = [streams.create(f"{base}/s{i:04d}") for i in range(count)]
    for i, path in enumerate(paths):
        streams.append_json(path, docs(i * 100, PER_STREAM))
    return paths


def expected_rows(paths: list[str]) -> dict[str, list[bytes]]:
    return {path: encoded(docs(i * 100, PER_STREAM)) for i, path in enumerate(paths)}


def by_stream(rows: list[dict]) -> dict[str, list[bytes]]:
    grouped: dict[str, list[bytes]] = {}
    for row in rows:
        grouped.setdefault(row["stream"], []).append(bytes(row["value"]))
    return grouped


def first_batch(server, streams: Streams, base: str, **chosen):
    """Fill ``base`` and plan a streaming reader's first batch over it: ``(paths, options, reader,
    start, end)``."""
    paths = fill(streams, base)
    options = options_for(server, pattern=f"{base}/*", **chosen)
    reader = stream_reader(options, DEFAULT_SCHEMA)
    start = reader.initialOffset()
    return paths, options, reader, start, all_available(reader, start)


def assert_replays_identically(
    streams: Streams, options, paths, start, end, partitions, rows
) -> None:
    """Appends after the batch change nothing of it: a restarted driver (no shared state) plans the
    same tasks, which read the same rows."""
    for path in paths[::50]:
        streams.append_json(path, docs(9000, 5))
    restarted = stream_reader(options, DEFAULT_SCHEMA)
    replayed = restarted.partitions(start, end)
    assert replayed == partitions
    assert read_all(restarted, replayed) == rows


def test_many_small_streams_are_packed_into_few_tasks_that_replay_identically(
    durastream_server, streams: Streams, exchanges
) -> None:
    paths, options, reader, start, end = first_batch(
        durastream_server, streams, unique("packed"), maxMessagesPerPartition=200
    )
    partitions = reader.partitions(start, end)

    # 720 messages, at most 200 a task: 4 tasks, not 240.
    assert len(partitions) == 4
    assert all(isinstance(p, PackedPartition) for p in partitions)
    assert [s.stream for p in partitions for s in p.segments] == paths  # each range once, in order
    assert all(sum(s.messages for s in p.segments) <= 200 for p in partitions)
    exchanges.clear()
    rows = read_all(reader, partitions)
    assert by_stream(rows) == expected_rows(paths)
    reads = [url for method, url in exchanges if method == "POST" and url.endswith(READS_PATH)]
    assert 1 <= len(reads) <= 8 and len(exchanges) == len(reads)  # multi-range reads only
    assert_replays_identically(streams, options, paths, start, end, partitions, rows)


def test_a_batch_read_of_many_streams_is_a_few_tasks(durastream_server, streams: Streams) -> None:
    base = unique("packed-batch")
    paths = fill(streams, base)
    reader = batch_reader(options_for(durastream_server, pattern=f"{base}/*"), DEFAULT_SCHEMA)
    partitions = reader.partitions()
    assert len(partitions) == 1 and isinstance(partitions[0], PackedPartition)
    assert by_stream(read_all(reader, partitions)) == expected_rows(paths)


def with_a_large_stream(streams: Streams, name: str) -> tuple[str, list[str], str]:
    """20 small streams and ``<base>/big`` of 600 messages (~11 KB): ``(base, small, big)``."""
    base = unique(name)
    small = fill(streams, base, 20)
    big = streams.create(f"{base}/big")
    for first in range(0, 600, 200):
        streams.append_json(big, docs(first, 200))
    return base, small, big


def test_large_ranges_are_still_split_among_packed_small_ones(
    durastream_server, streams: Streams
) -> None:
    base, small, big = with_a_large_stream(streams, "mixed")
    options = options_for(durastream_server, pattern=f"{base}/*", maxMessagesPerPartition=100)
    reader = stream_reader(options, DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = all_available(reader, start)
    partitions = reader.partitions(start, end)

    def messages(partition) -> int:
        if isinstance(partition, PackedPartition):
            return sum(s.messages for s in partition.segments)
        return len(read_all(reader, [partition]))

    assert all(messages(p) <= 100 for p in partitions)
    assert 6 <= len(partitions) <= 8  # 600 of big in 6 parts, 60 of the small ones packed
    rows = read_all(reader, partitions)
    assert by_stream(rows)[big] == encoded(docs(0, 600))
    assert {path: by_stream(rows)[path] for path in small} == expected_rows(small)


@pytest.mark.parametrize("selection", ["pattern", "streams"])
def test_planning_asks_the_change_feed_not_each_stream(
    durastream_server, streams: Streams, exchanges, selection: str
) -> None:
    base = unique(f"plan-{selection}")
    paths = fill(streams, base)
    chosen = {"pattern": f"{base}/*"} if selection == "pattern" else {"streams": ",".join(paths)}
    reader = stream_reader(options_for(durastream_server, **chosen), DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = all_available(reader, start)
    read_all(reader, reader.partitions(start, end))
    reader.commit(end)

    moved = [paths[7], paths[100], paths[233]]
    for path in moved:
        streams.append_json(path, docs(5000, 2))
    exchanges.clear()
    later = all_available(reader, end)
    planning = list(exchanges)
    rows = read_all(reader, reader.partitions(end, later))

    assert sorted(by_stream(rows)) == sorted(moved)
    assert all(len(values) == 2 for values in by_stream(rows).values())
    methods = Counter(method for method, _ in planning)
    assert methods["HEAD"] == 0  # never one HEAD per stream
    feed = [url for _, url in planning if CHANGES_PATH in url]
    assert len(feed) == 1 and len(planning) <= 3, planning


def wait_for_waiters(base_url: str, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if requests.get(base_url + "/healthz", timeout=5).json()["waiters"] >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"no request parked on the server within {DEADLINE_S} s")


def test_an_idle_trigger_waits_on_the_server_and_answers_as_soon_as_a_stream_changes(
    server_factory, exchanges
) -> None:
    server = server_factory()
    streams = Streams(server)
    base = unique("idle")
    paths = fill(streams, base, 30)
    reader = stream_reader(options_for(server, pattern=f"{base}/*"), DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = all_available(reader, start)
    assert all_available(reader, end) == end  # nothing new: the next trigger may wait

    exchanges.clear()
    answers: list[dict] = []
    trigger = threading.Thread(target=lambda: answers.append(all_available(reader, end)))
    trigger.start()
    wait_for_waiters(server.base_url, 1)  # parked on the change feed, not polling
    streams.append_json(paths[12], docs(700, 4))
    trigger.join(DEADLINE_S)
    assert not trigger.is_alive()
    (later,) = answers
    rows = read_all(reader, reader.partitions(end, later))
    assert by_stream(rows) == {paths[12]: encoded(docs(700, 4))}
    waits = [url for _, url in exchanges if CHANGES_PATH in url and "wait=" in url]
    assert waits and all("wait=1000" in url for url in waits)  # at most a second: stop() is prompt
    assert not [m for m, _ in exchanges if m == "HEAD"]


def test_a_checkpoint_of_many_streams_stays_compact(
    spark, durastream_server, streams: Streams, tmp_path: Path
) -> None:
    base = unique("compact")
    paths = fill(streams, base)
    options = options_for(durastream_server, pattern=f"{base}/*")
    checkpoint = str(tmp_path / "chk")
    first = BatchCollector()
    run_available_now(spark, options, checkpoint, first)
    assert by_stream(first.rows) == expected_rows(paths)

    streams.append_json(paths[3], docs(8000, 2))
    second = BatchCollector()
    run_available_now(spark, options, checkpoint, second)
    assert by_stream(second.rows) == {paths[3]: encoded(docs(8000, 2))}  # exactly once

    logs = sorted((tmp_path / "chk" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    offset = json.loads(logs[-1].read_text().splitlines()[-1])
    assert offset["v"] == 2 and offset["n"] == STREAMS
    readable = json.dumps({path: streams.tail(path) for path in paths})
    assert len(logs[-1].read_text()) < len(readable) / 3


# --------------------------------------------------------------------------------------------------------
# Sized by byte positions (docs/extensions.md section 12): packing without limit lookups
# --------------------------------------------------------------------------------------------------------


def lookups_of(exchanges: list[tuple[str, str]]) -> list[str]:
    return [url for _, url in exchanges if LOOKUPS_PATH in url or "lookup=limit" in url]


def streams_per_task(partitions) -> list[list[str]]:
    return [
        [s.stream for s in p.segments] if isinstance(p, PackedPartition) else [p.stream]
        for p in partitions
    ]


def filled(server, streams: Streams, name: str, **chosen) -> tuple[list[str], dict[str, str]]:
    """Streams ``<name>-<id>/sNNNN`` with their messages, and options selecting them by pattern."""
    base = unique(name)
    paths = fill(streams, base)
    return paths, options_for(server, pattern=f"{base}/*", **chosen)


def test_a_pattern_over_more_than_a_thousand_streams_is_listed_in_one_request(
    durastream_server, streams: Streams, exchanges
) -> None:
    """The listing asks for large pages (``LISTING_PAGE``, 2,500 streams): 1,050 streams are one
    listing request, not two (the planning of a batch read over many streams waits on each)."""
    base = unique("one-page")
    with requests.Session() as session:
        for n in range(1050):
            url = durastream_server.stream_url(f"{base}/s{n:04d}")
            put = session.put(url, headers={"Content-Type": "application/json"}, timeout=30)
            assert put.status_code == 201
    exchanges.clear()
    catalog = batch_reader(options_for(durastream_server, pattern=f"{base}/*"), DEFAULT_SCHEMA)
    assert catalog.partitions() == []  # empty streams: nothing to read
    listings = [url for _, url in exchanges if LISTING_PATH in url]
    assert len(listings) == 1, listings


def test_a_batch_read_is_packed_by_byte_positions_without_lookups(
    durastream_server, streams: Streams, exchanges
) -> None:
    paths, options = filled(durastream_server, streams, "positions-batch", minPartitions=3)
    exchanges.clear()
    reader = batch_reader(options, DEFAULT_SCHEMA)
    partitions = reader.partitions()

    assert lookups_of(exchanges) == []  # sized from the offsets alone
    assert (
        3 <= len(partitions) <= 4
    )  # an even byte share each (greedy: a last task may be a sliver)
    assert [s for task in streams_per_task(partitions) for s in task] == paths
    assert by_stream(read_all(reader, partitions)) == expected_rows(paths)
    again = batch_reader(options, DEFAULT_SCHEMA).partitions()  # the same ends: the same tasks
    assert again == partitions


def test_packed_tasks_sized_by_byte_positions_replay_identically(
    durastream_server, streams: Streams, exchanges
) -> None:
    paths, options, reader, start, end = first_batch(
        durastream_server, streams, unique("positions-replay"), minPartitions=4
    )
    exchanges.clear()
    partitions = reader.partitions(start, end)
    assert lookups_of(exchanges) == [] and len(partitions) >= 4
    rows = read_all(reader, partitions)
    assert by_stream(rows) == expected_rows(paths)
    assert_replays_identically(streams, options, paths, start, end, partitions, rows)


def test_only_a_range_too_large_for_a_task_is_measured_and_cut(
    durastream_server, streams: Streams, monkeypatch
) -> None:
    base, small, big = with_a_large_stream(streams, "positions-large")
    measured: list[str] = []
    real = StreamClient.lookup_ranges

    def spy(self, lookups):
        measured.extend(lookup.path for lookup in lookups)
        return real(self, lookups)

    monkeypatch.setattr(StreamClient, "lookup_ranges", spy)
    cap = 4096  # the big stream holds ~11 KB; each small one ~50 B
    options = options_for(durastream_server, pattern=f"{base}/*", maxBytesPerPartition=cap)
    reader = batch_reader(options, DEFAULT_SCHEMA)
    partitions = reader.partitions()

    assert measured == [big]
    tasks = streams_per_task(partitions)
    assert len([task for task in tasks if big in task]) >= 3  # cut at message boundaries
    for partition in partitions:  # every task within the cap
        assert sum(len(row["value"]) for row in read_all(reader, [partition])) <= cap
    rows = by_stream(read_all(reader, partitions))
    assert rows[big] == encoded(docs(0, 600))
    assert {path: rows[path] for path in small} == expected_rows(small)


def test_without_the_advertisement_ranges_are_measured_and_packed_alike(
    durastream_server, streams: Streams, exchanges
) -> None:
    paths, direct = filled(
        durastream_server, streams, "positions-hidden", maxBytesPerPartition=4096
    )
    expected = streams_per_task(batch_reader(direct, DEFAULT_SCHEMA).partitions())
    assert len(expected) >= 3
    with ExtensionHidingProxy(durastream_server.port, hide=frozenset({BYTE_POSITIONS})) as proxy:
        hidden = {**direct, "url": proxy.base_url + "/v1/stream"}
        exchanges.clear()
        reader = batch_reader(hidden, DEFAULT_SCHEMA)
        partitions = reader.partitions()
        assert not reader_extensions(hidden).byte_positions
        assert len(lookups_of(exchanges)) == 1  # today's path: one multi-range lookup
        assert streams_per_task(partitions) == expected  # the same bytes, so the same tasks
        assert by_stream(read_all(reader, partitions)) == expected_rows(paths)


def reader_extensions(options: dict[str, str]):
    from durastream_spark.options import ConnectionOptions

    return StreamClient(ConnectionOptions.parse({"url": options["url"]})).extensions()


@pytest.mark.parametrize("fail", ["true", "false"])
def test_a_stream_deleted_after_planning_by_positions_is_data_loss_in_its_task(
    durastream_server, streams: Streams, fail: str
) -> None:
    from durastream_spark.errors import DataLossError

    base = unique("positions-loss")
    paths = fill(streams, base, 30)
    options = options_for(durastream_server, pattern=f"{base}/*", failOnDataLoss=fail)
    reader = batch_reader(options, DEFAULT_SCHEMA)
    partitions = reader.partitions()
    gone = paths[11]
    streams.client.delete(gone)
    if fail == "false":  # warned, skipped, the others read exactly
        rows = by_stream(read_all(reader, partitions))
        assert rows == {p: v for p, v in expected_rows(paths).items() if p != gone}
        return
    with pytest.raises(DataLossError) as caught:
        read_all(reader, partitions)
    assert caught.value.stream == gone


def test_spark_reads_tasks_packed_by_byte_positions_exactly(
    spark, durastream_server, streams: Streams
) -> None:
    paths, options = filled(durastream_server, streams, "positions-spark", minPartitions=3)
    frame = reader_of(spark, options, stream=False)
    assert 3 <= frame.rdd.getNumPartitions() <= 4
    rows = [row.asDict() for row in frame.select("stream", "value").collect()]
    assert by_stream(rows) == expected_rows(paths)  # every message once, none from elsewhere


def test_a_packed_task_whose_answers_are_cut_short_reads_its_rows_in_order(
    server_factory, exchanges, monkeypatch
) -> None:
    """A packed task asks for its ranges a window at a time, and the server cuts answers short at
    its chunk size: every range is still read whole, once, continued where its answer stopped,
    and the rows come in order (the task's ranges in turn, each in offset order)."""
    server = server_factory(extra_args=["--chunk-bytes", "300"])  # ~3 of these messages an answer
    streams = Streams(server)
    paths, options = filled(server, streams, "windows", maxBytesPerPartition=1 << 20)
    monkeypatch.setattr(scan, "WINDOW_RANGES", 7)  # 240 ranges: 35 windows or more
    reader = batch_reader(options, DEFAULT_SCHEMA)
    partitions = reader.partitions()
    assert [type(p) for p in partitions] == [PackedPartition]

    exchanges.clear()
    rows = read_all(reader, partitions)
    reads = [url for _, url in exchanges if READS_PATH in url]
    assert len(reads) > len(paths) // 7 + 1  # some answers were cut short and continued
    wanted = [(path, value) for path, values in expected_rows(paths).items() for value in values]
    assert [(row["stream"], bytes(row["value"])) for row in rows] == wanted


def test_the_snapshot_as_columns_is_the_snapshot(durastream_server, streams: Streams) -> None:
    """The batch read plans from ``snapshot_columns`` (no object a stream): the same streams, tails,
    closures and content types in the same order as ``snapshot``, the source's own pins left out,
    for a one-regex pattern and a ``**`` one alike."""
    from durastream_spark.source.discovery import StreamCatalog

    base = unique("columns")
    paths = fill(streams, base, count=30)
    streams.append_json(paths[3], docs(0, 1), close=True)
    streams.create(f"{base}/pins/kept")
    streams.create(f"{base}/__pins/s0001", content_type="application/octet-stream")
    client = streams.client
    for pattern in (f"{base}/*", f"{base}/**"):
        catalog = StreamCatalog(client, pattern=pattern, exclude_prefix=f"{base}/__pins")
        states = catalog.snapshot()
        columns = catalog.snapshot_columns()
        assert columns.paths == list(states) and set(paths) <= set(states)
        assert f"{base}/__pins/s0001" not in states
        assert (f"{base}/pins/kept" in states) == (pattern.endswith("**"))
        assert columns.next_offsets == [state.tail for state in states.values()]
        assert columns.closed == [state.closed for state in states.values()]
        assert states[paths[3]].closed and not states[paths[4]].closed
        assert columns.content_types == [state.content_type for state in states.values()]
