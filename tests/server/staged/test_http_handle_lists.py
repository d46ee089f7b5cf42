"""``staged-append=2``: handle lists in the request body (no size cliff) and commit keys, over HTTP.

Issue 15, item 2: a commit used to list every handle in its ``Durastream-Commit`` header, and past about
1,000 handles the server's 32 KiB header limit answered 431, for every retry and for the abort too.
``Durastream-Commit: @body`` (and ``Durastream-Abort: @body``) carry the list in the body instead, up to
10,000 handles, and parse to the same request as the header form: the commit is still one record group,
and a retry in either form is a 204 duplicate.

Item 1: ``Durastream-Commit-Key`` makes the tuple's digest cover the key instead of the handle list, so
a commit re-made with other handles is recognised as the same commit (204), and anything else under
the tuple (an append, a commit with another key) is a 409.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import requests

from tests.support.server_process import ServerProcess

from .support import JSON, TEXT
from .test_http_staged import commit, create, error_code, producer, stage, unique

HANDLES = 10_000


def commit_body(url: str, handles: list[str], pid: str = "committer", seq: int = 0, **extra):
    return requests.post(
        url,
        data=",\n".join(handles).encode(),
        headers={"Durastream-Commit": "@body", **producer(pid, 0, seq), **extra},
        timeout=120,
    )


def abort_body(url: str, handles: list[str]):
    return requests.post(
        url, data=",".join(handles).encode(), headers={"Durastream-Abort": "@body"}, timeout=120
    )


def _stage_many(url: str, handles: list[str], first: int = 0) -> None:
    def one(index: int) -> int:
        body = b'{"n":%d}' % (first + index)
        return stage(url, handles[index], body, JSON).status_code

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(one, range(len(handles))))
    assert statuses == [200] * len(handles)


def test_ten_thousand_handles_commit_in_one_group_and_abort(server_factory) -> None:
    # Default limits (32 KiB of headers, 10,000 handles per commit); no fsync, to stage quickly.
    server = server_factory(long_poll_timeout=60.0, extra_args=["--durability", "none"])
    url = server.stream_url("many-handles")
    tail = create(url, b"[]", JSON)
    handles = [f"spark-7-3-0-0123456789ab-{i}" for i in range(HANDLES)]
    _stage_many(url, handles)

    # The header form cannot carry them: the cliff this extension removes.
    too_big = commit(url, ", ".join(handles))
    assert too_big.status_code == 431

    with ThreadPoolExecutor(1) as pool:
        long_poll = pool.submit(
            requests.get, url, params={"offset": tail, "live": "long-poll"}, timeout=120
        )
        done = commit_body(url, handles)
        assert done.status_code == 200, done.text
        assert done.headers["Durastream-Txn-Messages"] == str(HANDLES)
        woken = long_poll.result(120)
    # One record group: a reader parked at the tail wakes once, with every message.
    assert woken.status_code == 200
    assert [m["n"] for m in woken.json()] == list(range(HANDLES))
    assert [m["n"] for m in requests.get(url, params={"offset": "-1"}).json()] == list(
        range(HANDLES)
    )
    again = commit_body(url, handles)
    assert again.status_code == 204
    assert again.headers["Stream-Next-Offset"] == done.headers["Stream-Next-Offset"]

    # An abort names as many (some staged, the rest never staged: tombstoned all the same).
    more = [f"spark-8-3-0-0123456789ab-{i}" for i in range(HANDLES)]
    _stage_many(url, more[-10:], first=HANDLES)
    assert abort_body(url, more).status_code == 204
    # Staged names are aborted; never-staged ones stay fenced, the newest 1,024 per stream (decision 0005):
    # the oldest of the 10,000 is no longer fenced, and a commit of it finds no handle.
    for name, status, code in (
        (more[-1], 409, "TXN_ABORTED"),
        (more[-11], 409, "TXN_ABORTED"),
        (more[0], 404, "TXN_NOT_FOUND"),
    ):
        refused = commit_body(url, [name], seq=1)  # refused: seq 1 stays the next one
        assert (refused.status_code, error_code(refused)) == (status, code), name
    assert len(requests.get(url, params={"offset": "-1"}).json()) == HANDLES


def test_a_commit_retried_in_the_other_form_is_a_duplicate(durastream_server: ServerProcess):
    url = durastream_server.stream_url(unique("forms"))
    create(url)
    for name in ("a", "b", "c"):
        assert stage(url, f"{name}-1", name.encode()).status_code == 200
        assert stage(url, f"{name}-2", name.upper().encode()).status_code == 200
    first = commit(url, "a-1, b-1, c-1", "p", 0, 0)
    assert first.status_code == 200
    assert commit_body(url, ["a-1", "b-1", "c-1"], "p", 0).status_code == 204
    reordered = commit_body(url, ["b-1", "a-1", "c-1"], "p", 0)
    assert reordered.status_code == 409 and error_code(reordered) == "DUPLICATE_PAYLOAD_MISMATCH"
    second = commit_body(url, ["a-2", "b-2", "c-2"], "p", 1)
    assert second.status_code == 200
    assert commit(url, "a-2,b-2,c-2", "p", 0, 1).status_code == 204
    assert requests.get(url, params={"offset": "-1"}).content == b"abcABC"


def test_a_commit_key_recognises_the_same_commit_made_with_other_handles(
    durastream_server: ServerProcess,
) -> None:
    url = durastream_server.stream_url(unique("keys"))
    create(url)
    key = {"Durastream-Commit-Key": "sink-txn"}
    assert stage(url, "run1", b"one;").status_code == 200
    assert stage(url, "run2", b"two;").status_code == 200
    assert commit_body(url, ["run1"], "p", **key).status_code == 200
    # A replay re-staged its data under a new handle: same key, same tuple, a duplicate.
    replay = commit_body(url, ["run2"], "p", **key)
    assert replay.status_code == 204 and replay.headers["Producer-Seq"] == "0"
    # A duplicate is decided before the handles are looked at: a probe naming no staged handle.
    assert commit(url, "never-staged", "p", 0, 0, **key).status_code == 204
    other = commit(url, "never-staged", "p", 0, 0, **{"Durastream-Commit-Key": "another"})
    assert other.status_code == 409 and error_code(other) == "DUPLICATE_PAYLOAD_MISMATCH"
    unkeyed = commit(url, "run1", "p", 0, 0)
    assert unkeyed.status_code == 409 and error_code(unkeyed) == "DUPLICATE_PAYLOAD_MISMATCH"

    # A tuple first used by an append is never taken for a keyed commit...
    appended = requests.post(
        url, data=b"plain;", headers={"Content-Type": TEXT, **producer("q", 0, 0)}
    )
    assert appended.status_code == 200
    keyed = commit(url, "never-staged", "q", 0, 0, **key)
    assert keyed.status_code == 409 and error_code(keyed) == "DUPLICATE_PAYLOAD_MISMATCH"
    assert keyed.headers["Producer-Seq"] == "0"
    # ...and a probe at a tuple nobody used applies nothing (the handle does not exist).
    fresh = commit(url, "never-staged", "r", 0, 0, **key)
    assert fresh.status_code == 404 and error_code(fresh) == "TXN_NOT_FOUND"
    assert requests.get(url, params={"offset": "-1"}).content == b"one;plain;"
    assert stage(url, "run3", b"three;").status_code == 200
    assert commit(url, "run3", "r", 0, 0, **key).status_code == 200
    assert requests.get(url, params={"offset": "-1"}).content == b"one;plain;three;"


def test_bad_handle_lists_and_keys_are_refused_by_name(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("list-errors"))
    create(url)
    assert stage(url, "h", b"x").status_code == 200
    cases = [
        (b"", {"Durastream-Commit": "@body"}, "needs the handle list as the request body"),
        (b"h, no spaces", {"Durastream-Commit": "@body"}, "'no spaces'"),
        (b"h,,h2", {"Durastream-Commit": "@body"}, "''"),
        (b"h, h", {"Durastream-Commit": "@body"}, "'h' more than once"),
        ("h, \u00e9".encode(), {"Durastream-Commit": "@body"}, "must be ASCII"),
        (b"x" * (10_000 * 256 + 1), {"Durastream-Commit": "@body"}, "at most 2560000 bytes"),
        (
            ",".join(f"h{i}" for i in range(10_001)).encode(),
            {"Durastream-Commit": "@body"},
            "lists 10001 handles; at most 10000",
        ),
        (b"", {"Durastream-Abort": "@body"}, "Durastream-Abort: @body"),
        (b"h", {"Durastream-Abort": "h"}, "takes an empty body"),
        (b"", {"Durastream-Commit": "h", "Durastream-Commit-Key": "no spaces"}, "Commit-Key"),
        (b"", {"Durastream-Abort": "h", "Durastream-Commit-Key": "k"}, "only valid together"),
        (b"", {"Durastream-Commit-Key": "k"}, "only valid together with Durastream-Commit"),
    ]
    for body, headers, message in cases:
        response = requests.post(url, data=body, headers={**headers, **producer("c", 0, 0)})
        assert response.status_code == 400, (headers, response.text)
        assert message in response.json()["error"]["message"], (message, response.text)
    assert requests.get(url, params={"offset": "-1"}).content == b""
