"""Rows to message payloads: the ``value`` column as-is, or each row as one JSON object.

Two paths produce the same messages:

- ``ArrowPayloadEncoder`` works on the ``pyarrow.RecordBatch``es Spark hands the Arrow writers. Flat
  columns (numbers, booleans, decimals, strings, dates, timestamps, structs of those) are turned into JSON
  text with Arrow compute kernels, a column at a time, and the row objects are joined the same way, so a
  batch of 10,000 rows costs a few kernel calls instead of 10,000 Python ``json.dumps``. Arrays, maps,
  binary, intervals and variants go through the per-value converters below, column by column.
- ``RowPayloadEncoder`` works on ``pyspark.sql.Row``s (the row writer Spark 4.0 uses for streaming), with
  the per-value converters only.

JSON rendering (documented for users in ``durastream_spark.sink``): nested structs become objects, arrays
become arrays, maps become objects (non-string keys are rendered as JSON text and used as the key string);
timestamps become ISO-8601 UTC with microseconds and a ``Z`` (``2024-01-02T03:04:05.123456Z``);
``TIMESTAMP_NTZ`` the same without the ``Z``; dates ``YYYY-MM-DD``; decimals are JSON numbers with their
exact digits (``1.50``); binary is base64 in a string; NaN and infinities are the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` (as Spark's ``to_json`` writes them, since JSON has no such numbers);
day-time intervals are ISO-8601 durations (``PT93784.5S``); variants their JSON; null fields are written as
``null`` (the key stays).

Output: ``EncodedRows``, the payloads of consecutive rows concatenated in one buffer plus offsets. For JSON
streams every payload carries a trailing ``,``, so a request body is ``[`` + a slice of the buffer minus its
last byte + ``]``, built with one copy (``batcher.py``).
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import math
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    UserDefinedType,
    VariantType,
    VariantVal,
    YearMonthIntervalType,
)

from durastream_spark.sink.errors import UnsupportedWrite

VALUE_COLUMN = "value"
STREAM_COLUMN = "stream"
JSON_SEPARATOR = b","

try:  # not in every Spark 4.x
    from pyspark.sql.types import TimeType
except ImportError:  # pragma: no cover - depends on the installed Spark
    TimeType = None  # type: ignore[assignment,misc]

_UTC = dt.timezone.utc
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_JSON_SHORT_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROL_CHARS = r"[\x00-\x1f]"
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'


# ==========================================================================================================
# The encoded form
# ==========================================================================================================


@dataclass(frozen=True)
class EncodedRows:
    """Payloads of ``len(self)`` rows: row ``i`` is ``data[offsets[i]:offsets[i+1]]``.

    With ``separator`` 1 (JSON streams) every payload ends with ``,``; with 0 (other streams) payloads are
    the raw bytes. ``data`` may be a view of an Arrow buffer: no copy until a request body is built.
    """

    data: memoryview
    offsets: Sequence[int]
    separator: int

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return self.offsets[-1] - self.offsets[0]

    @classmethod
    def from_arrow(cls, array: pa.Array, separator: int) -> EncodedRows:
        """Wrap a (large_)string/binary array without nulls, zero-copy."""
        if array.null_count:
            raise ValueError("encoded payloads must not contain nulls")
        large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
        buffers = array.buffers()
        offsets = pa.Array.from_buffers(
            pa.int64() if large else pa.int32(),
            len(array) + 1,
            [None, buffers[1]],
            offset=array.offset,
        ).to_pylist()
        data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")
        return cls(data, offsets, separator)

    def slice(self, start: int, count: int) -> EncodedRows:
        """Rows ``start`` to ``start + count`` (the same buffer, no copy of the data)."""
        return EncodedRows(self.data, self.offsets[start : start + count + 1], self.separator)

    @classmethod
    def from_payloads(cls, payloads: Sequence[bytes], separator: int) -> EncodedRows:
        """From separate payloads (separators already included when ``separator`` is 1)."""
        offsets = [0, *itertools.accumulate(len(p) for p in payloads)]
        return cls(memoryview(b"".join(payloads)), offsets, separator)


# ==========================================================================================================
# Per-value JSON converters (rows, and Arrow columns without a vectorised kernel)
# ==========================================================================================================

Converter = Callable[[Any], str]


def python_converter(data_type: DataType, *, from_rows: bool) -> Converter:
    """A function turning one non-null value of ``data_type`` into JSON text.

    ``from_rows`` selects the Python form of the value: ``Row``s, dicts for maps and ``VariantVal``s as
    Spark's row writer gives them, or dicts for structs, ``(key, value)`` lists for maps and
    ``{"value", "metadata"}`` dicts for variants as ``pyarrow``'s ``to_pylist`` gives them.
    """
    if isinstance(data_type, NullType):
        return lambda _value: "null"
    if isinstance(data_type, BooleanType):
        return lambda value: "true" if value else "false"
    if isinstance(data_type, _INTEGRAL):
        return lambda value: str(int(value))
    if isinstance(data_type, DoubleType):
        return _double_text
    if isinstance(data_type, FloatType):
        return _float32_text
    if isinstance(data_type, DecimalType):
        return _decimal_text
    if isinstance(data_type, StringType):
        return _string_text
    if isinstance(data_type, BinaryType):
        return lambda value: '"' + base64.b64encode(bytes(value)).decode("ascii") + '"'
    if isinstance(data_type, DateType):
        return lambda value: '"' + _date_text(value) + '"'
    if isinstance(data_type, TimestampType):
        return lambda value: '"' + _timestamp_text(value, utc=True) + 'Z"'
    if isinstance(data_type, TimestampNTZType):
        return lambda value: '"' + _timestamp_text(value, utc=False) + '"'
    if isinstance(data_type, DayTimeIntervalType):
        return _duration_text
    if isinstance(data_type, YearMonthIntervalType):
        return _months_text
    if TimeType is not None and isinstance(data_type, TimeType):
        return lambda value: '"' + value.isoformat(timespec="microseconds") + '"'
    if isinstance(data_type, VariantType):
        return _variant_text
    if isinstance(data_type, ArrayType):
        element = _nullable(python_converter(data_type.elementType, from_rows=from_rows))
        return lambda value: "[" + ",".join(element(item) for item in value) + "]"
    if isinstance(data_type, MapType):
        return _map_converter(data_type, from_rows=from_rows)
    if isinstance(data_type, StructType):
        return _struct_converter(data_type, from_rows=from_rows)
    if isinstance(data_type, UserDefinedType):
        inner = python_converter(data_type.sqlType(), from_rows=from_rows)
        if from_rows:
            return lambda value: inner(data_type.serialize(value))
        return inner
    raise UnsupportedWrite(
        f"The durastream sink cannot render Spark type {data_type.simpleString()} as JSON. Convert the "
        "column first (e.g. cast it to STRING, or build the payload with to_json into a 'value' column)."
    )


def check_encodable(schema: StructType) -> None:
    """Raise ``UnsupportedWrite`` on the driver for a column no converter handles."""
    for field in schema.fields:
        try:
            python_converter(field.dataType, from_rows=True)
        except UnsupportedWrite as error:
            raise UnsupportedWrite(f"Column '{field.name}': {error}") from None


def _nullable(convert: Converter) -> Converter:
    return lambda value: "null" if value is None else convert(value)


def _string_text(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _double_text(value: float) -> str:
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return repr(float(value))


def _float32_text(value: float) -> str:
    """The shortest decimal that reads back as the same 32-bit float (``0.1``, not ``0.10000000149``)."""
    if math.isnan(value) or math.isinf(value):
        return _double_text(value)
    target = struct.unpack("<f", struct.pack("<f", value))[0]
    for digits in range(1, 10):
        text = f"{target:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(text)))[0] == target:
            return text
    return repr(target)  # pragma: no cover - 9 significant digits always round-trip a float32


def _decimal_text(value: Decimal) -> str:
    # str() keeps every digit and the scale ("1.50"); its exponent form ("1E+3") is a valid JSON number.
    return str(value)


def _date_text(value: dt.date) -> str:
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def _timestamp_text(value: dt.datetime, *, utc: bool) -> str:
    if utc:
        # Rows carry naive local times (Spark converts to the worker's local zone); Arrow carries aware ones.
        value = value.astimezone(_UTC)
    return (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:{value.minute:02d}:"
        f"{value.second:02d}.{value.microsecond:06d}"
    )


def _duration_text(value: dt.timedelta) -> str:
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    text = f"{seconds}.{fraction:06d}".rstrip("0").rstrip(".") if fraction else str(seconds)
    return f'"{sign}PT{text}S"'


def _months_text(value: int) -> str:
    sign = "-" if value < 0 else ""
    years, months = divmod(abs(int(value)), 12)
    return f'"{sign}P{years}Y{months}M"'


def _variant_text(value: Any) -> str:
    if isinstance(value, VariantVal):
        return value.toJson()
    return VariantVal(bytes(value["value"]), bytes(value["metadata"])).toJson()


def _map_converter(data_type: MapType, *, from_rows: bool) -> Converter:
    key_text = python_converter(data_type.keyType, from_rows=from_rows)
    value_text = _nullable(python_converter(data_type.valueType, from_rows=from_rows))
    string_keys = isinstance(data_type.keyType, StringType)

    def key(item: Any) -> str:
        return _string_text(item) if string_keys else _string_text(key_text(item))

    def convert(value: Any) -> str:
        pairs = value.items() if isinstance(value, dict) else value
        return "{" + ",".join(key(k) + ":" + value_text(v) for k, v in pairs) + "}"

    return convert


def _struct_converter(data_type: StructType, *, from_rows: bool) -> Converter:
    names = [_string_text(field.name) + ":" for field in data_type.fields]
    fields = [field.name for field in data_type.fields]
    converters = [
        _nullable(python_converter(field.dataType, from_rows=from_rows))
        for field in data_type.fields
    ]

    def convert(value: Any) -> str:
        items = [value.get(name) for name in fields] if isinstance(value, dict) else value
        return (
            "{"
            + ",".join(
                name + convert_one(item)
                for name, convert_one, item in zip(names, converters, items, strict=True)
            )
            + "}"
        )

    return convert


# ==========================================================================================================
# Vectorised (Arrow) column rendering
# ==========================================================================================================


def arrow_json_column(array: pa.Array, data_type: DataType) -> pa.Array:
    """JSON text of every value of ``array`` (a column of Spark type ``data_type``), nulls as ``null``."""
    opening, text, closing = arrow_json_parts(array, data_type)
    if opening or closing:
        text = pc.binary_join_element_wise(opening, text, closing, "")
    return text


def arrow_json_parts(array: pa.Array, data_type: DataType) -> tuple[str, pa.Array, str]:
    """``(opening, text, closing)``: every value's JSON is ``opening + text + closing``.

    Quoted types without nulls leave their quotes to the caller, which folds them into the literals of
    the row (one copy of the column less, for the common case of a non-null string column).
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not array.null_count:
        unquoted = _arrow_unquoted(array, data_type)
        if unquoted is not None:
            return '"', _single_width(unquoted[0]), unquoted[1]
    text = _single_width(_arrow_json_values(array, data_type))
    return "", pc.fill_null(text, "null") if text.null_count else text, ""


