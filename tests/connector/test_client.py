"""StreamClient against the real durastream-server (the ``durastream_server`` fixture). No mocks.

Tests of protocol extensions skip, naming the extension, while the server does not advertise it; they are
written against docs/extensions.md and start running as soon as the server does.
"""

from __future__ import annotations

import json
import pickle
import time
import uuid

import pyarrow as pa
import pyarrow.json as pj
import pytest
import requests

from durastream_spark.errors import (
    BadRequest,
    ContentTypeMismatch,
    DuplicatePayloadMismatch,
    EndBeyondTail,
    PayloadTooLarge,
    SequenceGapError,
    StaleEpochError,
    StreamClosedError,
    StreamGone,
    StreamNotFound,
    TxnAborted,
)
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol import extensions as ext
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.frames import decode_frames
from durastream_spark.protocol.jsonarray import split_json_array
from durastream_spark.protocol.models import FRAMES, FRAMES_LINES
from tests.support.http import poll_until

JSON = "application/json"


def root_of(server) -> str:
    return server.base_url + "/v1/stream"


@pytest.fixture
def client(durastream_server) -> StreamClient:
    return StreamClient(ConnectionOptions.parse({"url": root_of(durastream_server)}))


@pytest.fixture
def path() -> str:
    return f"client/{uuid.uuid4().hex}"


def require(client: StreamClient, name: str) -> None:
    if not client.extensions().supports(name):
        pytest.skip(f"server does not advertise {name} yet")


# ---- create / head / append / read ----------------------------------------------------------------------


def test_create_is_idempotent_and_head_reports_metadata(client: StreamClient, path: str) -> None:
    first = client.create(path, JSON, ttl_seconds=3600)
    assert first.created is True and first.next_offset is not None
    again = client.create(path, JSON, ttl_seconds=3600)
    assert again.created is False
    meta = client.head(path)
    assert meta.content_type == JSON and meta.is_json
    assert meta.next_offset == first.next_offset
    assert meta.closed is False
    assert meta.ttl_seconds == 3600


def test_append_and_read_json(client: StreamClient, path: str) -> None:
    start = client.create(path, JSON).next_offset
    first = client.append(path, b'[{"a":1},{"b":[1,2]}]', JSON)
    assert first.status == 204 and first.duplicate is False and first.next_offset > start
    second = client.append(path, b'{"c":"\xc3\xa9"}', JSON)
    chunk = client.read(path, "-1")
    assert chunk.up_to_date is True and chunk.closed is False
    assert chunk.next_offset == second.next_offset == client.head(path).next_offset
    assert split_json_array(chunk.body) == [b'{"a":1}', b'{"b":[1,2]}', b'{"c":"\xc3\xa9"}']
    rest = client.read(path, first.next_offset)
    assert json.loads(rest.body) == [{"c": "é"}]


def test_binary_round_trip(client: StreamClient, path: str) -> None:
    client.create(path, "application/octet-stream")
    payload = bytes(range(256)) * 3
    client.append(path, payload, "application/octet-stream")
    assert client.read(path, "-1").body == payload


def test_iter_range_follows_chunks(server_factory) -> None:
    server = server_factory(extra_args=["--chunk-bytes", "64"])
    client = StreamClient(ConnectionOptions.parse({"url": root_of(server)}))
    client.create("chunks", JSON)
    messages = [json.dumps({"i": i, "pad": "x" * 20}).encode() for i in range(40)]
    for i in range(0, 40, 8):
        client.append("chunks", b"[" + b",".join(messages[i : i + 8]) + b"]", JSON)
    chunks = list(client.iter_range("chunks", "-1", None))
    assert len(chunks) > 5  # really paged
    assert [m for c in chunks for m in split_json_array(c.body)] == messages
    assert chunks[-1].up_to_date and chunks[-1].next_offset == client.head("chunks").next_offset


# ---- producers --------------------------------------------------------------------------------------------


