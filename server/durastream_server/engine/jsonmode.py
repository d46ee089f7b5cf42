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

Message-count bombs. Every message costs the server objects and work of its own whatever its size (an
8 MiB ``[0,0,...]`` is 4.2 million messages), so a request may carry at most ``max_messages`` of them
(``--max-messages-per-request``; more is ``TooManyMessages``, 413), and that is decided *before* an
object is built per element: a body with fewer commas than the limit cannot have more elements; any
other body is validated by msgspec without splitting it (one ``Raw`` for the whole) and its top-level
elements are counted over its structure with C-level regular expressions (``_exceeds``). Splitting, and
the stdlib path for undecided bodies, run in a worker thread unless the body is small and has few
elements, so a bomb never holds the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sys
from typing import Final

import msgspec

from durastream_server.errors import BadRequest, EmptyJsonArray, InvalidJson, TooManyMessages

# Bodies at least this large are parsed in a worker thread, so a big JSON batch does not stall the
# event loop (and every other stream's requests) while it is validated: at about 0.4 ms per MiB on the
# fast path, a body just under the threshold holds the loop for about 2 ms.
OFFLOAD_BYTES: Final = 4 << 20
# ... and so are bodies that may hold more elements than this (a comma count is the bound), and bodies
# the fast path leaves to the stdlib loop above this size: the loop's cost follows the element count
# (about 1 us each), which the byte count alone does not bound.
OFFLOAD_ELEMENTS: Final = 8192
OFFLOAD_FALLBACK_BYTES: Final = 64 << 10
# The default of ``--max-messages-per-request``: 10x the Spark sink's default request (10,000 rows),
# and about 13 MB of transient per-message objects for the largest accepted request.
DEFAULT_MAX_MESSAGES: Final = 100_000

_WHITESPACE: Final = " \t\n\r"
_WHITESPACE_BYTES: Final = b" \t\n\r"
_BOM: Final = "\ufeff"
_BOM_BYTES: Final = _BOM.encode()
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
# Bodies the fast path leaves undecided go to the stdlib scanner below this size (its error messages
# name line and column); larger ones only if they may be one of its corners, since the scanner builds
# every nested value as objects (``_decide_with_msgspec``).
STDLIB_MAX_BYTES: Final = 64 << 10


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
# The C scanner behind ``_DECODER.raw_decode``, called directly (one Python frame less per element).
_SCAN: Final = _DECODER.scan_once


def _refusal(exc: BaseException) -> InvalidJson:
    """The 400 for a body a parser refused, in words a client can act on.

    Both parsers refuse containers nested deeper than about a thousand levels with a ``RecursionError``
    (the stdlib's depends on the stack depth it is called at, so it is not a fixed number): its message
    ("maximum recursion depth exceeded while decoding a JSON array...") names the interpreter, not the
    body, so it is replaced by one that says what to change.
    """
    if isinstance(exc, RecursionError):
        return InvalidJson(
            "invalid JSON: arrays and objects nested too deeply (about 900 levels at most are accepted)"
        )
    return InvalidJson(f"invalid JSON: {exc}")


# A top-level array into the raw bytes of its elements (surrounding whitespace trimmed).
_ARRAY_OF_RAW: Final = msgspec.json.Decoder(list[msgspec.Raw])
# Any JSON value as one span: validates every byte without an object per element.
_ANY_RAW: Final = msgspec.json.Decoder(msgspec.Raw)
_FAST_REJECTS: Final = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)

# Counting the top-level elements of a valid array without splitting it (``_exceeds``).
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_INNERMOST: Final = re.compile(rb"[\[{][^\[\]{}]*[\]}]")
_STRUCTURE: Final = re.compile(rb"[\[\]{},]")
_COLLAPSE_PASSES: Final = 8


def too_many(limit: int) -> TooManyMessages:
    return TooManyMessages(
        f"the JSON array has more than {limit} elements; the server accepts at most {limit} "
        "messages per request (--max-messages-per-request): send them in several requests"
    )


