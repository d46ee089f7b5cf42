"""Bulk writes: ``POST {root}/__ds/x-durastream/ensure``, ``.../stages`` and ``.../commits``
(docs/extensions.md section 11): the writes of many streams in one exchange, each entry answered as its
single request would be."""

from __future__ import annotations

import json
import time
from typing import Any

import requests

from durastream_server.http.bulk import encode_requests
from tests.server.extensions.support import TIMEOUT, unique
from tests.support.server_process import ServerProcess

NS = "__ds/x-durastream"
JSON = "application/json"


def ensure(server: ServerProcess, body: Any) -> requests.Response:
    return requests.post(server.stream_url(f"{NS}/ensure"), json=body, timeout=TIMEOUT)


def bulk(
    server: ServerProcess, resource: str, entries: list[tuple[str, dict[str, str], bytes]]
) -> list[dict[str, Any]]:
    response = requests.post(
        server.stream_url(f"{NS}/{resource}"), data=encode_requests(entries), timeout=TIMEOUT
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == len(entries)
    return results


def stage_entry(path: str, handle: str, body: bytes) -> tuple[str, dict[str, str], bytes]:
    headers = {
        "Durastream-Txn": handle,
        "Content-Type": JSON,
        "Producer-Id": handle,
        "Producer-Epoch": "0",
        "Producer-Seq": "0",
    }
    return path, headers, body


def commit_entry(
    path: str, handles: list[str], pid: str, epoch: int, key: str = "k"
) -> tuple[str, dict[str, str], bytes]:
    headers = {
        "Durastream-Commit": "@body",
        "Durastream-Commit-Key": key,
        "Producer-Id": pid,
        "Producer-Epoch": str(epoch),
        "Producer-Seq": "0",
    }
    return path, headers, ",".join(handles).encode()


def messages(server: ServerProcess, path: str) -> list[Any]:
    response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def test_ensure_creates_missing_streams_and_reports_existing_ones(
    durastream_server: ServerProcess,
) -> None:
    base = unique("bulk-ensure")
    existing, text, closed = f"{base}/old", f"{base}/text", f"{base}/closed"
    assert requests.put(durastream_server.stream_url(existing), headers={"Content-Type": JSON}).ok
    assert requests.put(
        durastream_server.stream_url(text), headers={"Content-Type": "text/plain"}
    ).ok
    assert requests.put(
        durastream_server.stream_url(closed),
        headers={"Content-Type": JSON, "Stream-Closed": "true"},
    ).ok
    paths = [existing, f"{base}/new", text, closed, f"{base}/new"]
    response = ensure(durastream_server, {"streams": paths, "content_type": JSON})
    assert response.status_code == 200, response.text
    old, new, other, shut, again = response.json()["results"]
    assert old["created"] is False and old["content_type"] == JSON and old["closed"] is False
    assert new["content_type"] == JSON and new["closed"] is False
    assert new["created"] is not again["created"]  # listed twice: created once
    assert other["content_type"] == "text/plain"  # reported, the caller compares
    assert shut["closed"] is True
    assert requests.head(durastream_server.stream_url(f"{base}/new")).status_code == 200


def test_ensure_without_create_reports_missing_streams_on_their_own(
    durastream_server: ServerProcess,
) -> None:
    path = unique("bulk-missing")
    response = ensure(durastream_server, {"streams": [path], "content_type": JSON, "create": False})
    (result,) = response.json()["results"]
    assert result["status"] == 404 and result["error"]["code"] == "NOT_FOUND"
    assert requests.head(durastream_server.stream_url(path)).status_code == 404


def test_ensure_refuses_bad_bodies_naming_the_field(durastream_server: ServerProcess) -> None:
    for body, named in (
        ({"streams": [], "content_type": JSON}, "'streams'"),
        ({"streams": ["a"], "content_type": ""}, "'content_type'"),
        ({"streams": ["a"], "content_type": "json"}, "'content_type' 'json' is not a media type"),
        ({"streams": ["a"], "content_type": "\r\nX: y"}, "type/subtype"),
        ({"streams": ["a"], "content_type": JSON, "create": "yes"}, "'create'"),
        ({"streams": ["a"]}, "streams"),
    ):
        response = ensure(durastream_server, body)
        assert response.status_code == 400, body
        assert named in response.json()["error"]["message"]
    response = ensure(durastream_server, {"streams": ["a/../b"], "content_type": JSON})
    (result,) = response.json()["results"]
    assert result["status"] == 400 and "streams[0]" in result["error"]["message"]
    # None of the refused bodies created anything (a malformed type is not given the default).
    assert requests.head(durastream_server.stream_url("a")).status_code == 404


def test_stages_and_commits_of_many_streams_in_two_requests(
    durastream_server: ServerProcess,
) -> None:
    base = unique("bulk-txn")
    paths = [f"{base}/s{n}" for n in range(50)]
    ensure(durastream_server, {"streams": paths, "content_type": JSON})
    staged = bulk(
        durastream_server,
        "stages",
        [stage_entry(p, f"h-{n}", json.dumps([n, n + 1]).encode()) for n, p in enumerate(paths)],
    )
    assert {r["status"] for r in staged} == {200}
    assert staged[3]["headers"]["Durastream-Txn-Messages"] == "2"
    assert all(
        messages(durastream_server, p) == [] for p in paths[:3]
    )  # invisible until the commit
    entries = [commit_entry(p, [f"h-{n}"], f"w-{n}", 7) for n, p in enumerate(paths)]
    committed = bulk(durastream_server, "commits", entries)
    assert {r["status"] for r in committed} == {200}
    assert committed[0]["headers"]["Durastream-Txn-Messages"] == "2"
    for n, path in enumerate(paths):
        assert messages(durastream_server, path) == [n, n + 1]
    # The whole request again (a client retry): every entry is a verified duplicate, nothing twice.
    again = bulk(durastream_server, "commits", entries)
    assert {r["status"] for r in again} == {204}
    assert {r["headers"]["Durastream-Digest"] for r in again} == {"match"}
    assert messages(durastream_server, paths[7]) == [7, 8]


def test_one_failing_entry_does_not_fail_the_others(durastream_server: ServerProcess) -> None:
    base = unique("bulk-mixed")
    good, missing = f"{base}/good", f"{base}/missing"
    ensure(durastream_server, {"streams": [good], "content_type": JSON})
    staged = bulk(
        durastream_server,
        "stages",
        [
            stage_entry(good, "g", b"[1]"),
            stage_entry(missing, "m", b"[2]"),
            stage_entry(good, "e", b"[]"),
        ],
    )
    assert [r["status"] for r in staged] == [200, 404, 400]
    assert staged[1]["error"]["code"] == "NOT_FOUND"
    results = bulk(
        durastream_server,
        "commits",
        [
            commit_entry(good, ["g"], "p-good", 1),
            commit_entry(good, ["nobody"], "p-other", 1),  # no such handle
            stage_entry(good, "x", b"[3]"),  # a stage is not accepted here
        ],
    )
    assert results[0]["status"] == 200
    assert results[1]["status"] == 404 and results[1]["error"]["code"] == "TXN_NOT_FOUND"
    assert results[2]["status"] == 400 and "requests[2]" in results[2]["error"]["message"]
    assert messages(durastream_server, good) == [1]


def test_commit_entries_follow_the_commit_key_rules(durastream_server: ServerProcess) -> None:
    """A replayed batch stages new handles and commits them under the same tuple and key: 204, and the
    data is there once; the same tuple under another key is 409 DUPLICATE_PAYLOAD_MISMATCH."""
    path = unique("bulk-key")
    ensure(durastream_server, {"streams": [path], "content_type": JSON})
    bulk(durastream_server, "stages", [stage_entry(path, "run1", b'["a"]')])
    (first,) = bulk(durastream_server, "commits", [commit_entry(path, ["run1"], "q-0", 3)])
    bulk(durastream_server, "stages", [stage_entry(path, "run2", b'["a"]')])
    replay, other = bulk(
        durastream_server,
        "commits",
        [commit_entry(path, ["run2"], "q-0", 3), commit_entry(path, ["run2"], "q-0", 3, key="z")],
    )
    assert first["status"] == 200 and replay["status"] == 204
    assert other["status"] == 409 and other["error"]["code"] == "DUPLICATE_PAYLOAD_MISMATCH"
    assert messages(durastream_server, path) == ["a"]


def test_malformed_bulk_bodies_are_400_naming_the_problem(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(f"{NS}/commits")
    header = json.dumps({"requests": [{"path": "a", "headers": {}, "bytes": 5}]}).encode()
    for body, named in (
        (b"nope", "DSR1"),
        (b"DSR1" + (999).to_bytes(4, "little") + b"{}", "header length"),
        (b"DSR1" + len(header).to_bytes(4, "little") + header + b"abc", "requests[0].bytes"),
        (b"DSR1" + len(header).to_bytes(4, "little") + header + b"abcdefg", "follow the last"),
    ):
        response = requests.post(url, data=body, timeout=TIMEOUT)
        assert response.status_code == 400, body
        assert named in response.json()["error"]["message"], response.text
    assert requests.get(url, timeout=TIMEOUT).status_code == 405


def inline_entry(path: str, body: bytes, pid: str, epoch: int, key: str = "k") -> tuple:
    headers = {
        "Durastream-Commit-Key": key,
        "Content-Type": JSON,
        "Producer-Id": pid,
        "Producer-Epoch": str(epoch),
        "Producer-Seq": "0",
    }
    return path, headers, body


def test_inline_commits_are_deduplicated_by_their_key_like_keyed_commits(
    durastream_server: ServerProcess,
) -> None:
    """A part small enough for one request is committed with its data inline: appended once under the
    tuple; the same tuple and key again (inline, or staged by a replay) is a 204; another key, or a
    plain append under the tuple, is refused; the single commit's probe (a keyed commit of a handle
    nobody staged) says the tuple holds this keyed commit."""
    path = unique("bulk-inline")
    ensure(durastream_server, {"streams": [path], "content_type": JSON})
    (first,) = bulk(durastream_server, "commits", [inline_entry(path, b'["a","b"]', "i-0", 4)])
    assert first["status"] == 200 and first["headers"]["Producer-Seq"] == "0"
    (again,) = bulk(durastream_server, "commits", [inline_entry(path, b'["a","b"]', "i-0", 4)])
    assert again["status"] == 204 and again["headers"]["Durastream-Digest"] == "match"
    bulk(durastream_server, "stages", [stage_entry(path, "replay", b'["a","b"]')])
    replay, other = bulk(
        durastream_server,
        "commits",
        [commit_entry(path, ["replay"], "i-0", 4), inline_entry(path, b'["c"]', "i-0", 4, key="z")],
    )
    assert replay["status"] == 204
    assert other["status"] == 409 and other["error"]["code"] == "DUPLICATE_PAYLOAD_MISMATCH"
    plain = requests.post(
        durastream_server.stream_url(path),
        data=b'["a","b"]',
        headers={
            "Content-Type": JSON,
            "Producer-Id": "i-0",
            "Producer-Epoch": "4",
            "Producer-Seq": "0",
        },
        timeout=TIMEOUT,
    )
    assert plain.status_code == 409  # an ordered-mode append under the tuple: not this commit
    probe = requests.post(
        durastream_server.stream_url(path),
        headers={
            "Durastream-Commit": "never-staged",
            "Durastream-Commit-Key": "k",
            "Producer-Id": "i-0",
            "Producer-Epoch": "4",
            "Producer-Seq": "0",
        },
        timeout=TIMEOUT,
    )
    assert probe.status_code == 204
    assert messages(durastream_server, path) == ["a", "b"]


def test_inline_commits_need_a_body_and_a_producer(durastream_server: ServerProcess) -> None:
    path = unique("bulk-inline-bad")
    ensure(durastream_server, {"streams": [path], "content_type": JSON})
    no_body, no_producer, bad_key = bulk(
        durastream_server,
        "commits",
        [
            inline_entry(path, b"", "p", 0),
            (path, {"Durastream-Commit-Key": "k", "Content-Type": JSON}, b"[1]"),
            inline_entry(path, b"[1]", "p", 0, key="bad key!"),
        ],
    )
    assert no_body["status"] == 400 and "needs a body" in no_body["error"]["message"]
    assert no_producer["status"] == 400 and "Producer-Id" in no_producer["error"]["message"]
    assert bad_key["status"] == 400 and "Durastream-Commit-Key" in bad_key["error"]["message"]
    (staged_here,) = bulk(durastream_server, "stages", [inline_entry(path, b"[1]", "p", 0)])
    assert staged_here["status"] == 400  # not a stage: only the commits resource takes them
    assert messages(durastream_server, path) == []


def test_a_bulk_request_of_many_entries_runs_them_on_a_few_tasks() -> None:
    """``_each`` (every bulk resource's loop) runs 1,000 entries on at most ``CONCURRENCY`` tasks (main made
    a task per entry, 1,000 at once, waiting on a semaphore), at most ``CONCURRENCY`` in flight, started
    in order, each answered at its place, a refused one with its error."""
    import asyncio

    from durastream_server.errors import BadRequest
    from durastream_server.http.bulk import CONCURRENCY, _each

    started: list[int] = []
    peak_tasks = peak_running = running = 0

    async def run(item: int) -> dict[str, Any]:
        nonlocal peak_tasks, peak_running, running
        started.append(item)
        running += 1
        peak_running = max(peak_running, running)
        peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))
        await asyncio.sleep(0)
        running -= 1
        if item % 100 == 7:
            raise BadRequest(f"entry {item} refused")
        return {"item": item}

    async def go() -> list[dict[str, Any]]:
        return await _each(list(range(1000)), run)

    results = asyncio.run(go())
    assert started == list(range(1000))
    assert peak_running == CONCURRENCY
    assert peak_tasks <= CONCURRENCY + 1, peak_tasks  # the workers and the test's own task
    for item, result in enumerate(results):
        if item % 100 == 7:
            assert result["status"] == 400 and "refused" in json.dumps(result), result
        else:
            assert result == {"item": item}


