"""Helpers for the extension tests: an independent decoder of the frames layout, and small HTTP calls.

``decode_frames`` re-implements ``docs/extensions.md`` section 2 byte by byte from the document, not
from the server's encoder, so an encoder bug cannot hide behind a shared helper.
"""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass
from typing import Any

import requests

from tests.support.server_process import ServerProcess

JSON = "application/json"
TEXT = "text/plain"
FRAMES_TYPE = "application/vnd.durastream.frames"
TIMEOUT = 30


def token(position: int) -> str:
    return f"{0:016d}_{position:016d}"


def position_of(offset: str) -> int:
    assert len(offset) == 33 and offset[16] == "_" and offset[:16] == "0" * 16, offset
    return int(offset[17:])


def unique(name: str) -> str:
    return f"ext/{name}-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Frames:
    flags: int
    positions: list[int]
    timestamps: list[int]
    values: list[bytes]


def decode_frames(body: bytes) -> Frames:
    """Decode a frames body, checking every structural rule of the layout on the way."""
    assert body[0:4] == b"DSF1", body[:16]
    count = int.from_bytes(body[4:8], "little")
    flags = int.from_bytes(body[8:12], "little")
    assert int.from_bytes(body[12:16], "little") == 0, "reserved field must be 0"
    assert flags in (0, 1), flags
    at = 16
    positions = [int.from_bytes(body[at + 8 * i : at + 8 * i + 8], "little") for i in range(count)]
    at += 8 * count
    timestamps = [
        int.from_bytes(body[at + 8 * i : at + 8 * i + 8], "little", signed=True)
        for i in range(count)
    ]
    at += 8 * count
    bounds = [int.from_bytes(body[at + 8 * i : at + 8 * i + 8], "little") for i in range(count + 1)]
    at += 8 * (count + 1)
    values_section = body[at:]
    assert bounds[0] == 0 and bounds[-1] == len(values_section), (bounds, len(values_section))
    assert bounds == sorted(bounds)
    values = []
    for i in range(count):
        raw = values_section[bounds[i] : bounds[i + 1]]
        if flags & 1:
            assert raw.endswith(b"\n") and b"\n" not in raw[:-1] and b"\r" not in raw, raw
            raw = raw[:-1]
        values.append(raw)
    return Frames(flags, positions, timestamps, values)


def create(
    server: ServerProcess,
    path: str,
    body: bytes = b"",
    content_type: str = JSON,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    response = requests.put(
        server.stream_url(path),
        data=body,
        headers={"Content-Type": content_type, **(headers or {})},
        timeout=TIMEOUT,
    )
    assert response.status_code in (200, 201), response.text
    return response


def fork(server: ServerProcess, source: str, at: str, content_type: str = JSON) -> str:
    """Fork ``source`` at offset ``at`` into a new stream; returns its path."""
    path = unique("fork")
    response = requests.put(
        server.stream_url(path),
        headers={
            "Content-Type": content_type,
            "Stream-Forked-From": f"/v1/stream/{source}",
            "Stream-Fork-Offset": at,
        },
        timeout=TIMEOUT,
    )
    assert response.status_code == 201, response.text
    return path


def append(
    server: ServerProcess, path: str, body: bytes, content_type: str = JSON, close: bool = False
) -> str:
    headers = {"Content-Type": content_type}
    if close:
        headers["Stream-Closed"] = "true"
    response = requests.post(server.stream_url(path), data=body, headers=headers, timeout=TIMEOUT)
    assert response.status_code in (200, 204), response.text
    return response.headers["Stream-Next-Offset"]


def get(server: ServerProcess, path: str, **params: Any) -> requests.Response:
    return requests.get(server.stream_url(path), params=params, timeout=TIMEOUT)


def read_all(server: ServerProcess, path: str, start: str = "-1", **params: Any) -> bytes:
    """Concatenated raw bodies of catch-up reads from ``start`` until up to date (base protocol)."""
    out = []
    offset = start
    while True:
        response = get(server, path, offset=offset, **params)
        assert response.status_code == 200, response.text
        out.append(response.content)
        offset = response.headers["Stream-Next-Offset"]
        if response.headers.get("Stream-Up-To-Date") == "true":
            return b"".join(out)


def json_messages(server: ServerProcess, path: str, start: str = "-1") -> list[Any]:
    """Every JSON message from ``start`` with a plain read (base protocol), for comparisons."""
    out: list[Any] = []
    offset = start
    while True:
        response = get(server, path, offset=offset)
        assert response.status_code == 200, response.text
        out.extend(response.json())
        offset = response.headers["Stream-Next-Offset"]
        if response.headers.get("Stream-Up-To-Date") == "true":
            return out


def frames_range(
    server: ServerProcess, path: str, start: str, end: str | None = None, fmt: str = "frames"
) -> tuple[Frames, list[requests.Response]]:
    """All frames in ``[start, end)`` (or to the tail), following Stream-Next-Offset."""
    positions: list[int] = []
    timestamps: list[int] = []
    values: list[bytes] = []
    responses: list[requests.Response] = []
    offset = start
    flags = 0
    while True:
        params: dict[str, str] = {"offset": offset, "format": fmt}
        if end is not None:
            params["end"] = end
        response = get(server, path, **params)
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"] == FRAMES_TYPE
        responses.append(response)
        frames = decode_frames(response.content)
        flags = frames.flags
        positions += frames.positions
        timestamps += frames.timestamps
        values += frames.values
        next_offset = response.headers["Stream-Next-Offset"]
        done = (
            response.headers.get("Durastream-End-Reached") == "true"
            if end is not None
            else response.headers.get("Stream-Up-To-Date") == "true"
        )
        if done:
            return Frames(flags, positions, timestamps, values), responses
        assert next_offset != offset, "a frames read made no progress"
        offset = next_offset


def lookup(server: ServerProcess, path: str, **params: Any) -> dict[str, Any]:
    response = get(server, path, lookup="limit", **params)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    return json.loads(response.content)


def error_code(response: requests.Response) -> str:
    return response.json()["error"]["code"]


def message_positions(messages: list[bytes], base: int = 0) -> list[int]:
    out = []
    at = base
    for message in messages:
        out.append(at)
        at += len(message)
    return out


def pack_u64(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)