def _exceeds(body: bytes, limit: int) -> bool:
    """True if the *valid* JSON array ``body`` has more than ``limit`` top-level elements.

    Strings become ``0`` (so their commas and brackets no longer count), then the innermost containers
    collapse to ``0`` a nesting level per pass until the commas left are the top-level ones, or few
    enough that there cannot be too many. C-level passes over the body, no object per element; only a
    body nested deeper than ``_COLLAPSE_PASSES`` levels is walked token by token, and that walk stops
    at the limit.
    """
    text = _STRING.sub(b"0", body) if b'"' in body else body
    inner = text[text.index(b"[") + 1 : text.rindex(b"]")]
    for _ in range(_COLLAPSE_PASSES):
        if inner.count(b",") < limit:
            return False  # an upper bound of the top-level commas, and elements = commas + 1
        if b"[" not in inner and b"{" not in inner:
            return True
        inner = _INNERMOST.sub(b"0", inner)
    depth = 0
    commas = 0
    for match in _STRUCTURE.finditer(inner):
        char = inner[match.start()]
        if char == 0x2C:  # ","
            if depth == 0:
                commas += 1
                if commas >= limit:
                    return True
        elif char in (0x5B, 0x7B):  # "[", "{"
            depth += 1
        else:
            depth -= 1
    return False


def fast_split(
    body: bytes, *, views: bool = False, max_messages: int | None = None
) -> tuple[bytes, ...] | None:
    """The elements of ``body`` if it is a valid JSON array (msgspec's parser), else None.

    None means "not decided here": the stdlib path then gives the verdict, and the error message.
    ``views``: return the ``msgspec.Raw`` spans themselves (bytes-like views into ``body``) instead of
    copying each into ``bytes``, for callers that only write the messages out (staging); the copies
    were a third of the split's cost. ``max_messages``: a valid array with more elements raises
    ``TooManyMessages``, decided before an element is split out.
    """
    if body[:1] != b"[":
        return None
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        if max_messages is not None and body.count(b",") >= max_messages:
            _ANY_RAW.decode(body)  # valid at all? (without an object per element)
            if _exceeds(body, max_messages):
                raise too_many(max_messages)
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
        raise _refusal(exc) from None
    return end


def split_messages(
    body: bytes,
    *,
    allow_empty_array: bool,
    views: bool = False,
    max_messages: int | None = None,
) -> tuple[bytes, ...]:
    """Validate ``body`` and return its messages: the elements of a top-level array, else the value.

    ``allow_empty_array`` is True for PUT (an empty array creates an empty stream) and False for POST,
    where ``[]`` is a client bug (400, section 9.1.3). An empty body yields no messages; the caller
    decides whether that is allowed. ``views``: see ``fast_split`` (the stdlib path returns bytes).
    ``max_messages``: more elements raise ``TooManyMessages`` (None: no limit).
    """
    if not body:
        return ()
    if body[:1] == b"{" and len(body) <= _SMALL_OBJECT_BYTES:
        single = _small_object(body)
        if single is not None:
            return single
    fast = fast_split(body, views=views, max_messages=max_messages)
    if fast is None:
        if len(body) < STDLIB_MAX_BYTES or _stdlib_corner(body):
            return split_with_stdlib(
                body, allow_empty_array=allow_empty_array, max_messages=max_messages
            )
        fast = _decide_with_msgspec(body, views=views, max_messages=max_messages)
    if not fast and not allow_empty_array:
        raise EmptyJsonArray("an empty JSON array appends nothing")
    return fast


