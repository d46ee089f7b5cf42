"""Message frames: ``format=frames`` and ``format=frames-lines`` (docs/extensions.md, 2), decoded byte
by byte with the independent decoder in ``support.py`` and compared with plain reads of the same range."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.json as pa_json
import pytest
import requests

from tests.server.extensions.conftest import SMALL_CHUNK, chunk_server
from tests.server.extensions.support import (
    FRAMES_TYPE,
    JSON,
    TEXT,
    TIMEOUT,
    append,
    create,
    decode_frames,
    error_code,
    fork,
    frames_range,
    get,
    json_messages,
    message_positions,
    read_all,
    token,
    unique,
)
from tests.support.server_process import ServerProcess


def test_layout_byte_by_byte(durastream_server: ServerProcess) -> None:
    path = unique("layout")
    create(durastream_server, path, b'[{"a":1},"bc"]')
    response = get(durastream_server, path, offset="-1", format="frames")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == FRAMES_TYPE
    body = response.content
    # header
    assert body[:16] == b"DSF1" + (2).to_bytes(4, "little") + bytes(4) + bytes(4)
    # positions: {"a":1} at 0 (7 bytes), "bc" at 7
    assert body[16:32] == (0).to_bytes(8, "little") + (7).to_bytes(8, "little")
    # timestamps: both messages came in one request, so they share one server time
    ts0 = int.from_bytes(body[32:40], "little", signed=True)
    assert body[40:48] == body[32:40]
    assert abs(ts0 - time.time() * 1000) < 10 * 60 * 1000  # a plausible epoch-ms value
    # value boundaries and values
    assert body[48:72] == b"".join(n.to_bytes(8, "little") for n in (0, 7, 11))
    assert body[72:] == b'{"a":1}"bc"'
    assert len(body) == 72 + 11
    # base headers keep their meaning
    assert response.headers["Stream-Next-Offset"] == token(11)
    assert response.headers["Stream-Up-To-Date"] == "true"
    assert "ETag" in response.headers


def test_json_frames_match_a_plain_read(small_chunk_server: ServerProcess) -> None:
    path = unique("json")
    batches = [[{"n": i, "s": "v" * (i % 17)} for i in range(j, j + 9)] for j in range(0, 90, 9)]
    create(small_chunk_server, path)
    for batch in batches:
        append(small_chunk_server, path, json.dumps(batch).encode())
    frames, responses = frames_range(small_chunk_server, path, "-1")
    assert len(responses) > 5  # the small chunk size really chunked it
    for response in responses:
        # the whole body (metadata included) respects the chunk size unless it is one message
        assert (
            len(response.content) <= SMALL_CHUNK or decode_frames(response.content).values[1:] == []
        )
    plain = json_messages(small_chunk_server, path)
    assert [json.loads(v) for v in frames.values] == plain
    assert frames.positions == message_positions(frames.values)
    assert frames.flags == 0
    # one timestamp per append request, non-decreasing
    assert frames.timestamps == sorted(frames.timestamps)
    for i in range(10):  # one server time per append request
        assert len(set(frames.timestamps[i * 9 : i * 9 + 9])) == 1


def test_byte_stream_frames_are_append_bodies(durastream_server: ServerProcess) -> None:
    path = unique("bytes")
    bodies = [b"alpha", b"\x00\x01\x02", b"gamma\n", b"d" * 5000]
    create(durastream_server, path, bodies[0], content_type="application/octet-stream")
    for body in bodies[1:]:
        append(durastream_server, path, body, content_type="application/octet-stream")
    frames, _ = frames_range(durastream_server, path, "-1")
    assert frames.values == bodies
    assert frames.positions == message_positions(bodies)
    assert b"".join(frames.values) == read_all(durastream_server, path)
    # a frames read starts at a message boundary only
    inside = get(durastream_server, path, offset=token(2), format="frames")
    assert inside.status_code == 400 and error_code(inside) == "INVALID_OFFSET"
    lines = get(durastream_server, path, offset="-1", format="frames-lines")
    assert lines.status_code == 400 and error_code(lines) == "INVALID_PARAMETER"
    assert "frames-lines" in lines.json()["error"]["message"]


def test_frames_lines_are_ndjson(durastream_server: ServerProcess) -> None:
    """Raw CR/LF inside a stored value become spaces; pyarrow.json parses the values section."""
    path = unique("lines")
    body = b'[{"a": 1,\r\n "b": [1,\n 2]}, {"a": 2, "b": []}, {"a":3,"b":[3]}]'
    create(durastream_server, path, body)
    frames, _ = frames_range(durastream_server, path, "-1", fmt="frames-lines")
    assert frames.flags == 1
    plain = json_messages(durastream_server, path)
    assert [json.loads(v) for v in frames.values] == plain
    # positions are those of the stored messages (CR/LF replacement keeps lengths)
    raw = get(durastream_server, path, offset="-1", format="frames").content
    assert frames.positions == decode_frames(raw).positions
    values = get(durastream_server, path, offset="-1", format="frames-lines").content
    start = 16 + 8 * 3 + 8 * 3 + 8 * 4
    table = pa_json.read_json(io.BytesIO(values[start:]))
    assert table.column("a").to_pylist() == [1, 2, 3]
    assert table.column("b").to_pylist() == [[1, 2], [], [3]]


def test_zero_copy_arrow_view(durastream_server: ServerProcess) -> None:
    """The connector's use: wrap the sections as Arrow arrays without copying."""
    path = unique("arrow")
    create(durastream_server, path, json.dumps(["x", {"y": 2}, [3]]).encode())
    body = get(durastream_server, path, offset="-1", format="frames").content
    n = int.from_bytes(body[4:8], "little")
    buf = pa.py_buffer(body)
    positions = pa.Array.from_buffers(pa.uint64(), n, [None, buf.slice(16, 8 * n)])
    times = pa.Array.from_buffers(pa.timestamp("ms"), n, [None, buf.slice(16 + 8 * n, 8 * n)])
    at = 16 + 16 * n
    values = pa.Array.from_buffers(
        pa.large_binary(), n, [None, buf.slice(at, 8 * (n + 1)), buf.slice(at + 8 * (n + 1))]
    )
    assert positions.to_pylist() == [0, 3, 11]
    assert values.to_pylist() == [b'"x"', b'{"y": 2}', b"[3]"]
    assert times.null_count == 0


