"""``bulk-write`` 2: an inline commit entry holding several parts of one stream
(``Durastream-Commit-Parts``, docs/extensions.md section 11; decision 0011). Each part is judged and
deduplicated exactly as the same part sent as an entry of its own, and answered at its place."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import requests

from tests.server.extensions.support import TIMEOUT, unique
from tests.server.extensions.test_bulk_write import (
    JSON,
    NS,
    bulk,
    ensure,
    inline_entry,
    messages,
)
from tests.server.workers.test_workers import paths_on_both_shards
from tests.support.server_process import ServerProcess


def parts_entry(
    path: str, prefix: str, parts: list[tuple[str, bytes]], epoch: int = 3, key: str = "k"
) -> tuple[str, dict[str, str], bytes]:
    headers = {
        "Durastream-Commit-Key": key,
        "Content-Type": JSON,
        "Producer-Id": prefix,
        "Producer-Epoch": str(epoch),
        "Producer-Seq": "0",
        "Durastream-Commit-Parts": ",".join(f"{suffix}:{len(body)}" for suffix, body in parts),
    }
    return path, headers, b"".join(body for _, body in parts)


def test_the_bulk_write_advertisement_is_version_2(durastream_server: ServerProcess) -> None:
    response = requests.get(durastream_server.stream_url(f"{NS}/extensions"), timeout=TIMEOUT)
    assert response.json()["extensions"]["bulk-write"] == 2


def test_a_multi_part_entry_is_answered_per_part_and_each_part_is_its_own_commit(
    durastream_server: ServerProcess,
) -> None:
    """Two parts of one stream and one part of another, in one request: every part appended once
    under its own producer tuple, answered at its place; each part is then the same commit as the
    part sent alone (a repeat of it alone is a 204 match)."""
    a, b = unique("parts-a"), unique("parts-b")
    ensure(durastream_server, {"streams": [a, b], "content_type": JSON})
    first, second = bulk(
        durastream_server,
        "commits",
        [
            parts_entry(a, "w-", [("0", b'["a0","a1"]'), ("1", b'["a2"]')]),
            parts_entry(b, "w-", [("1", b'["b0"]')]),
        ],
    )
    assert first["status"] == 200 and len(first["parts"]) == 2
    assert [part["status"] for part in first["parts"]] == [200, 200]
    assert [part["headers"]["Producer-Seq"] for part in first["parts"]] == ["0", "0"]
    assert second["status"] == 200 and [p["status"] for p in second["parts"]] == [200]
    assert messages(durastream_server, a) == ["a0", "a1", "a2"]
    assert messages(durastream_server, b) == ["b0"]
    # Part 1 of a alone, as bulk-write 1 sends it: the same commit (tuple w-1, epoch 3, key k).
    (alone,) = bulk(durastream_server, "commits", [inline_entry(a, b'["a2"]', "w-1", 3)])
    assert alone["status"] == 204 and alone["headers"]["Durastream-Digest"] == "match"
    assert messages(durastream_server, a) == ["a0", "a1", "a2"]


def test_a_repeated_multi_part_entry_is_all_204_and_writes_nothing(
    durastream_server: ServerProcess,
) -> None:
    """A driver's replay of the batch (or a retry after a lost answer): every part a duplicate; a
    replay whose part 0 was committed alone before and part 1 not: part 0 is 204, part 1 applied."""
    path = unique("parts-repeat")
    ensure(durastream_server, {"streams": [path], "content_type": JSON})
    entry = parts_entry(path, "r-", [("0", b"[1]"), ("1", b"[2]")])
    bulk(durastream_server, "commits", [entry])
    (again,) = bulk(durastream_server, "commits", [entry])
    assert [part["status"] for part in again["parts"]] == [204, 204]
    assert messages(durastream_server, path) == [1, 2]
    other = unique("parts-half")
    ensure(durastream_server, {"streams": [other], "content_type": JSON})
    bulk(durastream_server, "commits", [inline_entry(other, b"[1]", "r-0", 3)])
    (mixed,) = bulk(
        durastream_server, "commits", [parts_entry(other, "r-", [("0", b"[1]"), ("1", b"[2]")])]
    )
    assert [part["status"] for part in mixed["parts"]] == [204, 200]
    assert messages(durastream_server, other) == [1, 2]


def test_a_part_under_a_tuple_used_otherwise_is_409_alone(durastream_server: ServerProcess) -> None:
    """A part whose tuple holds another payload (another key: an ordered run's append) is its own
    409 DUPLICATE_PAYLOAD_MISMATCH; the entry's other parts are applied."""
    path = unique("parts-409")
    ensure(durastream_server, {"streams": [path], "content_type": JSON})
    bulk(durastream_server, "commits", [inline_entry(path, b'["x"]', "m-1", 3, key="other")])
    (answer,) = bulk(
        durastream_server, "commits", [parts_entry(path, "m-", [("0", b'["a"]'), ("1", b'["b"]')])]
    )
    ok, refused = answer["parts"]
    assert ok["status"] == 200
    assert refused["status"] == 409
    assert refused["error"]["code"] == "DUPLICATE_PAYLOAD_MISMATCH"
    assert messages(durastream_server, path) == ["x", "a"]


def test_bad_parts_headers_are_400_naming_the_field_and_apply_nothing(
    durastream_server: ServerProcess,
) -> None:
    path = unique("parts-bad")
    ensure(durastream_server, {"streams": [path], "content_type": JSON})
    good = parts_entry(path, "b-", [("0", b"[1]"), ("1", b"[2]")])
    bad: list[tuple[str, dict[str, str], bytes]] = []
    for value in ("0:3,1:4", "0:3,0:3", "0:3;1:3", "0:0,1:6", "a b:3,1:3", ""):
        headers = dict(good[1], **{"Durastream-Commit-Parts": value})
        bad.append((path, headers, good[2]))
    answers: list[dict[str, Any]] = bulk(durastream_server, "commits", bad)
    for value, answer in zip(("0:3,1:4", "0:3,0:3"), answers, strict=False):
        assert answer["status"] == 400, (value, answer)
    for answer in answers:
        assert answer["status"] == 400 and "parts" not in answer
        assert "requests[" in answer["error"]["message"]
        assert "Durastream-Commit-Parts" in answer["error"]["message"]
    no_producer = (path, {k: v for k, v in good[1].items() if k != "Producer-Id"}, good[2])
    (missing,) = bulk(durastream_server, "commits", [no_producer])
    assert missing["status"] == 400 and "Producer-Id" in missing["error"]["message"]
    assert messages(durastream_server, path) == []


@pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT as Linux has it")
def test_multi_part_entries_of_both_shards_under_workers(server_factory) -> None:
    """``--workers 2``: each multi-part entry goes whole to its stream's shard (shards/bulkwrite.py)
    and comes back at its index with its parts' answers; a repeat is all 204s."""
    server = server_factory(extra_args=("--workers", "2"))
    paths = paths_on_both_shards(unique("parts-workers"))
    ensure(server, {"streams": paths, "content_type": JSON})
    entries = [
        parts_entry(path, "k-", [("0", f'["{n}a"]'.encode()), ("1", f'["{n}b"]'.encode())])
        for n, path in enumerate(paths)
    ]
    answers = bulk(server, "commits", entries)
    assert [[part["status"] for part in answer["parts"]] for answer in answers] == [[200, 200]] * 4
    again = bulk(server, "commits", entries)
    assert [[part["status"] for part in answer["parts"]] for answer in again] == [[204, 204]] * 4
    for n, path in enumerate(paths):
        assert messages(server, path) == [f"{n}a", f"{n}b"]