def test_ensure_treats_an_expired_stream_as_missing(durastream_server: ServerProcess) -> None:
    """An expired stream not yet swept: without ``create`` it is reported missing (HEAD's 404, with
    its message); with ``create`` it is replaced by a new stream, as a PUT would."""
    path = unique("bulk-expired")
    url = durastream_server.stream_url(path)
    assert requests.put(url, headers={"Content-Type": JSON, "Stream-TTL": "1"}).status_code == 201
    deadline = time.monotonic() + 30
    while requests.head(url, timeout=TIMEOUT).status_code != 404:
        assert time.monotonic() < deadline, "the stream did not expire"
        time.sleep(0.1)
    response = ensure(durastream_server, {"streams": [path], "content_type": JSON, "create": False})
    (missing,) = response.json()["results"]
    assert missing["status"] == 404 and path in missing["error"]["message"]
    response = ensure(durastream_server, {"streams": [path], "content_type": JSON})
    (created,) = response.json()["results"]
    assert created["created"] is True and created["content_type"] == JSON
    assert requests.head(url, timeout=TIMEOUT).status_code == 200


def test_inline_commits_of_many_streams_are_answered_each_at_its_place(
    durastream_server: ServerProcess,
) -> None:
    """The routed sink's request: two parts (two producers) of each of 300 streams committed inline
    in one request, beside a commit of handles, a refused entry and a missing stream. Every entry
    is answered at its place as its single request would be; each part is appended once; the
    request again is all 204s and appends nothing."""
    base = unique("bulk-inline-many")
    paths = [f"{base}/s{n}" for n in range(300)]
    ensure(durastream_server, {"streams": paths, "content_type": JSON})
    bulk(durastream_server, "stages", [stage_entry(paths[0], "hx", b'["staged"]')])
    entries = [
        inline_entry(p, json.dumps([f"{n}-{part}"]).encode(), f"p{part}-{n}", 2)
        for n, p in enumerate(paths)
        for part in (0, 1)
    ]
    entries[10:10] = [
        commit_entry(paths[0], ["hx"], "handles", 1),
        inline_entry(paths[1], b"", "empty", 0),  # an inline commit needs a body
        inline_entry(f"{base}/missing", b"[1]", "gone", 0),
    ]
    results = bulk(durastream_server, "commits", entries)
    assert results[10]["status"] == 200 and results[10]["headers"]["Durastream-Txn-Messages"] == "1"
    assert results[11]["status"] == 400 and "requests[11]" in results[11]["error"]["message"]
    assert results[12]["status"] == 404 and results[12]["error"]["code"] == "NOT_FOUND"
    inline = results[:10] + results[13:]
    assert [r["status"] for r in inline] == [200] * 600
    first = inline[0]
    assert list(first) == ["status", "headers"]
    assert list(first["headers"]) == [
        "Stream-Next-Offset",
        "Cache-Control",
        "Producer-Epoch",
        "Producer-Seq",
    ]
    assert (first["headers"]["Producer-Epoch"], first["headers"]["Producer-Seq"]) == ("2", "0")
    for n in (0, 1, 150, 299):
        got = messages(durastream_server, paths[n])
        assert sorted(m for m in got if m != "staged") == [f"{n}-0", f"{n}-1"], got
        tail = requests.head(durastream_server.stream_url(paths[n]), timeout=TIMEOUT)
        assert (
            inline[2 * n + 1]["headers"]["Stream-Next-Offset"] <= tail.headers["Stream-Next-Offset"]
        )
    again = bulk(durastream_server, "commits", entries)
    assert {r["status"] for i, r in enumerate(again) if i not in (11, 12)} == {204}
    assert sorted(messages(durastream_server, paths[150])) == ["150-0", "150-1"]


