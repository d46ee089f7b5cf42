"""``bulk-write`` with ``--workers 2`` (``shards/bulkwrite.py``): a bulk request split by shard.

End to end against real workers and, for every answer, a one-process server given the same bodies:
an ``ensure`` of paths of both shards, ``commits`` of inline commits of both shards and their retry
(``stages`` and commits of handles: test_staged.py),
bad bodies and bad entries, and a worker that dies mid-way (the whole request is 503, then served and
deduplicated). The rule that a shard's 4xx for its part is relayed, never made a 503, is checked on
the fan-out with a stand-in router (fault injection: the receiving worker's own checks make a real
shard's 4xx unreachable).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from durastream_server import extensions
from durastream_server.errors import ProtocolError, ShardUnavailable
from durastream_server.http import bulk
from durastream_server.shards.bulkwrite import BulkFanOut, ShardRefused
from durastream_server.shards.layout import shard_of
from tests.server.workers.test_listing import answer_while_a_worker_is_down
from tests.server.workers.test_workers import WORKERS, paths_on_both_shards
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

TEXT = "text/plain"
NS = "__ds/x-durastream"
TIMEOUT = 60


@pytest.fixture
def workers(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    return server_factory(extra_args=WORKERS)


def _post(server: ServerProcess, resource: str, **kwargs: Any) -> requests.Response:
    return requests.post(server.stream_url(f"{NS}/{resource}"), timeout=TIMEOUT, **kwargs)


def _both(servers: tuple[ServerProcess, ServerProcess], resource: str, **kwargs: Any) -> dict:
    """The answer of each server to the same request; they must be the same document."""
    answers = [_post(server, resource, **kwargs) for server in servers]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    documents = [a.json() for a in answers]
    assert documents[0] == documents[1]
    return documents[0]


def _producer(pid: str) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": "0", "Producer-Seq": "0"}


def _inline(path: str, body: bytes, pid: str, key: str = "k") -> tuple[str, dict[str, str], bytes]:
    headers = {"Content-Type": TEXT, "Durastream-Commit-Key": key, **_producer(pid)}
    return path, headers, body


def _read(server: ServerProcess, path: str) -> bytes:
    response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.content


def _listed(server: ServerProcess, prefix: str) -> list[str]:
    response = requests.get(server.stream_url(f"{NS}/streams"), params={"prefix": prefix})
    assert response.status_code == 200, response.text
    return [entry["path"] for entry in response.json()["streams"]]


def test_bulk_write_and_staged_appends_are_advertised(workers: ServerProcess) -> None:
    """Both are served (bulk ``stages`` and commits of handles: tests/server/workers/test_staged.py)."""
    assert not {"bulk-write", "staged-append"} & extensions.NOT_WITH_WORKERS
    advertised = requests.get(workers.stream_url(f"{NS}/extensions")).json()["extensions"]
    assert "bulk-write" in advertised and "staged-append" in advertised


@pytest.fixture
def servers(workers: ServerProcess, server_factory) -> tuple[ServerProcess, ServerProcess]:  # type: ignore[no-untyped-def]
    """``--workers 2`` and a one-process server, to be given the same requests."""
    return workers, server_factory()


def test_an_ensure_of_both_shards_creates_each_once_as_one_process_does(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    workers = servers[0]
    streams = paths_on_both_shards("bulk/e", each=4)
    listed = [*streams[:3], "a/../b", *streams[3:], streams[0]]  # a bad path, a path twice
    first = _both(servers, "ensure", json={"streams": listed, "content_type": TEXT})["results"]
    assert [r.get("created") for r in first] == [True] * 3 + [None] + [True] * 5 + [False]
    assert first[3]["status"] == 400 and "streams[3]" in first[3]["error"]["message"]
    assert sorted(_listed(workers, "bulk/")) == sorted(streams)  # each once, in its shard
    for path in streams:
        assert requests.head(workers.stream_url(path)).status_code == 200

    again = _both(servers, "ensure", json={"streams": streams, "content_type": TEXT})["results"]
    assert [r["created"] for r in again] == [False] * len(streams)  # as PUT of an existing one

    # Another content type for existing streams: each answered as it is (its own type), as one
    # process answers it (documents compared); the writer refuses the mismatch (only a create racing
    # another gives PUT's 409, decision 0008).
    clash = _both(servers, "ensure", json={"streams": streams, "content_type": "application/json"})
    assert [r["content_type"] for r in clash["results"]] == [TEXT] * len(streams)


def test_racing_ensures_of_both_shards_create_each_stream_once(workers: ServerProcess) -> None:
    """Two ensures of the same new paths with other content types, at once: each path is created by
    one of them; the other answers the stream as it is, or PUT's 409 if its create raced (decision
    0008), at that path's index."""
    streams = paths_on_both_shards("bulk/race", each=100)
    types = (TEXT, "application/octet-stream")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(
                lambda t: _post(workers, "ensure", json={"streams": streams, "content_type": t}),
                types,
            )
        )
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    results = [a.json()["results"] for a in answers]
    put = requests.put(workers.stream_url(streams[0]), headers={"Content-Type": "text/csv"})
    assert put.status_code == 409
    for index, path in enumerate(streams):
        made = [k for k in (0, 1) if results[k][index].get("created")]
        assert len(made) == 1, (path, results[0][index], results[1][index])
        winner, other = types[made[0]], results[1 - made[0]][index]
        if "error" in other:
            assert (other["status"], other["error"]["code"]) == (409, put.json()["error"]["code"])
        else:
            assert other["content_type"] == winner and not other["created"]
        head = requests.head(workers.stream_url(path))
        assert head.headers["Content-Type"] == winner


