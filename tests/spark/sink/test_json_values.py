"""Issue 15, item 3: one row, one message, or a clear error.

A JSON stream's request body is the values of its rows joined into an array, and the server makes one
message per element. A value that was not exactly one JSON text changed the count: ``{"id":2},{"id":3}``
became two messages, and the rows ``[1`` and ``2]`` one message (or a 400, depending on where a request
ended). Now each input batch is checked before any of its rows go into a request (``json_values.py``).

- The vectorised check against the reference (the standard library, value by value), on generated
  values: valid texts with or without whitespace around them, and fragments, concatenations and splits
  of texts placed to cancel each other out in the array (the cases a count alone would miss).
- Through the task's real write path against a real server: the task fails with ``InvalidPayload`` naming
  the column, the partition, the row and the beginning of the value, and nothing of it was sent.
"""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from durastream_spark.sink import json_values
from durastream_spark.sink.encoding import EncodedRows
from durastream_spark.sink.errors import InvalidPayload
from tests.spark.sink.support import WriterHarness, read_stream, unique

json_documents = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=10,
)
whitespace = st.sampled_from(["", "", "", " ", "\n", " \t\r\n "])


@st.composite
def texts(draw) -> str:
    document = json.dumps(draw(json_documents), ensure_ascii=draw(st.booleans()))
    return draw(whitespace) + document + draw(whitespace)


@st.composite
def values(draw) -> list[str]:
    """Mostly valid texts; sometimes one joins two texts, splits one in two, or cuts a string open."""
    rows = draw(st.lists(texts(), min_size=1, max_size=12))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(rows) - 1))
        kind = draw(st.sampled_from(["join", "split", "garbage"]))
        if kind == "join":
            rows[at] = rows[at] + draw(st.sampled_from([",", " , ", ""])) + draw(texts())
        elif kind == "split" and len(rows[at]) > 1:
            cut = draw(st.integers(1, len(rows[at]) - 1))
            rows[at : at + 1] = [rows[at][:cut], rows[at][cut:]]
        else:
            rows[at] = draw(
                st.sampled_from(['"a', 'b"', "[1", "2]", "", " ", "NaN", "{}{}", "1 2"])
            )
    return rows


def _reference(rows: list[str]) -> int | None:
    """The first row the standard library does not read as exactly one JSON text."""
    for index, row in enumerate(rows):
        try:
            json.loads(row, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
        except ValueError:
            return index
    return None


def _check(rows: list[str | bytes]) -> json_values.NotOneText | None:
    payloads = [(r if isinstance(r, bytes) else r.encode()) + b"," for r in rows]
    encoded = EncodedRows.from_payloads(payloads, 1)
    return json_values.check(encoded.data, encoded.offsets)


@settings(max_examples=600, deadline=None)
@given(rows=values())
def test_the_vectorised_check_finds_the_first_row_that_is_not_one_text(rows) -> None:
    problem = _check(rows)
    assert (problem.index if problem else None) == _reference(rows)
    arrow = json_values.check_arrow(pa.array([r + "," for r in rows]))
    assert (arrow.index if arrow else None) == _reference(rows)


@pytest.mark.parametrize(
    ("rows", "index", "reason"),
    [
        (['{"id":1}', '{"id":2},{"id":3}', '{"id":4}'], 1, "more than one JSON text"),
        (["[1", "2]"], 0, "not JSON"),
        # A split and a join that cancel out in the array: the element count alone would match.
        (['  "a', '"', "1,2"], 0, "not JSON"),
        (['"x"', '"a', 'b"', "[3]"], 1, "not JSON"),
        (["1", "NaN"], 1, "NaN is not valid JSON"),
        (["1", ""], 1, "empty"),
        (["1", b"\xff"], 1, "not UTF-8"),
    ],
)
def test_the_culprit_and_why(rows, index, reason) -> None:
    problem = _check(rows)
    assert problem is not None and problem.index == index
    assert reason in problem.reason


def test_whitespace_around_a_text_and_odd_but_valid_escapes_pass() -> None:
    assert _check([' {"a": 1}\n', "\t2", '"\\ud800"', "null"]) is None


SCHEMA = StructType([StructField("n", LongType()), StructField("value", StringType())])
ARROW = pa.schema([("n", pa.int64()), ("value", pa.string())])


@pytest.mark.parametrize("mode", ["transactional", "ordered"])
@pytest.mark.parametrize(
    ("bad", "reason"),
    [('{"id":2},{"id":3}', "more than one JSON text"), ("[1", "not JSON")],
)
def test_the_task_fails_before_sending_a_request_that_holds_the_row(
    durastream_server, mode, bad, reason
) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique(f"one-text-{mode}")
    harness = WriterHarness(
        {"url": root, "stream": stream, "exactlyOnce": mode, "maxMessagesPerRequest": "4"},
        SCHEMA,
        str(uuid.uuid4()),
    )
    good = [{"n": n, "value": json.dumps({"id": n})} for n in range(10)]
    rows = good[:9] + [{"n": 9, "value": bad}] + good
    batches = [pa.RecordBatch.from_pylist(rows[i : i + 7], schema=ARROW) for i in (0, 7, 14)]
    with pytest.raises(InvalidPayload) as raised:
        harness.write(batches, epoch=0, partition=3, attempt=0)
    text = str(raised.value)
    assert "Column 'value'" in text and "partition 3" in text and "row 9 of this partition" in text
    assert reason in text and repr(bad[:10])[:-1] in text
    # Ordered mode sent the full requests of the batch before (rows 0-3), not one with row 9 (rows 8-11).
    visible = read_stream(root, stream)
    assert [m["id"] for m in visible] == ([] if mode == "transactional" else [0, 1, 2, 3])


def test_a_binary_value_column_is_checked_too(durastream_server) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("one-text-binary")
    schema = StructType([StructField("value", BinaryType())])
    harness = WriterHarness({"url": root, "stream": stream}, schema, str(uuid.uuid4()))
    batch = pa.RecordBatch.from_pylist(
        [{"value": b'{"ok":1}'}, {"value": b"[1,2] [3]"}],
        schema=pa.schema([("value", pa.binary())]),
    )
    with pytest.raises(InvalidPayload, match=r"row 1 of this partition .* more than one JSON text"):
        harness.write([batch], epoch=0, partition=0, attempt=0)
    assert read_stream(root, stream) == []