# A small body that is one JSON object (the one-event appends of issue 17) is validated by msgspec
# without a Python object per value; the stdlib scanner decoded it to text, built its dict and encoded
# it back. Only msgspec's "valid" is taken, and only where it is the stdlib's verdict too: an ASCII
# body (msgspec does not check UTF-8; the stdlib decodes it), no longer than the interpreter's limit
# on an integer's digits (the stdlib refuses a longer one, msgspec's span does not), and few enough
# containers that the stdlib's recursion limit cannot be reached. Anything msgspec refuses (a lone
# surrogate escape it is stricter about, or an error) goes to the stdlib path for its verdict and
# message, as before.
_SMALL_OBJECT_BYTES: Final = min(4096, sys.get_int_max_str_digits() or 4096)
_SMALL_OBJECT_CONTAINERS: Final = 200


def _small_object(body: bytes) -> tuple[bytes] | None:
    """``(value,)`` for a small ASCII body that is one valid JSON object (whitespace after it
    trimmed, as the stdlib path trims it), else None: not decided here."""
    if not body.isascii() or body.count(b"{") + body.count(b"[") > _SMALL_OBJECT_CONTAINERS:
        return None
    try:
        _ANY_RAW.decode(body)
    except _FAST_REJECTS:
        return None
    return (body.rstrip(_WHITESPACE_BYTES),)


def _stdlib_corner(body: bytes) -> bool:
    """Could ``body`` be one of the few valid bodies msgspec refuses (a BOM, a lone surrogate escape)?"""
    return body.startswith(_BOM_BYTES) or _SURROGATE_ESCAPE.search(body) is not None


def _decide_with_msgspec(
    body: bytes, *, views: bool, max_messages: int | None
) -> tuple[bytes, ...]:
    """The verdict on a large body ``fast_split`` left undecided and that is none of the stdlib's
    corners: invalid if msgspec says so, else a single value (or an array after whitespace).

    The stdlib scanner would build every nested value of an element as Python objects: an invalid
    8 MiB ``[[{},{},...`` cost 238 MB and 3 s before it failed. msgspec decides without objects.
    """
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidJson("JSON body is not valid UTF-8") from None
    try:
        _ANY_RAW.decode(body)
    except _FAST_REJECTS as exc:
        raise _refusal(exc) from None
    value = body.strip(_WHITESPACE_BYTES)
    if value[:1] != b"[":
        return (value,)
    split = fast_split(value, views=views, max_messages=max_messages)
    if split is None:  # cannot happen for a value msgspec accepted; never store what is unchecked
        raise InvalidJson("invalid JSON")
    return split


def split_with_stdlib(
    body: bytes, *, allow_empty_array: bool, max_messages: int | None = None
) -> tuple[bytes, ...]:
    """``split_messages`` with the stdlib scanner alone: the authority on what is valid, and on the
    error message. Every body ``fast_split`` leaves undecided comes here. Past ``max_messages``
    elements it stops with ``TooManyMessages`` (the elements after that are not looked at)."""
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
    limit = max_messages if max_messages is not None else -1
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
            raise _refusal(exc) from None
        if len(messages) == limit:
            raise too_many(limit)
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
    body: bytes, *, allow_empty_array: bool, views: bool = False, max_messages: int | None = None
) -> tuple[bytes, ...] | BadRequest:
    """``split_messages``, in a worker thread unless the body is small and has few elements (the
    comma count bounds them). Returns the validation error instead of raising it, so the caller can
    report it at its place in the error precedence; ``TooManyMessages`` is raised at once."""
    try:
        if len(body) < OFFLOAD_BYTES and body.count(b",") < OFFLOAD_ELEMENTS:
            fast = fast_split(body, views=views, max_messages=max_messages)
            if fast is not None or len(body) < OFFLOAD_FALLBACK_BYTES:
                if fast is not None and (fast or allow_empty_array):
                    return fast
                return split_messages(
                    body,
                    allow_empty_array=allow_empty_array,
                    views=views,
                    max_messages=max_messages,
                )
        return await asyncio.to_thread(
            functools.partial(
                split_messages,
                body,
                allow_empty_array=allow_empty_array,
                views=views,
                max_messages=max_messages,
            )
        )
    except (InvalidJson, EmptyJsonArray) as exc:
        return exc
