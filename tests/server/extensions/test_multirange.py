"""Multi-range requests: ``POST {root}/__ds/x-durastream/lookups`` and ``.../reads`` (docs/extensions.md,
9): many ranges in one exchange, each answered exactly as its single request would be."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from durastream_server.errors import BadRequest
from durastream_server.http import multirange
from durastream_server.subscriptions import jsonbody
from tests.server.extensions.support import (
    TEXT,
    TIMEOUT,
    Frames,
    append,
    create,
    decode_frames,
    error_code,
    frames_range,
    lookup,
    token,
    unique,
)
from tests.support.server_process import ServerProcess

NS = "__ds/x-durastream"


def post(server: ServerProcess, resource: str, body: Any) -> requests.Response:
    return requests.post(server.stream_url(f"{NS}/{resource}"), json=body, timeout=TIMEOUT)


def decode_multi(body: bytes) -> tuple[list[dict[str, Any]], Frames]:
    """The layout of section 9, byte by byte: magic, header length, JSON header (padded so the frames
    body starts at a multiple of 8), then one frames body."""
    assert body[:4] == b"DSM1", body[:16]
    length = int.from_bytes(body[4:8], "little")
    assert (8 + length) % 8 == 0
    header = json.loads(body[8 : 8 + length])
    # Compact JSON, as json.dumps writes it (the server writes a range's entry as text), then padding.
    assert body[8 : 8 + length].rstrip(b" ") == json.dumps(header, separators=(",", ":")).encode()
    return header["ranges"], decode_frames(body[8 + length :])


def read_ranges(
    server: ServerProcess, ranges: list[dict[str, str]], fmt: str = "frames"
) -> tuple[list[dict[str, Any]], Frames]:
    response = post(server, "reads", {"ranges": ranges, "format": fmt})
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/vnd.durastream.multi-frames"
    return decode_multi(response.content)


@pytest.fixture
def three(durastream_server: ServerProcess) -> dict[str, str]:
    """Three JSON streams with 3, 0 and 2 messages, and a text stream with two appends: path -> tail."""
    tails = {}
    for name, body in (("a", b'[1,{"x":2},"three"]'), ("b", b""), ("c", b"[4,5]")):
        path = unique(f"multi-{name}")
        create(durastream_server, path, body)
        tails[path] = requests.head(durastream_server.stream_url(path)).headers[
            "Stream-Next-Offset"
        ]
    text = unique("multi-t")
    create(durastream_server, text, content_type=TEXT)
    append(durastream_server, text, b"hello", TEXT)
    tails[text] = append(durastream_server, text, b" world", TEXT)
    return tails


def test_reads_answer_every_range_in_one_frames_body(
    durastream_server: ServerProcess, three: dict[str, str]
) -> None:
    ranges = [{"path": path, "offset": "-1", "end": tail} for path, tail in three.items()]
    entries, frames = read_ranges(durastream_server, ranges)
    assert [e["messages"] for e in entries] == [3, 0, 2, 2]
    assert all(e["end_reached"] for e in entries)
    assert [e["next_offset"] for e in entries] == list(three.values())
    single: list[bytes] = []
    positions: list[int] = []
    for path, tail in three.items():
        alone, _ = frames_range(durastream_server, path, "-1", tail)
        single += alone.values
        positions += alone.positions
    assert frames.values == single and frames.positions == positions
    assert frames.values[-2:] == [b"hello", b" world"]  # one message per append for byte streams


def test_a_small_chunk_answers_a_prefix_and_the_client_continues(
    small_chunk_server: ServerProcess,
) -> None:
    paths = []
    for i in range(6):
        path = unique(f"chunked-{i}")
        create(small_chunk_server, path, json.dumps([{"i": i, "pad": "x" * 40}] * 3).encode())
        paths.append(path)
    tails = [
        requests.head(small_chunk_server.stream_url(p)).headers["Stream-Next-Offset"] for p in paths
    ]
    pending = [{"path": p, "offset": "-1", "end": t} for p, t in zip(paths, tails, strict=True)]
    got: dict[str, list[bytes]] = {p: [] for p in paths}
    requests_made = 0
    while pending:
        entries, frames = read_ranges(small_chunk_server, pending)
        requests_made += 1
        assert 1 <= len(entries) <= len(pending)
        at = 0
        for entry, asked in zip(entries, pending, strict=False):
            got[asked["path"]] += frames.values[at : at + entry["messages"]]
            at += entry["messages"]
        assert at == len(frames.values)
        last = entries[-1]
        rest = pending[len(entries) :]
        if not last["end_reached"]:
            assert all(e["end_reached"] for e in entries[:-1])  # only the last is cut short
            rest = [{**pending[len(entries) - 1], "offset": last["next_offset"]}, *rest]
        pending = rest
    assert requests_made > 1
    assert all(len(values) == 3 for values in got.values())
    assert got[paths[0]][0] == json.dumps({"i": 0, "pad": "x" * 40}).encode()


def test_a_failing_range_does_not_fail_the_others(
    durastream_server: ServerProcess, three: dict[str, str]
) -> None:
    path, tail = next(iter(three.items()))
    beyond = token(10**9)
    entries, frames = read_ranges(
        durastream_server,
        [
            {"path": unique("missing"), "offset": "-1", "end": tail},
            {"path": path, "offset": "-1", "end": beyond},
            {"path": path, "offset": "-1", "end": tail},
        ],
    )
    assert entries[0]["error"]["status"] == 404 and entries[0]["error"]["code"] == "NOT_FOUND"
    assert entries[1]["error"]["code"] == "END_BEYOND_TAIL" and entries[1]["error"]["tail"] == tail
    assert entries[2]["messages"] == 3 and len(frames.values) == 3
    text = list(three)[-1]
    lines, _ = read_ranges(
        durastream_server, [{"path": text, "offset": "-1", "end": three[text]}], "frames-lines"
    )
    assert lines[0]["error"]["status"] == 400 and "JSON" in lines[0]["error"]["message"]


def test_lookups_answer_like_single_lookups(
    durastream_server: ServerProcess, three: dict[str, str]
) -> None:
    asked = [
        {"path": path, "offset": "-1", "end": tail, "max_messages": 2}
        for path, tail in three.items()
    ]
    asked.append({"path": unique("missing"), "offset": "-1"})
    response = post(durastream_server, "lookups", {"lookups": asked})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    for item, result in zip(asked[:-1], results, strict=False):
        single = lookup(
            durastream_server,
            item["path"],
            offset="-1",
            end=item["end"],
            max_messages=2,
        )
        assert result == single
    assert results[-1]["error"]["code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    ("resource", "body"),
    [
        ("lookups", {"lookups": []}),
        ("lookups", {"lookups": [{"path": "a"}]}),
        ("lookups", {"lookups": [{"path": "a", "offset": "-1", "max_bytes": -1}]}),
        ("lookups", {"lookups": [{"path": "a", "offset": "-1", "max_messages": True}]}),
        ("lookups", [{"path": "a", "offset": "-1"}]),
        ("reads", {"ranges": [{"path": "a", "offset": "-1"}]}),
        ("reads", {"ranges": [{"path": "a", "offset": "-1", "end": "x"}], "format": "json"}),
        ("reads", {"ranges": [{"path": "a", "offset": "-1", "end": "x"}], "extra": 1}),
        ("reads", {"ranges": ["a"]}),
    ],
)
def test_malformed_bodies_are_400_saying_what_is_expected(
    durastream_server: ServerProcess, resource: str, body: Any
) -> None:
    response = post(durastream_server, resource, body)
    assert response.status_code == 400 and error_code(response) == "BAD_REQUEST", response.text
    message = response.json()["error"]["message"]
    assert any(word in message for word in ("lookups", "ranges", "format", "entry", "offset"))


def test_get_is_405(durastream_server: ServerProcess) -> None:
    response = requests.get(durastream_server.stream_url(f"{NS}/reads"), timeout=TIMEOUT)
    assert response.status_code == 405 and response.headers["Allow"] == "POST"


def test_hundreds_of_idle_streams_answer_like_their_single_reads(
    durastream_server: ServerProcess,
) -> None:
    """More ranges than one read group (engine/multiread.py), of streams idle past their hot tail,
    closed or deleted: the multi-range answer is, range by range and byte by byte (positions, append
    times, values), what each range's single frames read returns."""
    session = requests.Session()
    ranges = []
    for i in range(300):
        path = unique(f"idle-{i}")
        body = json.dumps([{"i": i, "k": k} for k in range(1 + i % 4)]).encode()
        response = session.put(
            durastream_server.stream_url(path),
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=TIMEOUT,
        )
        ranges.append({"path": path, "offset": "-1", "end": response.headers["Stream-Next-Offset"]})
    closed = ranges[7]
    response = session.post(
        durastream_server.stream_url(closed["path"]),
        headers={"Content-Type": "application/json", "Stream-Closed": "true"},
        timeout=TIMEOUT,
    )
    assert response.status_code in (200, 204), response.text
    session.delete(durastream_server.stream_url(ranges[9]["path"]), timeout=TIMEOUT)
    entries, frames = read_ranges(durastream_server, ranges)
    assert len(entries) == 300
    assert entries[9]["error"]["status"] == 404
    at = 0
    for entry, asked in zip(entries, ranges, strict=True):
        if "error" in entry:
            continue
        alone, _ = frames_range(durastream_server, asked["path"], "-1", asked["end"])
        assert entry["messages"] == len(alone.values)
        assert entry["end_reached"] and entry["next_offset"] == asked["end"]
        window = slice(at, at + entry["messages"])
        assert frames.values[window] == alone.values
        assert frames.positions[window] == alone.positions
        assert frames.timestamps[window] == alone.timestamps
        at += entry["messages"]
    assert at == len(frames.values) == sum(1 + i % 4 for i in range(300) if i != 9)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"offset": "-1", "end": "x"}, "'path' must be"),
        ({"path": "a\x00b", "offset": "-1", "end": "x"}, "without NUL"),
        ({"path": "a" * 4097, "offset": "-1", "end": "x"}, "at most 4096 characters"),
        ({"path": 7, "offset": "-1", "end": "x"}, "got 7"),
        ({"path": "a", "offset": "-1"}, "'end' must be"),
    ],
)
def test_a_bad_range_field_is_named_with_what_is_wrong(
    durastream_server: ServerProcess, entry: dict[str, Any], says: str
) -> None:
    response = post(durastream_server, "reads", {"ranges": [entry]})
    assert response.status_code == 400 and error_code(response) == "BAD_REQUEST", response.text
    message = response.json()["error"]["message"]
    assert message.startswith("entry 0: ") and says in message, message
    if set(entry) < {"path", "offset", "end"}:
        assert "it is missing" in message


