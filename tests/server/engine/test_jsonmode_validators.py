"""The two JSON validators agree: whatever the fast one (msgspec) accepts, the stdlib one accepts with the
same messages. The fast path may only say "valid"; everything else is decided by the stdlib path, so a
difference here would let the server store a body it would otherwise reject, or split it differently."""

from __future__ import annotations

import asyncio
import json
import threading
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durastream_server.engine import jsonmode
from durastream_server.errors import BadRequest, TooManyMessages

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Bytes that break JSON in interesting places: structure, escapes, numbers, control and non-ASCII bytes.
_NOISE = st.sampled_from(
    [b",", b"]", b"[", b"{", b"}", b":", b'"', b"\\", b"\\u", b"\\ud800", b"-", b"0", b"e", b".",
     b" ", b"\n", b"\t", b"\x0c", b"\x00", b"\x1f", b"\x7f", b"\xff", b"\xc3\xa9", b"\xef\xbb\xbf",
     b"NaN", b"Infinity", b"true", b"nul"]
)  # fmt: skip


def _stdlib(body: bytes) -> tuple[bytes, ...] | type[BadRequest]:
    try:
        return jsonmode.split_with_stdlib(body, allow_empty_array=True)
    except BadRequest:
        return BadRequest


def _damage(body: bytearray, data: st.DataObject, *, at_least: int) -> None:
    """Insert noise or cut bytes at random places (``at_least`` to 3 times)."""
    for _ in range(data.draw(st.integers(min_value=at_least, max_value=3))):
        at = data.draw(st.integers(min_value=0, max_value=len(body)))
        if data.draw(st.booleans()):
            body[at:at] = data.draw(_NOISE)
        else:
            del body[at : at + data.draw(st.integers(min_value=1, max_value=3))]


def _rendered(values: list[object], separators: tuple[str, str], ascii_only: bool) -> bytes:
    return json.dumps(values, separators=separators, ensure_ascii=ascii_only).encode()


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_VALUES, max_size=6),
    st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]),
    st.booleans(),
)
def test_valid_arrays_split_the_same(
    values: list[object], separators: tuple[str, str], ascii_only: bool
) -> None:
    body = _rendered(values, separators, ascii_only)
    fast = jsonmode.fast_split(body)
    assert fast is not None, body
    assert fast == _stdlib(body)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_VALUES, min_size=1, max_size=4), st.data())
def test_a_damaged_array_is_never_accepted_by_the_fast_path_alone(
    values: list[object], data: st.DataObject
) -> None:
    body = bytearray(_rendered(values, (",", ":"), data.draw(st.booleans())))
    _damage(body, data, at_least=1)
    fast = jsonmode.fast_split(bytes(body))
    if fast is not None:
        assert fast == _stdlib(bytes(body)), bytes(body)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'["\\ud800"]', (b'"\\ud800"',)),  # a lone surrogate escape: msgspec refuses, JSON allows
        (b"\xef\xbb\xbf[1]", (b"1",)),  # a BOM
        (b" [1]", (b"1",)),  # leading whitespace
        (b'{"a": 1}', (b'{"a": 1}',)),  # not an array
    ],
)
def test_bodies_the_fast_path_leaves_undecided_still_split(
    body: bytes, expected: tuple[bytes, ...]
) -> None:
    assert jsonmode.fast_split(body) is None
    assert jsonmode.split_messages(body, allow_empty_array=False) == expected


def test_invalid_utf8_inside_a_string_is_rejected() -> None:
    body = b'["\xff"]'
    assert jsonmode.fast_split(body) is None
    with pytest.raises(BadRequest):
        jsonmode.split_messages(body, allow_empty_array=False)


def test_views_hold_the_same_bytes_without_copying() -> None:
    body = b'[{"a": 1}, [2, 3], "four"]'
    views = jsonmode.split_messages(body, allow_empty_array=False, views=True)
    assert not any(isinstance(view, bytes) for view in views)
    assert [bytes(view) for view in views] == [b'{"a": 1}', b"[2, 3]", b'"four"']
    assert list(map(len, views)) == [8, 6, 6]
    assert b"".join(views) == b'{"a": 1}[2, 3]"four"'


# ---- message-count bombs: the cap is decided before an element is split out -----------------------

_DEEP = st.recursive(
    st.integers(min_value=0, max_value=9) | st.text(alphabet=',[]{}"\\:ab', max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(alphabet=",[]{}ab", max_size=3), children, max_size=2)
    ),
    max_leaves=40,
)


@settings(max_examples=250, deadline=None)
@given(
    st.lists(_DEEP, max_size=12),
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=0, max_value=14),
    st.sampled_from([(",", ":"), (", ", ": ")]),
)
def test_the_message_cap_counts_top_level_elements_exactly(
    values: list[object], limit: int, wrap: int, separators: tuple[str, str]
) -> None:
    """Whatever the nesting (strings full of commas and brackets, containers nested deeper than the
    collapse passes), a body is refused exactly when its array has more than ``limit`` elements."""
    for _ in range(wrap):  # nest some elements deeply
        if values:
            values[0] = [values[0], [values[0]]]
    body = json.dumps(values, separators=separators).encode()
    if len(values) > limit:
        with pytest.raises(TooManyMessages):
            jsonmode.split_messages(body, allow_empty_array=True, max_messages=limit)
        with pytest.raises(TooManyMessages):
            jsonmode.split_with_stdlib(body, allow_empty_array=True, max_messages=limit)
    else:
        split = jsonmode.split_messages(body, allow_empty_array=True, max_messages=limit)
        assert [json.loads(v) for v in split] == values


