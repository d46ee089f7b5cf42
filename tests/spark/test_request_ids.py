"""Issue 19 (connector): errors from the server keep their request id, on every path.

The server names each request (``X-Request-Id``) in its access log; the connector's error for a refused
request must say ``request id X``, so an operator can go from a connector log line to the server's. One test
per path: the source's planning requests (the multi-range limit lookup, the change feed and the selection it
registers), the source's reads (a single bounded read and a packed task's multi-range read) and the sink's
commits (a refused transactional commit, a transactional replay of an ordered run, an ordered replay with
other bytes). Each runs the connector's own code against a real server that logs requests, and finds the
id of the error's message in that log, on the line of the request that failed.
"""

from __future__ import annotations

import re
import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from durastream_spark.errors import AccessDenied, BadRequest, DataLossError, DurastreamError
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.sink.errors import CommitError
from durastream_spark.source import stream_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from durastream_spark.source.planner import StreamRange
from durastream_spark.source.scan import PackedPartition, RangePartition
from tests.spark.sink.support import WriterHarness, record_batches
from tests.spark.source.support import Streams, docs, unique
from tests.support.http import poll_until

TENANT = "ids-tenant-" + uuid.uuid4().hex
SCHEMA = StructType([StructField("n", LongType())])
ARROW_SCHEMA = pa.schema([("n", pa.int64())])


@pytest.fixture
def server(server_factory):
    """A server that logs every request with its id; a second token only covers ``tenant-a``."""
    return server_factory(
        extra_args=["--access-log", "--auth-token", f"{TENANT}:read-write:tenant-a"]
    )


def _tenant_header() -> dict[str, str]:
    return {"header.Authorization": f"Bearer {TENANT}"}


def _streams(server) -> Streams:
    return Streams(server, **_tenant_header())


def assert_request_id_logged(server, error: BaseException, status: int) -> str:
    """The message names a request id; the server's access log has that request, answered ``status``."""
    text = str(error)
    found = re.search(r"request id ([^\s;\]]+)\]", text)
    assert found, f"no request id in: {text}"
    request_id = found.group(1)

    def logged() -> bool:
        return any(
            f"[{request_id}]" in line and f"-> {status} " in line
            for line in server.log_path.read_text(errors="replace").splitlines()
        )

    poll_until(logged, f"the server's access-log line of request {request_id} ({status})")
    return request_id


def _reader(server, **options: str):
    return stream_reader(
        {"url": server.base_url + "/v1/stream", **_tenant_header(), **options}, DEFAULT_SCHEMA
    )


def _deleted_stream(streams: Streams) -> tuple[str, str]:
    path = streams.create(f"tenant-a/{unique('gone')}")
    streams.append_json(path, docs(0, 5))
    tail = streams.tail(path)
    streams.client.delete(path)
    return path, tail


# ---- source: planning ----------------------------------------------------------------------------------


def test_the_multi_range_limit_lookup_keeps_the_request_id(server) -> None:
    """Planning measures ranges in one multi-range lookup; a failed entry is reported as data loss."""
    path, tail = _deleted_stream(_streams(server))
    reader = _reader(server, streams=path)
    assert reader.driver.client.extensions().multi_range
    with pytest.raises(DataLossError) as caught:
        reader.driver.measure([StreamRange(path, "-1", tail)])
    assert path in str(caught.value)
    assert_request_id_logged(server, caught.value, 200)  # the lookup answered; its entry failed


def test_the_change_feed_and_its_selection_keep_the_request_id(server) -> None:
    """The reader's first refresh asks the change feed; outside the token's prefix it is refused."""
    reader = _reader(server, pattern="elsewhere/*")
    with pytest.raises(AccessDenied) as caught:
        reader.driver.refresh()
    assert "changes" in str(caught.value) or "streams" in str(caught.value)
    assert_request_id_logged(server, caught.value, 403)

    client = StreamClient(
        ConnectionOptions.parse({"url": server.base_url + "/v1/stream", **_tenant_header()})
    )
    with pytest.raises(BadRequest) as refused:
        client.register_selection([])  # the selection the change feed of a stream list uses
    assert_request_id_logged(server, refused.value, 400)


# ---- source: reads -------------------------------------------------------------------------------------