def test_frames_with_end_and_empty_ranges(durastream_server: ServerProcess) -> None:
    path = unique("end")
    create(durastream_server, path, b'["aa","bb","cc","dd"]')  # at 0, 4, 8, 12; tail 16
    frames, responses = frames_range(durastream_server, path, token(4), end=token(12))
    assert frames.values == [b'"bb"', b'"cc"'] and frames.positions == [4, 8]
    assert responses[-1].headers["Durastream-End-Reached"] == "true"
    empty = get(durastream_server, path, offset=token(8), end=token(8), format="frames")
    assert empty.status_code == 200
    assert empty.content == b"DSF1" + bytes(12) + bytes(8)  # N = 0, one boundary (0)
    inside = get(durastream_server, path, offset="-1", end=token(6), format="frames")
    assert error_code(inside) == "INVALID_END"
    beyond = get(durastream_server, path, offset="-1", end=token(20), format="frames")
    assert error_code(beyond) == "END_BEYOND_TAIL"
    at_tail = get(durastream_server, path, offset=token(16), format="frames")
    assert decode_frames(at_tail.content).values == []
    assert at_tail.headers["Stream-Up-To-Date"] == "true"


def test_text_frames_with_end_inside_an_append_is_invalid(durastream_server: ServerProcess) -> None:
    path = unique("text-end")
    create(durastream_server, path, b"hello", content_type=TEXT)
    append(durastream_server, path, b"world", content_type=TEXT)
    assert get(durastream_server, path, offset="-1", end=token(7)).content == b"hellowo"
    frames = get(durastream_server, path, offset="-1", end=token(7), format="frames")
    assert error_code(frames) == "INVALID_END"
    whole = get(durastream_server, path, offset="-1", end=token(5), format="frames")
    assert decode_frames(whole.content).values == [b"hello"]


def test_message_larger_than_the_chunk(small_chunk_server: ServerProcess) -> None:
    path = unique("big")
    big = "z" * (4 * SMALL_CHUNK)
    create(small_chunk_server, path, json.dumps(["s", big, "t"]).encode())
    frames, responses = frames_range(small_chunk_server, path, "-1")
    assert [json.loads(v) for v in frames.values] == ["s", big, "t"]
    # "s" alone (the big one does not fit after it), then the big one alone, then "t"
    assert [decode_frames(r.content).values for r in responses] == [
        [b'"s"'],
        [json.dumps(big).encode()],
        [b'"t"'],
    ]
    assert len(responses[1].content) > SMALL_CHUNK


def test_closed_stream(durastream_server: ServerProcess) -> None:
    path = unique("closed")
    create(durastream_server, path, b'["a","b"]')
    append(durastream_server, path, b'["c"]', close=True)
    partial = get(durastream_server, path, offset="-1", end=token(6), format="frames")
    assert "Stream-Closed" not in partial.headers
    full = get(durastream_server, path, offset="-1", format="frames")
    assert decode_frames(full.content).values == [b'"a"', b'"b"', b'"c"']
    assert full.headers["Stream-Closed"] == "true"
    assert full.headers["Stream-Next-Offset"] == token(9)


def test_etag_depends_on_format(durastream_server: ServerProcess) -> None:
    path = unique("etag")
    create(durastream_server, path, b'["a"]')
    tags = {
        get(durastream_server, path, offset="-1", **extra).headers["ETag"]
        for extra in ({}, {"format": "frames"}, {"format": "frames-lines"}, {"end": token(3)})
    }
    assert len(tags) == 4