def _single_width(text: pa.Array) -> pa.Array:
    if pa.types.is_large_string(text.type):
        return text.cast(pa.string())  # one batch is far below 2 GiB; the row join needs one type
    return text


def join_parts(parts: list[Any]) -> pa.Array:
    """``binary_join_element_wise`` of literals and columns, adjacent literals merged first."""
    merged: list[Any] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif not (isinstance(part, str) and not part):
            merged.append(part)
    return pc.binary_join_element_wise(*merged, "")


def _arrow_unquoted(array: pa.Array, data_type: DataType) -> tuple[pa.Array, str] | None:
    """The text between the quotes, and the closing, of types rendered as JSON strings (else None)."""
    if isinstance(data_type, StringType):
        return _arrow_escape(array), '"'
    if isinstance(data_type, DateType):
        return pc.cast(array, pa.string()), '"'
    if isinstance(data_type, TimestampType):
        utc = array.cast(pa.timestamp("us", tz="UTC"))
        return pc.strftime(utc, format="%Y-%m-%dT%H:%M:%S"), 'Z"'
    if isinstance(data_type, TimestampNTZType):
        return pc.strftime(array.cast(pa.timestamp("us")), format="%Y-%m-%dT%H:%M:%S"), '"'
    return None


def _arrow_json_values(array: pa.Array, data_type: DataType) -> pa.Array:
    """JSON text with nulls left as nulls."""
    if isinstance(data_type, NullType):
        return pa.nulls(len(array), pa.string())
    if isinstance(data_type, BooleanType):
        return pc.if_else(array, "true", "false")
    if isinstance(data_type, (*_INTEGRAL, DecimalType)):
        return pc.cast(array, pa.string())
    if isinstance(data_type, FloatType | DoubleType):
        return _arrow_floats(array)
    unquoted = _arrow_unquoted(array, data_type)
    if unquoted is not None:
        return _quote(unquoted[0], close=unquoted[1])
    if isinstance(data_type, StructType) and pa.types.is_struct(array.type):
        return _arrow_struct(array, data_type)
    # Everything else (arrays, maps, binary, intervals, variants, UDTs): per value, this column only.
    convert = python_converter(data_type, from_rows=False)
    return pa.array(
        [None if value is None else convert(value) for value in array.to_pylist()], pa.string()
    )


