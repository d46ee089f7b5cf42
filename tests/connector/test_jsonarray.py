"""The fallback JSON-array splitter keeps each message's exact bytes."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from durastream_spark.errors import MalformedResponse
from durastream_spark.protocol.jsonarray import json_array_values, split_json_array


def test_exact_bytes_are_kept() -> None:
    body = b'[1.0,{"a": [1, 2]} , "x,]y" ,\n[[]],1e400,null,"\\u00e9"]'
    assert split_json_array(body) == [
        b"1.0",
        b'{"a": [1, 2]}',
        b'"x,]y"',
        b"[[]]",
        b"1e400",  # json.dumps(json.loads(...)) would have turned this into Infinity
        b"null",
        b'"\\u00e9"',
    ]


def test_non_ascii_bodies_slice_by_bytes() -> None:
    body = '[ "é", {"ü": "😀"} ]'.encode()
    assert split_json_array(body) == ['"é"'.encode(), '{"ü": "😀"}'.encode()]


def test_empty_and_whitespace() -> None:
    assert split_json_array(b"[]") == []
    assert split_json_array(b" \n[ ] \n") == []


@pytest.mark.parametrize(
    "body",
    [b"", b"{}", b"[1,]", b"[1 2]", b"[1", b"[1]x", b"[,1]", b'["\xff"]', b"[{]"],
)
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedResponse):
        split_json_array(body)


def test_arrow_values() -> None:
    values = json_array_values(b'[{"a":1},2]')
    assert values.type == pa.large_binary()
    assert values.to_pylist() == [b'{"a":1}', b"2"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3)
    ),
    max_leaves=8,
)


@given(st.lists(json_values, max_size=6), st.sampled_from(["", " ", "\n  "]), st.booleans())
def test_any_array_splits_into_its_elements(values: list, space: str, ascii_only: bool) -> None:
    elements = [json.dumps(v, ensure_ascii=ascii_only) for v in values]
    body = ("[" + space + ("," + space).join(elements) + space + "]").encode()
    parts = split_json_array(body)
    assert parts == [e.encode() for e in elements]
    assert [json.loads(p) for p in parts] == json.loads(body)
