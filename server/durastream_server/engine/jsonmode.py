"""JSON mode (section 9.1): validation and one-level flattening of request bodies.

Each message is stored as the *original bytes* of its JSON value (surrounding whitespace trimmed), not a
re-serialization: Python's float conversion would change numbers the client sent (``1.10``, 20-digit
decimals, ``1e400`` would even become ``Infinity``), and the protocol promises to keep what was written.
Validation still parses every value, so only RFC 8259 JSON is stored: ``NaN``/``Infinity`` (which
Python's parser accepts by default) and raw control characters in strings are rejected.

Two validators, one verdict. The hot path (every JSON append and stage, about 1,000 elements per MiB) is
msgspec's compiled parser, decoding a top-level array into ``msgspec.Raw`` spans: it checks the grammar
of every byte without building Python objects for the values, about 4x faster than the stdlib scanner
(docs/decisions/0004). It is *stricter* than the stdlib in corners (a lone ``\ud800`` escape, a BOM,
a top-level scalar), so it only ever says "valid": anything it rejects, and every body that does not
start with ``[``, goes to the stdlib path below, which is the authority and writes the error messages.
msgspec does not check UTF-8 inside strings, so non-ASCII bodies are decoded once to check it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Final

import msgspec

from durastream_server.errors import BadRequest, EmptyJsonArray, InvalidJson

# Bodies at least this large are parsed in a worker thread, so a big JSON batch does not stall the
# event loop (and every other stream's requests) while it is validated: at about 0.4 ms per MiB on the
# fast path, a body just under the threshold holds the loop for about 2 ms.
OFFLOAD_BYTES: Final = 4 << 20

_WHITESPACE: Final = " \t\n\r"
_BOM: Final = "\ufeff"


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
# The C scanner behind ``_DECODER.raw_decode``, called directly (one Python frame less per element).
_SCAN: Final = _DECODER.scan_once


# A top-level array into the raw bytes of its elements (surrounding whitespace trimmed).
_ARRAY_OF_RAW: Final = msgspec.json.Decoder(list[msgspec.Raw])
_FAST_REJECTS: Final = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def fast_split(body: bytes, *, views: bool = False) -> tuple[bytes, ...] | None:
    """The elements of ``body`` if it is a valid JSON array (msgspec's parser), else None.

    None means "not decided here": the stdlib path then gives the verdict, and the error message.
    ``views``: return the ``msgspec.Raw`` spans themselves (bytes-like views into ``body``) instead of
    copying each into ``bytes``, for callers that only write the messages out (staging); the copies
    were a third of the split's cost.
    """
    if body[:1] != b"[":
        return None
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        elements = _ARRAY_OF_RAW.decode(body)
    except _FAST_REJECTS:
        return None
    if views:
        return tuple(elements)  # type: ignore[arg-type]  # bytes-like: buffer protocol and len()
    return tuple(map(bytes, elements))


def _skip_ws(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def _value_end(text: str, index: int) -> int:
    """Parse one JSON value starting at ``index``; return the index just after it."""
    try:
        _, end = _SCAN(text, index)
    except StopIteration as stop:
        raise InvalidJson(
            f"invalid JSON: {json.JSONDecodeError('Expecting value', text, stop.value)}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidJson(f"invalid JSON: {exc}") from None
    return end


def split_messages(
    body: bytes, *, allow_empty_array: bool, views: bool = False
) -> tuple[bytes, ...]:
    """Validate ``body`` and return its messages: the elements of a top-level array, else the value.

    ``allow_empty_array`` is True for PUT (an empty array creates an empty stream) and False for POST,
    where ``[]`` is a client bug (400, section 9.1.3). An empty body yields no messages; the caller
    decides whether that is allowed. ``views``: see ``fast_split`` (the stdlib path returns bytes).
    """
    if not body:
        return ()
    fast = fast_split(body, views=views)
    if fast is None:
        return split_with_stdlib(body, allow_empty_array=allow_empty_array)
    if not fast and not allow_empty_array:
        raise EmptyJsonArray("an empty JSON array appends nothing")
    return fast


def split_with_stdlib(body: bytes, *, allow_empty_array: bool) -> tuple[bytes, ...]:
    """``split_messages`` with the stdlib scanner alone: the authority on what is valid, and on the
    error message. Every body ``fast_split`` leaves undecided comes here."""
    if not body:
        return ()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidJson("JSON body is not valid UTF-8") from None
    if text.startswith(_BOM):
        text = text[1:]
    start = _skip_ws(text, 0)
    if start == len(text):
        raise InvalidJson("JSON body is empty")
    if text[start] != "[":
        end = _value_end(text, start)
        if _skip_ws(text, end) != len(text):
            raise InvalidJson("unexpected data after the JSON value")
        return (text[start:end].encode("utf-8"),)
    # One pass: the C scanner parses each top-level element and this loop checks the separators,
    # which validates exactly what a whole-document parse would, but parses every byte once instead
    # of twice (validation was the largest cost of a 64 KiB append; docs/decisions/0004). For an
    # ASCII body, character and byte indices agree, so elements are cut from ``body`` directly.
    # This loop was the hot path before msgspec took it over; it now runs for the bodies msgspec leaves
    # undecided (mostly invalid ones). It calls the scanner directly and handles the common separators
    # (``,`` and ``]`` right after a value, no whitespace) inline, leaving function calls to rare cases.
    ascii_body = body.isascii()
    n = len(text)
    index = _skip_ws(text, start + 1)
    if index < n and text[index] == "]":
        if _skip_ws(text, index + 1) != n:
            raise InvalidJson("unexpected data after the JSON value")
        if not allow_empty_array:
            raise EmptyJsonArray("an empty JSON array appends nothing")
        return ()
    scan = _SCAN
    messages: list[bytes] = []
    append = messages.append
    whitespace = _WHITESPACE
    while True:
        try:
            _, element_end = scan(text, index)
        except StopIteration as stop:  # no value at ``index`` (also a missing element)
            raise InvalidJson(
                f"invalid JSON: {json.JSONDecodeError('Expecting value', text, stop.value)}"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise InvalidJson(f"invalid JSON: {exc}") from None
        append(body[index:element_end] if ascii_body else text[index:element_end].encode("utf-8"))
        if element_end == n:
            raise InvalidJson("invalid JSON: unterminated array")
        char = text[element_end]
        if char in whitespace:
            element_end = _skip_ws(text, element_end)
            if element_end == n:
                raise InvalidJson("invalid JSON: unterminated array")
            char = text[element_end]
        if char == ",":
            index = element_end + 1
            if index < n and text[index] in whitespace:
                index = _skip_ws(text, index)
            continue
        if char == "]":
            if element_end + 1 != n and _skip_ws(text, element_end + 1) != n:
                raise InvalidJson("unexpected data after the JSON value")
            return tuple(messages)
        raise InvalidJson(f"invalid JSON: expected ',' or ']' at character {element_end}")


async def split_messages_offloaded(
    body: bytes, *, allow_empty_array: bool, views: bool = False
) -> tuple[bytes, ...] | BadRequest:
    """``split_messages``, in a worker thread for large bodies. Returns the validation error instead
    of raising it, so the caller can report it at its place in the error precedence."""
    try:
        if len(body) < OFFLOAD_BYTES:
            return split_messages(body, allow_empty_array=allow_empty_array, views=views)
        return await asyncio.to_thread(
            split_messages, body, allow_empty_array=allow_empty_array, views=views
        )
    except (InvalidJson, EmptyJsonArray) as exc:
        return exc
