"""Fallback for servers without ``format=frames``: split a JSON stream's catch-up body into its messages.

A catch-up read of an ``application/json`` stream returns one JSON array of every message in the chunk
(spec 9.1.5). The fallback reader needs each message's bytes. They are cut out of the body exactly as the
server sent them, never re-serialised: ``json.loads`` + ``json.dumps`` would change what users stored
(``1.0`` vs ``1``, escapes, big numbers, key spacing), so that rows read through the fallback would differ
from rows read through frames.

How: the C-accelerated ``json.JSONDecoder.raw_decode`` finds where each element ends (and validates it);
the element's bytes are then sliced from the original body. For an ASCII body (the common case) character
and byte positions coincide and the slice is taken straight from the bytes; otherwise the element's text is
re-encoded to UTF-8, which gives back the same bytes for any valid UTF-8 input.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

from durastream_spark.errors import MalformedResponse

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _fail(what: str, position: int) -> MalformedResponse:
    return MalformedResponse(
        f"JSON stream body is not a JSON array of messages: {what} at index {position}"
    )


def split_json_array(body: bytes | bytearray | memoryview) -> list[bytes]:
    """The exact bytes of each element of the JSON array ``body``. Raises ``MalformedResponse``."""
    raw = bytes(body)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedResponse(f"JSON stream body is not valid UTF-8: {exc}") from None
    same_positions = raw.isascii()
    position = _WHITESPACE.match(text, 0).end()  # type: ignore[union-attr]
    if text[position : position + 1] != "[":
        raise _fail("expected '['", position)
    position = _WHITESPACE.match(text, position + 1).end()  # type: ignore[union-attr]
    messages: list[bytes] = []
    if text[position : position + 1] == "]":
        position += 1
    else:
        while True:
            try:
                _, end = _DECODER.raw_decode(text, position)
            except json.JSONDecodeError as exc:
                raise _fail(f"invalid element ({exc.msg})", exc.pos) from None
            messages.append(raw[position:end] if same_positions else text[position:end].encode())
            position = _WHITESPACE.match(text, end).end()  # type: ignore[union-attr]
            delimiter = text[position : position + 1]
            if delimiter == ",":
                position = _WHITESPACE.match(text, position + 1).end()  # type: ignore[union-attr]
                continue
            if delimiter == "]":
                position += 1
                break
            raise _fail("expected ',' or ']'", position)
    if _WHITESPACE.match(text, position).end() != len(text):  # type: ignore[union-attr]
        raise _fail("unexpected data after the array", position)
    return messages


def json_array_values(body: bytes | bytearray | memoryview) -> pa.LargeBinaryArray:
    """``split_json_array`` as an Arrow ``large_binary`` array (the shape ``frames.decode_frames`` gives)."""
    return pa.array(split_json_array(body), type=pa.large_binary())
