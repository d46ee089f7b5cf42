"""Messages to Arrow ``RecordBatch``es in exactly the layout Spark expects from a Python data source.

Spark (>= 4.2) checks every batch a Python source yields against ``to_arrow_schema(schema, timezone="UTC")``:
same names, types and nullability. ``OutputLayout`` is built once from the query's schema (on the driver, so a
bad schema fails the query before any task starts) and turns a block of messages into such a batch:

- **Default schema** ``stream STRING, offset STRING, value BINARY, timestamp TIMESTAMP``: the frames body
  is wrapped, not copied (``value`` shares the response buffer; ``offset`` and ``stream`` are built with
  vectorised kernels). ``timestamp`` is the server's append time: Arrow ``timestamp[ms, UTC]`` from the
  frames body, widened to Spark's microseconds. It is null where the server gives none.
- **User schema** (``.schema("id INT, name STRING")``): each message is one JSON object, parsed by
  ``pyarrow.json`` straight into typed columns (no Python per row, no ``from_json``). Top-level keys
  match column names exactly; missing keys are null; keys not in the schema are ignored. Reserved column
  names give metadata instead of a JSON field: ``_stream`` STRING, ``_offset`` STRING, ``_timestamp``
  TIMESTAMP and ``_value`` BINARY (the raw message).

JSON types the parser supports: BOOLEAN, TINYINT/SMALLINT/INT/BIGINT, FLOAT/DOUBLE, DECIMAL, STRING, DATE
(``"2024-01-31"``), TIMESTAMP (ISO 8601, with an offset or ``Z``; read as UTC), TIMESTAMP_NTZ, and ARRAY /
STRUCT of these. Others (MAP, BINARY, VARIANT, intervals) are refused when the query starts, with the
advice to read ``_value`` and use ``from_json``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    _parse_datatype_json_string,
)

from durastream_spark.columns import SOURCE_STREAM_MARK
from durastream_spark.errors import DurastreamError
from durastream_spark.protocol.frames import Frames, offset_token

log = logging.getLogger(__name__)

STREAM, OFFSET, VALUE, TIMESTAMP = "stream", "offset", "value", "timestamp"
META_TYPES: dict[str, DataType] = {
    STREAM: StringType(),
    OFFSET: StringType(),
    VALUE: BinaryType(),
    TIMESTAMP: TimestampType(),
}
RESERVED_COLUMNS: dict[str, str] = {f"_{kind}": kind for kind in META_TYPES}
DEFAULT_SCHEMA = StructType(
    [
        StructField(name, kind, True, metadata=SOURCE_STREAM_MARK if name == STREAM else None)
        for name, kind in META_TYPES.items()
    ]
)
SPARK_TIMESTAMP = pa.timestamp("us", tz="UTC")

_SIMPLE_JSON_TYPES: dict[type, pa.DataType] = {
    BooleanType: pa.bool_(),
    ByteType: pa.int8(),
    ShortType: pa.int16(),
    IntegerType: pa.int32(),
    LongType: pa.int64(),
    FloatType: pa.float32(),
    DoubleType: pa.float64(),
    StringType: pa.string(),
    DateType: pa.string(),  # parsed as text, then cast: pyarrow.json has no date inference from strings
    TimestampType: SPARK_TIMESTAMP,
    TimestampNTZType: pa.timestamp("us"),
}


class SchemaNotSupported(DurastreamError, ValueError):
    """The user schema has a column the JSON parser cannot fill, or a metadata column of the wrong type."""


class MalformedMessage(DurastreamError):
    """A message does not parse as a JSON object matching the user schema."""


class SchemaMismatch(MalformedMessage):
    """A message's field does not fit its column of the user schema. Named in Spark's terms: ``stream``,
    ``offset`` (of the message), ``column`` and ``spark_type`` (``INT``, ``array<string>``, ...)."""

    def __init__(self, stream: str, offset: str, column: str, data_type: DataType, value: object):
        spark_type = spark_type_name(data_type)
        shown = _clip(json.dumps({column: value}, ensure_ascii=False, default=str)[1:-1])
        super().__init__(
            f"Stream '{stream}': the message at offset {offset} does not fit column '{column}' "
            f"{spark_type} of the query's schema: it has {shown} ({_json_kind(value)}). Fix the "
            f"producer, or give '{column}' a type that fits in .schema(...) (or read the raw message "
            "as '_value BINARY' and parse it with from_json)."
        )
        self.stream = stream
        self.offset = offset
        self.column = column
        self.spark_type = spark_type


def spark_type_name(data_type: DataType) -> str:
    """``INT``, ``TIMESTAMP``, ``DECIMAL(10,2)``; nested types as Spark prints them (``array<int>``)."""
    if isinstance(data_type, (ArrayType, StructType)):
        return data_type.simpleString()
    return data_type.simpleString().upper()


def _json_kind(value: object) -> str:
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, (int, float)):
        return "a JSON number"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, list):
        return "a JSON array"
    return "a JSON object"


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_arrow_schema(schema: StructType) -> pa.Schema:
    """Spark's own conversion, so the layout matches what Spark checks (older signatures tolerated)."""
    from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow

    try:
        return spark_to_arrow(schema, timezone="UTC")
    except TypeError:  # pragma: no cover - Spark 4.0 without the timezone keyword
        return spark_to_arrow(schema)


