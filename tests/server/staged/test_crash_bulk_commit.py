"""SIGKILL the server before, within and after a bulk commit of many streams (``bulk-write``,
docs/extensions.md section 11), restart it, and check that every stream gets its rows exactly once.

A bulk commit is many keyed commits in one request, here half of them of staged handles and half inline
(the rows in the entry); the server applies each as one record of its stream (decision 0008), so a kill
within it leaves some streams committed and the others not. What must hold, per stream, after the
restart:

- the stream holds all of its staged rows or none (a commit is atomic per stream);
- the same bulk commit sent again (the client's retry) completes it: every entry is 200 or 204, every
  stream then holds its rows exactly once;
- a replay with new handles under the same tuples and key (a re-run Spark batch) is a 204 for every
  stream, whether the first run committed it inline or staged, and adds nothing; its handles are then
  aborted in bulk.

The kill "within" is aimed by polling until the first entry's stream shows its rows; with ``STREAMS``
entries committed at most 64 at a time it lands before the last one in practice. The test does not
depend on where it lands: the invariants above hold for every point.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from typing import Any

import pytest
import requests

from durastream_server.http.bulk import encode_requests
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

STREAMS = 300
ROWS = 3
NS = "__ds/x-durastream"
JSON = "application/json"
TIMEOUT = 60


def _bulk(server: ServerProcess, resource: str, entries: list) -> list[dict[str, Any]]:
    response = requests.post(
        server.stream_url(f"{NS}/{resource}"), data=encode_requests(entries), timeout=TIMEOUT
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


def _paths(base: str) -> list[str]:
    return [f"{base}/s{n:04d}" for n in range(STREAMS)]


def _rows(n: int) -> bytes:
    return json.dumps([{"s": n, "i": i} for i in range(ROWS)]).encode()


def _stage_all(server: ServerProcess, base: str, run: str, *, every: int = 1) -> list[str]:
    """Stage each ``every``-th stream's rows under a handle of ``run``; the handle names of all."""
    handles = [f"{run}-{n}" for n in range(STREAMS)]
    entries = [
        (
            path,
            {
                "Durastream-Txn": handle,
                "Content-Type": JSON,
                "Producer-Id": handle,
                "Producer-Epoch": "0",
                "Producer-Seq": "0",
            },
            _rows(n),
        )
        for n, (path, handle) in enumerate(zip(_paths(base), handles, strict=True))
        if n % every == 0
    ]
    assert {r["status"] for r in _bulk(server, "stages", entries)} == {200}
    return handles


def _commits(base: str, handles: list[str], epoch: int, *, inline_odd: bool = False) -> list:
    """Each stream's keyed commit of its handle; with ``inline_odd`` the odd streams' commits carry
    their rows inline instead (nothing staged for them)."""
    entries = []
    for n, (path, handle) in enumerate(zip(_paths(base), handles, strict=True)):
        headers = {
            "Durastream-Commit-Key": "batch",
            "Producer-Id": f"writer-{n}",
            "Producer-Epoch": str(epoch),
            "Producer-Seq": "0",
        }
        if inline_odd and n % 2:
            entries.append((path, {**headers, "Content-Type": JSON}, _rows(n)))
        else:
            entries.append((path, {**headers, "Durastream-Commit": "@body"}, handle.encode()))
    return entries


def _rows_in(server: ServerProcess, path: str) -> list[Any]:
    response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def _send_in_background(server: ServerProcess, entries: list) -> threading.Thread:
    def send() -> None:
        # The server is killed under it: the answer is lost, as the test intends.
        with contextlib.suppress(requests.RequestException):
            requests.post(
                server.stream_url(f"{NS}/commits"), data=encode_requests(entries), timeout=TIMEOUT
            )

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _check_exactly_once_after(server: ServerProcess, base: str, commits: list, epoch: int) -> int:
    """Each stream all-or-nothing; the retried bulk commit completes it; a replay adds nothing.
    Returns how many streams were committed before the retry."""
    paths = _paths(base)
    before = [len(_rows_in(server, path)) for path in paths]
    assert set(before) <= {0, ROWS}, "a stream holds part of its commit"
    retried = _bulk(server, "commits", commits)
    assert {r["status"] for r in retried} <= {200, 204}, retried[:3]
    assert sum(r["status"] == 204 for r in retried) == sum(1 for b in before if b)
    replay_handles = _stage_all(server, base, f"replay{epoch}")
    replayed = _bulk(server, "commits", _commits(base, replay_handles, epoch))
    assert {r["status"] for r in replayed} == {204}
    aborts = [
        (path, {"Durastream-Abort": "@body"}, handle.encode())
        for path, handle in zip(paths, replay_handles, strict=True)
    ]
    assert {r["status"] for r in _bulk(server, "commits", aborts)} == {204}
    for n, path in enumerate(paths):
        assert _rows_in(server, path) == json.loads(_rows(n)), path
    return sum(1 for b in before if b)


