"""The sink's per-batch figures: one INFO line from the driver per committed batch, and the same figures as
a dict, with the requests the tasks and the commit sent counted exactly."""

from __future__ import annotations

import logging
import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from durastream_spark.sink import stream_writer
from tests.spark.sink.support import (
    WriterHarness,
    assert_exactly_once,
    read_stream,
    record_batches,
    unique,
)

SCHEMA = StructType([StructField("n", LongType())])
ARROW_SCHEMA = pa.schema([("n", pa.int64())])


@pytest.mark.parametrize("mode", ["transactional", "ordered"])
def test_one_line_and_a_dict_per_committed_batch(durastream_server, mode, caplog) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique(f"figures-{mode}")
    options = {
        "url": root,
        "stream": stream,
        "exactlyOnce": mode,
        "maxMessagesPerRequest": "10",
        "maxInFlight": "1",
    }
    harness = WriterHarness(options, SCHEMA, query_id=str(uuid.uuid4()))
    messages = [
        harness.write(
            record_batches(ARROW_SCHEMA, [{"n": n} for n in range(p * 50, p * 50 + 50)], 50),
            epoch=0,
            partition=p,
            attempt=0,
        )
        for p in range(2)
    ]
    # 50 rows per task at 10 messages per request: 5 data requests each, plus the mode's own (stream
    # checks, staging handles); at least the data requests, and never a retry against a healthy server.
    assert all(message.requests >= 5 and message.retries == 0 for message in messages)
    writer = stream_writer(options, SCHEMA, False)
    with caplog.at_level(logging.INFO, logger="durastream_spark.sink.commit"):
        writer.commit(messages, 0)
    assert_exactly_once(read_stream(root, stream), range(100), partition=None)
    figures = writer.last_batch.as_dict()
    assert figures["batch"] == "0" and figures["mode"] == mode
    assert (figures["streams"], figures["rows"], figures["partitions"]) == (1, 100, 2)
    assert figures["bytes"] == sum(part.bytes for m in messages for part in m.parts) > 0
    assert figures["task_requests"] == sum(m.requests for m in messages)
    assert figures["commit_requests"] >= (1 if mode == "transactional" else 0)
    assert figures["commit_retries"] == 0 and figures["commit_ms"] >= 0
    assert figures["per_stream"][0]["stream"] == stream
    (line,) = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("batch 0 committed (")
    ]
    assert f"({mode}): 1 stream(s), 100 rows" in line
    assert f"tasks sent {figures['task_requests']} requests (0 retries)" in line