def test_ensure_answers_each_path_at_its_place_whatever_the_others_are(
    durastream_server: ServerProcess,
) -> None:
    """New, existing, invalid and repeated paths in one ensure: each answered at its place (the new
    ones created once, in request order), an invalid path its own 400."""
    base = unique("bulk-ensure-mix")
    existing = f"{base}/old"
    assert requests.put(durastream_server.stream_url(existing), headers={"Content-Type": JSON}).ok
    paths = [f"{base}/n{n}" for n in range(200)]
    listed = [*paths[:100], existing, "a/../b", paths[0], *paths[100:]]
    response = ensure(durastream_server, {"streams": listed, "content_type": JSON})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == len(listed)
    assert [r["created"] for r in results[:100]] == [True] * 100
    assert results[100] == {
        "content_type": JSON,
        "next_offset": results[100]["next_offset"],
        "closed": False,
        "created": False,
    }
    assert results[101]["status"] == 400 and "streams[101]" in results[101]["error"]["message"]
    assert results[102]["created"] is False  # listed twice: created by its first entry
    assert [r["created"] for r in results[103:]] == [True] * 100
    assert all(requests.head(durastream_server.stream_url(p)).status_code == 200 for p in paths)


def test_inline_commits_of_one_header_set_are_judged_once_each_as_alone() -> None:
    """``SharedAppendHeaders``: entries with the same headers (a routed sink's partition) share the
    judged producer tuple, each with its own path and body; an entry without a body, or with headers
    that are refused, gets exactly the error it gets alone (the body's names its own index)."""
    from durastream_server.errors import BadRequest
    from durastream_server.http.bulk import SharedAppendHeaders, _inline_commit

    def headers(pid: str, key: str = "k", seq: str = "0") -> dict[str, str]:
        return {
            "content-type": JSON,
            "durastream-commit-key": key,
            "producer-id": pid,
            "producer-epoch": "3",
            "producer-seq": seq,
        }

    shared = SharedAppendHeaders()
    first = shared.inline_commit("s/0", headers("a"), b"[0]", 0)
    second = shared.inline_commit("s/1", headers("a"), b"[1]", 1)
    other = shared.inline_commit("s/1", headers("b"), b"[2]", 2)
    assert (second.path, second.body) == ("s/1", b"[1]")
    assert second.producer is first.producer  # judged once for the set
    assert second == _inline_commit("s/1", headers("a"), b"[1]", 1)  # what it is alone
    assert other.producer is not None and other.producer.producer_id == "b"
    for index, entry_headers, body in (
        (3, headers("a"), b""),  # an accepted set, but no body
        (4, headers("a", key="bad key!"), b"[1]"),
        (5, headers("a", seq="-1"), b"[1]"),
        (6, headers("a", key="bad key!"), b"[1]"),  # a refused set is never kept
    ):
        try:
            _inline_commit("s/2", entry_headers, body, index)
        except BadRequest as alone:
            expected = alone.message
        try:
            shared.inline_commit("s/2", entry_headers, body, index)
        except BadRequest as error:
            assert error.message == expected  # as alone (an empty body's names its index)
            assert index != 3 or f"requests[{index}]" in expected
        else:
            raise AssertionError(f"entry {index} was accepted")