def json_parse_type(column: str, data_type: DataType) -> pa.DataType:
    """The Arrow type ``pyarrow.json`` parses a column as (then cast to Spark's layout)."""
    simple = _SIMPLE_JSON_TYPES.get(type(data_type))
    if simple is not None:
        return simple
    if isinstance(data_type, DecimalType):
        return pa.decimal128(data_type.precision, data_type.scale)
    if isinstance(data_type, ArrayType):
        return pa.list_(json_parse_type(column, data_type.elementType))
    if isinstance(data_type, StructType):
        return pa.struct(
            [
                pa.field(f.name, json_parse_type(f"{column}.{f.name}", f.dataType))
                for f in data_type.fields
            ]
        )
    raise SchemaNotSupported(
        f"Column '{column}' has type {data_type.simpleString()}, which the source cannot parse from JSON "
        "messages. Supported: boolean, integer types, float, double, decimal, string, date, timestamp, "
        "timestamp_ntz, and arrays/structs of these. Declare the raw message as '_value BINARY' instead "
        "and parse it with from_json."
    )


# --------------------------------------------------------------------------------------------------------
# Blocks of messages
# --------------------------------------------------------------------------------------------------------


class MessageBlock:
    """Messages of one read response, however the server described them."""

    count: int

    def offsets(self) -> pa.Array:
        raise NotImplementedError

    def timestamps(self) -> pa.Array:
        raise NotImplementedError

    def values(self) -> pa.Array:
        raise NotImplementedError

    def json_text(self) -> pa.Buffer:
        """The messages as one JSON text for ``pyarrow.json``: one value after another."""
        raise NotImplementedError

    def raw_value(self, index: int) -> bytes:
        raise NotImplementedError

    def offset_of(self, index: int) -> str:
        raise NotImplementedError


class FramesBlock(MessageBlock):
    """A ``format=frames`` / ``frames-lines`` body: each message's own offset and append time."""

    def __init__(self, frames: Frames) -> None:
        self.frames = frames
        self.count = frames.count

    def offsets(self) -> pa.Array:
        return self.frames.offsets()

    def timestamps(self) -> pa.Array:
        return pc.cast(self.frames.timestamps, SPARK_TIMESTAMP)

    def values(self) -> pa.Array:
        return pc.cast(self.frames.values_without_newline(), pa.binary())

    def json_text(self) -> pa.Buffer:
        # The values section, zero-copy: NDJSON in frames-lines mode, and in frames mode the messages
        # back to back, which pyarrow's JSON reader parses the same way (it is whitespace-insensitive
        # between values, and every message of a typed read must be an object, so no two run together;
        # one that is not an object fails the parse or the row count, as it does as a line). The server
        # then sends each stored record's messages as one buffer, instead of cutting them into lines.
        return self.frames.ndjson

    def raw_value(self, index: int) -> bytes:
        value = self.frames.values[index].as_py()
        return value[:-1] if self.frames.lines else value

    def offset_of(self, index: int) -> str:
        return offset_token(self.frames.positions[index].as_py())


