"""Bounded reads: ``GET {stream}?offset=S&end=E`` returns exactly ``[S, E)`` (docs/extensions.md, 1)."""

from __future__ import annotations

import json

import pytest
import requests

from tests.server.extensions.conftest import SMALL_CHUNK
from tests.server.extensions.support import (
    JSON,
    TEXT,
    TIMEOUT,
    append,
    create,
    error_code,
    fork,
    get,
    json_messages,
    position_of,
    token,
    unique,
)
from tests.support.server_process import ServerProcess


def bounded_chunks(
    server: ServerProcess, path: str, start: str, end: str
) -> list[requests.Response]:
    """Every chunk of a bounded read, following Stream-Next-Offset until End-Reached."""
    chunks = []
    offset = start
    while True:
        response = get(server, path, offset=offset, end=end)
        assert response.status_code == 200, response.text
        chunks.append(response)
        if response.headers.get("Durastream-End-Reached") == "true":
            assert response.headers["Stream-Next-Offset"] == end
            return chunks
        assert position_of(response.headers["Stream-Next-Offset"]) < position_of(end)
        assert response.headers["Stream-Next-Offset"] != offset, "no progress"
        offset = response.headers["Stream-Next-Offset"]


def test_byte_stream_mid_stream_end_at_tail(durastream_server: ServerProcess) -> None:
    path = unique("bytes")
    create(durastream_server, path, b"0123456789", content_type=TEXT)
    mid = get(durastream_server, path, offset=token(2), end=token(7))
    assert mid.status_code == 200
    assert mid.content == b"23456"  # a byte stream may end inside an append
    assert mid.headers["Stream-Next-Offset"] == token(7)
    assert mid.headers["Durastream-End-Reached"] == "true"
    assert "Stream-Up-To-Date" not in mid.headers and "Stream-Closed" not in mid.headers
    at_tail = get(durastream_server, path, offset="-1", end=token(10))
    assert at_tail.content == b"0123456789"
    assert at_tail.headers["Durastream-End-Reached"] == "true"
    assert at_tail.headers["Stream-Up-To-Date"] == "true"
    plain = get(durastream_server, path, offset="-1")
    assert "Durastream-End-Reached" not in plain.headers  # only bounded reads carry it


def test_end_beyond_tail_is_400_with_the_tail(durastream_server: ServerProcess) -> None:
    path = unique("beyond")
    create(durastream_server, path, b"abc", content_type=TEXT)
    response = get(durastream_server, path, offset="-1", end=token(4))
    assert response.status_code == 400
    assert error_code(response) == "END_BEYOND_TAIL"
    assert response.headers["Stream-Next-Offset"] == token(3)


@pytest.mark.parametrize(
    ("content_type", "body", "empty"), [(TEXT, b"abcdef", b""), (JSON, b'["ab","cd"]', b"[]")]
)
def test_end_equal_to_start_is_empty(
    durastream_server: ServerProcess, content_type: str, body: bytes, empty: bytes
) -> None:
    path = unique("empty")
    create(durastream_server, path, body, content_type=content_type)
    response = get(durastream_server, path, offset=token(4), end=token(4))
    assert response.status_code == 200
    assert response.content == empty
    assert response.headers["Stream-Next-Offset"] == token(4)
    assert response.headers["Durastream-End-Reached"] == "true"


def test_invalid_ends(durastream_server: ServerProcess) -> None:
    path = unique("invalid")
    create(durastream_server, path, b'["ab","cd","ef"]')  # messages at 0, 4, 8; tail 12
    before = get(durastream_server, path, offset=token(8), end=token(4))
    assert before.status_code == 400 and error_code(before) == "INVALID_END"
    inside = get(durastream_server, path, offset="-1", end=token(6))
    assert inside.status_code == 400 and error_code(inside) == "INVALID_END"
    assert "inside a message" in inside.json()["error"]["message"]
    for bad in ("", "6", "0_6", "-1", "now", token(6) + "x"):
        response = get(durastream_server, path, offset="-1", end=bad)
        assert response.status_code == 400 and error_code(response) == "INVALID_END", bad
        assert "end" in response.json()["error"]["message"]
    twice = requests.get(
        durastream_server.stream_url(path) + f"?offset=-1&end={token(4)}&end={token(8)}",
        timeout=TIMEOUT,
    )
    assert twice.status_code == 400 and "more than once" in twice.text


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_rejected_on_live_modes(durastream_server: ServerProcess, live: str) -> None:
    path = unique("live")
    create(durastream_server, path, b"abc", content_type=TEXT)
    response = get(durastream_server, path, offset="-1", end=token(3), live=live)
    assert response.status_code == 400
    assert error_code(response) == "INVALID_PARAMETER"
    assert "live" in response.json()["error"]["message"]


def test_json_boundaries_and_chunks(small_chunk_server: ServerProcess) -> None:
    """A bounded JSON read in small chunks: whole messages, every chunk within the chunk size (or one
    message), and exactly the messages of [S, E) in total."""
    path = unique("json-chunks")
    messages = [{"i": i, "pad": "x" * (i % 40)} for i in range(60)]
    create(small_chunk_server, path, json.dumps(messages, separators=(",", ":")).encode())
    encoded = [json.dumps(m, separators=(",", ":")).encode() for m in messages]
    starts = [sum(len(m) for m in encoded[:i]) for i in range(len(encoded) + 1)]
    start, end = starts[5], starts[47]
    chunks = bounded_chunks(small_chunk_server, path, token(start), token(end))
    assert len(chunks) > 3
    got = []
    for chunk in chunks:
        part = chunk.json()
        payload = len(chunk.content) - len(part) - 1  # minus brackets and commas
        assert payload <= SMALL_CHUNK or len(part) == 1
        got += part
    assert got == messages[5:47]


