"""Each ``value`` written to a JSON stream is exactly one JSON text: checked per input batch, vectorised.

Why: the sink joins the values of a request into a JSON array (``[v1,v2,...]``) and the server makes one
message per array element. A value that is not one JSON text does not fail on its own: ``{"id":2},{"id":3}``
becomes two messages, and the two rows ``[1`` and ``2]`` become one message or a 400 depending on where a
request boundary falls. The server cannot tell rows apart inside one array, so the task checks, before a
batch's rows go into any request, and fails with ``InvalidPayload`` naming the row.

How, without Python work per row: the values of a batch, which the encoder already laid out in one buffer
each followed by ``,``, become one array ``[v1,...,vn]`` (one copy) that msgspec's compiled parser splits
into the raw spans of its elements (the parser durastream-server uses for the same job). The batch is
accepted when there are ``n`` elements and each element has exactly its value's length and the value does
not start with whitespace. By induction over the rows, that means every element *is* its value: element
``i`` starts where value ``i`` starts (the earlier ones are aligned, and a value with no leading whitespace
starts its element), spans the same bytes, and the parser then finds the separator right after it. So each
value is one complete JSON text, and the request bodies will hold exactly one message per row.

Anything else (a parse error, another count, a length or leading-whitespace mismatch) goes to the exact
path: the rows concerned are parsed one by one with the standard library, which is also the server's
authority on what is valid (RFC 8259: no ``NaN``, no trailing data, UTF-8). The first row that is not one
JSON text is the culprit: by the same induction, the first misaligned row is always among the rows checked
there. Rows that only have whitespace around one JSON text are fine (the server trims it), they just take
the exact path; so does a batch that msgspec refuses and the standard library accepts (a lone surrogate
escape such as ``"\\ud800"``).
"""

from __future__ import annotations

import array
import functools
import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from durastream_spark.sink.errors import UnsupportedWrite

_JSON_WHITESPACE = pa.array(list(b" \t\n\r"), pa.uint8())
_OPEN, _CLOSE = ord("["), ord("]")
_scratch = threading.local()


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


_STRICT = json.JSONDecoder(parse_constant=_reject_constant)


@functools.cache
def _parser() -> tuple[Any, tuple[type[BaseException], ...]]:
    """msgspec's decoder of a JSON array into raw element spans, and what it raises on a bad body.
    Imported when first needed (only a ``value`` column written to a JSON stream needs it), so that a
    node without msgspec fails with advice, not at ``import durastream_spark``."""
    try:
        import msgspec
    except ImportError:
        raise UnsupportedWrite(
            "Writing a 'value' column to a JSON stream checks each value with msgspec, which is not "
            "installed here: install it on every node (pip install msgspec; it is a dependency of "
            "durastream-spark, see docs/deploy.md)."
        ) from None
    rejects = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
    return msgspec.json.Decoder(list[msgspec.Raw]), rejects


@dataclass(frozen=True)
class NotOneText:
    """Row ``index`` (of the rows checked) is not exactly one JSON text; ``reason`` says why."""

    index: int
    reason: str


def check_arrow(payloads: pa.Array) -> NotOneText | None:
    """``check`` for the encoder's payload array (string or binary, every payload ending with ``,``)."""
    if not len(payloads):
        return None
    large = pa.types.is_large_string(payloads.type) or pa.types.is_large_binary(payloads.type)
    offsets_buffer, data_buffer = payloads.buffers()[1:3]
    offsets = pa.Array.from_buffers(
        pa.int64() if large else pa.int32(),
        len(payloads) + 1,
        [None, offsets_buffer],
        offset=payloads.offset,
    )
    return check(data_buffer if data_buffer is not None else pa.py_buffer(b""), offsets)


