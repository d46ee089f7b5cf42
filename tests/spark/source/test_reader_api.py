"""The reader objects Spark drives, called directly against the real server (fast, precise, no query).

These pin down the correctness properties at the API Spark uses: ``partitions(start, end)`` followed by
``read()`` yields the same rows every time, whatever is appended meanwhile; ``latest`` survives a restart
before the first commit; one large stream splits into tasks at message boundaries; admission control
shares the budget and never exceeds it.
"""

from __future__ import annotations

import threading

import pytest
from pyspark.sql.types import StructType

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from durastream_spark.source import batch_reader, stream_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from durastream_spark.source.offsets import EARLIEST
from durastream_spark.source.scan import FRAMES_ROUTE, RangePartition
from tests.spark.source.support import Streams, docs, encoded, options_for, unique

needs_admission_control = pytest.mark.skipif(
    not HAS_ADMISSION_CONTROL,
    reason="admission control (latestOffset(start, limit), getDefaultReadLimit) needs Spark >= 4.2",
)


def read_all(reader, partitions) -> list[dict]:
    return [
        row
        for partition in partitions
        for batch in reader.read(partition)
        for row in batch.to_pylist()
    ]


def all_available(reader, start: dict) -> dict:
    """The end of a batch that reads everything: ``latestOffset()`` without a limit on Spark 4.0/4.1."""
    if not HAS_ADMISSION_CONTROL:
        return reader.latestOffset()
    from durastream_spark.compat import ReadAllAvailable

    return reader.latestOffset(start, ReadAllAvailable())