def test_a_message_larger_than_the_chunk_is_returned_whole(
    small_chunk_server: ServerProcess,
) -> None:
    path = unique("big-msg")
    big = {"big": "y" * (3 * SMALL_CHUNK)}
    create(small_chunk_server, path, json.dumps([1, big, 2]).encode())
    end = 1 + len(json.dumps(big).encode())  # messages are stored as sent: "1" then the object
    response = get(small_chunk_server, path, offset=token(1), end=token(end))
    assert response.json() == [big]
    assert response.headers["Durastream-End-Reached"] == "true"


def test_replay_determinism(small_chunk_server: ServerProcess) -> None:
    """The same bounded read after more appends returns identical chunks, byte for byte."""
    path = unique("replay")
    create(small_chunk_server, path, json.dumps([{"n": i} for i in range(40)]).encode())
    tail = requests.head(small_chunk_server.stream_url(path), timeout=TIMEOUT).headers[
        "Stream-Next-Offset"
    ]
    first = [
        (r.content, r.headers["Stream-Next-Offset"])
        for r in bounded_chunks(small_chunk_server, path, "-1", tail)
    ]
    assert len(first) > 1
    for i in range(3):
        append(small_chunk_server, path, json.dumps([{"later": i}] * 7).encode())
    again = [
        (r.content, r.headers["Stream-Next-Offset"])
        for r in bounded_chunks(small_chunk_server, path, "-1", tail)
    ]
    assert again == first
    assert json_messages(small_chunk_server, path)[40:] == [
        {"later": i} for i in range(3) for _ in range(7)
    ]


def test_closed_streams(durastream_server: ServerProcess) -> None:
    path = unique("closed")
    create(durastream_server, path, b'["a","b","c"]')
    final = append(durastream_server, path, b"", close=True)
    assert final == token(9)
    early = get(durastream_server, path, offset="-1", end=token(6))
    assert early.json() == ["a", "b"]
    assert early.headers["Durastream-End-Reached"] == "true"
    assert "Stream-Closed" not in early.headers and "Stream-Up-To-Date" not in early.headers
    full = get(durastream_server, path, offset=token(3), end=final)
    assert full.json() == ["b", "c"]
    assert full.headers["Stream-Closed"] == "true"
    assert full.headers["Durastream-End-Reached"] == "true"
    at_end = get(durastream_server, path, offset=final, end=final)
    assert at_end.json() == [] and at_end.headers["Stream-Closed"] == "true"
    beyond = get(durastream_server, path, offset="-1", end=token(10))
    assert error_code(beyond) == "END_BEYOND_TAIL" and beyond.headers["Stream-Next-Offset"] == final


def test_offset_now_takes_only_the_tail_as_end(durastream_server: ServerProcess) -> None:
    path = unique("now")
    create(durastream_server, path, b"abcd", content_type=TEXT)
    ok = get(durastream_server, path, offset="now", end=token(4))
    assert ok.status_code == 200 and ok.content == b""
    assert ok.headers["Durastream-End-Reached"] == "true"
    assert error_code(get(durastream_server, path, offset="now", end=token(2))) == "INVALID_END"
    assert error_code(get(durastream_server, path, offset="now", end=token(5))) == "END_BEYOND_TAIL"


def test_forks(small_chunk_server: ServerProcess) -> None:
    server = small_chunk_server
    source = unique("src")
    create(server, source, json.dumps([f"s{i:02d}" for i in range(30)]).encode())  # 5 bytes each
    child = fork(server, source, token(50))  # after s00..s09
    append(server, child, json.dumps([f"c{i:02d}" for i in range(30)]).encode())
    append(server, source, b'"after-fork"')  # invisible to the fork
    # end inside the inherited range
    inside = [m for r in bounded_chunks(server, child, token(10), token(40)) for m in r.json()]
    assert inside == [f"s{i:02d}" for i in range(2, 8)]
    # across the fork point
    across = [m for r in bounded_chunks(server, child, token(25), token(100)) for m in r.json()]
    assert across == [f"s{i:02d}" for i in range(5, 10)] + [f"c{i:02d}" for i in range(10)]
    # exactly at the fork point
    upto = get(server, child, offset=token(45), end=token(50))
    assert upto.json() == ["s09"] and upto.headers["Durastream-End-Reached"] == "true"
    # a fork of a fork, branching inside the inherited range
    grandchild = fork(server, child, token(30))
    append(server, grandchild, b'["g"]')
    chain = [m for r in bounded_chunks(server, grandchild, "-1", token(33)) for m in r.json()]
    assert chain == [f"s{i:02d}" for i in range(6)] + ["g"]
    mid = get(server, child, offset="-1", end=token(52))
    assert error_code(mid) == "INVALID_END"  # inside the fork's own first message


def test_etag_depends_on_end(durastream_server: ServerProcess) -> None:
    path = unique("etag")
    create(durastream_server, path, b"0123456789", content_type=TEXT)
    bounded = get(durastream_server, path, offset="-1", end=token(10))
    plain = get(durastream_server, path, offset="-1")
    assert bounded.content == plain.content
    assert bounded.headers["ETag"] != plain.headers["ETag"]
    cached = requests.get(
        durastream_server.stream_url(path),
        params={"offset": "-1", "end": token(10)},
        headers={"If-None-Match": bounded.headers["ETag"]},
        timeout=TIMEOUT,
    )
    assert cached.status_code == 304
    other = requests.get(
        durastream_server.stream_url(path),
        params={"offset": "-1"},
        headers={"If-None-Match": bounded.headers["ETag"]},
        timeout=TIMEOUT,
    )
    assert other.status_code == 200
