"""Issue 14 item 5's hard case, through Spark: a query whose batch was committed to the server but not
recorded by Spark (the driver died in between) is restarted after the server forgot the batch's producers
(``--producer-expiry-seconds``). The replay must fail loudly, never write the batch a second time.

The crash is simulated the way it looks afterwards: the batch's entry in the checkpoint's commit log is
removed, so Spark replays it, exactly as after a driver killed between the server commit and the commit
log (``test_driver_crash.py`` kills a real driver there; here the point is the time that passes).

Also issue 15 item 6 at the sink: in ordered mode, a retry the server can no longer compare (older than
the digests it keeps) fails the task instead of being taken for a verified duplicate.
"""

from __future__ import annotations

import contextlib
import json
import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from durastream_spark.errors import DurastreamError, ProducerForgottenError, UnverifiedDuplicate
from durastream_spark.sink.messages import SinkCommitMessage
from tests.spark.sink.support import (
    WriterHarness,
    assert_exactly_once,
    client_for,
    read_stream,
    record_batches,
    unique,
)
from tests.support.http import poll_until
from tests.support.server_process import FORGET_PRODUCERS_FAST

ROWS = 300


def _run_once(spark, root: str, stream: str, mode: str, checkpoint) -> object:
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .load()
        .selectExpr("spark_partition_id() AS p", "value AS n")
    )
    query = (
        df.writeStream.format("durastream")
        .option("url", root)
        .option("stream", stream)
        .option("exactlyOnce", mode)
        .option("maxMessagesPerRequest", "40")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(Exception):  # the query's own failure, inspected by the caller
        query.awaitTermination()
    return query


def _wait_until_forgotten(root: str, stream: str, query_id: str) -> None:
    """Probe each partition's producer with a request it never sent (a different payload under its
    batch-0 tuple): refused as a reused tuple while the server remembers it, as a possible repeat once
    it is forgotten. Nothing is ever written by a probe."""
    client = client_for(root)
    pending = {f"spark-{query_id}-{p}" for p in (0, 1)}

    def forgotten() -> bool:
        for pid in sorted(pending):
            try:
                client.append(stream, b'{"probe":1}', "application/json", producer=(pid, 0, 0))
            except ProducerForgottenError:
                pending.discard(pid)
            except DurastreamError:
                pass  # DUPLICATE_PAYLOAD_MISMATCH: still remembered
            else:
                raise AssertionError("a probe was written")
        return not pending

    poll_until(forgotten, "the batch's producers to be forgotten", timeout=60)


@pytest.mark.parametrize("mode", ["transactional", "ordered"])
def test_a_batch_replayed_after_its_producers_were_forgotten_fails_loudly(
    sink_spark, server_factory, tmp_path, mode
) -> None:
    # The first run writes with the default producer expiry: a second's expiry from the start could
    # forget a producer between two requests of the batch itself when a loaded machine stalls a task.
    server = server_factory()
    root = server.base_url + "/v1/stream"
    stream = unique(f"forgotten-replay-{mode}")
    checkpoint = tmp_path / "checkpoint"
    first = _run_once(sink_spark, root, stream, mode, checkpoint)
    assert first.exception() is None
    assert_exactly_once(read_stream(root, stream), range(ROWS))

    # The driver "died" after committing batch 0 to the server, before Spark recorded it; time passes,
    # and the server (restarted on the same data, now forgetting idle producers after a second) forgets.
    for name in ("0", ".0.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    server.terminate()
    server.extra_args = tuple(FORGET_PRODUCERS_FAST)
    server.start()
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    _wait_until_forgotten(root, stream, query_id)

    second = _run_once(sink_spark, root, stream, mode, checkpoint)
    error = second.exception()
    assert error is not None, "the replay of a batch the server could not vouch for succeeded"
    assert "PRODUCER_FORGOTTEN" in str(error) or "no longer knows" in str(error)
    assert_exactly_once(read_stream(root, stream), range(ROWS))


def test_an_ordered_retry_older_than_the_digest_window_fails_loudly(server_factory) -> None:
    """More requests in one batch than the server keeps digests for (EPOCH_DIGESTS = 4096, trimmed at
    8192): a retry of the task resends the oldest ones, which the server answers 204 with
    ``Durastream-Digest: unknown``; the sink fails the attempt rather than trust them."""
    server = server_factory(extra_args=["--durability", "none"])  # 8,300 requests: no fsync each
    root = server.base_url + "/v1/stream"
    stream = unique("ordered-window")
    schema = StructType([StructField("n", LongType())])
    rows = [{"n": n} for n in range(8300)]
    batches = record_batches(pa.schema([("n", pa.int64())]), rows, 1000)
    options = {
        "url": root,
        "stream": stream,
        "exactlyOnce": "ordered",
        "maxMessagesPerRequest": "1",
        "maxInFlight": "8",
    }
    harness = WriterHarness(options, schema, query_id=str(uuid.uuid4()))
    first = harness.write(batches, epoch=0, partition=0, attempt=0)
    assert isinstance(first, SinkCommitMessage)
    with pytest.raises(UnverifiedDuplicate, match="no longer remembers"):
        harness.write(batches, epoch=0, partition=0, attempt=1)
    assert [m["n"] for m in read_stream(root, stream)] == list(range(8300))  # one request per row
