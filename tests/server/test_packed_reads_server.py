"""The real server process over packed records (decision 0010 step 2): a packed stream with records
found at start-up is served over HTTP exactly as its directory twin is (bodies, offsets, ETags), and
still after SIGKILLs and restarts.

The data directories are built as ``tests/server/storage/test_packed_reads.py`` builds them (the
round that writes packed records is built separately). The server needs no flag to serve them: the
flag only decides whether it writes packed records; a data directory holding some is always read."""

from __future__ import annotations

from pathlib import Path

import requests

from durastream_server.offsets import format_offset, parse_position
from durastream_server.storage import features
from tests.server.storage.test_packed_reads import _twins
from tests.support.server_process import ServerProcess


def _answers(server: ServerProcess, offsets: list[str]) -> list[tuple[int, bytes, str, str]]:
    out = []
    for offset in offsets:
        response = requests.get(server.stream_url("chat"), params={"offset": offset}, timeout=10)
        out.append(
            (
                response.status_code,
                response.content,
                response.headers.get("Stream-Next-Offset", ""),
                response.headers.get("ETag", ""),
            )
        )
    head = requests.head(server.stream_url("chat"), timeout=10)
    out.append((head.status_code, b"", head.headers.get("Stream-Next-Offset", ""), ""))
    # The multi-range extension (the Spark source's reads): every range to the tail at once.
    ranges = [{"path": "chat", "offset": o, "end": offsets[-1]} for o in offsets[:-1]]
    for resource, body in (("reads", {"ranges": ranges}), ("lookups", {"lookups": ranges})):
        response = requests.post(
            server.stream_url(f"__ds/x-durastream/{resource}"), json=body, timeout=10
        )
        out.append((response.status_code, response.content, resource, ""))
    return out


def _offsets(tail: int) -> list[str]:
    """The start, the tail, and positions between (boundaries or not: errors are compared too)."""
    return ["-1", *(format_offset(p) for p in sorted({0, 1, 7, tail // 3, tail // 2, tail}))]


def test_the_server_serves_a_packed_stream_as_its_directory_twin_across_sigkills(
    tmp_path: Path,
) -> None:
    directory, packed, _log_id = _twins(tmp_path, records=60)
    features.mark(packed, features.PACKED_RECORDS, sync=True)
    with ServerProcess(directory) as server:
        tail = parse_position(
            requests.head(server.stream_url("chat"), timeout=10).headers["Stream-Next-Offset"]
        )
        offsets = _offsets(tail)
        want = _answers(server, offsets)
    assert tail > 1000 and want[0][0] == 200 and len(want[0][1]) > 1000
    assert want[-2][0] == 200 and len(want[-2][1]) > 1000  # the multi-range read's answer
    with ServerProcess(packed) as server:
        assert _answers(server, offsets) == want
        for _ in range(2):
            server.kill()
            server.restart()
            assert _answers(server, offsets) == want
        assert not (packed / "streams" / _log_id).exists()  # served from packs, no directory