def check(
    data: pa.Buffer | bytes | memoryview, offsets: Sequence[int] | pa.Array
) -> NotOneText | None:
    """The first row whose payload ``data[offsets[i]:offsets[i+1]]`` (its value and a trailing ``,``) is
    not exactly one JSON text, or None when every row is."""
    bounds = (
        offsets.cast(pa.int64()) if isinstance(offsets, pa.Array) else pa.array(offsets, pa.int64())
    )
    count = len(bounds) - 1
    if count <= 0:
        return None
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    view = memoryview(buffer).cast("B") if buffer.size else memoryview(b"")
    start, end = bounds[0].as_py(), bounds[count].as_py()
    starts = bounds.slice(0, count)
    lengths = pc.subtract(pc.subtract(bounds.slice(1), starts), 1)  # without the separator
    decoder, rejects = _parser()
    try:
        elements = decoder.decode(_as_array(view, start, end))
    except rejects:
        return _first_invalid(view, bounds, range(count))
    found = array.array("q", map(len, elements))  # C loops: no Python work per row
    nonempty = pc.greater(lengths, 0)
    firsts = pc.take(
        pa.Array.from_buffers(pa.uint8(), buffer.size, [None, buffer]),
        pc.if_else(nonempty, starts, 0),  # an empty value's byte is its separator: caught below
    )
    padded = pc.and_(nonempty, pc.is_in(firsts, value_set=_JSON_WHITESPACE))
    if (
        len(found) == count
        and memoryview(found).cast("B") == _int64_bytes(lengths)
        and not pc.any(padded).as_py()
    ):
        return None
    found.extend([-1] * max(0, count - len(found)))
    suspect = pc.or_(pc.not_equal(pa.array(found[:count], pa.int64()), lengths), padded)
    culprit = _first_invalid(view, bounds, pc.indices_nonzero(suspect).to_pylist())
    if culprit is None and len(elements) != count:
        # Cannot happen when every suspect row is one JSON text (module docstring); on a doubt, every
        # row is asked. Rows that are each one JSON text make exactly one message each.
        culprit = _first_invalid(view, bounds, range(count))
    return culprit


def _int64_bytes(values: pa.Array) -> memoryview:
    """The bytes of an int64 array without nulls (a computed one: offset 0)."""
    return memoryview(values.buffers()[1]).cast("B")[
        values.offset * 8 : (values.offset + len(values)) * 8
    ]


def _as_array(data: memoryview, start: int, end: int) -> memoryview:
    """``[`` + ``data[start:end]`` with its last byte (the final separator) turned into ``]``, in a
    buffer reused by the thread (the check runs once per input batch)."""
    size = end - start
    buffer: bytearray | None = getattr(_scratch, "buffer", None)
    if buffer is None or len(buffer) < size + 1:
        buffer = _scratch.buffer = bytearray(max(size + 1, 2 * len(buffer or b"")))
    view = memoryview(buffer)
    view[1 : size + 1] = data[start:end]
    view[0] = _OPEN
    view[size] = _CLOSE
    return view[: size + 1]


def _first_invalid(data: memoryview, bounds: pa.Array, rows: Iterable[int]) -> NotOneText | None:
    for row in rows:
        value = bytes(data[bounds[row].as_py() : bounds[row + 1].as_py() - 1])
        reason = _not_one_text(value)
        if reason is not None:
            return NotOneText(row, reason)
    return None


def _not_one_text(value: bytes) -> str | None:
    """Why ``value`` is not exactly one JSON text (the standard library's verdict), or None."""
    if not value.strip(b" \t\n\r"):
        return "it is empty"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"it is not UTF-8 ({exc.reason} at byte {exc.start})"
    try:
        _STRICT.decode(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            return f"it holds more than one JSON text (the first ends at character {exc.pos})"
        return f"it is not JSON ({exc.msg} at character {exc.pos})"
    except (ValueError, RecursionError) as exc:
        return f"it is not JSON ({exc})"
    return None


def describe(value: bytes | str, limit: int = 60) -> str:
    """The beginning of a value, for an error message."""
    text = value if isinstance(value, str) else value.decode("utf-8", errors="replace")
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"