def _quote(text: pa.Array, close: str = '"') -> pa.Array:
    return pc.binary_join_element_wise('"', text, close, "")


def _arrow_escape(array: pa.Array) -> pa.Array:
    """JSON string escaping, byte-identical to ``json.dumps(s, ensure_ascii=False)``."""
    if not _needs_escape(array):
        return array  # the common case: nothing to escape, no copy
    escaped = pc.replace_substring(array, "\\", "\\\\")
    escaped = pc.replace_substring(escaped, '"', '\\"')
    if pc.any(pc.match_substring_regex(escaped, _CONTROL_CHARS)).as_py():
        for code in range(32):
            char = chr(code)
            escaped = pc.replace_substring(
                escaped, char, _JSON_SHORT_ESCAPES.get(char, f"\\u{code:04x}")
            )
    return escaped


def _needs_escape(array: pa.Array) -> bool:
    """Whether any value holds a byte JSON must escape (``"``, ``\\``, or below 0x20).

    Scans the array's one data buffer rather than the values (a regular expression over the values is
    ten times slower): the minimum byte finds control characters, ``bytes.find`` the rest. Bytes under
    null slots may give a false positive, which only costs the exact (slower) path.
    """
    large = pa.types.is_large_string(array.type)
    if array.offset or not (large or pa.types.is_string(array.type)):
        return bool(pc.any(pc.match_substring_regex(array, _NEEDS_ESCAPE)).as_py())
    offsets_buffer, data = array.buffers()[1:3]
    if data is None or not len(array):
        return False
    offsets = pa.Array.from_buffers(
        pa.int64() if large else pa.int32(), len(array) + 1, [None, offsets_buffer]
    )
    start, end = offsets[0].as_py(), offsets[len(array)].as_py()
    if end <= start:
        return False
    region = data.slice(start, end - start)
    low = pc.min(pa.Array.from_buffers(pa.uint8(), end - start, [None, region])).as_py()
    if low < 0x20:
        return True
    return _holds_quote_or_backslash(region)


