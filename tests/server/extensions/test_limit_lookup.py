"""Limit lookups over HTTP: ``GET {stream}?offset=S&lookup=limit&max_messages=N&max_bytes=B&end=E``
(docs/extensions.md, 3). The exhaustive model comparison is in ``test_lookup_engine.py``."""

from __future__ import annotations

import json

import pytest
import requests

from tests.server.extensions.support import (
    TEXT,
    TIMEOUT,
    append,
    create,
    error_code,
    frames_range,
    get,
    lookup,
    token,
    unique,
)
from tests.support.server_process import ServerProcess

# Five messages of 4, 6, 8, 10 and 12 stored bytes: boundaries 0, 4, 10, 18, 28, 40.
MESSAGES = [b'"ab"', b'"abcd"', b'"abcdef"', b'"abcdefgh"', b'"abcdefghij"']
BOUNDS = [0, 4, 10, 18, 28, 40]


@pytest.fixture
def stream(durastream_server: ServerProcess) -> str:
    path = unique("limit")
    create(durastream_server, path, b"[" + b",".join(MESSAGES[:2]) + b"]")
    append(durastream_server, path, b"[" + b",".join(MESSAGES[2:]) + b"]")
    return path


def test_wire_format(durastream_server: ServerProcess, stream: str) -> None:
    response = get(durastream_server, stream, offset="-1", lookup="limit", max_messages=3)
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    assert response.json() == {
        "start": token(0),
        "end": token(18),
        "messages": 3,
        "bytes": 18,
        "tail": token(40),
        "closed": False,
    }


def test_limits_of_zero_and_one(durastream_server: ServerProcess, stream: str) -> None:
    for params in ({"max_messages": 0}, {"max_bytes": 0}, {"max_messages": 0, "max_bytes": 99}):
        answer = lookup(durastream_server, stream, offset=token(4), **params)
        assert (answer["end"], answer["messages"], answer["bytes"]) == (token(4), 0, 0), params
    one = lookup(durastream_server, stream, offset=token(4), max_messages=1)
    assert (one["end"], one["messages"], one["bytes"]) == (token(10), 1, 6)
    # max_bytes smaller than one message: the first message is still admitted (soft limit)
    small = lookup(durastream_server, stream, offset=token(4), max_bytes=1)
    assert (small["end"], small["messages"], small["bytes"]) == (token(10), 1, 6)
    # but never a second one that does not fit
    nine = lookup(durastream_server, stream, offset=token(4), max_bytes=13)
    assert (nine["end"], nine["messages"]) == (token(10), 1)
    exact = lookup(durastream_server, stream, offset=token(4), max_bytes=14)
    assert (exact["end"], exact["messages"]) == (token(18), 2)


def test_no_limit_and_limits_larger_than_the_stream(
    durastream_server: ServerProcess, stream: str
) -> None:
    for params in ({}, {"max_messages": 1000}, {"max_bytes": 10**9}):
        answer = lookup(durastream_server, stream, offset="-1", **params)
        assert (answer["end"], answer["messages"], answer["bytes"]) == (token(40), 5, 40)
    both = lookup(durastream_server, stream, offset="-1", max_messages=4, max_bytes=20)
    assert (both["end"], both["messages"]) == (token(18), 3)  # the byte limit binds first
    at_tail = lookup(durastream_server, stream, offset=token(40), max_messages=5)
    assert (at_tail["end"], at_tail["messages"]) == (token(40), 0)


def test_with_end(durastream_server: ServerProcess, stream: str) -> None:
    capped = lookup(durastream_server, stream, offset=token(4), end=token(28))
    assert (capped["end"], capped["messages"], capped["bytes"]) == (token(28), 3, 24)
    limited = lookup(durastream_server, stream, offset=token(4), end=token(28), max_messages=2)
    assert limited["end"] == token(18)
    empty = lookup(durastream_server, stream, offset=token(10), end=token(10), max_messages=3)
    assert (empty["end"], empty["messages"]) == (token(10), 0)
    inside = get(durastream_server, stream, offset="-1", lookup="limit", end=token(5))
    assert error_code(inside) == "INVALID_END"
    beyond = get(durastream_server, stream, offset="-1", lookup="limit", end=token(41))
    assert error_code(beyond) == "END_BEYOND_TAIL"
    assert beyond.headers["Stream-Next-Offset"] == token(40)


def test_start_must_be_a_boundary(durastream_server: ServerProcess, stream: str) -> None:
    response = get(durastream_server, stream, offset=token(5), lookup="limit", max_messages=1)
    assert response.status_code == 400 and error_code(response) == "INVALID_OFFSET"


def test_split_a_backlog_into_tasks(durastream_server: ServerProcess) -> None:
    """The connector's use: chain lookups to cut [start, tail) into ranges, then read each range
    with a bounded frames read; the ranges tile the stream exactly."""
    path = unique("split")
    create(durastream_server, path)
    for batch in range(20):
        append(durastream_server, path, json.dumps([[batch, i] for i in range(batch + 1)]).encode())
    tail = requests.head(durastream_server.stream_url(path), timeout=TIMEOUT).headers[
        "Stream-Next-Offset"
    ]
    ranges = []
    start = token(0)
    while start != tail:
        answer = lookup(durastream_server, path, offset=start, max_messages=17, max_bytes=400)
        assert answer["messages"] >= 1 and answer["messages"] <= 17
        ranges.append((start, answer["end"], answer["messages"]))
        start = answer["end"]
    everything = []
    for begin, end, count in ranges:
        frames, _ = frames_range(durastream_server, path, begin, end=end)
        assert len(frames.values) == count
        assert sum(len(v) for v in frames.values) <= 400 or count == 1
        everything += [json.loads(v) for v in frames.values]
    assert everything == [[b, i] for b in range(20) for i in range(b + 1)]


def test_closed_and_byte_streams(durastream_server: ServerProcess) -> None:
    path = unique("closed-bytes")
    create(durastream_server, path, b"hello", content_type=TEXT)
    append(durastream_server, path, b"world!", content_type=TEXT, close=True)
    answer = lookup(durastream_server, path, offset="-1", max_messages=1)
    assert answer == {
        "start": token(0),
        "end": token(5),
        "messages": 1,
        "bytes": 5,
        "tail": token(11),
        "closed": True,
    }
    rest = lookup(durastream_server, path, offset=token(5))
    assert (rest["end"], rest["messages"], rest["closed"]) == (token(11), 1, True)


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"lookup": "limits"}, "lookup"),
        ({"lookup": "limit", "max_messages": "-1"}, "max_messages"),
        ({"lookup": "limit", "max_messages": "01"}, "max_messages"),
        ({"lookup": "limit", "max_bytes": "1e3"}, "max_bytes"),
        ({"lookup": "limit", "max_bytes": "9007199254740992"}, "max_bytes"),
        ({"max_messages": "3"}, "max_messages"),
        ({"lookup": "limit", "format": "frames"}, "format"),
        ({"lookup": "limit", "live": "long-poll"}, "live"),
    ],
)
def test_bad_parameters_name_themselves(
    durastream_server: ServerProcess, stream: str, params: dict[str, str], names: str
) -> None:
    response = get(durastream_server, stream, offset="-1", **params)
    assert response.status_code == 400
    assert error_code(response) == "INVALID_PARAMETER"
    assert names in response.json()["error"]["message"]
