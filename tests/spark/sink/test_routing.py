"""Issue 15, items 4 and 5: routing keys are normalised before rows are grouped, and the ``stream`` option
wins over a ``stream`` column (as Kafka's ``topic`` option over a ``topic`` column).

Item 4: rows were grouped by the raw routing value and only then normalised, so ``"s"``, ``"/s"`` and
``" s"`` were three groups written to ``s`` one after the other: input 1..5 became 1,3,5,2,4. The property
tests generate spellings of a few targets, in any order, and check that each target gets its rows in input
order: on the pure splitting function (many examples), and through the task's real write path against a
real server (``WriterHarness``, fewer examples), which is where the bug was.

Item 5 (the rule, decided on the driver): the unit tests of ``Routing.decide``; the Spark-level copy
pipeline is ``test_copy_pipeline.py``.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType

from durastream_spark.columns import SOURCE_STREAM_MARK
from durastream_spark.sink import routing
from durastream_spark.sink.encoding import PayloadLayout
from durastream_spark.sink.errors import UnsupportedWrite
from durastream_spark.sink.options import SinkOptions
from tests.spark.sink.support import WriterHarness, read_stream, unique

TARGETS = ("s", "a/b", "deep/er/path")
SPELLINGS = (
    lambda t: t,
    lambda t: "/" + t,
    lambda t: t + "/",
    lambda t: " " + t,
    lambda t: f" /{t}/ ",
    lambda t: f"\t{t}\n",
    lambda t: f"//{t}",
)
rows_strategy = st.lists(
    st.tuples(
        st.integers(0, len(TARGETS) - 1),
        st.integers(0, len(SPELLINGS) - 1),
    ),
    min_size=1,
    max_size=60,
)


def _expected(rows: list[tuple[int, int]], prefix: str = "") -> dict[str, list[int]]:
    expected: dict[str, list[int]] = {}
    for n, (target, _) in enumerate(rows):
        expected.setdefault(prefix + TARGETS[target], []).append(n)
    return expected


@settings(max_examples=300, deadline=None)
@given(rows=rows_strategy)
def test_every_spelling_of_a_target_keeps_the_rows_in_input_order(rows) -> None:
    values = pa.array([SPELLINGS[spelling](TARGETS[t]) for t, spelling in rows])
    payloads = pa.array([f"{n}," for n in range(len(rows))])
    found = {
        path: [int(p[:-1]) for p in group.to_pylist()]
        for path, group in routing.split(values, payloads)
    }
    assert found == _expected(rows)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=rows_strategy, batch_size=st.integers(1, 25))
def test_the_task_writes_each_target_in_input_order(durastream_server, rows, batch_size) -> None:
    root = durastream_server.base_url + "/v1/stream"
    base = unique("spellings")
    schema = StructType([StructField("n", LongType()), StructField("stream", StringType())])
    arrow = pa.schema([("n", pa.int64()), ("stream", pa.string())])
    data = [
        {"n": n, "stream": SPELLINGS[spelling](f"{base}/{TARGETS[t]}")}
        for n, (t, spelling) in enumerate(rows)
    ]
    batches = [
        pa.RecordBatch.from_pylist(data[i : i + batch_size], schema=arrow)
        for i in range(0, len(data), batch_size)
    ]
    harness = WriterHarness(
        {"url": root, "exactlyOnce": "ordered", "maxMessagesPerRequest": "3"},
        schema,
        str(uuid.uuid4()),
    )
    harness.commit([harness.write(batches, epoch=0, partition=0, attempt=0)], 0)
    for path, keys in _expected(rows, f"{base}/").items():
        assert [m["n"] for m in read_stream(root, path)] == keys


# ---- the rule -------------------------------------------------------------------------------------------

URL = "http://127.0.0.1:1/v1/stream"


def _decide(options: dict[str, str], *fields: StructField) -> routing.Routing:
    schema = StructType([StructField("value", StringType()), *fields])
    layout = PayloadLayout.from_schema(schema, json_stream=True)
    return routing.Routing.decide(SinkOptions.parse({"url": URL, **options}), layout, schema)


def test_the_option_wins_over_a_column_and_a_column_routes_without_it() -> None:
    column = StructField("stream", StringType())
    source_column = StructField("stream", StringType(), metadata=SOURCE_STREAM_MARK)
    assert _decide({"stream": " /copy/events/ "}, column) == routing.Routing("copy/events", None)
    assert _decide({"stream": "copy"}, source_column) == routing.Routing("copy", None)
    assert _decide({"stream": "copy"}, StructField("stream", LongType())).fixed == "copy"
    assert _decide({}, column) == routing.Routing(None, 1)


def test_routing_without_a_target_is_refused_with_the_fix() -> None:
    source_column = StructField("stream", StringType(), metadata=SOURCE_STREAM_MARK)
    with pytest.raises(UnsupportedWrite, match="back into its own source stream.*option 'stream'"):
        _decide({}, source_column)
    with pytest.raises(UnsupportedWrite, match="must be STRING, got bigint"):
        _decide({}, StructField("stream", LongType()))
    with pytest.raises(UnsupportedWrite, match="No target stream: set option 'stream'"):
        _decide({})


def test_null_and_invalid_targets_name_the_row_or_the_value() -> None:
    payloads = pa.array(["1,", "2,", "3,"])
    with pytest.raises(UnsupportedWrite, match="Row 1 of this batch has a null 'stream'"):
        list(routing.split(pa.array(["s", None, "s"]), payloads))
    with pytest.raises(UnsupportedWrite, match="'a//b', which is not a stream path"):
        list(routing.split(pa.array(["s", "/a//b", "s"]), payloads))
    with pytest.raises(UnsupportedWrite, match="'', which is not a stream path"):
        list(routing.split(pa.array(["s", " / ", "s"]), payloads))
    assert routing.target_of(" /x/y/ ") == "x/y"
    with pytest.raises(UnsupportedWrite, match="null 'stream'"):
        routing.target_of(None)