def test_json_fork(durastream_server: ServerProcess) -> None:
    source = unique("src")
    create(durastream_server, source, b'["s0","s1","s2"]')  # 4 bytes each
    child = fork(durastream_server, source, token(8), JSON)
    append(durastream_server, child, b'["c0"]')
    append(durastream_server, source, b'["late"]')
    frames, _ = frames_range(durastream_server, child, "-1")
    assert frames.values == [b'"s0"', b'"s1"', b'"c0"']
    assert frames.positions == [0, 4, 8]
    across, _ = frames_range(durastream_server, child, token(4), end=token(12))
    assert across.values == [b'"s1"', b'"c0"']


def test_byte_stream_fork_inside_an_append(durastream_server: ServerProcess) -> None:
    """A byte-stream fork may branch inside an append; in the fork that message ends at the fork
    point, and a frames read returns it as that prefix instead of stalling before it."""
    source = unique("src-bytes")
    create(durastream_server, source, b"abcdef", content_type=TEXT)
    append(durastream_server, source, b"ghij", content_type=TEXT)
    child = fork(durastream_server, source, token(3), TEXT)  # inside "abcdef"
    append(durastream_server, child, b"XYZ", content_type=TEXT)
    frames, _ = frames_range(durastream_server, child, "-1")
    assert frames.values == [b"abc", b"XYZ"]
    assert frames.positions == [0, 3]
    assert b"".join(frames.values) == read_all(durastream_server, child)


@pytest.mark.parametrize("fmt", ["frames", "frames-lines"])
def test_frames_rejected_on_live_modes(durastream_server: ServerProcess, fmt: str) -> None:
    path = unique("live")
    create(durastream_server, path, b'["a"]')
    response = get(durastream_server, path, offset="-1", format=fmt, live="long-poll")
    assert response.status_code == 400 and error_code(response) == "INVALID_PARAMETER"
    bad = get(durastream_server, path, offset="-1", format="arrow")
    assert bad.status_code == 400 and "format must be one of" in bad.json()["error"]["message"]


def test_bounded_frames_replay_identically(small_chunk_server: ServerProcess) -> None:
    """A micro-batch's frames read, repeated after more appends, returns the same bytes."""
    path = unique("replay")
    create(small_chunk_server, path, json.dumps([{"k": i} for i in range(50)]).encode())
    end = requests.head(small_chunk_server.stream_url(path), timeout=TIMEOUT).headers[
        "Stream-Next-Offset"
    ]
    _, first = frames_range(small_chunk_server, path, token(0), end=end)
    append(small_chunk_server, path, json.dumps([{"late": True}] * 30).encode())
    _, again = frames_range(small_chunk_server, path, token(0), end=end)
    assert len(first) > 1
    assert [r.content for r in again] == [r.content for r in first]
    assert [r.headers["Stream-Next-Offset"] for r in again] == [
        r.headers["Stream-Next-Offset"] for r in first
    ]


RUN_CHUNK = 16 * 1024


@pytest.fixture(scope="module")
def run_chunk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Chunks smaller than one stored record, so frames reads cut records (runs) inside."""
    yield from chunk_server(tmp_path_factory, RUN_CHUNK)


@pytest.mark.parametrize("fmt", ["frames", "frames-lines"])
def test_records_read_from_disk_as_runs(run_chunk_server: ServerProcess, fmt: str) -> None:
    """Records of many messages, most read back from disk, where the server hands whole records to the
    encoder as runs and cuts them at the chunk budget: every message once, in order, at its position,
    with its record's timestamp, every response within the budget; pretty-printed values keep working."""
    server = run_chunk_server
    path = unique(f"runs-{fmt}")
    create(server, path)
    stored: list[bytes] = []
    for record in range(40):  # ~300 KiB: far more than the in-memory tail
        messages = [
            json.dumps({"r": record, "i": i, "pad": "p" * ((record * 7 + i) % 50)}).encode()
            for i in range(100)
        ]
        if record % 9 == 4:  # raw CR/LF inside values: insignificant JSON whitespace
            messages[3] = b'{"r": %d, "i": 3,\r\n "pretty": [1,\n 2]}' % record
        stored.extend(messages)
        append(server, path, b"[" + b",".join(messages) + b"]")
    frames, responses = frames_range(server, path, "-1", fmt=fmt)
    assert len(responses) > 15
    for response in responses:
        assert len(response.content) <= RUN_CHUNK
    expected = (
        [m.replace(b"\r", b" ").replace(b"\n", b" ") for m in stored]
        if fmt == "frames-lines"
        else stored
    )
    assert frames.values == expected
    assert frames.positions == message_positions(stored)
    assert [len(set(frames.timestamps[r * 100 : r * 100 + 100])) for r in range(40)] == [1] * 40
    # A bounded read that starts and ends inside records returns exactly that range.
    start, end = 1234, 2345
    bounded, _ = frames_range(
        server, path, token(frames.positions[start]), token(frames.positions[end]), fmt=fmt
    )
    assert bounded.values == expected[start:end]
    assert bounded.positions == frames.positions[start:end]
