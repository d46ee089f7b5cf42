"""The change feed of ``--workers 2`` (``shards/changefeed.py``): every shard's changes, one cursor.

The cursor and the merge are checked as pure functions, then end to end: real workers, streams of both
shards, small pages compared with a one-process server fed the same appends, the idle wait woken by
either shard, selections, bad cursors, and a worker that dies.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sys
import uuid

import pytest
import requests

from durastream_server import extensions
from durastream_server.errors import InvalidParameter
from durastream_server.shards.changefeed import CompositeCursor, merge_parts, refill, shares
from durastream_server.shards.layout import shard_of
from tests.server.workers.test_listing import answer_while_a_worker_is_down
from tests.server.workers.test_workers import (
    WORKERS,
    paths_on_both_shards,
    worker_of_shard,
)
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

TEXT = "text/plain"
CHANGES = "__ds/x-durastream/changes"
WRITER = "writer-token-0123456789"
TENANT = "tenant-token-0123456789"


def _part(paths: list[str], cursor: str, more: bool = False) -> dict:
    return {
        "changes": [{"path": p, "next_offset": "1"} for p in paths],
        "cursor": cursor,
        "more": more,
        "reset": False,
    }


def test_a_composite_cursor_round_trips_and_refuses_what_it_is_not() -> None:
    cursor = CompositeCursor(("e0:3", ""), 1)
    assert CompositeCursor.decode(cursor.encode(), 2) == cursor
    for bad in ("e0:3", "garbage", "w1.2.", "w1.2.!!!", "w2.2.MDs", cursor.encode() + "x"):
        with pytest.raises(InvalidParameter, match="since"):
            CompositeCursor.decode(bad, 2)
    with pytest.raises(InvalidParameter, match="since.*--workers 2"):
        CompositeCursor.decode(cursor.encode(), 3)


def test_the_limit_is_split_and_a_part_that_does_not_fit_keeps_its_cursor() -> None:
    assert shares(10, 2) == [5, 5] and shares(5, 2) == [3, 2] and shares(1, 2) == [1, 1]
    state = CompositeCursor(("a:1", "b:1"), 0)
    page = merge_parts({0: _part(["x"], "a:2"), 1: _part(["y"], "b:2")}, state, 1, reset=False)
    # limit 1 below N = 2: shard 1's part is dropped whole, its cursor stays; shard 1 goes first next
    assert [c["path"] for c in page["changes"]] == ["x"] and page["more"]
    assert CompositeCursor.decode(page["cursor"], 2) == CompositeCursor(("a:2", "b:1"), 1)
    page = merge_parts({0: _part([], "a:2"), 1: _part(["y"], "b:2")}, state, 1, reset=False)
    assert CompositeCursor.decode(page["cursor"], 2).cursors == ("a:2", "b:2")
    assert not page["more"]


def test_a_short_part_leaves_its_room_to_the_shards_that_have_more() -> None:
    state = CompositeCursor(("a:1", "b:1"), 1)
    first = {0: _part(["x"] * 5, "a:6", more=True), 1: _part(["y"] * 2, "b:3")}
    assert refill(first, [1, 0], 10) == {0: 3}  # shard 1 used 2 of its 5: shard 0 asked for 3 more
    again = {0: _part(["z"] * 3, "a:9", more=True)}
    page = merge_parts(first, state, 10, reset=False, again=again)
    assert [c["path"] for c in page["changes"]] == ["y"] * 2 + ["x"] * 5 + ["z"] * 3
    assert page["more"] and CompositeCursor.decode(page["cursor"], 2).cursors == ("a:9", "b:3")
    # no room, or no shard with more: no second round
    assert (
        refill({0: _part(["x"] * 5, "a:6", more=True), 1: _part(["y"] * 5, "b:6")}, [0, 1], 10)
        == {}
    )
    assert refill({0: _part(["x"], "a:2"), 1: _part([], "b:1")}, [0, 1], 10) == {}
    # limit below N: the room goes to the first shards in turn order, one entry each
    assert refill({0: _part([], "a:1", more=True), 1: _part([], "b:1", more=True)}, [1, 0], 1) == {
        1: 1
    }
    # a second part that would overflow, or that says reset (a restart between the rounds), is
    # dropped: its shard's cursor stays at the end of its first part
    for bad in (_part(["z"] * 4, "a:10"), {**_part(["z"], "e2:1"), "reset": True}):
        page = merge_parts(first, state, 10, reset=False, again={0: bad})
        assert len(page["changes"]) == 7 and page["more"]
        assert CompositeCursor.decode(page["cursor"], 2).cursors == ("a:6", "b:3")


def _create_and_append(server: ServerProcess, path: str, body: str) -> None:
    response = requests.put(server.stream_url(path), headers={"Content-Type": TEXT})
    assert response.status_code in (200, 201), response.text
    _append(server, path, body)


def _append(server: ServerProcess, path: str, body: str) -> None:
    response = requests.post(server.stream_url(path), data=body, headers={"Content-Type": TEXT})
    assert response.status_code in (200, 204), response.text


def _ask(server: ServerProcess, **params: str) -> dict:
    response = requests.get(server.stream_url(CHANGES), params=params, timeout=90)
    assert response.status_code == 200, response.text
    return response.json()


def _walk(server: ServerProcess, since: str | None, **params: str) -> tuple[list[tuple], str]:
    """Every page from ``since`` until ``more`` is false: the (path, next_offset) in the order
    answered, and the cursor after them."""
    found: list[tuple] = []
    for _ in range(1000):
        page = _ask(server, **params, **({"since": since} if since is not None else {}))
        found += [(c["path"], c.get("next_offset")) for c in page["changes"]]
        assert len(page["changes"]) <= int(params.get("limit", "1000"))
        since = page["cursor"]
        if not page["more"]:
            return found, since
    raise AssertionError("the change feed never ended")


@pytest.fixture
def workers(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    return server_factory(extra_args=WORKERS)


def test_the_feed_reports_both_shards_and_resumes_without_loss_or_repeat(
    workers: ServerProcess, server_factory
) -> None:
    single = server_factory()
    streams = paths_on_both_shards("feed/s", each=6)
    for server in (workers, single):
        for path in streams:
            _create_and_append(server, path, "first")
    walked: dict[str, list[tuple]] = {}
    cursors: dict[str, str] = {}
    for name, server in (("workers", workers), ("single", single)):
        walked[name], cursors[name] = _walk(server, None, prefix="feed/", limit="3")
        assert sorted(p for p, _ in walked[name]) == sorted(streams), name  # each once
    assert sorted(walked["workers"]) == sorted(walked["single"])
    assert {"changes"} <= set(
        requests.get(workers.stream_url("__ds/x-durastream/extensions")).json()["extensions"]
    )

    later = streams[1::3] + streams[::4]  # streams of both shards, some twice
    assert {shard_of(p, 2) for p in later} == {0, 1}
    for server in (workers, single):
        for path in later:
            _append(server, path, "again")
    for name, server in (("workers", workers), ("single", single)):
        walked[name], cursors[name] = _walk(server, cursors[name], prefix="feed/", limit="2")
        assert sorted(p for p, _ in walked[name]) == sorted(set(later)), name
    assert sorted(walked["workers"]) == sorted(walked["single"])
    assert _walk(workers, cursors["workers"], prefix="feed/")[0] == []  # nothing repeated


def _paths_of_shards(prefix: str, counts: dict[int, int]) -> list[str]:
    """Fresh stream paths, ``counts[k]`` of them on shard ``k`` (of 2)."""
    found: dict[int, list[str]] = {shard: [] for shard in counts}
    while any(len(found[shard]) < count for shard, count in counts.items()):
        path = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if len(found[shard_of(path, 2)]) < counts[shard_of(path, 2)]:
            found[shard_of(path, 2)].append(path)
    return [path for paths in found.values() for path in paths]


def test_a_page_is_filled_from_the_busy_shard_when_the_other_has_few_changes(
    workers: ServerProcess, server_factory
) -> None:
    single = server_factory()
    streams = _paths_of_shards("fill/s", {0: 180, 1: 20})  # 90% of the changes on one shard
    for server in (workers, single):
        for path in streams:
            _create_and_append(server, path, "first")
    page = _ask(workers, prefix="fill/", limit="100")
    # shard 1's part holds its 20 of its share of 50: the other 30 go to shard 0 in a second round
    assert len(page["changes"]) == 100 and page["more"]
    walked: dict[str, list[tuple]] = {}
    for name, server in (("workers", workers), ("single", single)):
        walked[name], _ = _walk(server, None, prefix="fill/", limit="100")
        assert sorted(p for p, _ in walked[name]) == sorted(streams), name  # each once
    assert sorted(walked["workers"]) == sorted(walked["single"])
    cursor = page["cursor"]
    rest, _ = _walk(workers, cursor, prefix="fill/", limit="100")  # the first page's rest: 100 more
    assert len(rest) == 100
    assert sorted({c["path"] for c in page["changes"]} | {p for p, _ in rest}) == sorted(streams)


def test_a_cursor_this_server_did_not_answer_is_400_naming_since(workers: ServerProcess) -> None:
    good = _ask(workers)["cursor"]
    assert good.startswith("w1.2.")
    for bad in (
        "3f9a1c0e22b4:12",  # a one-process cursor
        "not-a-cursor",
        CompositeCursor(("e:1", "e:1", "e:1"), 0).encode(),  # another N
        "w9" + good[2:],  # another version
        good[:-3] + "%%%",
    ):
        response = requests.get(workers.stream_url(CHANGES), params={"since": bad})
        assert response.status_code == 400, (bad, response.text)
        error = response.json()["error"]
        assert error["code"] == "INVALID_PARAMETER" and "since" in error["message"], error


def test_a_selection_registered_on_any_worker_selects_on_every_shard(
    workers: ServerProcess, server_factory
) -> None:
    single = server_factory()
    streams = paths_on_both_shards("sel/s", each=3)
    chosen = streams[:4]
    ids = set()
    for server in (workers, single):
        for path in streams:
            _create_and_append(server, path, "x")
        response = requests.post(
            server.stream_url("__ds/x-durastream/selections"), json={"streams": chosen}
        )
        assert response.status_code == 200, response.text
        assert response.json()["streams"] == len(chosen)
        ids.add(response.json()["selection"])
    assert len(ids) == 1  # the same id with one process and with two
    (selection,) = ids
    for _ in range(4):  # from whichever worker each connection reaches
        found, _cursor = _walk(workers, None, selection=selection, limit="1")
        assert sorted(p for p, _ in found) == sorted(chosen)


def _fed(server: ServerProcess, prefix: str, each: int) -> tuple[list[str], str]:
    """``each`` streams per shard under ``prefix``, each with a message; the feed's cursor after them."""
    streams = paths_on_both_shards(prefix + "s", each=each)
    for path in streams:
        _create_and_append(server, path, "x")
    return streams, _walk(server, None, prefix=prefix)[1]


