"""Staged appends with ``--workers 2`` (decision 0009, "What is left" 2).

A handle belongs to the stream it was staged into, so a stage, a commit and an abort are requests of
that stream, served by its shard's worker (forwarded or handed off there like any request), and bulk
``stages`` and ``commits`` are split by shard (``shards/bulkwrite.py``). Every answer is compared with
a one-process server given the same requests (handle expiry times aside: they are the clock's); then
a bulk repeat is deduplicated, an abort fences, a handle's TTL still sweeps in its shard, and a worker
killed under a bulk request makes it 503 and its retry completes exactly once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from durastream_server import extensions
from durastream_server.http import bulk
from durastream_server.shards.layout import shard_of
from tests.server.workers.test_bulk import refused_then_retried
from tests.server.workers.test_workers import WORKERS, paths_on_both_shards
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

TEXT = "text/plain"
NS = "__ds/x-durastream"
TIMEOUT = 60
EXPIRES = "durastream-txn-expires-at"  # the clock's, not the request's: left out of comparisons
# What a staged-append answer says (besides its status): compared between the two servers.
_COMPARED = (
    "stream-next-offset",
    "durastream-txn-messages",
    "durastream-txn-bytes",
    "producer-epoch",
    "producer-seq",
    "stream-closed",
    "durastream-digest",
)
Call = tuple[str, str, dict[str, str], bytes]  # method, path, headers, body


@pytest.fixture
def workers(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    return server_factory(extra_args=WORKERS)


@pytest.fixture
def servers(workers: ServerProcess, server_factory) -> tuple[ServerProcess, ServerProcess]:  # type: ignore[no-untyped-def]
    """``--workers 2`` and a one-process server, to be given the same requests."""
    return workers, server_factory()


def _producer(pid: str, epoch: int = 0, seq: int = 0) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


def _stage(handle: str, pid: str, **extra: str) -> dict[str, str]:
    return {"Durastream-Txn": handle, "Content-Type": TEXT, **_producer(pid), **extra}


def _answer(response: requests.Response) -> tuple[int, dict[str, str], str | None]:
    """A single request's answer as compared: status, the staged-append headers, the error code."""
    headers = {k: response.headers[k] for k in _COMPARED if k in response.headers}
    code = response.json()["error"]["code"] if response.status_code >= 400 else None
    return response.status_code, headers, code


def _call(server: ServerProcess, call: Call) -> requests.Response:
    method, path, headers, body = call
    return requests.request(
        method, server.stream_url(path), headers=headers, data=body, timeout=TIMEOUT
    )


def _same(servers: tuple[ServerProcess, ServerProcess], call: Call) -> tuple[int, dict, str | None]:
    """Each server's answer to ``call``; they must be the same."""
    answers = [_answer(_call(server, call)) for server in servers]
    assert answers[0] == answers[1], call
    return answers[0]


def _post(server: ServerProcess, resource: str, **kwargs: Any) -> requests.Response:
    return requests.post(server.stream_url(f"{NS}/{resource}"), timeout=TIMEOUT, **kwargs)