def test_a_single_range_read_keeps_the_request_id(server) -> None:
    streams = _streams(server)
    path = streams.create(f"tenant-a/{unique('single')}")
    streams.append_json(path, docs(0, 5))
    reader = _reader(server, streams=path)
    start = reader.initialOffset()
    end = {**start, path: streams.tail(path)}
    (partition,) = reader.partitions(start, end)
    assert isinstance(partition, RangePartition)
    streams.client.delete(path)
    with pytest.raises(DataLossError) as caught:
        list(reader.read(partition))
    assert_request_id_logged(server, caught.value, 404)


def test_a_packed_tasks_multi_range_read_keeps_the_request_id(server) -> None:
    streams = _streams(server)
    base = f"tenant-a/{unique('packed')}"
    paths = [streams.create(f"{base}/{name}") for name in ("a", "b", "c")]
    for path in paths:
        streams.append_json(path, docs(0, 3))
    reader = _reader(server, streams=",".join(paths))
    start = reader.initialOffset()
    end = {**start, **{path: streams.tail(path) for path in paths}}
    (packed,) = reader.partitions(start, end)
    assert isinstance(packed, PackedPartition)
    streams.client.delete(paths[1])
    with pytest.raises(DataLossError) as caught:
        list(reader.read(packed))
    assert paths[1] in str(caught.value)
    assert_request_id_logged(server, caught.value, 200)  # the read answered; one range failed


# ---- sink: commits --------------------------------------------------------------------------------------


def _harness(server, stream: str, mode: str) -> WriterHarness:
    options = {
        "url": server.base_url + "/v1/stream",
        **_tenant_header(),
        "stream": stream,
        "exactlyOnce": mode,
    }
    return WriterHarness(options, SCHEMA, query_id=str(uuid.uuid4()))


def _rows(first: int, count: int) -> list[pa.RecordBatch]:
    return record_batches(ARROW_SCHEMA, [{"n": n} for n in range(first, first + count)], count)


# durastream-server commits a batch's parts in bulk requests (bulk-write): a refused part's error names
# the bulk request, which the server logs as answered 200 with the part's refusal inside.
BULK_ANSWERED = 200


def test_a_refused_transactional_commit_keeps_the_request_id(server) -> None:
    stream = f"tenant-a/{unique('commit')}"
    harness = _harness(server, stream, "transactional")
    # Enough rows for more than one request: the part is staged (a part of one small request is
    # carried inline to the commit and has nothing staged to lose).
    message = harness.write(_rows(0, 30_000), epoch=0, partition=0, attempt=0)
    assert message.parts[0].handles
    # The staged data is gone before the commit (as after its transactionTtl): the commit is refused.
    _streams(server).client.abort(stream, list(message.parts[0].handles))
    with pytest.raises(CommitError) as caught:
        harness.commit([message], 0)
    assert stream in str(caught.value)
    assert caught.value.failures[0].status == 409
    assert_request_id_logged(server, caught.value, BULK_ANSWERED)


def test_a_transactional_replay_of_an_ordered_run_keeps_the_request_id(server) -> None:
    """The commit finds an ordered request under its producer tuple (409): a BatchModeConflict."""
    stream = f"tenant-a/{unique('modes')}"
    ordered = _harness(server, stream, "ordered")
    first = ordered.write(_rows(0, 10), epoch=0, partition=0, attempt=0)
    ordered.commit([first], 0)
    transactional = _harness(server, stream, "transactional")
    transactional.query_id = ordered.query_id  # the same query, restarted in the other mode
    replay = transactional.write(_rows(0, 10), epoch=0, partition=0, attempt=0)
    with pytest.raises(CommitError) as caught:
        transactional.commit([replay], 0)
    assert "ordered mode" in str(caught.value)
    assert_request_id_logged(server, caught.value, BULK_ANSWERED)


def test_an_ordered_replay_with_other_bytes_keeps_the_request_id(server) -> None:
    """The final request of a replayed batch differs from what the first run committed (409)."""
    stream = f"tenant-a/{unique('reordered')}"
    harness = _harness(server, stream, "ordered")
    first = harness.write(_rows(0, 10), epoch=0, partition=0, attempt=0)
    harness.commit([first], 0)
    replay = harness.write(_rows(100, 10), epoch=0, partition=0, attempt=0)
    with pytest.raises(DurastreamError) as caught:
        harness.commit([replay], 0)
    assert "different bytes" in str(caught.value)
    assert_request_id_logged(server, caught.value, 409)
