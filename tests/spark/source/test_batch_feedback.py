"""What the source tells the people running a query: lag per batch, and listed streams that do not exist.

Called through the reader objects Spark drives, against the real server; the log lines are the driver's.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from durastream_spark.protocol.client import StreamClient
from durastream_spark.source import stream_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from durastream_spark.source.progress import behind_latest
from tests.spark.source.support import (
    BatchCollector,
    Streams,
    docs,
    encoded,
    options_for,
    run_available_now,
    unique,
)

STREAM_LOGGER = "durastream_spark.source.stream"


def batch_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The source's batch lines, their planning time (which varies) replaced by ``N``."""
    return [
        re.sub(r"planned in [\d.]+ ms", "planned in N ms", r.getMessage())
        for r in caplog.records
        if r.name == STREAM_LOGGER and r.getMessage().startswith("batch reads")
    ]


def read_everything(reader, start: dict) -> dict:
    if not HAS_ADMISSION_CONTROL:
        return reader.latestOffset()
    from durastream_spark.compat import ReadAllAvailable

    return reader.latestOffset(start, ReadAllAvailable())


@pytest.mark.skipif(not HAS_ADMISSION_CONTROL, reason="maxMessagesPerTrigger needs Spark >= 4.2")
def test_each_batch_logs_its_size_and_the_lag_behind_the_tails(
    durastream_server, streams: Streams, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=STREAM_LOGGER)
    base = unique("lag")
    a, b = streams.create(f"{base}/a"), streams.create(f"{base}/b")
    streams.append_json(a, docs(0, 30))
    streams.append_json(b, docs(100, 10))
    client = StreamClient(streams.client.connection)
    total = {p: client.lookup_limit(p, "-1") for p in (a, b)}
    reader = stream_reader(
        options_for(durastream_server, streams=f"{a},{b}", maxMessagesPerTrigger=8), DEFAULT_SCHEMA
    )
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    end = reader.latestOffset(start, limit)
    reader.partitions(start, end)
    read = {p: client.lookup_limit(p, "-1", end=end[p]) for p in (a, b)}
    assert read[a].messages + read[b].messages == 8
    read_bytes = read[a].bytes + read[b].bytes
    behind_bytes = total[a].bytes + total[b].bytes - read_bytes
    assert batch_lines(caplog) == [
        f"batch reads 2 stream(s), 8 messages, {read_bytes} bytes, in 1 task(s), planned in N ms; behind the tails "
        f"after it: 32 messages, {behind_bytes} bytes in 2 stream(s)"
    ]
    summary = reader.driver.last_batch
    assert summary is not None and summary.as_dict()["behind"]["messages"] == 32
    assert summary.as_dict()["planning_ms"] >= 0


def test_without_a_limit_a_batch_leaves_nothing_behind(
    durastream_server, streams: Streams, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=STREAM_LOGGER)
    path = streams.create(unique("nolag"))
    streams.append_json(path, docs(0, 5))
    reader = stream_reader(options_for(durastream_server, streams=path), DEFAULT_SCHEMA)
    start = reader.initialOffset()
    end = read_everything(reader, start)
    reader.partitions(start, end)
    (line,) = batch_lines(caplog)
    stored = sum(len(value) for value in encoded(docs(0, 5)))
    # Sized by the offsets' byte positions (no lookups): bytes, not messages.
    assert line.startswith(
        f"batch reads 1 stream(s), {stored} bytes (messages not counted: sized by byte positions), "
    )
    assert line.endswith("behind the tails after it: 0 messages, 0 bytes in 0 stream(s)")
    counting = stream_reader(
        options_for(durastream_server, streams=path, maxMessagesPerPartition=1000), DEFAULT_SCHEMA
    )
    counting.partitions(start, read_everything(counting, start))  # limit lookups count messages
    assert batch_lines(caplog)[-1].startswith(
        f"batch reads 1 stream(s), 5 messages, {stored} bytes"
    )
    # A batch planned by another run (a replay after a restart) says its lag was not measured.
    restarted = stream_reader(options_for(durastream_server, streams=path), DEFAULT_SCHEMA)
    restarted.partitions(start, end)
    assert batch_lines(caplog)[-1].endswith("lag not measured (a replayed batch)")


def test_a_listed_stream_that_does_not_exist_gets_one_warning_and_is_read_once_created(
    durastream_server, streams: Streams, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=STREAM_LOGGER)
    base = unique("missing")
    present = streams.create(f"{base}/present")
    streams.append_json(present, docs(0, 2))
    typo = f"{base}/evnets"
    reader = stream_reader(
        options_for(durastream_server, streams=f"{present},{typo}"), DEFAULT_SCHEMA
    )
    start = reader.initialOffset()
    end = read_everything(reader, start)
    assert read_everything(reader, end) == end  # a second trigger: no second warning
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"Stream(s) '{typo}' (option 'streams') do not exist under {streams.url}: the query reads "
        "each one from its beginning once it is created; check the names if that is not expected."
    ]
    # Today's semantics are kept: once created, the stream is read from its beginning.
    streams.create(typo)
    streams.append_json(typo, docs(10, 3))
    later = read_everything(reader, end)
    rows = [
        row
        for partition in reader.partitions(end, later)
        for batch in reader.read(partition)
        for row in batch.to_pylist()
    ]
    assert [r["stream"] for r in rows] == [typo] * 3


def test_the_warning_suggests_the_stream_root_when_url_lacks_it(
    durastream_server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=STREAM_LOGGER)
    base_url = durastream_server.base_url
    reader = stream_reader({"url": base_url, "streams": "events"}, DEFAULT_SCHEMA)
    read_everything(reader, reader.initialOffset())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.endswith(f'so use .option("url", "{base_url}/v1/stream").')


@pytest.mark.skipif(not HAS_ADMISSION_CONTROL, reason="latestOffset in progress needs Spark >= 4.2")
def test_lag_in_messages_and_bytes_from_a_querys_progress(
    spark, durastream_server, streams: Streams, tmp_path
) -> None:
    path = streams.create(unique("progress-lag"))
    streams.append_json(path, docs(0, 40))
    options = options_for(durastream_server, streams=path, maxMessagesPerTrigger=8)
    query = run_available_now(spark, options, str(tmp_path / "chk"), BatchCollector())
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in progress] == [8] * 5
    first = progress[0]["sources"][0]
    lag = behind_latest(first, {"url": options["url"]})
    client = streams.client
    end = json.loads(first["endOffset"])[path]
    assert (lag.messages, lag.streams) == (32, 1)
    assert lag.bytes == client.lookup_limit(path, end).bytes
    last = behind_latest(progress[-1]["sources"][0], {"url": options["url"]})
    assert (last.messages, last.bytes, last.streams) == (0, 0, 0)
