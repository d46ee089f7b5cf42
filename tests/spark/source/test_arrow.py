"""Messages to Arrow batches whose schema is exactly what Spark checks (``to_arrow_schema``, UTC)."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from durastream_spark.protocol.frames import decode_frames, encode_frames, offset_token
from durastream_spark.source.arrow import (
    DEFAULT_SCHEMA,
    FramesBlock,
    MalformedMessage,
    OutputLayout,
    SchemaMismatch,
    SchemaNotSupported,
    ValuesBlock,
)

UTC = dt.timezone.utc


def to_arrow_schema(schema: StructType) -> pa.Schema:
    """Spark's own conversion, as its data source worker checks it: ``timezone="UTC"`` where the keyword
    exists (Spark 4.0 has none, and converts timestamps to UTC by default)."""
    try:
        return spark_to_arrow_schema(schema, timezone="UTC")
    except TypeError:
        return spark_to_arrow_schema(schema)


def frames_block(
    values: list[bytes], *, lines: bool, first_ms: int = 1_700_000_000_000
) -> FramesBlock:
    positions, position = [], 100
    for value in values:
        positions.append(position)
        position += len(value)
    times = [first_ms + i for i in range(len(values))]
    return FramesBlock(decode_frames(encode_frames(positions, times, values, lines=lines)))


def test_default_schema_batch_matches_spark_exactly() -> None:
    layout = OutputLayout.for_schema(DEFAULT_SCHEMA)
    batch = layout.batch("events/a", frames_block([b'{"a":1}', b"[2]"], lines=False))
    assert batch.schema == to_arrow_schema(DEFAULT_SCHEMA)
    assert batch.to_pylist() == [
        {
            "stream": "events/a",
            "offset": offset_token(100),
            "value": b'{"a":1}',
            "timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
        },
        {
            "stream": "events/a",
            "offset": offset_token(107),
            "value": b"[2]",
            "timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, 1000, tzinfo=UTC),
        },
    ]
    assert not layout.needs_json


def test_default_columns_in_another_order_are_still_metadata() -> None:
    schema = StructType(
        [
            DEFAULT_SCHEMA["value"],
            DEFAULT_SCHEMA["stream"],
            DEFAULT_SCHEMA["offset"],
            DEFAULT_SCHEMA["timestamp"],
        ]
    )
    layout = OutputLayout.for_schema(schema)
    batch = layout.batch("s", frames_block([b"x"], lines=False))
    assert batch.schema.names == ["value", "stream", "offset", "timestamp"]
    assert batch.column(0).to_pylist() == [b"x"]


def test_user_schema_parses_json_into_typed_columns_with_metadata() -> None:
    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("name", StringType()),
            StructField("at", TimestampType()),
            StructField("day", DateType()),
            StructField("price", DecimalType(10, 2)),
            StructField("tags", ArrayType(StringType())),
            StructField(
                "inner", StructType([StructField("x", IntegerType()), StructField("d", DateType())])
            ),
            StructField("_offset", StringType()),
            StructField("_stream", StringType()),
            StructField("_timestamp", TimestampType()),
            StructField("_value", BinaryType()),
        ]
    )
    first = {
        "id": 1,
        "name": "a\nb",
        "at": "2024-01-02T03:04:05.5Z",
        "day": "2024-02-29",
        "price": 12.5,
        "tags": ["x", "y"],
        "inner": {"x": 7, "d": "2020-01-01"},
        "ignored": True,
    }
    pretty = json.dumps({"id": 2}, indent=2).encode()  # raw newlines inside a message
    values = [json.dumps(first).encode(), pretty]
    layout = OutputLayout.for_schema(schema)
    assert layout.needs_json
    for block in (
        frames_block(values, lines=True),
        frames_block(values, lines=False),
        ValuesBlock(values, "-1"),
    ):
        batch = layout.batch("s", block)
        assert batch.schema == to_arrow_schema(schema)
        rows = batch.to_pylist()
        assert rows[0]["id"] == 1 and rows[0]["name"] == "a\nb"
        assert rows[0]["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)
        assert rows[0]["day"] == dt.date(2024, 2, 29)
        assert rows[0]["price"] == decimal.Decimal("12.50")
        assert rows[0]["tags"] == ["x", "y"]
        assert rows[0]["inner"] == {"x": 7, "d": dt.date(2020, 1, 1)}
        assert rows[1]["id"] == 2 and rows[1]["name"] is None and rows[1]["tags"] is None
        assert [r["_value"] for r in rows] == values
        assert rows[0]["_stream"] == "s"


def test_values_block_has_the_reads_offset_and_no_timestamp() -> None:
    layout = OutputLayout.for_schema(DEFAULT_SCHEMA)
    batch = layout.batch("s", ValuesBlock([b"1", b"2"], "0000000000000000_0000000000000009"))
    assert batch.schema == to_arrow_schema(DEFAULT_SCHEMA)
    assert batch.column("offset").to_pylist() == ["0000000000000000_0000000000000009"] * 2
    assert batch.column("timestamp").to_pylist() == [None, None]


@pytest.mark.parametrize(
    "field, fragment",
    [
        (StructField("m", MapType(StringType(), IntegerType())), "cannot parse from JSON"),
        (StructField("blob", BinaryType()), "cannot parse from JSON"),
        (StructField("_offset", LongType()), "reserved metadata column"),
    ],
)
def test_unsupported_user_schemas_are_refused_up_front(field: StructField, fragment: str) -> None:
    with pytest.raises(SchemaNotSupported, match=fragment) as caught:
        OutputLayout.for_schema(StructType([StructField("id", IntegerType()), field]))
    assert field.name in str(caught.value)


def test_a_message_that_is_not_an_object_is_named_by_offset() -> None:
    layout = OutputLayout.for_schema(StructType([StructField("id", IntegerType())]))
    block = frames_block([b'{"id": 1}', b"[1, 2]"], lines=True)
    with pytest.raises(MalformedMessage, match=offset_token(109)) as caught:
        layout.batch("events/x", block)
    assert "events/x" in str(caught.value) and "not an object" in str(caught.value)
    with pytest.raises(SchemaMismatch) as mismatch:
        layout.batch("events/x", frames_block([b'{"id": 1}', b'{"id": "seven"}'], lines=True))
    assert str(mismatch.value).startswith(
        f"Stream 'events/x': the message at offset {offset_token(109)} does not fit column 'id' INT "
        'of the query\'s schema: it has "id": "seven" (a JSON string). Fix the producer'
    )
    assert (mismatch.value.column, mismatch.value.spark_type) == ("id", "INT")


def test_a_value_spark_cannot_hold_is_named_with_its_column_and_offset() -> None:
    layout = OutputLayout.for_schema(StructType([StructField("day", DateType())]))
    good = b'{"day": "2024-01-31"}'
    block = frames_block([good, b'{"day": "2024-13-45"}'], lines=True)
    with pytest.raises(SchemaMismatch) as mismatch:
        layout.batch("events/x", block)
    second = offset_token(100 + len(good))
    assert str(mismatch.value).startswith(
        f"Stream 'events/x': the message at offset {second} does not fit column 'day' DATE"
    )
    assert '"day": "2024-13-45"' in str(mismatch.value)


def test_layout_pickles_and_rebuilds_its_arrow_schema() -> None:
    import pickle

    layout = OutputLayout.for_schema(DEFAULT_SCHEMA)
    assert layout.arrow_schema == to_arrow_schema(DEFAULT_SCHEMA)
    copy = pickle.loads(pickle.dumps(layout))
    assert copy.arrow_schema == layout.arrow_schema
    assert isinstance(copy.batch("s", ValuesBlock([b"v"], "-1")), pa.RecordBatch)