def test_replay_is_identical_after_more_appends(durastream_server, streams: Streams) -> None:
    base = unique("replay")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b", "text/plain")
    streams.append_json(a, docs(0, 50))
    streams.append_raw(b, b"one", "text/plain")
    streams.append_raw(b, b"two", "text/plain")
    options = options_for(durastream_server, streams=f"{a},{b}")

    reader = stream_reader(options, DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = all_available(reader, start)
    first = read_all(reader, reader.partitions(start, end))

    streams.append_json(a, docs(50, 25))
    streams.append_raw(b, b"three", "text/plain")
    again = read_all(reader, reader.partitions(start, end))
    restarted = stream_reader(options, DEFAULT_SCHEMA)  # as after a driver restart: no shared state
    replayed = read_all(restarted, restarted.partitions(start, end))

    assert first == again == replayed
    assert [r["value"] for r in first if r["stream"] == a] == encoded(docs(0, 50))
    assert [r["value"] for r in first if r["stream"] == b] == [b"one", b"two"]  # one row per append


def test_reads_racing_appends_never_pass_the_end(durastream_server, streams: Streams) -> None:
    path = streams.create(unique("race"))
    streams.append_json(path, docs(0, 200))
    reader = stream_reader(options_for(durastream_server, streams=path), DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = all_available(reader, start)
    stop = threading.Event()

    def writer() -> None:
        n = 200
        while not stop.is_set():
            streams.append_json(path, docs(n, 20))
            n += 20

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        reads = [read_all(reader, reader.partitions(start, end)) for _ in range(5)]
    finally:
        stop.set()
        thread.join()
    assert all(read == reads[0] for read in reads)
    assert [r["value"] for r in reads[0]] == encoded(docs(0, 200))


def test_latest_is_the_same_after_a_restart_before_the_first_commit(
    durastream_server, streams: Streams
) -> None:
    path = streams.create(unique("latest"))
    streams.append_json(path, docs(0, 10))
    options = options_for(durastream_server, streams=path, startingOffsets="latest")

    first_run = stream_reader(options, DEFAULT_SCHEMA)
    initial = first_run.initialOffset()
    end0 = all_available(first_run, initial)  # Spark writes this to the offset log, then crashes
    streams.append_json(path, docs(10, 5))

    second_run = stream_reader(options, DEFAULT_SCHEMA)
    assert second_run.initialOffset() == initial  # a pure function of the options
    assert read_all(second_run, second_run.partitions(initial, end0)) == []  # batch 0: nothing
    end1 = all_available(second_run, end0)
    rows = read_all(second_run, second_run.partitions(end0, end1))
    assert [r["value"] for r in rows] == encoded(docs(10, 5))


def test_one_large_stream_splits_into_tasks_at_message_boundaries(
    durastream_server, streams: Streams
) -> None:
    path = streams.create(unique("split"))
    payload = "x" * 1000
    for first in range(0, 2000, 500):
        streams.append_json(path, docs(first, 500, pad=payload))
    options = options_for(durastream_server, streams=path, maxBytesPerPartition="256k")
    reader = stream_reader(options, DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = all_available(reader, start)
    partitions = reader.partitions(start, end)

    assert 7 <= len(partitions) <= 10  # about 2 MB / 256 KiB
    assert all(isinstance(p, RangePartition) and p.route == FRAMES_ROUTE for p in partitions)
    assert partitions[0].start == EARLIEST and partitions[-1].end == end[path]
    assert all(x.end == y.start for x, y in zip(partitions, partitions[1:], strict=False))
    per_task = [[r["value"] for r in read_all(reader, [p])] for p in partitions]
    assert all(per_task)
    assert [v for task in per_task for v in task] == encoded(docs(0, 2000, pad=payload))
    assert max(sum(len(v) for v in task) for task in per_task) <= 256 * 1024 + 1100

    spread = stream_reader(
        {**options, "maxBytesPerPartition": "1g", "minPartitions": "4"}, DEFAULT_SCHEMA
    )
    assert len(spread.partitions(start, end)) == 4


def test_batch_reader_plans_the_same_split(durastream_server, streams: Streams) -> None:
    path = streams.create(unique("batchsplit"))
    streams.append_json(path, docs(0, 100))
    reader = batch_reader(
        options_for(durastream_server, streams=path, maxMessagesPerPartition=30), DEFAULT_SCHEMA
    )
    partitions = reader.partitions()
    assert len(partitions) == 4
    assert [r["value"] for r in read_all(reader, partitions)] == encoded(docs(0, 100))


@needs_admission_control
def test_admission_control_shares_the_budget_in_proportion_to_lag(
    durastream_server, streams: Streams
) -> None:
    from durastream_spark.compat import ReadMaxRows

    base = unique("admit")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 30))
    streams.append_json(b, docs(100, 10))
    reader = stream_reader(
        options_for(durastream_server, streams=f"{a},{b}", maxMessagesPerTrigger=8), DEFAULT_SCHEMA
    )
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxRows(8)
    start, sizes, rows = reader.initialOffset(), [], []
    while True:
        end = reader.latestOffset(start, limit)
        if end == start:
            break
        batch = read_all(reader, reader.partitions(start, end))
        sizes.append((sum(r["stream"] == a for r in batch), sum(r["stream"] == b for r in batch)))
        rows += batch
        start = end
    assert sizes[0] == (6, 2)  # 8 shared 30:10
    assert all(x + y <= 8 for x, y in sizes) and sum(x + y for x, y in sizes) == 40
    assert sorted(r["value"] for r in rows) == sorted(encoded(docs(0, 30) + docs(100, 10)))
    assert reader.reportLatestOffset() == {a: streams.tail(a), b: streams.tail(b)}


def test_pattern_picks_up_new_streams_from_their_beginning(
    durastream_server, streams: Streams
) -> None:
    base = unique("discover")
    first = streams.create(f"{base}/one")
    streams.append_json(first, docs(0, 3))
    reader = stream_reader(
        options_for(durastream_server, pattern=f"{base}/*", startingOffsets="latest"),
        DEFAULT_SCHEMA,
    )
    start = reader.initialOffset()
    end0 = all_available(reader, start)
    assert read_all(reader, reader.partitions(start, end0)) == []  # existing data skipped

    second = streams.create(f"{base}/two")
    streams.append_json(second, docs(10, 2))
    streams.append_json(first, docs(3, 1))
    streams.create(f"{base}-other/x")  # does not match
    end1 = all_available(reader, end0)
    rows = read_all(reader, reader.partitions(end0, end1))
    assert sorted((r["stream"], r["value"]) for r in rows) == sorted(
        [(first, v) for v in encoded(docs(3, 1))] + [(second, v) for v in encoded(docs(10, 2))]
    )


def test_user_schema_refuses_a_non_json_stream_when_planning(
    durastream_server, streams: Streams
) -> None:
    from durastream_spark.source.arrow import SchemaNotSupported

    path = streams.create(unique("text"), "text/plain")
    streams.append_raw(path, b"plain", "text/plain")
    reader = batch_reader(
        options_for(durastream_server, streams=path),
        StructType.fromJson(
            {
                "type": "struct",
                "fields": [{"name": "id", "type": "integer", "nullable": True, "metadata": {}}],
            }
        ),
    )
    with pytest.raises(SchemaNotSupported, match="text/plain"):
        reader.partitions()


def test_a_stream_deleted_after_planning_is_data_loss_in_the_task(
    durastream_server, streams: Streams
) -> None:
    from durastream_spark.errors import DataLossError

    for fail in ("true", "false"):
        path = streams.create(unique("taskloss"))
        streams.append_json(path, docs(0, 5))
        reader = stream_reader(
            options_for(durastream_server, streams=path, failOnDataLoss=fail), DEFAULT_SCHEMA
        )
        start = reader.initialOffset()
        end = all_available(reader, start)
        partitions = reader.partitions(start, end)
        assert partitions
        streams.client.delete(path)
        if fail == "false":
            assert read_all(reader, partitions) == []  # warned, skipped, continued
            continue
        with pytest.raises(DataLossError) as caught:
            read_all(reader, partitions)
        assert caught.value.stream == path and caught.value.end == end[path]
        assert path in str(caught.value) and "failOnDataLoss=false" in str(caught.value)


def test_a_starting_offset_past_the_tail_is_an_option_error(
    durastream_server, streams: Streams
) -> None:
    from durastream_spark.errors import OptionError

    path = streams.create(unique("badstart"))
    streams.append_json(path, docs(0, 1))
    beyond = "0000000000000000_0000000000999999"
    reader = stream_reader(
        options_for(durastream_server, streams=path, startingOffsets=f'{{"{path}": "{beyond}"}}'),
        DEFAULT_SCHEMA,
    )
    with pytest.raises(OptionError) as caught:  # planning the end (Spark >= 4.2) or the batch (4.0)
        start = reader.initialOffset()
        reader.partitions(start, all_available(reader, start))
    assert caught.value.option == "startingOffsets" and beyond in str(caught.value)


def test_the_latest_offset_of_many_streams_re_encodes_only_the_tails_that_moved(
    durastream_server, streams: Streams, monkeypatch
) -> None:
    """``reportLatestOffset`` runs every trigger: over many streams its text is derived from the last
    one (only moved tails encoded again), and says exactly every tail."""
    from durastream_spark.source import offset_codec
    from durastream_spark.source.offsets import SourceOffset

    base = unique("latest-many")
    paths = [streams.create(f"{base}/s{i:03d}") for i in range(120)]
    for path in paths[:3]:
        streams.append_json(path, docs(0, 2))
    reader = stream_reader(options_for(durastream_server, pattern=f"{base}/*"), DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = all_available(reader, start)
    first = SourceOffset.from_dict(reader.reportLatestOffset())
    assert first.as_dict() == {path: streams.tail(path) for path in paths}

    written: list[str] = []
    real = offset_codec.entry_text
    monkeypatch.setattr(
        offset_codec, "entry_text", lambda path, value: written.append(path) or real(path, value)
    )
    streams.append_json(paths[7], docs(0, 1))
    all_available(reader, end)
    latest = SourceOffset.from_dict(reader.reportLatestOffset())
    assert latest.as_dict() == {path: streams.tail(path) for path in paths}
    assert paths[7] in written and len(set(written)) <= 2  # the moved tail (and the batch end's)