def test_commits_of_both_shards_answer_as_one_process_and_a_retry_is_deduplicated(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    workers, single = servers
    streams = paths_on_both_shards("bulk/c", each=5)
    _both(servers, "ensure", json={"streams": streams, "content_type": TEXT})
    entries = [_inline(path, f"row-{k};".encode(), "p-0") for k, path in enumerate(streams)]
    entries.insert(4, (streams[0], {"Content-Type": TEXT, "Durastream-Commit-Key": "k"}, b"x"))
    entries.insert(7, ("bad/../path", entries[0][1], b"y"))
    entries.insert(2, (streams[1], {"Durastream-Txn": "h", "Content-Type": TEXT}, b"z"))
    body = bulk.encode_requests(entries)

    first = _both(servers, "commits", data=body)["results"]
    assert first[2]["status"] == 400 and "requests[2]" in first[2]["error"]["message"]  # a stage
    assert first[5]["status"] == 400 and "Producer-Id" in first[5]["error"]["message"]
    assert first[8]["status"] == 400 and "requests[8].path" in first[8]["error"]["message"]
    inline = [i for i, entry in enumerate(entries) if entry[0] in streams and i not in (2, 5)]
    assert [first[i]["status"] for i in inline] == [200] * len(streams)

    retry = _both(servers, "commits", data=body)["results"]  # the connector's retry of the whole
    assert [retry[i]["status"] for i in inline] == [204] * len(streams)
    for k, path in enumerate(streams):
        assert _read(workers, path) == _read(single, path) == f"row-{k};".encode()


def test_bad_bodies_are_the_4xx_one_process_gives(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    workers, single = servers
    for resource, kwargs in (
        ("ensure", {"json": {"streams": [], "content_type": TEXT}}),
        ("ensure", {"json": {"streams": ["a"], "content_type": TEXT, "create": "yes"}}),
        ("ensure", {"data": b"{not json"}),
        ("commits", {"data": b"DSR1"}),
        ("commits", {"data": bulk.encode_requests([("a", {}, b"x")])[:-1]}),
    ):
        answers = [_post(server, resource, **kwargs) for server in (workers, single)]
        assert answers[0].status_code == answers[1].status_code == 400, kwargs
        assert answers[0].json() == answers[1].json()
    assert requests.get(workers.stream_url(f"{NS}/ensure")).status_code == 405


def refused_then_retried(server: ServerProcess, resource: str, body: bytes) -> list[dict]:
    """The results of bulk ``resource`` of ``body`` retried whole after its 503 while shard 1's
    worker was down (the surviving worker, shard 0, answered it and applied its own entries)."""
    refused = answer_while_a_worker_is_down(server, f"{NS}/{resource}", {}, 1, data=body)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "SHARD_UNAVAILABLE"
    assert refused.headers["Retry-After"] == "1"
    served = _post(server, resource, data=body)  # the whole request again, once restarted
    assert served.status_code == 200, served.text
    return served.json()["results"]


def test_a_worker_down_makes_the_whole_request_503_then_a_retry_is_served_once(
    workers: ServerProcess,
) -> None:
    streams = paths_on_both_shards("bulk/down", each=3)
    _post(workers, "ensure", json={"streams": streams, "content_type": TEXT})
    entries = [_inline(path, f"r{k};".encode(), "p-d") for k, path in enumerate(streams)]
    results = refused_then_retried(workers, "commits", bulk.encode_requests(entries))
    statuses = [result["status"] for result in results]
    assert statuses == [204 if shard_of(p, 2) == 0 else 200 for p in streams]
    for k, path in enumerate(streams):
        assert _read(workers, path) == f"r{k};".encode()  # once, whichever shard


class _Router:
    """A stand-in for ``ShardRouter`` (fault injection): shard 1 answers ``answer`` or raises it."""

    index, count = 0, 2

    def __init__(self, answer: tuple[int, bytes] | Exception) -> None:
        self.answer = answer

    def holders(self) -> Callable[[str], int]:
        return lambda path: shard_of(path, self.count)  # no fork placed elsewhere

    async def fetch(self, shard: int, head: bytes) -> tuple[int, bytes]:
        assert shard == 1 and b"x-durastream-shard-page: 1" in head
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "status", "code"),
    [
        ((403, b'{"error":{"code":"FORBIDDEN","message":"no"}}'), 403, "FORBIDDEN"),
        ((413, b"not json"), 413, "BAD_REQUEST"),
        ((500, b'{"error":{"code":"INTERNAL","message":"x"}}'), 503, "SHARD_UNAVAILABLE"),
        ((200, b'{"results":[]}'), 503, "SHARD_UNAVAILABLE"),  # not one answer per entry
        (ShardUnavailable("down"), 503, "SHARD_UNAVAILABLE"),
    ],
)
def test_a_shards_4xx_is_relayed_and_anything_else_is_503(
    answer: tuple[int, bytes] | Exception, status: int, code: str
) -> None:
    paths = paths_on_both_shards("bulk/fault", each=1)
    request = SimpleNamespace(
        raw_path=b"/v1/stream/__ds/x-durastream/ensure", query_string=b"", headers={}, token=None
    )
    body = bulk.EnsureBody(paths, TEXT, True)

    async def here(part: bulk.EnsureBody) -> list[dict[str, Any]]:
        return [{"created": True} for _ in part.streams]

    fan = BulkFanOut(_Router(answer))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError) as raised:
        asyncio.run(fan.ensure(request, body, here))  # type: ignore[arg-type]
    assert raised.value.status == status and raised.value.code == code
    assert isinstance(raised.value, ShardRefused) == (status < 500)
    good = json.dumps({"results": [{"created": False}]}).encode()
    answers = asyncio.run(BulkFanOut(_Router((200, good))).ensure(request, body, here))  # type: ignore[arg-type]
    assert answers == [{"created": True}, {"created": False}]  # each at its index