def test_bulk_answers_are_the_bytes_json_dumps_gives() -> None:
    """``answer_body`` (msgspec) writes a bulk answer as the stdlib encoder did: compact, UTF-8 as
    is, control characters escaped, every value type a bulk answer holds."""
    from durastream_server.http.bulk import answer_body

    document = {
        "results": [
            {"status": 200, "headers": {"Stream-Next-Offset": "0_1", "Producer-Seq": "0"}},
            {"content_type": "application/json", "next_offset": "0_0", "closed": False},
            {"created": True, "none": None, "count": 2**53 - 1},
            {"status": 409, "headers": {}, "error": {"code": "X", "message": 'é\u2028\x01/"\\ ✓'}},
        ]
    }
    expected = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    assert answer_body(document) == expected


def test_entries_with_the_same_headers_share_one_checked_dict_and_bad_ones_are_named() -> None:
    """``_requests``: equal headers are checked and lower-cased once (the entries share the dict);
    headers that are not an object of strings, even after equal good ones, are refused naming the
    entry; an entry with a field besides path, headers and bytes is refused."""
    import asyncio

    import pytest

    from durastream_server.errors import BadRequest
    from durastream_server.http.bulk import MAGIC, _requests

    good = {"Content-Type": JSON, "Producer-Id": "p"}
    entries = asyncio.run(
        _requests(encode_requests([("a", good, b"1"), ("b", dict(good), b"22"), ("c", {}, b"")]))
    )
    assert [(p, b) for p, _, b in entries] == [("a", b"1"), ("b", b"22"), ("c", b"")]
    assert entries[0][1] == {"content-type": JSON, "producer-id": "p"}
    assert entries[0][1] is entries[1][1]

    def body(items: list[dict[str, Any]]) -> bytes:
        header = json.dumps({"requests": items}).encode()
        return MAGIC + len(header).to_bytes(4, "little") + header

    for bad, named in (
        ({"Producer-Id": ["p"]}, "requests[1].headers"),  # unhashable
        ({"Producer-Id": 5}, "requests[1].headers"),
        (["Producer-Id"], "requests[1].headers"),
    ):
        items = [{"path": "a", "headers": good}, {"path": "b", "headers": bad}]
        with pytest.raises(BadRequest, match=named.replace("[", r"\[").replace("]", r"\]")):
            asyncio.run(_requests(body(items)))
    extra = [{"path": "a", "headers": good, "bytes": 0, "more": 1}]
    with pytest.raises(BadRequest, match=r"requests\[0\] must be an object"):
        asyncio.run(_requests(body(extra)))
    with pytest.raises(BadRequest, match=r"requests\[0\] must be an object"):
        asyncio.run(_requests(body([{"path": "a", "bytes": 0, "more": 1}])))
