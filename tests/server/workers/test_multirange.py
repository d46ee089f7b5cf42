"""Multi-range reads and lookups of ``--workers 2`` (``shards/multirange.py``): every shard's ranges
in one answer, byte for byte what one process holding the same streams answers.

Both servers are fed the same streams and appends (offsets are byte positions, so their tokens are
the same); only the append times differ, so the frames bodies are compared with that column zeroed.
A small chunk size makes the budget cut the answers, so the ranges asked again at the cut are tested
too, walking each request to its end as the connector does.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import pytest
import requests

from durastream_server.http import frames
from durastream_server.shards.layout import shard_of
from tests.server.workers.test_listing import answer_while_a_worker_is_down
from tests.server.workers.test_workers import WORKERS, paths_on_both_shards
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

NS = "__ds/x-durastream"
JSON = "application/json"
TEXT = "text/plain"
STORAGE = {"directories": (), "packed": ("--packed-appends", "--durability", "fsync")}


def _feed(server: ServerProcess, streams: dict[str, tuple[str, list[bytes]]]) -> dict[str, str]:
    """Create each stream with its appends; its tail by path."""
    tails = {}
    for path, (content_type, bodies) in streams.items():
        response = requests.put(server.stream_url(path), headers={"Content-Type": content_type})
        assert response.status_code in (200, 201), response.text
        for body in bodies:
            response = requests.post(
                server.stream_url(path), data=body, headers={"Content-Type": content_type}
            )
            assert response.status_code in (200, 204), response.text
        tails[path] = requests.head(server.stream_url(path)).headers["Stream-Next-Offset"]
    return tails


def _streams() -> dict[str, tuple[str, list[bytes]]]:
    """Streams of both shards: JSON and text, empty, one message, many of varying sizes."""
    paths = paths_on_both_shards("mr/s", each=5)
    assert {shard_of(p, 2) for p in paths} == {0, 1}
    shapes: list[tuple[str, list[bytes]]] = [
        (JSON, []),
        (JSON, [b'[{"a":1}]']),
        (TEXT, [b"hello", b" world", b"!" * 90]),
        (JSON, [json.dumps([{"k": k, "pad": "x" * (k * 7)} for k in range(6)]).encode()]),
        (TEXT, []),
        (JSON, [b"[1,2,3]", b'["four"]', b'[{"five":5}]']),
        (TEXT, [b"t" * 40] * 5),
        (JSON, [json.dumps(list(range(30))).encode()]),
        # asked first, one per shard (``_ranges``): with a chunk of 300 the second fits whole in its
        # shard's budget but not in what the first leaves, so it is asked again and cut there
        (TEXT, [b"p" * 50] * 2),
        (TEXT, [b"q" * 50] * 2),
    ]
    return dict(zip(paths, shapes, strict=True))


def _zero_times(body: bytes) -> bytes:
    """The answer with the frames body's append times zeroed (they differ between servers)."""
    size = int.from_bytes(body[4:8], "little")
    at = 8 + size
    _, n, _, _ = frames.HEADER.unpack_from(body, at)
    times = at + frames.HEADER.size + 8 * n
    return body[:times] + bytes(8 * n) + body[times + 8 * n :]


def _walk(server: ServerProcess, ranges: list[dict[str, str]], fmt: str) -> list[bytes]:
    """Every answer of a reads request walked to its end: each time, the ranges not yet answered,
    the cut one resumed from where it stopped (the connector's loop)."""
    answers = []
    pending = list(ranges)
    while pending:
        response = requests.post(
            server.stream_url(f"{NS}/reads"), json={"ranges": pending, "format": fmt}, timeout=60
        )
        assert response.status_code == 200, response.text
        answers.append(_zero_times(response.content))
        size = int.from_bytes(response.content[4:8], "little")
        entries = json.loads(response.content[8 : 8 + size])["ranges"]
        assert entries, "an answer must make progress"
        last = entries[-1]
        rest = pending[len(entries) :]
        if "error" not in last and not last["end_reached"]:
            rest.insert(0, {**pending[len(entries) - 1], "offset": last["next_offset"]})
        pending = rest
    return answers


def _ranges(tails: dict[str, str]) -> list[dict[str, str]]:
    """Every stream from its start to its tail in a mixed order, a missing stream, an end past a
    stream's tail, and an empty range at a tail."""
    *paths, first, second = list(tails)
    longest = max(tails.values(), key=lambda tail: int(tail.replace("_", "")))
    ranges = [{"path": p, "offset": "-1", "end": tails[p]} for p in paths]
    ranges += [
        {"path": "mr/missing-stream", "offset": "-1", "end": longest},
        {"path": paths[1], "offset": "-1", "end": longest},  # past its tail
        {"path": paths[2], "offset": tails[paths[2]], "end": tails[paths[2]]},  # empty
    ]
    random.Random(7).shuffle(ranges)
    return [{"path": p, "offset": "-1", "end": tails[p]} for p in (first, second)] + ranges