class ValuesBlock(MessageBlock):
    """Messages from a base-protocol read (servers without frames): no per-message offset or time.

    ``offset`` is the offset the read started at, the same for every message of the read: a position at or
    before each message, from which a query re-reads it (documented in ``docs/source.md``).
    """

    def __init__(self, values: list[bytes], offset: str) -> None:
        self._values = values
        self._offset = offset
        self.count = len(values)

    def offsets(self) -> pa.Array:
        return pa.repeat(pa.scalar(self._offset, pa.string()), self.count)

    def timestamps(self) -> pa.Array:
        return pa.nulls(self.count, SPARK_TIMESTAMP)

    def values(self) -> pa.Array:
        return pa.array(self._values, pa.binary())

    def json_text(self) -> pa.Buffer:
        return pa.py_buffer(b"".join(_one_line(value) for value in self._values))

    def raw_value(self, index: int) -> bytes:
        return self._values[index]

    def offset_of(self, index: int) -> str:
        return f"{self._offset} (message {index + 1} of the read starting there)"


def _one_line(value: bytes) -> bytes:
    # Raw CR and LF can only be insignificant whitespace in valid JSON, so replacing them keeps the value.
    return value.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n"


# --------------------------------------------------------------------------------------------------------
# The output layout
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputColumn:
    name: str
    meta: str | None  # STREAM/OFFSET/VALUE/TIMESTAMP, or None for a JSON field