def test_producer_duplicate_counts_as_delivered(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    first = client.append(path, b'[{"n":1}]', JSON, producer=("p", 0, 0))
    assert (first.status, first.duplicate, first.producer_epoch, first.producer_seq) == (
        200,
        False,
        0,
        0,
    )
    again = client.append(path, b'[{"n":1}]', JSON, producer=("p", 0, 0))
    assert again.status == 204 and again.duplicate is True and again.delivered is True
    assert again.next_offset == first.next_offset
    assert json.loads(client.read(path, "-1").body) == [{"n": 1}]


def test_sequence_gap(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    client.append(path, b"1", JSON, producer=("p", 0, 0))
    with pytest.raises(SequenceGapError) as caught:
        client.append(path, b"3", JSON, producer=("p", 0, 3))
    assert (caught.value.expected_seq, caught.value.received_seq) == (1, 3)
    assert caught.value.attempts == 1  # a 409 is never retried
    assert "expects seq 1, received 3" in str(caught.value)


def test_stale_epoch_is_fenced_not_claimed(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    client.append(path, b"1", JSON, producer=("p", 1, 0))
    with pytest.raises(StaleEpochError) as caught:
        client.append(path, b"2", JSON, producer=("p", 0, 1))
    assert caught.value.current_epoch == 1
    assert "A newer batch owns the producer" in str(caught.value)
    assert json.loads(client.read(path, "-1").body) == [1]  # nothing from the zombie


def test_producer_close_is_sequenced_and_idempotent(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    client.append(path, b"1", JSON, producer=("p", 0, 0))
    closed = client.close(path, producer=("p", 0, 1))
    assert closed.closed is True
    retried = client.close(path, producer=("p", 0, 1))
    assert retried.duplicate is True and retried.closed is True


# ---- errors ---------------------------------------------------------------------------------------------------


def test_closed_stream(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    client.append(path, b"1", JSON)
    result = client.close(path)
    assert result.closed is True
    assert client.close(path).closed is True  # close-only is idempotent
    meta = client.head(path)
    assert meta.closed is True
    with pytest.raises(StreamClosedError) as caught:
        client.append(path, b"2", JSON)
    assert caught.value.final_offset == meta.next_offset == result.next_offset
    assert meta.next_offset in str(caught.value)
    at_tail = client.read(path, meta.next_offset)
    assert at_tail.closed is True and at_tail.body == b"[]"


def test_missing_stream(client: StreamClient, path: str) -> None:
    for call in (
        lambda: client.head(path),
        lambda: client.read(path, "-1"),
        lambda: client.append(path, b"1", JSON),
        lambda: client.close(path),
    ):
        with pytest.raises(StreamNotFound) as caught:
            call()
        assert path in str(caught.value) and caught.value.status == 404


def test_gone_stream(client: StreamClient, path: str) -> None:
    client.create(path, "text/plain")
    client.append(path, b"abc", "text/plain")
    fork = requests.put(
        client.stream_url(path + "-fork"),
        headers={"Stream-Forked-From": f"/v1/stream/{path}"},
        timeout=10,
    )
    assert fork.status_code == 201
    client.delete(path)  # soft-deleted: a fork still reads through it
    with pytest.raises(StreamGone):
        client.head(path)
    with pytest.raises(StreamGone) as caught:
        client.read(path, "-1")
    assert caught.value.status == 410 and path in str(caught.value)


def test_content_type_mismatch(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    with pytest.raises(ContentTypeMismatch) as on_append:
        client.append(path, b"hello", "text/plain")
    assert on_append.value.requested == "text/plain"
    with pytest.raises(ContentTypeMismatch) as on_create:
        client.create(path, "text/plain")
    assert (on_create.value.requested, on_create.value.existing) == ("text/plain", JSON)
    assert "text/plain" in str(on_create.value) and JSON in str(on_create.value)


def test_payload_too_large_is_not_retried(server_factory) -> None:
    server = server_factory(max_body_bytes=1024)
    client = StreamClient(ConnectionOptions.parse({"url": root_of(server)}))
    client.create("big", "application/octet-stream")
    with pytest.raises(PayloadTooLarge) as caught:
        client.append("big", b"x" * 4096, "application/octet-stream", producer=("p", 0, 0))
    assert caught.value.attempts == 1
    assert "4096 bytes" in str(caught.value)


def test_bad_offset(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    with pytest.raises(BadRequest):
        client.read(path, "not-an-offset")


def test_extensions_match_the_header(client: StreamClient, path: str) -> None:
    client.create(path, JSON)
    raw = requests.head(client.stream_url(path), timeout=10)
    advertised = ext.Extensions.parse(raw.headers.get(ext.HEADER))
    assert client.extensions() == advertised
    assert client.head(path).extensions == advertised


# ---- extensions (skip until the server advertises them) --------------------------------------------------


def _three_messages(client: StreamClient, path: str) -> list[str]:
    """Offsets: [start, after the first two messages, after the third]."""
    start = client.create(path, JSON).next_offset
    first = client.append(path, b'[{"id":1,"name":"a"},{"id":2,"name":"b\\nc"}]', JSON)
    second = client.append(path, b'{"id":3,\n "name":"d"}', JSON)
    return [start, first.next_offset, second.next_offset]


def test_frames_against_the_server(client: StreamClient, path: str) -> None:
    require(client, ext.MESSAGE_FRAMES)
    before_ms = int(time.time() * 1000) - 60_000
    offsets = _three_messages(client, path)
    chunk = client.read(path, offsets[0], format=FRAMES)
    frames = decode_frames(chunk.body)
    assert frames.count == 3 and not frames.lines
    assert frames.values.to_pylist() == [
        b'{"id":1,"name":"a"}',
        b'{"id":2,"name":"b\\nc"}',
        b'{"id":3,\n "name":"d"}',
    ]
    tokens = frames.offsets().to_pylist()
    assert tokens[0] == offsets[0] and tokens[2] == offsets[1]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert chunk.next_offset == offsets[2]
    stamps = frames.timestamps.cast(pa.int64()).to_pylist()
    assert all(s >= before_ms for s in stamps) and stamps == sorted(stamps)


def test_frames_lines_parse_as_ndjson(client: StreamClient, path: str) -> None:
    require(client, ext.MESSAGE_FRAMES)
    offsets = _three_messages(client, path)
    frames = decode_frames(client.read(path, offsets[0], format=FRAMES_LINES).body)
    assert frames.lines
    table = pj.read_json(pa.BufferReader(frames.ndjson))
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("name").to_pylist() == ["a", "b\nc", "d"]


def test_bounded_read_is_replay_deterministic(client: StreamClient, path: str) -> None:
    require(client, ext.BOUNDED_READ)
    offsets = _three_messages(client, path)
    first = client.read(path, offsets[0], end=offsets[1])
    assert first.end_reached and first.next_offset == offsets[1]
    client.append(path, b'{"id":4}', JSON)
    again = client.read(path, offsets[0], end=offsets[1])
    assert again.body == first.body
    assert len(split_json_array(first.body)) == 2
    empty = client.read(path, offsets[1], end=offsets[1])
    assert empty.end_reached and empty.body == b"[]"
    beyond = "0000000000000000_9999999999999999"
    with pytest.raises(EndBeyondTail) as caught:
        client.read(path, offsets[0], end=beyond)
    assert caught.value.tail == client.head(path).next_offset


def test_limit_lookup(client: StreamClient, path: str) -> None:
    require(client, ext.LIMIT_LOOKUP)
    offsets = _three_messages(client, path)
    found = client.lookup_limit(path, offsets[0], max_messages=2)
    assert (found.start, found.end, found.messages) == (offsets[0], offsets[1], 2)
    assert found.tail == offsets[2] and found.closed is False
    assert client.lookup_limit(path, offsets[0], max_messages=0).end == offsets[0]
    assert client.lookup_limit(path, offsets[0]).end == offsets[2]


def test_listing_pages(client: StreamClient) -> None:
    require(client, ext.LISTING)
    prefix = f"list-{uuid.uuid4().hex}/"
    names = [prefix + name for name in ("a", "b", "c/d")]
    for name in names:
        client.create(name, JSON)
    listed = list(client.list_streams(prefix=prefix, page_size=1))
    assert [s.path for s in listed] == names
    assert all(s.content_type == JSON and not s.closed for s in listed)
    one_level = [s.path for s in client.list_streams(pattern=prefix + "*")]
    assert one_level == names[:2]


def test_listing_follows_pages_that_found_nothing(server_factory) -> None:
    """A page that examined its allowance (limit + 1000 paths) without a match is empty but has a
    ``next``: the client keeps going until ``next`` is null."""
    server = server_factory(extra_args=["--durability", "none"])
    client = StreamClient(ConnectionOptions.parse({"url": root_of(server)}))
    prefix = "sparse/"
    with requests.Session() as session:
        for n in range(1050):
            url = server.stream_url(f"{prefix}pad/{n:04d}")
            assert session.put(url, timeout=30).status_code == 201
    client.create(prefix + "zz/hit", JSON)
    first = requests.get(
        root_of(server) + ext.LISTING_PATH,
        params={"pattern": prefix + "*/hit", "limit": 1},
        timeout=30,
    ).json()
    assert first["streams"] == [] and first["next"] is not None  # the case under test
    found = [s.path for s in client.list_streams(pattern=prefix + "*/hit", page_size=1)]
    assert found == [prefix + "zz/hit"]


def test_a_listing_stopped_early_leaves_the_client_usable(client: StreamClient) -> None:
    """The next page is fetched while the caller reads the current one: a caller that stops after the
    first stream gets it, the page in flight is dropped, and the client keeps working (the same
    listing read to the end still holds every stream once, in order)."""
    require(client, ext.LISTING)
    prefix = f"early-{uuid.uuid4().hex}/"
    names = [f"{prefix}{n}" for n in range(7)]
    for name in names:
        client.create(name, JSON)
    listing = client.list_streams(prefix=prefix, page_size=2)
    assert next(listing).path == names[0]
    listing.close()
    assert [s.path for s in client.list_streams(prefix=prefix, page_size=2)] == names
    assert client.head(names[-1]).content_type == JSON


def test_staged_append_commit_and_abort(client: StreamClient, path: str) -> None:
    require(client, ext.STAGED_APPEND)
    tail = client.create(path, JSON).next_offset
    staged = client.stage(path, "h-1", b'[{"x":1},{"x":2}]', JSON)
    assert staged.messages == 2 and staged.expires_at is not None
    client.stage(path, "h-2", b'{"x":3}', JSON, producer=("h-2-writer", 0, 0))
    client.stage(path, "h-dropped", b'{"x":99}', JSON)
    assert client.head(path).next_offset == tail  # invisible until committed
    client.abort(path, "h-dropped")
    client.abort(path, "h-dropped")  # idempotent
    committed = client.commit(path, ["h-1", "h-2"], ("committer", 0, 0))
    assert committed.duplicate is False and committed.txn_messages == 3
    with pytest.raises(TxnAborted):
        client.commit(path, ["h-dropped"], ("committer", 0, 1))
    assert client.commit(path, ["h-1", "h-2"], ("committer", 0, 0)).duplicate is True
    assert json.loads(client.read(path, "-1").body) == [{"x": 1}, {"x": 2}, {"x": 3}]


def test_payload_digest_detects_a_reused_tuple(client: StreamClient, path: str) -> None:
    require(client, ext.PAYLOAD_DIGEST)
    client.create(path, JSON)
    client.append(path, b'{"v":"A"}', JSON, producer=("p", 0, 0))
    with pytest.raises(DuplicatePayloadMismatch):
        client.append(path, b'{"v":"B"}', JSON, producer=("p", 0, 0))
    assert json.loads(client.read(path, "-1").body) == [{"v": "A"}]


def test_many_handles_and_commit_keys(client: StreamClient, path: str) -> None:
    """Issue 15: a commit of 2,000 handles (its header form would pass the server's 32 KiB header
    limit), and keyed commits, which recognise a commit re-made with other handles."""
    require(client, ext.STAGED_APPEND)
    client.create(path, JSON)
    handles = [f"many-handles-handle-{i:05d}" for i in range(2000)]
    for index, handle in enumerate(handles):
        client.stage(path, handle, b'{"i":%d}' % index, JSON)
    assert len(", ".join(handles)) > 32 * 1024
    first = client.commit(path, handles, ("txn", 0, 0), key="sink")
    assert first.txn_messages == 2000
    client.stage(path, "replayed", b'{"i":-1}', JSON)
    assert client.commit(path, ["replayed"], ("txn", 0, 0), key="sink").duplicate is True
    with pytest.raises(DuplicatePayloadMismatch):
        client.commit(path, ["replayed"], ("txn", 0, 0), key="other")
    client.abort(path, ["replayed", *[f"never-{i:05d}" for i in range(2000)]])
    assert client.committed_under_key(path, ("txn", 0, 0), "sink") is True
    assert client.committed_under_key(path, ("txn", 0, 0), "other") is False
    assert client.committed_under_key(path, ("unused", 0, 0), "sink") is False
    client.append(path, b'{"i":-2}', JSON, producer=("appender", 3, 0))
    assert client.committed_under_key(path, ("appender", 3, 0), "sink") is False
    assert [m["i"] for m in json.loads(client.read(path, "-1").body)] == [*range(2000), -2]


def test_server_errors_keep_the_servers_request_id(server_factory) -> None:
    """The id in a connector error is the one in the server's access log: one line matches the other."""
    server = server_factory(extra_args=["--access-log"])
    client = StreamClient(ConnectionOptions.parse({"url": root_of(server)}))
    with pytest.raises(StreamNotFound) as caught:
        client.read("client/never-created", "-1")
    request_id = caught.value.request_id
    assert request_id and f"request id {request_id}]" in str(caught.value)
    assert (
        pickle.loads(pickle.dumps(caught.value)).request_id == request_id
    )  # crosses Spark processes
    poll_until(
        lambda: (
            "-> 404 in" in server.log_path.read_text()
            and f"[{request_id}]" in server.log_path.read_text()
        ),
        "the server's access-log line naming the same request id",
    )