def _general_reads(body: bytes) -> tuple[list[tuple[str, str, str]], str]:
    """What the reads resource made of a body before ``_plain_reads`` (and still makes of any
    body that is not plain): its ranges and format, or the BadRequest it raises."""
    document = jsonbody.loads(body)
    items = multirange._list(document, "ranges", multirange._READS_SHAPE, ("format",))
    fmt = document.get("format", "frames")
    if fmt not in multirange.FORMATS:
        raise BadRequest(f"bad format {fmt!r}")
    return multirange._ranges(items), fmt


_OK = {"path": "a/b", "offset": "-1", "end": "0000000000000000_0000000000000042"}
_BODIES = [
    json.dumps({"ranges": [_OK] * 3}).encode(),
    json.dumps({"ranges": [_OK], "format": "frames-lines"}).encode(),
    b' {"ranges" : [ {"end":"x","offset":"1","path":"p"} ] }\n',
    # the longest text, in characters (msgspec's length check), not bytes
    json.dumps({"ranges": [{**_OK, "path": "\u00e9" * 4096}]}, ensure_ascii=False).encode(),
    b'{"ranges":[{"path":"a","path":"b","offset":"-1","end":"x"}]}',  # the last one wins, as json
    json.dumps({"ranges": [{**_OK, "extra": {"deep": [[[1]]]}}]}).encode(),  # accepted, ignored
    json.dumps({"ranges": [_OK], "extra": 1}).encode(),
    json.dumps({"ranges": [_OK], "format": "raw"}).encode(),
    json.dumps({"ranges": [_OK], "format": 1}).encode(),
    json.dumps({"ranges": []}).encode(),
    json.dumps({"ranges": [_OK] * 10_001}).encode(),
    json.dumps({"ranges": [{"path": "a", "offset": "-1"}]}).encode(),
    json.dumps({"ranges": [{**_OK, "path": ""}]}).encode(),
    json.dumps({"ranges": [{**_OK, "path": 7}]}).encode(),
    json.dumps({"ranges": [{**_OK, "path": "a\x00b"}]}).encode(),
    json.dumps({"ranges": [{**_OK, "end": "9" * 4097}]}).encode(),
    json.dumps({"ranges": [{**_OK, "path": "\u00e9" * 4097}]}, ensure_ascii=False).encode(),
    json.dumps({"ranges": [{**_OK, "offset": ""}]}).encode(),
    b'{"ranges":[{"path":"a\x00b","offset":"-1","end":"x"}]}',  # a raw NUL: not JSON
    json.dumps({"ranges": [{**_OK, "path": "caf\u00e9"}]}).encode(),  # a \u escape
    b'{"ranges":[{"path":"\\ud800","offset":"-1","end":"x"}]}',  # an unpaired surrogate
    b'{"ranges":[{"path":"a\xff","offset":"-1","end":"x"}]}',  # not UTF-8
    b'\xef\xbb\xbf{"ranges":[{"path":"a","offset":"-1","end":"x"}]}',  # a BOM
    b'{"ranges":[{"path":"a","offset":"-1","end":"x"}]} trailing',
    b'{"ranges":["a"]}',
    b"[]",
    b"not json",
]


@pytest.mark.parametrize("body", _BODIES)
def test_a_plain_reads_body_is_read_as_the_general_parse_reads_it(body: bytes) -> None:
    """``_plain_reads`` (msgspec against the documented shape) takes a body only when the general
    parse gives the same ranges and format; any other body (None) goes through the general parse,
    which accepts it or answers its error as before."""
    try:
        expected: Any = _general_reads(body)
    except (BadRequest, ValueError) as exc:
        expected = exc
    got = multirange._plain_reads(body)
    if isinstance(expected, Exception):
        assert got is None, (body[:80], expected)
    elif got is not None:
        assert got == expected
    plain = body in _BODIES[:5]
    assert (got is not None) == plain, body[:80]
