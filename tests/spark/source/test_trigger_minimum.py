"""``minMessagesPerTrigger`` / ``minBytesPerTrigger`` with ``maxTriggerDelay`` (Spark >= 4.2): a trigger
skips the batch until enough is waiting or the delay has passed since the last batch, whose time lives in
the offset log, so a restart neither waits the whole delay again nor skips it. No timing is asserted: the
tests wait (by polling) until a delay has certainly passed, or use a delay no test run reaches."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from durastream_spark.errors import OptionError
from durastream_spark.source import stream_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from durastream_spark.source.offsets import BATCH_TIME_KEY, SourceOffset
from durastream_spark.source.options import SourceOptions
from durastream_spark.source.planner import RangeSize, TriggerMinimum, batch_due
from tests.spark.source.support import (
    BatchCollector,
    docs,
    ids_of,
    options_for,
    reader_of,
    run_available_now,
    unique,
)

needs_admission_control = pytest.mark.skipif(
    not HAS_ADMISSION_CONTROL, reason="minMessagesPerTrigger needs Spark >= 4.2 (ReadMinRows)"
)
HOUR = "1h"


@pytest.mark.parametrize(
    ("lags", "last", "now", "due"),
    [
        ({"a": RangeSize(6, 60), "b": RangeSize(4, 40)}, 0, 1, True),  # 10 messages: enough
        ({"a": RangeSize(9, 90)}, 0, 999, False),  # too few, delay not passed
        ({"a": RangeSize(9, 90)}, 0, 1000, True),  # the delay has passed since the last batch
        ({"a": RangeSize(1, 5000)}, 0, 1, True),  # the byte minimum is reached
        ({}, None, 0, True),  # a new query's first batch is not held back
    ],
)
def test_batch_due(lags: dict, last: int | None, now: int, due: bool) -> None:
    assert batch_due(lags, TriggerMinimum(10, 4096, 1000), last, now) is due


def test_the_batch_time_round_trips_and_old_offsets_stay_readable() -> None:
    offset = SourceOffset.of({"a": "0000000000000000_0000000000000004"}, batch_ms=1_700_000_000_000)
    assert json.loads(offset.json())[BATCH_TIME_KEY] == "1700000000000"
    assert SourceOffset.from_json(offset.json()) == offset
    old = SourceOffset.from_json('{"a":"0000000000000000_0000000000000004"}')
    assert old.batch_ms is None and old.same_positions(offset)


@pytest.mark.parametrize(
    ("options", "option", "fragment"),
    [
        ({"maxTriggerDelay": "5m"}, "maxTriggerDelay", "would be ignored"),
        (
            {"minMessagesPerTrigger": "10", "maxMessagesPerTrigger": "5"},
            "minMessagesPerTrigger",
            "never hold the minimum",
        ),
        ({"minBytesPerTrigger": "2m", "maxBytesPerTrigger": "1m"}, "minBytesPerTrigger", "never"),
        ({"minMessagesPerTrigger": "0"}, "minMessagesPerTrigger", "integer from 1"),
        ({"minMessagesPerTrigger": "5", "maxTriggerDelay": "soon"}, "maxTriggerDelay", "duration"),
    ],
)
def test_refused_options_name_themselves(options: dict, option: str, fragment: str) -> None:
    with pytest.raises(OptionError) as caught:
        SourceOptions.parse({"url": "http://127.0.0.1:1/v1/stream", "streams": "a", **options})
    assert caught.value.option == option and fragment in str(caught.value)


@pytest.mark.skipif(HAS_ADMISSION_CONTROL, reason="the refusal is for Spark 4.0/4.1")
def test_spark_before_4_2_refuses_the_minimum_naming_the_version(durastream_server) -> None:
    options = options_for(durastream_server, streams="a", minMessagesPerTrigger=10)
    reader = stream_reader(
        options, DEFAULT_SCHEMA
    )  # refuses at Spark's first call (RefusedStreamReader)
    with pytest.raises(OptionError, match=r"minMessagesPerTrigger.*Spark >= 4\.2"):
        reader.initialOffset()


def start_query(spark, options: dict, checkpoint: str, collector: BatchCollector):
    return (
        reader_of(spark, options)
        .writeStream.foreachBatch(collector)
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", checkpoint)
        .start()
    )


def last_batch_ms(checkpoint: str) -> int:
    """The batch time in the newest entry of Spark's offset log."""
    log = Path(checkpoint) / "offsets"
    newest = max((p for p in log.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return int(json.loads(newest.read_text().splitlines()[-1])[BATCH_TIME_KEY])


@needs_admission_control
def test_a_trigger_waits_for_the_minimum_and_the_delay_counts_from_the_last_batch_across_restarts(
    spark, durastream_server, streams, tmp_path
) -> None:
    path = streams.create(unique("min"))
    streams.append_json(path, docs(0, 3))
    options = options_for(
        durastream_server, streams=path, minMessagesPerTrigger=10, maxTriggerDelay=HOUR
    )
    checkpoint = str(tmp_path / "chk")
    collector = BatchCollector()
    query = start_query(spark, options, checkpoint, collector)
    try:
        query.processAllAvailable()
        assert ids_of(collector.rows) == [0, 1, 2]  # a new query's first batch is not held back
        streams.append_json(path, docs(3, 4))
        query.processAllAvailable()
        assert len(collector.rows) == 3  # 4 waiting < 10, and the hour has not passed
        streams.append_json(path, docs(7, 6))
        query.processAllAvailable()
        assert ids_of(collector.rows) == list(range(13))
        assert len(collector.non_empty_batches[-1][1]) == 10
    finally:
        query.stop()

    streams.append_json(path, docs(13, 2))
    query = start_query(spark, options, checkpoint, collector)
    try:
        query.processAllAvailable()
        assert len(collector.rows) == 13  # a restart does not skip what is left of the delay
    finally:
        query.stop()

    # With a short delay that has certainly passed since the last batch (by the time in the offset
    # log), the first trigger after a restart plans the batch: the delay is not waited again.
    delay_ms = 2000
    last = last_batch_ms(checkpoint)
    deadline = time.monotonic() + 30
    while time.time() * 1000 < last + delay_ms:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    options["maxTriggerDelay"] = f"{delay_ms}ms"
    query = start_query(spark, options, checkpoint, collector)
    try:
        query.processAllAvailable()
        assert ids_of(collector.rows) == list(range(15))
    finally:
        query.stop()


@needs_admission_control
def test_the_maximum_still_caps_a_batch_the_minimum_let_through(
    spark, durastream_server, streams, tmp_path
) -> None:
    base = unique("minmax")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    options = options_for(
        durastream_server,
        streams=f"{a},{b}",
        minMessagesPerTrigger=3,
        maxMessagesPerTrigger=4,
        maxTriggerDelay=HOUR,
    )
    collector = BatchCollector()
    query = start_query(spark, options, str(tmp_path / "chk"), collector)
    try:
        query.processAllAvailable()  # batch 0: nothing yet
        streams.append_json(a, docs(0, 6))
        streams.append_json(b, docs(100, 4))
        query.processAllAvailable()
    finally:
        query.stop()
    # 10 waiting: a batch of 4 (the maximum), then 6 waiting: 4, then 2 waiting < 3: the trigger waits.
    assert [len(rows) for _, rows in collector.non_empty_batches] == [4, 4]


@needs_admission_control
def test_available_now_ignores_the_minimum(spark, durastream_server, streams, tmp_path) -> None:
    path = streams.create(unique("min-now"))
    streams.append_json(path, docs(0, 3))
    collector = BatchCollector()
    run_available_now(
        spark,
        options_for(
            durastream_server, streams=path, minMessagesPerTrigger=100, maxTriggerDelay=HOUR
        ),
        str(tmp_path / "chk"),
        collector,
    )
    assert ids_of(collector.rows) == [0, 1, 2]