def _parked(server: ServerProcess, count: int) -> bool:
    return server.waiters() == count  # /healthz sums every shard's


def test_an_idle_wait_wakes_on_either_shards_append_and_ends_empty_at_its_bound(
    workers: ServerProcess,
) -> None:
    streams, cursor = _fed(workers, "wait/", each=1)
    quiet = _ask(workers, since=cursor, prefix="wait/", wait="300")
    assert (quiet["changes"], quiet["more"], quiet["reset"]) == ([], False, False)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # each shard's stream in turn: for the worker that got the query, one of them is the other's
        for path in streams:
            waiting = pool.submit(_ask, workers, since=cursor, prefix="wait/", wait="60000")
            poll_until(lambda: _parked(workers, 2), "the wait parked in both shards", timeout=30)
            _append(workers, path, "wake")
            page = waiting.result(timeout=30)  # well before its 60 s bound
            assert [c["path"] for c in page["changes"]] == [path]
            poll_until(lambda: _parked(workers, 0), "the other shard's wait released", timeout=30)
            cursor = page["cursor"]
    assert _ask(workers, since=cursor, prefix="wait/")["changes"] == []


def test_the_feed_while_a_worker_is_down_is_503_then_a_reset_once_it_is_back(
    workers: ServerProcess,
) -> None:
    streams, cursor = _fed(workers, "down/", each=2)
    response = answer_while_a_worker_is_down(
        workers, CHANGES, {"since": cursor, "prefix": "down/", "wait": "1000"}
    )
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1"
    assert json.loads(response.content)["error"]["code"] == "SHARD_UNAVAILABLE"
    poll_until(
        lambda: (
            requests.get(workers.stream_url(CHANGES), params={"since": cursor}).status_code == 200
        ),
        "the feed served again",
        timeout=60,
    )
    # the restarted shard cannot continue its cursor: the whole feed starts over, every stream once
    page = _ask(workers, since=cursor, prefix="down/")
    assert page["reset"]
    found = [c["path"] for c in page["changes"]]
    if page["more"]:
        found += [p for p, _ in _walk(workers, page["cursor"], prefix="down/")[0]]
    assert sorted(found) == sorted(streams)
    assert "changes" not in extensions.NOT_WITH_WORKERS