_scratch = threading.local()


def _holds_quote_or_backslash(region: pa.Buffer) -> bool:
    """``b'"' in region or b"\\" in region``, searched at memchr speed in a reused per-thread buffer.

    ``region.to_pybytes()`` allocated a fresh batch-sized ``bytes`` every batch, and faulting in its
    pages made that copy a sixth of the sink's Python CPU; copying into memory that stays mapped costs
    a tenth of that.
    """
    size = region.size
    scratch: bytearray | None = getattr(_scratch, "buffer", None)
    if scratch is None or len(scratch) < size:
        scratch = _scratch.buffer = bytearray(size)
    memoryview(scratch)[:size] = memoryview(region).cast("B")
    return scratch.find(b'"', 0, size) >= 0 or scratch.find(b"\\", 0, size) >= 0


def _arrow_floats(array: pa.Array) -> pa.Array:
    text = pc.cast(array, pa.string())
    special = pc.is_nan(array)
    infinite = pc.is_inf(array)
    if not (pc.any(special).as_py() or pc.any(infinite).as_py()):
        return text
    positive = pc.and_(infinite, pc.greater(array, 0))
    text = pc.if_else(special, '"NaN"', text)
    text = pc.if_else(positive, '"Infinity"', text)
    return pc.if_else(pc.and_(infinite, pc.invert(positive)), '"-Infinity"', text)


def _arrow_struct(array: pa.StructArray, data_type: StructType) -> pa.Array:
    if not data_type.fields:
        text = pa.array(["{}"] * len(array), pa.string())
    else:
        # flatten() applies the array's offset and the struct's own validity to the children.
        children = array.flatten()
        parts: list[Any] = []
        for index, (field, child) in enumerate(zip(data_type.fields, children, strict=True)):
            parts.append(("{" if index == 0 else ",") + _string_text(field.name) + ":")
            parts.extend(arrow_json_parts(child, field.dataType))
        parts.append("}")
        text = join_parts(parts)
    if array.null_count:
        text = pc.if_else(array.is_valid(), text, pa.scalar(None, pa.string()))
    return text


# ==========================================================================================================
# Payload encoders
# ==========================================================================================================