def test_sigkill_before_within_and_after_a_bulk_commit(server_factory) -> None:
    server = server_factory()
    response = requests.post(
        server.stream_url(f"{NS}/ensure"), json={"streams": [], "content_type": JSON}, timeout=10
    )
    assert response.status_code == 400  # the resource is there (and refuses an empty list)
    for epoch, point in enumerate(("before", "within", "after")):
        base = f"crash-bulk/{point}"
        ensured = requests.post(
            server.stream_url(f"{NS}/ensure"),
            json={"streams": _paths(base), "content_type": JSON},
            timeout=TIMEOUT,
        )
        assert ensured.status_code == 200
        handles = _stage_all(server, base, f"run{epoch}", every=2)
        commits = _commits(base, handles, epoch, inline_odd=True)
        if point == "within":
            sender = _send_in_background(server, commits)
            first = _paths(base)[0]
            poll_until(lambda first=first: _rows_in(server, first) != [], "the first commit", 60)
            server.kill()
            sender.join(timeout=TIMEOUT)
        elif point == "after":
            assert {r["status"] for r in _bulk(server, "commits", commits)} == {200}
            server.kill()
        else:
            server.kill()
        server.restart()
        committed = _check_exactly_once_after(server, base, commits, epoch)
        expected = {"before": 0, "after": STREAMS}.get(point)
        if expected is not None:
            assert committed == expected, (point, committed)
        else:
            assert committed >= 1, "the kill landed before the first commit was durable"


ROUTED = 200  # new streams per bulk ensure + bulk commits round of the routed writer below


@pytest.mark.parametrize(
    "layout, per_stream",
    [((), False), (("--no-packed-appends",), False), ((), True)],
    ids=["packed", "directories", "packed-multi-part"],
)
def test_sigkill_under_bulk_creates_and_inline_commits_of_many_new_streams(
    server_factory, layout: tuple[str, ...], per_stream: bool
) -> None:
    """The routed sink's requests, batched on the server (one create batch per ``ensure``, one
    settling batch per ``commits``): a writer thread sends rounds of a bulk ``ensure`` of ``ROUTED``
    new streams and their inline commits (two partitions' parts side by side, as the connector lists
    them) until the server is SIGKILLed under it. After the restart: every stream an ``ensure``
    answered as created exists, every acknowledged part is present exactly once, and the writer's
    retry of everything (ensures and commits, same tuples and keys) answers 200 or 204 and leaves
    every stream of every round with both its parts, once, in order. ``per_stream``: a stream's two
    parts as one multi-part entry (``bulk-write`` 2, decision 0011), the same tuples and keys."""
    server = server_factory(extra_args=layout)
    created: list[str] = []
    acked: dict[str, list[int]] = {}  # path -> the parts acknowledged (0, 1)
    sent: list[tuple[list[str], list]] = []
    stop = threading.Event()

    def routed_round(r: int) -> tuple[list[str], list]:
        paths = [f"routed/r{r:03d}/s{n:04d}" for n in range(ROUTED)]
        entries = []
        for n, path in enumerate(paths):
            for part in (0, 1):
                headers = {
                    "Durastream-Commit-Key": "batch",
                    "Producer-Id": f"w{part}-{n}",
                    "Producer-Epoch": "0",
                    "Producer-Seq": "0",
                    "Content-Type": JSON,
                }
                entries.append((path, headers, json.dumps([{"s": n, "p": part}]).encode()))
        if per_stream:  # each stream's two entries as one: producer "w" + suffix "<part>-<n>"
            entries = [
                _multi_part(path, entries[2 * n : 2 * n + 2]) for n, path in enumerate(paths)
            ]
        return paths, entries

    def writer() -> None:
        with contextlib.suppress(requests.RequestException):
            for r in itertools.count():
                if stop.is_set():
                    return
                paths, entries = routed_round(r)
                sent.append((paths, entries))
                ensured = requests.post(
                    server.stream_url(f"{NS}/ensure"),
                    json={"streams": paths, "content_type": JSON},
                    timeout=TIMEOUT,
                )
                assert ensured.status_code == 200, ensured.text
                results = ensured.json()["results"]
                assert all(r.get("created") for r in results), results[:3]
                created.extend(paths)
                for (path, headers, _), result in zip(
                    entries, _bulk(server, "commits", entries), strict=True
                ):
                    for part, answer in enumerate(result.get("parts", [result])):
                        assert answer["status"] == 200, result
                        number = part if per_stream else int(headers["Producer-Id"][1])
                        acked.setdefault(path, []).append(number)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    poll_until(lambda: len(acked) >= 3 * ROUTED or not thread.is_alive(), "three rounds", 120)
    assert thread.is_alive(), "the writer stopped before the kill"
    server.kill()
    stop.set()
    thread.join(timeout=TIMEOUT)
    server.restart()

    for path in created:
        assert requests.head(server.stream_url(path), timeout=TIMEOUT).status_code == 200, path
    for path, parts in acked.items():
        rows = _rows_in(server, path)
        assert set(parts) <= {row["p"] for row in rows}, (path, rows)  # acknowledged: there
        assert len(rows) == len({row["p"] for row in rows}), (path, rows)  # none twice
    for paths, entries in sent:  # the writer's retry of everything it sent
        ensured = requests.post(
            server.stream_url(f"{NS}/ensure"),
            json={"streams": paths, "content_type": JSON},
            timeout=TIMEOUT,
        )
        assert ensured.status_code == 200
        retried = _bulk(server, "commits", entries)
        assert {a["status"] for r in retried for a in r.get("parts", [r])} <= {200, 204}
        for n, path in enumerate(paths):
            assert _rows_in(server, path) == [{"s": n, "p": 0}, {"s": n, "p": 1}], path


def _multi_part(path: str, entries: list) -> tuple[str, dict[str, str], bytes]:
    """Two single-part inline entries of ``path`` (producers ``w0-<n>``, ``w1-<n>``) as one entry
    of two parts under the same tuples: ``Producer-Id: w`` and suffixes ``0-<n>``, ``1-<n>``."""
    headers = dict(entries[0][1])
    headers["Producer-Id"] = "w"
    headers["Durastream-Commit-Parts"] = ",".join(
        f"{h['Producer-Id'][1:]}:{len(body)}" for _, h, body in entries
    )
    return path, headers, b"".join(body for _, _, body in entries)