def test_a_bomb_is_refused_without_an_object_per_element() -> None:
    """8 MiB of ``0,``: 4.2 million elements, refused by counting, so the split's list of element
    objects (~300 MB here) is never built."""
    body = b"[" + b"0," * (4 * 1024 * 1024 - 1) + b"0]"
    tracemalloc.start()
    try:
        with pytest.raises(TooManyMessages) as raised:
            jsonmode.split_messages(body, allow_empty_array=False, max_messages=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(body), peak
    assert "100000" in raised.value.message and "--max-messages-per-request" in raised.value.message


def test_the_stdlib_path_stops_at_the_cap_too() -> None:
    body = b'["\\ud800"' + b",0" * 50 + b"]"  # a lone surrogate: only the stdlib path accepts it
    assert jsonmode.fast_split(body) is None
    with pytest.raises(TooManyMessages):
        jsonmode.split_messages(body, allow_empty_array=False, max_messages=50)
    assert len(jsonmode.split_messages(body, allow_empty_array=False, max_messages=51)) == 51


def test_bodies_with_many_elements_are_split_off_the_loop() -> None:
    """A body under the size threshold but with many elements is split in a worker thread: the loop
    would otherwise spend ~1 s on 2 million of them."""
    body = b"[" + b"0," * 20_000 + b"0]"
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = jsonmode.split_messages

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(threading.get_ident())
        return real(*args, **kwargs)

    async def go() -> tuple[bytes, ...] | BadRequest:
        return await jsonmode.split_messages_offloaded(body, allow_empty_array=False)

    jsonmode.split_messages = spy  # type: ignore[assignment]
    try:
        parsed = asyncio.run(go())
    finally:
        jsonmode.split_messages = real  # type: ignore[assignment]
    assert isinstance(parsed, tuple) and len(parsed) == 20_001
    assert seen and loop_thread not in seen


@settings(max_examples=800, deadline=None)
@given(st.lists(_VALUES, min_size=0, max_size=4), st.data())
def test_large_undecided_bodies_get_the_stdlib_verdict_from_msgspec(
    values: list[object], data: st.DataObject
) -> None:
    """Above STDLIB_MAX_BYTES a body the fast path leaves undecided is judged by msgspec alone (the
    stdlib scanner builds every nested value as objects): same verdict, same messages, whatever the
    damage, leading whitespace or top-level value."""
    value: object = values if data.draw(st.booleans()) else data.draw(_VALUES)
    body = bytearray(data.draw(st.sampled_from([b"", b" ", b"\n\t"])))
    body += _rendered(value, (",", ":"), data.draw(st.booleans()))  # type: ignore[arg-type]
    _damage(body, data, at_least=0)
    expected = _stdlib(bytes(body))
    original = jsonmode.STDLIB_MAX_BYTES
    jsonmode.STDLIB_MAX_BYTES = 0  # type: ignore[misc]
    try:
        got = jsonmode.split_messages(bytes(body), allow_empty_array=True)
    except BadRequest:
        got = BadRequest
    finally:
        jsonmode.STDLIB_MAX_BYTES = original  # type: ignore[misc]
    assert got == expected, bytes(body)


def test_a_large_invalid_nested_body_is_refused_without_building_its_values() -> None:
    body = b"[[" + b"{}," * (8 * 1024 * 1024 // 3 - 1) + b"{}]"  # the outer array is unterminated
    tracemalloc.start()
    try:
        with pytest.raises(BadRequest):
            jsonmode.split_messages(body, allow_empty_array=False, max_messages=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(body), peak  # the stdlib scanner built 238 MB of dicts here


def _verdict(body: bytes) -> tuple[bytes, ...] | tuple[str, str]:
    """``split_messages``'s answer: the messages, or the refusal's class and message."""
    try:
        return jsonmode.split_messages(body, allow_empty_array=False)
    except BadRequest as exc:
        return type(exc).__name__, str(exc)


def _stdlib_verdict(body: bytes) -> tuple[bytes, ...] | tuple[str, str]:
    try:
        return jsonmode.split_with_stdlib(body, allow_empty_array=False)
    except BadRequest as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=1500, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _VALUES, max_size=5), st.booleans(), st.data())
def test_a_small_object_gets_the_stdlib_verdict(
    value: dict[str, object], ascii_only: bool, data: st.DataObject
) -> None:
    """A small body that starts with ``{`` (one event per append, issue 17) is validated by msgspec
    (``_small_object``): the same messages as the stdlib path, the same refusal and message,
    whatever the damage, trailing whitespace or non-ASCII text."""
    body = bytearray(json.dumps(value, ensure_ascii=ascii_only).encode())
    body += data.draw(st.sampled_from([b"", b" ", b"\n\t\r "]))
    _damage(body, data, at_least=0)
    if not body.startswith(b"{"):
        body[0:0] = b"{"
    assert _verdict(bytes(body)) == _stdlib_verdict(bytes(body)), bytes(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a":"\\ud800"}',  # a lone surrogate escape: msgspec refuses it, the stdlib accepts it
        b'{"a":' + b"9" * 4400 + b"}",  # more digits than int() takes: the stdlib refuses it
        b'{"a":' + b"[" * 300 + b"]" * 300 + b"}",  # many containers: the stdlib's recursion
        b'{"\xff":1}',  # invalid UTF-8: msgspec does not check it
        '{"é":"\u2028"}'.encode(),
        b'{"a":1}\x0b',
        b'{"a":1} \n',
        b'{"a":NaN}',
        b'{"a":01}',
    ],
)
def test_small_object_corners_get_the_stdlib_verdict(body: bytes) -> None:
    assert _verdict(body) == _stdlib_verdict(body)