@dataclass(frozen=True)
class PayloadLayout:
    """Which columns make the payload, decided once from the schema on the driver. Picklable."""

    schema: StructType
    json_stream: bool
    value_index: int | None  # the 'value' column, if the DataFrame has one
    stream_index: (
        int | None
    )  # the 'stream' column, if any: it routes (routing.py), it is never payload
    data_indexes: tuple[
        int, ...
    ]  # columns rendered into the JSON object (when there is no 'value')

    @classmethod
    def from_schema(cls, schema: StructType, *, json_stream: bool) -> PayloadLayout:
        names = [field.name for field in schema.fields]
        value_index = _column_index(names, VALUE_COLUMN)
        stream_index = _column_index(names, STREAM_COLUMN)
        if value_index is not None:
            value_type = schema.fields[value_index].dataType
            if not isinstance(value_type, StringType | BinaryType):
                raise UnsupportedWrite(
                    f"Column 'value' has type {value_type.simpleString()}, but the sink writes a 'value' "
                    "column as-is and accepts only STRING or BINARY. Cast it, or rename it to have every "
                    "row written as a JSON object."
                )
        data_indexes = tuple(i for i in range(len(names)) if i != stream_index)
        if value_index is None:
            if not json_stream:
                raise UnsupportedWrite(
                    "Without a 'value' column every row is written as a JSON object, which needs "
                    "contentType application/json. Add a STRING or BINARY 'value' column holding the "
                    "payload for other content types."
                )
            if not data_indexes:
                raise UnsupportedWrite(
                    "The DataFrame has no column to write besides 'stream': add a 'value' column or data "
                    "columns."
                )
            check_encodable(StructType([schema.fields[i] for i in data_indexes]))
        return cls(schema, json_stream, value_index, stream_index, data_indexes)

    @property
    def separator(self) -> int:
        return 1 if self.json_stream else 0


def _column_index(names: list[str], wanted: str) -> int | None:
    """Case-insensitive, like Spark's column resolution; an ambiguous match is an error."""
    matches = [i for i, name in enumerate(names) if name.lower() == wanted]
    if len(matches) > 1:
        raise UnsupportedWrite(
            f"The DataFrame has {len(matches)} columns named '{wanted}' (case-insensitively); keep one."
        )
    return matches[0] if matches else None


class ArrowPayloadEncoder:
    """Payloads of Arrow record batches (the Arrow writers)."""

    def __init__(self, layout: PayloadLayout) -> None:
        self.layout = layout
        fields = layout.schema.fields
        self._object_parts = [
            ("{" if n == 0 else ",") + _string_text(fields[i].name) + ":"
            for n, i in enumerate(layout.data_indexes)
        ]

    def encode(self, batch: pa.RecordBatch) -> pa.Array:
        """One payload per row (with the JSON separator for JSON streams), as a string/binary array."""
        layout = self.layout
        if layout.value_index is not None:
            values = batch.column(layout.value_index)
            if layout.json_stream:
                scalar_type = values.type
                values = pc.fill_null(values, pa.scalar("null", scalar_type))
                return pc.binary_join_element_wise(
                    values, pa.scalar("", scalar_type), pa.scalar(",", scalar_type)
                )
            empty = pa.scalar(b"" if pa.types.is_binary(values.type) else "", values.type)
            return pc.fill_null(values, empty) if values.null_count else values
        fields = layout.schema.fields
        parts: list[Any] = []
        for prefix, index in zip(self._object_parts, layout.data_indexes, strict=True):
            parts.append(prefix)
            parts.extend(arrow_json_parts(batch.column(index), fields[index].dataType))
        parts.append("},")
        if batch.num_rows == 0:
            return pa.array([], pa.string())
        return join_parts(parts)


class RowPayloadEncoder:
    """Payloads of ``pyspark.sql.Row``s (the row writer)."""

    def __init__(self, layout: PayloadLayout) -> None:
        self.layout = layout
        fields = layout.schema.fields
        if layout.value_index is None:
            data_type = StructType([fields[i] for i in layout.data_indexes])
            convert = _struct_converter(data_type, from_rows=True)
            indexes = layout.data_indexes

            def encode(row: Sequence[Any]) -> bytes:
                return (convert([row[i] for i in indexes]) + ",").encode("utf-8")

        else:
            index = layout.value_index
            json_stream = layout.json_stream

            def encode(row: Sequence[Any]) -> bytes:
                value = row[index]
                if value is None:
                    payload = b"null" if json_stream else b""
                elif isinstance(value, str):
                    payload = value.encode("utf-8")
                else:
                    payload = bytes(value)
                return payload + JSON_SEPARATOR if json_stream else payload

        self.encode = encode

    def encode_all(self, rows: Iterable[Sequence[Any]]) -> EncodedRows:
        return EncodedRows.from_payloads([self.encode(row) for row in rows], self.layout.separator)