def test_a_selection_a_restarted_worker_forgot_is_404_then_registered_again(
    workers: ServerProcess,
) -> None:
    streams, _cursor = _fed(workers, "forgot/", each=2)
    url = workers.stream_url("__ds/x-durastream/selections")
    selection = requests.post(url, json={"streams": streams}).json()["selection"]
    down_pid = worker_of_shard(workers, 1)
    assert down_pid is not None
    os.kill(down_pid, signal.SIGKILL)  # the parent restarts it, with no selection in memory
    poll_until(
        lambda: worker_of_shard(workers, 1) not in (None, down_pid), "the restart", timeout=30
    )

    def status() -> int:
        return requests.get(
            workers.stream_url(CHANGES), params={"selection": selection}
        ).status_code

    poll_until(lambda: status() == 404, "the forgotten selection answered 404", timeout=60)
    response = requests.get(workers.stream_url(CHANGES), params={"selection": selection})
    assert response.json()["error"]["code"] == "SELECTION_NOT_FOUND"
    again = requests.post(url, json={"streams": streams}).json()
    assert again == {"selection": selection, "streams": len(streams)}
    found, _ = _walk(workers, None, selection=selection, limit="3")
    assert sorted(p for p, _ in found) == sorted(streams)


def test_every_shard_checks_the_clients_token_and_its_prefix(server_factory) -> None:  # type: ignore[no-untyped-def]
    secured = server_factory(
        extra_args=(*WORKERS, "--auth-token", WRITER, "--auth-token", f"{TENANT}:read-only:ten/")
    )
    writer = {"Authorization": f"Bearer {WRITER}"}
    tenant = {"Authorization": f"Bearer {TENANT}"}
    streams = paths_on_both_shards("ten/s", each=2)
    for path in [*streams, *paths_on_both_shards("other/s", each=1)]:
        response = requests.put(secured.stream_url(path), headers={**writer, "Content-Type": TEXT})
        assert response.status_code == 201, response.text
    url = secured.stream_url(CHANGES)
    page = requests.get(url, params={"prefix": "ten/"}, headers=tenant).json()
    assert sorted(c["path"] for c in page["changes"]) == sorted(streams)  # both shards' parts
    assert requests.get(url, headers=tenant).status_code == 403  # no prefix: beyond its streams
    assert requests.get(url, params={"prefix": "ten/"}).status_code == 401
