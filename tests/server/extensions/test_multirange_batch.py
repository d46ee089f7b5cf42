"""The multi-range read as one batch (``engine/multiread.py``, ``reader.preread_records``): a group's
one-record ranges are read together, a file at a time, neighbours in one ``pread``. Over many streams
of every state, packed (in the WAL, then in a pack after a checkpoint) and in directories, the batched
answer is range by range and byte by byte what each range's single read answers, and so is a read
that the chunk cuts into several requests."""

from __future__ import annotations

import json
from typing import Any

import requests

from durastream_server.offsets import format_offset
from tests.server.extensions.support import TIMEOUT, Frames, frames_range, unique
from tests.server.extensions.test_multirange import decode_multi, post
from tests.server.test_crash_packed import _checkpointed, _pack_files
from tests.support.server_process import ServerProcess

JSON = "application/json"


def _put(session: requests.Session, server: ServerProcess, path: str, body: bytes = b"") -> str:
    response = session.put(
        server.stream_url(path), data=body, headers={"Content-Type": JSON}, timeout=TIMEOUT
    )
    assert response.status_code == 201, response.text
    return response.headers["Stream-Next-Offset"]


def _post(
    session: requests.Session, server: ServerProcess, path: str, body: bytes, close: bool = False
) -> str:
    headers = {"Content-Type": JSON, **({"Stream-Closed": "true"} if close else {})}
    response = session.post(server.stream_url(path), data=body, headers=headers, timeout=TIMEOUT)
    assert response.status_code in (200, 204), response.text
    return response.headers["Stream-Next-Offset"]


def _messages(i: int, count: int) -> bytes:
    return json.dumps([{"i": i, "k": k, "pad": "p" * (i % 7)} for k in range(count)]).encode()


def _mixed_streams(server: ServerProcess) -> list[dict[str, str]]:
    """Ranges over streams of every state: packed (created empty, one append), in a directory
    (created with a body), packed with two records, closed, empty, a range from inside a stream, a
    range past the tail, a deleted stream, a missing one."""
    session = requests.Session()
    ranges = []
    for i in range(240):
        path = unique(f"batch-{i}")
        if i % 2:
            tail = _put(session, server, path, _messages(i, 1 + i % 5))  # a directory
        else:
            _put(session, server, path)
            tail = _post(session, server, path, _messages(i, 1 + i % 5))  # packed records
        ranges.append({"path": path, "offset": "-1", "end": tail})
    two = ranges[10]  # a second record: not the one-record read
    middle = two["end"]
    two["end"] = _post(session, server, two["path"], _messages(10, 3))
    ranges.append({"path": two["path"], "offset": middle, "end": two["end"]})
    closed = ranges[12]
    closed["end"] = _post(session, server, closed["path"], _messages(12, 2), close=True)
    empty = unique("batch-empty")
    ranges.insert(20, {"path": empty, "offset": "-1", "end": _put(session, server, empty)})
    ranges.insert(30, {**ranges[30], "end": format_offset(10**9)})  # past the tail
    deleted = ranges[40]["path"]
    assert session.delete(server.stream_url(deleted), timeout=TIMEOUT).status_code == 204
    ranges.append({"path": unique("batch-missing"), "offset": "-1", "end": format_offset(0)})
    return ranges


def _single(server: ServerProcess, asked: dict[str, str]) -> tuple[Frames, None] | tuple[None, Any]:
    """The range's single frames read: its frames, or the error code it answers."""
    response = requests.get(
        server.stream_url(asked["path"]),
        params={"offset": asked["offset"], "end": asked["end"], "format": "frames"},
        timeout=TIMEOUT,
    )
    if response.status_code != 200:
        return None, (response.status_code, response.json()["error"]["code"])
    frames, _ = frames_range(server, asked["path"], asked["offset"], asked["end"])
    return frames, None


def _read_all(server: ServerProcess, ranges: list[dict[str, str]]) -> tuple[list[Any], int, int]:
    """Every range read to its end by multi-range requests, continuing where the chunk cut one (as
    the Spark source does): per range its (positions, timestamps, values) or its error, the number
    of requests, and how many ranges a chunk cut short."""
    got: list[Any] = [None] * len(ranges)
    pending = [(i, asked) for i, asked in enumerate(ranges)]
    requests_made = cut = 0
    while pending:
        response = post(server, "reads", {"ranges": [asked for _, asked in pending]})
        assert response.status_code == 200, response.text
        entries, frames = decode_multi(response.content)
        requests_made += 1
        at = 0
        for entry, (index, _) in zip(entries, pending, strict=False):
            if "error" in entry:
                got[index] = (entry["error"]["status"], entry["error"]["code"])
                continue
            window = slice(at, at + entry["messages"])
            if got[index] is None:
                got[index] = ([], [], [])
            for mine, theirs in zip(
                got[index], (frames.positions, frames.timestamps, frames.values), strict=True
            ):
                mine += theirs[window]
            at += entry["messages"]
        assert at == len(frames.values)
        last = entries[-1]
        rest = pending[len(entries) :]
        if "error" not in last and not last["end_reached"]:
            assert all("error" in e or e["end_reached"] for e in entries[:-1])
            index, asked = pending[len(entries) - 1]
            rest = [(index, {**asked, "offset": last["next_offset"]}), *rest]
            cut += 1
        else:
            assert "error" in last or last["next_offset"] == pending[len(entries) - 1][1]["end"]
        pending = rest
    return got, requests_made, cut


def _same_as_single_reads(server: ServerProcess, ranges: list[dict[str, str]]) -> int:
    got, requests_made, _ = _read_all(server, ranges)
    errors = 0
    for asked, answer in zip(ranges, got, strict=True):
        frames, error = _single(server, asked)
        if frames is None:
            assert answer == error, (asked, answer)
            errors += 1
        else:
            assert answer == (frames.positions, frames.timestamps, frames.values), asked
    return errors


def test_batched_reads_of_mixed_streams_equal_their_single_reads(server_factory) -> None:
    """Packed streams (in the WAL, then in a pack after a restart's checkpoint) and directory
    streams, closed, empty, deleted, missing, past the tail, from inside a stream: each range's
    answer equals its single read, byte for byte, and its error is the single read's."""
    server = server_factory(extra_args=("--packed-appends",))
    ranges = _mixed_streams(server)
    assert _same_as_single_reads(server, ranges) == 3  # past the tail, deleted, missing
    server.restart()
    _checkpointed(server)
    assert _pack_files(server), "the packed streams were not carried into a pack"
    assert _same_as_single_reads(server, ranges) == 3


def test_a_batched_read_cut_by_the_chunk_continues_to_the_same_answers(server_factory) -> None:
    """A chunk of 1 KiB holds a few ranges: the read takes many requests, ranges are cut short in
    their middle and continued from their next offset, and every range still ends with exactly its
    single read's messages."""
    server = server_factory(extra_args=("--packed-appends", "--chunk-bytes", "1024"))
    ranges = _mixed_streams(server)
    server.restart()
    _checkpointed(server)
    got, requests_made, cut = _read_all(server, ranges)
    assert requests_made > 10 and cut > 0
    assert _same_as_single_reads(server, ranges) == 3