def _without_expiry(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for result in results:
        headers = {k.lower(): v for k, v in result.get("headers", {}).items()}
        result["headers"] = {k: v for k, v in headers.items() if k != EXPIRES}
    return results


def _bulk_same(
    servers: tuple[ServerProcess, ServerProcess], resource: str, entries: list
) -> list[dict[str, Any]]:
    """Each server's answer to a bulk ``resource`` of ``entries``; the same document (expiry aside)."""
    body = bulk.encode_requests(entries)
    answers = [_post(server, resource, data=body) for server in servers]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    documents = [_without_expiry(a.json()["results"]) for a in answers]
    assert documents[0] == documents[1]
    return documents[0]


def _read(server: ServerProcess, path: str) -> bytes:
    response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.content


def _staging_files(server: ServerProcess) -> list[Path]:
    return sorted(server.data_dir.glob("shards/*/streams/*/txn/*.stg"))


def test_staged_append_is_advertised_by_every_worker(workers: ServerProcess) -> None:
    assert "staged-append" not in extensions.NOT_WITH_WORKERS
    document = requests.get(workers.stream_url(f"{NS}/extensions")).json()
    assert document["extensions"]["staged-append"] == extensions.EXTENSIONS["staged-append"]
    path = paths_on_both_shards("staged/adv", each=1)[1]
    answer = requests.put(workers.stream_url(path), headers={"Content-Type": TEXT})
    assert "staged-append=2" in answer.headers["Durastream-Extensions"]


def test_stages_commits_and_aborts_on_both_shards_answer_as_one_process(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """The wire sequence of docs/extensions.md section 5 on streams of both shards (each request on
    a new connection: the kernel gives it to either worker, so some are forwarded)."""
    streams = paths_on_both_shards("staged/one", each=2)
    for path in streams:
        assert _same(servers, ("PUT", path, {"Content-Type": TEXT}, b""))[0] == 201
        first = _same(servers, ("POST", path, _stage("a", "w"), b"a1;"))
        assert first[0] == 200 and first[1]["durastream-txn-messages"] == "1"
        assert _same(servers, ("POST", path, _stage("a", "w"), b"a1;"))[0] == 204  # a repeat
        second = _stage("a", "w", **{"Producer-Seq": "1"})
        assert _same(servers, ("POST", path, second, b"a2;"))[0] == 200
        assert _same(servers, ("POST", path, _stage("b", "v"), b"b1;"))[0] == 200
        assert _same(servers, ("POST", path, _stage("x", "v"), b"x1;"))[0] == 200
        abort = {"Durastream-Abort": "x, never-staged"}
        assert _same(servers, ("POST", path, abort, b""))[0] == 204
        commit = {"Durastream-Commit": "@body", **_producer("c", 3)}
        done = _same(servers, ("POST", path, commit, b"b,\na"))
        assert done[0] == 200 and done[1]["durastream-txn-messages"] == "3"
        assert _same(servers, ("POST", path, commit, b"b,\na"))[0] == 204  # a retried commit
        header_form = {"Durastream-Commit": "b, a", **_producer("c", 3)}
        assert _same(servers, ("POST", path, header_form, b""))[0] == 204  # same commit
        fenced = {"Durastream-Commit": "x", **_producer("c", 3, 1)}
        assert _same(servers, ("POST", path, fenced, b""))[2] == "TXN_ABORTED"
        late = _same(servers, ("POST", path, _stage("never-staged", "z"), b"z;"))
        assert late[2] == "TXN_ABORTED"  # a zombie's late stage is fenced
        assert _read(servers[0], path) == _read(servers[1], path) == b"b1;a1;a2;"
    # A handle is its stream's: committing it on a stream of the other shard finds nothing there.
    here, there = streams[0], streams[1]
    assert shard_of(here, 2) != shard_of(there, 2)
    assert _same(servers, ("POST", here, _stage("mine", "m"), b"m;"))[0] == 200
    elsewhere = _same(
        servers, ("POST", there, {"Durastream-Commit": "mine", **_producer("e")}, b"")
    )
    assert elsewhere[2] == "TXN_NOT_FOUND"
    mine = {"Durastream-Commit": "mine", **_producer("e")}
    assert _same(servers, ("POST", here, mine, b""))[0] == 200


def test_bulk_stages_and_commits_over_both_shards_answer_as_one_process_once(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    workers, single = servers
    streams = paths_on_both_shards("staged/bulk", each=4)
    for server in servers:
        answer = _post(server, "ensure", json={"streams": streams, "content_type": TEXT})
        assert answer.status_code == 200, answer.text
    stages = [
        (p, _stage(f"t{k}", f"task-{k}"), f"row-{k};".encode()) for k, p in enumerate(streams)
    ]
    stages += [(p, _stage("gone", "g"), b"never;") for p in streams[:2]]  # aborted below
    stages.insert(3, ("bad/../path", stages[0][1], b"x"))
    stages.insert(5, (streams[0], {"Durastream-Commit": "t0", **_producer("c")}, b""))
    staged = _bulk_same(servers, "stages", stages)
    assert staged[3]["status"] == 400 and "requests[3].path" in staged[3]["error"]["message"]
    assert staged[5]["status"] == 400 and "requests[5]" in staged[5]["error"]["message"]
    good = [i for i in range(len(stages)) if i not in (3, 5)]
    assert [staged[i]["status"] for i in good] == [200] * len(good)
    repeat = _bulk_same(servers, "stages", stages)  # the connector's retry of the whole request
    assert [repeat[i]["status"] for i in good] == [204] * len(good)  # deduplicated, not staged
    files = _staging_files(workers)
    assert len(files) == len(streams) + 2  # one per handle, in its stream's shard
    assert {f.parents[3].name for f in files} == {"0", "1"}

    commits = [
        (p, {"Durastream-Commit": f"t{k}", **_producer("driver", 7)}, b"")
        for k, p in enumerate(streams)
    ]
    committed = _bulk_same(servers, "commits", commits)
    assert [r["status"] for r in committed] == [200] * len(streams)
    assert [r["status"] for r in _bulk_same(servers, "commits", commits)] == [204] * len(streams)
    # Aborts in a request of their own: entries of one request run concurrently, so an abort's
    # answer (the stream's tail) beside a commit of its stream would depend on which ran first.
    aborts = [(p, {"Durastream-Abort": "gone"}, b"") for p in streams[:2]]
    assert [r["status"] for r in _bulk_same(servers, "commits", aborts)] == [204, 204]
    assert [r["status"] for r in _bulk_same(servers, "commits", aborts)] == [204, 204]
    for k, path in enumerate(streams):
        assert _read(workers, path) == _read(single, path) == f"row-{k};".encode()
    poll_until(lambda: _staging_files(workers) == [], "every staging file reclaimed")


def test_a_handle_expires_and_is_swept_in_its_shard(workers: ServerProcess) -> None:
    streams = paths_on_both_shards("staged/ttl", each=1)
    for path in streams:
        requests.put(workers.stream_url(path), headers={"Content-Type": TEXT})
        staged = _call(
            workers, ("POST", path, _stage("short", "s", **{"Durastream-Txn-TTL": "1"}), b"x")
        )
        assert staged.status_code == 200, staged.text
    assert len(_staging_files(workers)) == 2
    poll_until(lambda: _staging_files(workers) == [], "each shard's sweeper to reclaim its handle")
    for path in streams:
        expired = _call(
            workers, ("POST", path, {"Durastream-Commit": "short", **_producer("c")}, b"")
        )
        assert expired.status_code == 410 and expired.json()["error"]["code"] == "TXN_EXPIRED"
        assert _read(workers, path) == b""


def test_a_worker_down_makes_bulk_stages_and_commits_503_then_the_retry_completes_once(
    workers: ServerProcess,
) -> None:
    streams = paths_on_both_shards("staged/down", each=3)
    _post(workers, "ensure", json={"streams": streams, "content_type": TEXT})
    stages = bulk.encode_requests(
        [(p, _stage(f"h{k}", f"task-{k}"), f"r{k};".encode()) for k, p in enumerate(streams)]
    )
    expected = [204 if shard_of(p, 2) == 0 else 200 for p in streams]
    retried = refused_then_retried(workers, "stages", stages)
    assert [r["status"] for r in retried] == expected  # shard 0's: duplicates
    assert [r["headers"]["Durastream-Txn-Messages"] for r in retried] == ["1"] * len(streams)

    commits = bulk.encode_requests(
        [
            (p, {"Durastream-Commit": f"h{k}", **_producer("driver", 1)}, b"")
            for k, p in enumerate(streams)
        ]
    )
    assert [r["status"] for r in refused_then_retried(workers, "commits", commits)] == expected
    for k, path in enumerate(streams):
        assert _read(workers, path) == f"r{k};".encode()  # once, whichever shard
