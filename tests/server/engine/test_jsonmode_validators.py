"""The two JSON validators agree: whatever the fast one (msgspec) accepts, the stdlib one accepts with the
same messages. The fast path may only say "valid"; everything else is decided by the stdlib path, so a
difference here would let the server store a body it would otherwise reject, or split it differently."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durastream_server.engine import jsonmode
from durastream_server.errors import BadRequest

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
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        at = data.draw(st.integers(min_value=0, max_value=len(body)))
        if data.draw(st.booleans()):
            body[at:at] = data.draw(_NOISE)
        else:
            del body[at : at + data.draw(st.integers(min_value=1, max_value=3))]
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
