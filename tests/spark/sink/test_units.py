"""Unit tests of the sink's pure parts: request boundaries, the pipelined producer, encoding, options.

No Spark session and no server: these pin down the properties the exactly-once argument relies on.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from durastream_spark.errors import OptionError, RequestContext, SequenceGapError, ServerError
from durastream_spark.sink.batcher import RequestBatcher
from durastream_spark.sink.encoding import (
    ArrowPayloadEncoder,
    EncodedRows,
    PayloadLayout,
    RowPayloadEncoder,
)
from durastream_spark.sink.errors import UnsupportedWrite
from durastream_spark.sink.identity import TaskIdentity, handle_name
from durastream_spark.sink.options import SinkOptions
from durastream_spark.sink.producer import PipelinedProducer, RequestPool

# ---- batcher ---------------------------------------------------------------------------------------------


def _payloads(sizes: list[int]) -> list[bytes]:
    """JSON string payloads (with the trailing separator) of about the given sizes."""
    return [b'"' + (b"%d" % i).ljust(size, b"x") + b'",' for i, size in enumerate(sizes)]


def _cut(payloads: list[bytes], splits: list[int], max_messages: int, max_bytes: int):
    batcher = RequestBatcher(max_messages, max_bytes, json_framing=True)
    full, start = [], 0
    for end in [*splits, len(payloads)]:
        full += batcher.add(EncodedRows.from_payloads(payloads[start:end], 1))
        start = end
    return full, batcher.remainder()


def _reference_cut(payloads: list[bytes], max_messages: int, max_bytes: int):
    """The boundary rule taken literally, one row at a time (JSON framing)."""
    requests, current, size = [], [], 1
    for payload in payloads:
        if current and size + len(payload) > max_bytes:
            requests.append(current)
            current, size = [], 1
        current.append(payload)
        size += len(payload)
        if len(current) == max_messages:
            requests.append(current)
            current, size = [], 1
    return [b"[" + b"".join(r)[:-1] + b"]" for r in requests], current


@settings(max_examples=500, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=0, max_size=120),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=6),
    max_messages=st.integers(min_value=1, max_value=20),
    max_bytes=st.integers(min_value=2, max_value=2000),
)
def test_request_boundaries_do_not_depend_on_how_the_input_arrives(
    sizes, cuts, max_messages, max_bytes
) -> None:
    payloads = _payloads(sizes)
    splits = sorted({min(c, len(payloads)) for c in cuts})
    whole, rest = _cut(payloads, [], max_messages, max_bytes)
    split, split_rest = _cut(payloads, splits, max_messages, max_bytes)
    assert split == whole and split_rest == rest
    reference, reference_rest = _reference_cut(payloads, max_messages, max_bytes)
    assert [r.body for r in whole] == reference
    assert (rest.rows if rest else 0) == len(reference_rest)
    # Every request is a valid JSON array of the rows, in order, within the limits (a lone big row aside).
    requests = whole + ([rest] if rest else [])
    rows = [item for r in requests for item in json.loads(bytes(r.body))]
    assert rows == [json.loads(p[:-1]) for p in payloads] if payloads else rows == []
    for request in requests:
        assert request.rows <= max_messages
        assert len(request.body) <= max_bytes or request.rows == 1


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=80),
    keep=st.integers(min_value=0, max_value=80),
)
def test_full_requests_of_a_truncated_input_are_a_prefix_of_the_complete_ones(sizes, keep) -> None:
    """What ordered mode relies on: a truncated attempt never sends a request the retry would not."""
    payloads = _payloads(sizes)
    complete, _ = _cut(payloads, [], 7, 600)
    truncated, _ = _cut(payloads[:keep], [], 7, 600)
    assert truncated == complete[: len(truncated)]


def test_byte_streams_are_concatenated_and_big_rows_travel_alone() -> None:
    batcher = RequestBatcher(100, 10, json_framing=False)
    full = batcher.add(EncodedRows.from_payloads([b"aaaa", b"bbbb", b"c" * 30, b"dd"], 0))
    assert [r.body for r in full] == [b"aaaabbbb", b"c" * 30]
    assert batcher.remainder().body == b"dd"


# ---- producer --------------------------------------------------------------------------------------------


def _gap(expected: int, received: int) -> SequenceGapError:
    error = SequenceGapError(
        "gap",
        context=RequestContext("POST", "http://x/s", stream="s"),
        status=409,
        code="SEQUENCE_GAP",
        headers={},
        server_message=None,
    )
    error.expected_seq, error.received_seq = expected, received
    return error


class FakeServer:
    """Applies seqs strictly in order, like a producer-checking server; scripted failures per seq."""

    def __init__(self, fail: dict[int, BaseException] | None = None) -> None:
        self.applied: list[int] = []
        self.sent: list[int] = []
        self.fail = dict(fail or {})
        self.lock = threading.Lock()
        self.first_answered = threading.Event()
        self.sent_before_first: list[int] = []

    def send(self, seq: int, body: bytes) -> int:
        with self.lock:
            self.sent.append(seq)
            if seq != 0 and not self.first_answered.is_set():
                self.sent_before_first.append(seq)
            if seq in self.fail:
                raise self.fail.pop(seq)
            expected = len(self.applied)
            if seq > expected:
                raise _gap(expected, seq)
            if seq == expected:
                self.applied.append(seq)
        self.first_answered.set()
        return seq


def test_producer_waits_out_gaps_and_sends_the_first_seq_alone() -> None:
    server = FakeServer()
    pool = RequestPool(8)
    producer = PipelinedProducer(server.send, pool, label="p")
    for index in range(50):
        producer.submit(b"%d" % index)
    assert producer.drain() == list(range(50))
    pool.shutdown()
    assert server.applied == list(range(50))
    assert server.sent_before_first == []


def test_producer_never_swallows_a_failure() -> None:
    boom = ServerError(
        "boom",
        context=RequestContext("POST", "http://x/s"),
        status=500,
        code=None,
        headers={},
        server_message=None,
    )
    server = FakeServer(fail={3: boom})
    pool = RequestPool(4)
    producer = PipelinedProducer(server.send, pool, label="p")
    with pytest.raises(ServerError):
        for index in range(40):
            producer.submit(b"%d" % index)
    with pytest.raises(ServerError):
        producer.drain()
    pool.shutdown()
    assert server.applied == [0, 1, 2]  # nothing after the failed seq was applied


# ---- encoding ---------------------------------------------------------------------------------------------

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("x", DoubleType()),
        StructField("dec", DecimalType(20, 4)),
        StructField("s", StringType()),
        StructField("b", BinaryType()),
        StructField("ts", TimestampType()),
        StructField("a", ArrayType(StringType())),
        StructField("m", MapType(StringType(), LongType())),
        StructField("st", StructType([StructField("q", StringType())])),
    ]
)
ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("x", pa.float64()),
        ("dec", pa.decimal128(20, 4)),
        ("s", pa.string()),
        ("b", pa.binary()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("a", pa.list_(pa.string())),
        ("m", pa.map_(pa.string(), pa.int64())),
        ("st", pa.struct([("q", pa.string())])),
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
            st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
            st.one_of(st.none(), st.decimals(places=4, min_value=-(10**15), max_value=10**15)),
            st.one_of(st.none(), st.text()),
            st.one_of(st.none(), st.binary()),
            st.one_of(
                st.none(),
                st.datetimes(
                    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)
                ).map(lambda d: d.replace(tzinfo=dt.timezone.utc)),
            ),
            st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text()), max_size=3)),
            st.one_of(st.none(), st.dictionaries(st.text(), st.integers(0, 9), max_size=3)),
            st.one_of(st.none(), st.text().map(lambda q: {"q": q})),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_arrow_and_row_encodings_agree_and_are_valid_json(rows) -> None:
    layout = PayloadLayout.from_schema(SCHEMA, json_stream=True)
    batch = pa.RecordBatch.from_pylist(
        [
            dict(
                zip(
                    ARROW.names,
                    r[:7] + (list(r[7].items()) if r[7] is not None else None, r[8]),
                    strict=True,
                )
            )
            for r in rows
        ],
        schema=ARROW,
    )
    arrow = ArrowPayloadEncoder(layout).encode(batch).to_pylist()
    row_encoder = RowPayloadEncoder(layout)
    as_rows = [(*r[:8], Row(q=r[8]["q"]) if r[8] is not None else None) for r in rows]
    by_rows = [row_encoder.encode(r).decode("utf-8") for r in as_rows]
    parsed_arrow = [json.loads(a[:-1], parse_float=Decimal) for a in arrow]
    parsed_rows = [json.loads(r[:-1], parse_float=Decimal) for r in by_rows]
    assert parsed_arrow == parsed_rows
    for record, original in zip(parsed_arrow, rows, strict=True):
        assert record["id"] == original[0]
        assert record["s"] == original[3]
        if original[2] is not None:
            assert Decimal(record["dec"]) == original[2]


def test_layout_refuses_what_it_cannot_write() -> None:
    with pytest.raises(UnsupportedWrite, match="needs contentType application/json"):
        PayloadLayout.from_schema(SCHEMA, json_stream=False)
    with pytest.raises(UnsupportedWrite, match="no column to write besides 'stream'"):
        PayloadLayout.from_schema(StructType([StructField("stream", LongType())]), json_stream=True)


# ---- options and names ------------------------------------------------------------------------------------


def test_options_defaults_and_errors() -> None:
    options = SinkOptions.parse({"url": "http://h:1/v1/stream", "stream": "/a/b/"})
    assert options.stream == "a/b"
    assert (options.exactly_once, options.max_in_flight, options.content_type) == (
        "auto",
        4,
        "application/json",
    )
    # Staged requests default to 4 MiB, ordered ones to 1 MiB (their last one travels to the driver);
    # a value the user gives holds in both modes.
    assert (options.request_bytes("transactional"), options.request_bytes("ordered")) == (
        4 * 1024 * 1024,
        1024 * 1024,
    )
    chosen = SinkOptions.parse({"url": "http://h:1/v1/stream", "maxBytesPerRequest": "65536"})
    assert (chosen.request_bytes("transactional"), chosen.request_bytes("ordered")) == (
        65536,
        65536,
    )
    with pytest.raises(OptionError, match="maxBytesPerRequest"):
        SinkOptions.parse({"url": "http://h:1/v1/stream", "maxBytesPerRequest": "1023"})
    with pytest.raises(OptionError, match="option\\('stream'"):
        SinkOptions.parse({"url": "http://h:1/v1/stream", "path": "events"})
    with pytest.raises(OptionError, match="producerId"):
        SinkOptions.parse({"url": "http://h:1/v1/stream", "producerId": "a b"})
    with pytest.raises(OptionError, match="transactionTtl"):
        SinkOptions.parse({"url": "http://h:1/v1/stream", "transactionTtl": "8d"})


def test_handle_names_are_valid_and_unique_per_attempt() -> None:
    identity = TaskIdentity("q" * 300, 7, 3, 1)
    name = handle_name("spark", identity, "abc", 0)
    assert len(name) <= 200 and name.endswith("-7-3-1-abc-0")
    assert handle_name("spark", identity, "abd", 0) != name