@dataclass(frozen=True)
class OutputLayout:
    """How the query's columns are filled. Frozen and picklable (the schema travels as JSON)."""

    schema_json: str
    columns: tuple[OutputColumn, ...]

    @classmethod
    def for_schema(cls, schema: StructType) -> OutputLayout:
        """Check the schema and decide each column's source. Raises ``SchemaNotSupported``."""
        if _is_default_projection(schema):
            columns = tuple(OutputColumn(f.name, f.name) for f in schema.fields)
            return cls(schema.json(), columns)
        columns_list: list[OutputColumn] = []
        for f in schema.fields:
            kind = RESERVED_COLUMNS.get(f.name)
            if kind is not None:
                expected = META_TYPES[kind]
                if f.dataType != expected:
                    raise SchemaNotSupported(
                        f"Column '{f.name}' is the reserved metadata column for the message's {kind}; "
                        f"declare it as {expected.simpleString().upper()}, not "
                        f"{f.dataType.simpleString().upper()} (or rename it if it is a JSON field)."
                    )
                columns_list.append(OutputColumn(f.name, kind))
            else:
                json_parse_type(f.name, f.dataType)  # refuses unsupported types now
                columns_list.append(OutputColumn(f.name, None))
        return cls(schema.json(), tuple(columns_list))

    @cached_property
    def spark_schema(self) -> StructType:
        parsed = _parse_datatype_json_string(self.schema_json)
        assert isinstance(parsed, StructType)
        return parsed

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return to_arrow_schema(self.spark_schema)

    @cached_property
    def parse_schema(self) -> pa.Schema:
        fields = {f.name: f for f in self.spark_schema.fields}
        return pa.schema(
            [
                pa.field(c.name, json_parse_type(c.name, fields[c.name].dataType))
                for c in self.columns
                if c.meta is None
            ]
        )

    @property
    def needs_json(self) -> bool:
        """Whether any column is parsed from the message's JSON (the stream must be JSON, read as lines)."""
        return any(c.meta is None for c in self.columns)

    def batch(
        self, stream: str, block: MessageBlock, streams: pa.Array | None = None
    ) -> pa.RecordBatch:
        """One ``RecordBatch`` of ``block``'s messages with exactly ``arrow_schema``. ``streams``: each
        message's stream, for a block of several streams (a packed task); ``stream`` then only names
        them in errors."""
        parsed = self._parse_json(stream, block) if self.needs_json else None
        arrays: list[pa.Array] = []
        for column, target in zip(self.columns, self.arrow_schema, strict=True):
            if column.meta == STREAM:
                array = (
                    pa.repeat(pa.scalar(stream, pa.string()), block.count)
                    if streams is None
                    else streams
                )
            elif column.meta == OFFSET:
                array = block.offsets()
            elif column.meta == VALUE:
                array = block.values()
            elif column.meta == TIMESTAMP:
                array = block.timestamps()
            else:
                assert parsed is not None
                array = parsed.column(column.name).combine_chunks()
            if array.type != target.type:
                try:
                    array = pc.cast(array, target.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise self._explain_cast(stream, block, column.name, array, target) from None
            arrays.append(array)
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _parse_json(self, stream: str, block: MessageBlock) -> pa.Table:
        buffer = block.json_text()
        try:
            table = pajson.read_json(
                pa.BufferReader(buffer),
                read_options=pajson.ReadOptions(
                    use_threads=False, block_size=max(buffer.size + 1, 1 << 16)
                ),
                parse_options=pajson.ParseOptions(
                    explicit_schema=self.parse_schema, unexpected_field_behavior="ignore"
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise self._explain_bad_json(stream, block, error) from None
        if table.num_rows != block.count:
            raise MalformedMessage(
                f"Stream '{stream}': {block.count} messages parsed into {table.num_rows} rows "
                f"(from offset {block.offset_of(0)}); every message must be one JSON object."
            )
        return table

    def _spark_type(self, column: str) -> DataType:
        return next(f.dataType for f in self.spark_schema.fields if f.name == column)

    def _fits(self, column: str, value: object) -> bool:
        """Whether ``{column: value}`` parses as the column's type (pyarrow's rules, not a copy of them)."""
        text = json.dumps({column: value}).encode()
        try:
            pajson.read_json(
                pa.BufferReader(text),
                parse_options=pajson.ParseOptions(
                    explicit_schema=pa.schema([self.parse_schema.field(column)]),
                    unexpected_field_behavior="ignore",
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False
        return True

    def _explain_bad_json(
        self, stream: str, block: MessageBlock, error: Exception
    ) -> MalformedMessage:
        """The first message that does not parse: not JSON, not an object, or a field that does not fit
        its column (named with its Spark type). Only runs once a block failed, so it may be slow."""
        for index in range(block.count):
            raw = block.raw_value(index)
            try:
                document = json.loads(raw)
            except ValueError as exc:
                reason = f"not valid JSON ({exc})"
            else:
                if isinstance(document, dict):
                    for name in self.parse_schema.names:
                        if name in document and not self._fits(name, document[name]):
                            return SchemaMismatch(
                                stream,
                                block.offset_of(index),
                                name,
                                self._spark_type(name),
                                document[name],
                            )
                    continue
                reason = f"a JSON {type(document).__name__}, not an object"
            return MalformedMessage(
                f"Stream '{stream}': the message at offset {block.offset_of(index)} is {reason}, so it "
                "cannot fill the columns of the user schema. Read without .schema() to get the raw "
                "bytes, or fix the producer."
            )
        return MalformedMessage(
            f"Stream '{stream}': messages from offset {block.offset_of(0)} do not match the user schema "
            f"{self.spark_schema.simpleString()}: {error}"
        )

    def _explain_cast(
        self, stream: str, block: MessageBlock, column: str, array: pa.Array, target: pa.Field
    ) -> MalformedMessage:
        """A parsed value that Spark's type cannot hold (``"2024-13-45"`` for a DATE): the first one."""
        for index in range(len(array)):
            try:
                pc.cast(array.slice(index, 1), target.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                value = array[index].as_py()
                return SchemaMismatch(
                    stream, block.offset_of(index), column, self._spark_type(column), value
                )
        return MalformedMessage(
            f"Stream '{stream}': column '{column}' of messages from offset {block.offset_of(0)} cannot "
            f"be converted to {spark_type_name(self._spark_type(column))}."
        )


def _is_default_projection(schema: StructType) -> bool:
    """Exactly the default columns (any order, any nullability): metadata, not JSON fields."""
    names = [f.name for f in schema.fields]
    return sorted(names) == sorted(META_TYPES) and all(
        f.dataType == META_TYPES[f.name] for f in schema.fields
    )