def test_each_shard_checks_the_clients_token_and_its_prefix(server_factory) -> None:  # type: ignore[no-untyped-def]
    """The parts carry the client's token: a prefixed token's paths outside its prefix are 403 at
    their index, those inside are created in both shards; no token is the request's 401."""
    writer, tenant = "writer-token-0123456789", "tenant-token-0123456789"
    server = server_factory(
        extra_args=(*WORKERS, "--auth-token", writer, "--auth-token", f"{tenant}:read-write:ten/")
    )
    inside = paths_on_both_shards("ten/a", each=2)
    outside = paths_on_both_shards("other/a", each=1)
    listed = [inside[0], outside[0], inside[1], outside[1], *inside[2:]]
    body = {"streams": listed, "content_type": TEXT}
    assert _post(server, "ensure", json=body).status_code == 401
    answer = _post(server, "ensure", json=body, headers={"Authorization": f"Bearer {tenant}"})
    assert answer.status_code == 200, answer.text
    statuses = [r.get("status", 200) for r in answer.json()["results"]]
    assert statuses == [200, 403, 200, 403, 200, 200]
    auth = {"Authorization": f"Bearer {writer}"}
    for path in inside:
        assert requests.head(server.stream_url(path), headers=auth).status_code == 200
    for path in outside:
        assert requests.head(server.stream_url(path), headers=auth).status_code == 404