@pytest.mark.parametrize("storage", sorted(STORAGE))
@pytest.mark.parametrize("chunk", ["4096", "300"])
def test_reads_and_lookups_are_what_one_process_answers(
    server_factory, storage: str, chunk: str
) -> None:
    args = (*STORAGE[storage], "--chunk-bytes", chunk)
    workers = server_factory(extra_args=(*WORKERS, *args))
    single = server_factory(extra_args=args)
    streams = _streams()
    tails = _feed(workers, streams)
    assert _feed(single, streams) == tails
    ranges = _ranges(tails)
    for fmt in ("frames", "frames-lines"):
        got = _walk(workers, ranges, fmt)
        assert got == _walk(single, ranges, fmt), fmt
        if chunk == "300":
            assert len(got) > 2, "the budget never cut an answer: the re-ask was not tested"
        for shard in (0, 1):  # one shard's ranges only: the receiving worker's own, or another's
            alone = [r for r in ranges if shard_of(r["path"], 2) == shard]
            assert _walk(workers, alone, fmt) == _walk(single, alone, fmt), (fmt, shard)

    lookups = [
        {"path": r["path"], "offset": r["offset"], "end": r["end"], "max_messages": 2}
        for r in ranges
    ]
    answers = [
        requests.post(server.stream_url(f"{NS}/lookups"), json={"lookups": lookups}, timeout=60)
        for server in (workers, single)
    ]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert answers[0].content == answers[1].content
    results: list[dict[str, Any]] = answers[0].json()["results"]
    assert any("error" in r for r in results) and any("error" not in r for r in results)


def test_the_extension_is_advertised_and_a_worker_down_is_503_then_served(
    server_factory,
) -> None:
    workers = server_factory(extra_args=WORKERS)
    for url in (workers.stream_url(f"{NS}/extensions"),):
        assert "multi-range" in requests.get(url).json()["extensions"]
    assert "multi-range" in requests.get(workers.stream_url(f"{NS}/extensions")).headers.get(
        "Durastream-Extensions", ""
    )
    tails = _feed(workers, _streams())
    ranges = [{"path": p, "offset": "-1", "end": t} for p, t in tails.items()]
    down = answer_while_a_worker_is_down(
        workers, f"{NS}/reads", {}, json_body={"ranges": ranges, "format": "frames"}
    )
    assert down.status_code == 503, down.text
    assert down.json()["error"]["code"] == "SHARD_UNAVAILABLE"
    assert down.headers["Retry-After"]
    response = requests.post(
        workers.stream_url(f"{NS}/reads"), json={"ranges": ranges, "format": "frames"}, timeout=60
    )
    assert response.status_code == 200, response.text
    size = int.from_bytes(response.content[4:8], "little")
    entries = json.loads(response.content[8 : 8 + size])["ranges"]
    assert len(entries) == len(ranges) and all(e["end_reached"] for e in entries)


def test_a_prefixed_token_is_refused_each_range_outside_its_prefix_at_its_place(
    server_factory,
) -> None:
    writer, tenant = "writer-token-0123456789", "tenant-token-0123456789"
    args = ("--auth-token", writer, "--auth-token", f"{tenant}:read-only:ten")
    workers = server_factory(extra_args=(*WORKERS, *args))
    single = server_factory(extra_args=args)
    paths = paths_on_both_shards("ten/s", each=2) + paths_on_both_shards("other/s", each=2)
    ranges = [{"path": p, "offset": "-1", "end": "-1"} for p in paths]
    random.Random(3).shuffle(ranges)
    bodies = []
    for server in (workers, single):
        for path in paths:
            response = requests.put(
                server.stream_url(path),
                data=b"[1]",
                headers={"Content-Type": JSON, "Authorization": f"Bearer {writer}"},
            )
            assert response.status_code == 201, response.text
        tails = {
            p: requests.head(
                server.stream_url(p), headers={"Authorization": f"Bearer {writer}"}
            ).headers["Stream-Next-Offset"]
            for p in paths
        }
        body = {"ranges": [{**r, "end": tails[r["path"]]} for r in ranges]}
        response = requests.post(
            server.stream_url(f"{NS}/reads"),
            json=body,
            headers={"Authorization": f"Bearer {tenant}"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        bodies.append(_zero_times(response.content))
    assert bodies[0] == bodies[1]
    size = int.from_bytes(bodies[0][4:8], "little")
    entries = json.loads(bodies[0][8 : 8 + size])["ranges"]
    refused = [r["path"] for r, e in zip(ranges, entries, strict=True) if "error" in e]
    assert sorted(refused) == sorted(p for p in paths if p.startswith("other/"))
    assert {e["error"]["status"] for e in entries if "error" in e} == {403}
