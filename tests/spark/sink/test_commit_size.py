"""Issue 15, item 2: no size cliff in the sink's commits and aborts.

A transactional commit used to name every staged handle of a (stream, partition) in one
``Durastream-Commit`` header. Past about 1,000 stage requests the header passed the server's default 32 KiB
limit and got 431, which is not retried: every replay of the batch failed the same way, and so did the
abort. With ``maxMessagesPerRequest=1`` (what docs/guarantees.md recommends for non-JSON streams) that was
about 1,000 rows per partition. Now the handles travel in the request body (``staged-append=2``).

Driven with ``WriterHarness`` (the task and the driver's commit, by hand) against a server at its default
limits (only fsync is off, to stage quickly).
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from durastream_spark.errors import TxnAborted
from tests.spark.sink.support import WriterHarness, client_for, read_bytes, record_batches

ROWS = 1500  # one stage request and one handle each: a list of 1,500 handles is about 50 KiB


def test_a_partition_of_1500_stage_requests_commits_and_aborts(server_factory) -> None:
    server = server_factory(extra_args=["--durability", "none"])
    root = server.base_url + "/v1/stream"
    stream = "commit-size/one-row-per-request"
    schema = StructType([StructField("value", StringType())])
    arrow_schema = pa.schema([("value", pa.string())])
    rows = [{"value": f"row {i:05d}\n"} for i in range(ROWS)]
    options = {
        "url": root,
        "stream": stream,
        "exactlyOnce": "transactional",
        "contentType": "text/plain",
        "maxMessagesPerRequest": "1",
        "maxInFlight": "16",
    }
    harness = WriterHarness(options, schema, query_id=str(uuid.uuid4()))
    message = harness.write(
        record_batches(arrow_schema, rows, 500), epoch=0, partition=0, attempt=0
    )
    (part,) = message.parts
    assert part.requests == len(part.handles) == ROWS
    assert len(", ".join(part.handles)) > 32 * 1024  # the header the commit used to send
    harness.commit([message], 0)
    expected = "".join(row["value"] for row in rows).encode()
    assert read_bytes(root, stream) == expected
    # A replay of the batch (new attempt, new handles) is a duplicate; its handles are aborted.
    replay = harness.write(record_batches(arrow_schema, rows, 500), epoch=0, partition=0, attempt=0)
    harness.commit([replay], 0)
    assert read_bytes(root, stream) == expected
    with pytest.raises(TxnAborted):  # all of the replay's handles were aborted, in one request
        client_for(root).commit(stream, replay.parts[0].handles[-1:], ("someone-else", 0, 0))
