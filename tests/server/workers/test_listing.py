"""The listing of ``--workers 2`` (``shards/fanout.py``): every shard's streams, paged as one server pages.

The merge is checked as a pure function on hand-made pages (a shard that stopped early must bound the
merged page), then end to end: real workers, streams of both shards, small pages, compared with a
one-process server holding the same paths.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import pytest
import requests

from durastream_server import extensions
from durastream_server.shards.fanout import SHARD_PAGE_HEADER, merge_pages
from durastream_server.shards.layout import shard_of
from tests.server.workers.test_handoff import _exited
from tests.server.workers.test_workers import WORKERS, paths_on_both_shards, worker_of_shard
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

TEXT = "text/plain"


def _entry(path: str) -> dict:
    return {"path": path, "content_type": TEXT, "next_offset": "0", "closed": False}


def _page(paths: list[str], next_: str | None) -> dict:
    return {"streams": [_entry(p) for p in paths], "next": next_}


def _paths(page: dict) -> list[str]:
    return [entry["path"] for entry in page["streams"]]


def test_merge_interleaves_by_path_and_cuts_at_the_limit() -> None:
    merged = merge_pages([_page(["a", "c", "e"], None), _page(["b", "d"], None)], limit=3)
    assert (_paths(merged), merged["next"]) == (["a", "b", "c"], "c")
    merged = merge_pages([_page(["a", "c"], None), _page(["b"], None)], limit=3)
    assert (_paths(merged), merged["next"]) == (["a", "b", "c"], None)  # exactly all: no next


def test_merge_stops_at_the_smallest_next_of_a_shard_that_stopped_early() -> None:
    # shard 0 examined up to "c" and may hold more after it: shard 1's "d" and "f" must wait
    merged = merge_pages([_page(["a"], "c"), _page(["b", "d", "f"], None)], limit=10)
    assert (_paths(merged), merged["next"]) == (["a", "b"], "c")
    # a shard that found nothing in its examined range still bounds the page
    merged = merge_pages([_page([], "m"), _page(["k", "z"], None)], limit=10)
    assert (_paths(merged), merged["next"]) == (["k"], "m")
    merged = merge_pages([_page([], "m"), _page([], "q")], limit=10)
    assert (_paths(merged), merged["next"]) == ([], "m")


def _walk(server: ServerProcess, **params: str) -> list[str]:
    """Every page of the listing with ``params``; the paths in the order answered."""
    found: list[str] = []
    after: str | None = None
    for _ in range(1000):
        query = dict(params, **({"after": after} if after is not None else {}))
        response = requests.get(server.stream_url("__ds/x-durastream/streams"), params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        found += _paths(page)
        after = page["next"]
        if after is None:
            return found
    raise AssertionError("the listing never ended")


def _create(server: ServerProcess, path: str) -> None:
    response = requests.put(server.stream_url(path), headers={"Content-Type": TEXT})
    assert response.status_code in (200, 201), response.text


@pytest.fixture
def workers(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    return server_factory(extra_args=WORKERS)


def test_the_listing_pages_every_shards_streams_as_one_server_does(
    workers: ServerProcess, server_factory
) -> None:
    single = server_factory()
    streams = paths_on_both_shards("list/s", each=12) + paths_on_both_shards("other/s", each=3)
    assert {shard_of(p, 2) for p in streams} == {0, 1}
    for path in streams:
        _create(workers, path)
        _create(single, path)
    listed = sorted(p for p in streams if p.startswith("list/"))
    for params in ({"prefix": "list/", "limit": "5"}, {"pattern": "list/*", "limit": "7"}):
        # each page from whichever worker the connection reaches: every path once, in order
        assert _walk(workers, **params) == listed, params
        assert _walk(workers, **params) == _walk(single, **params), params
    assert _walk(workers) == sorted(streams)
    one_page = requests.get(
        workers.stream_url("__ds/x-durastream/streams"), params={"prefix": "list/"}
    ).json()
    assert (_paths(one_page), one_page["next"]) == (listed, None)


def test_the_shard_page_header_from_a_client_still_gets_the_whole_listing(
    workers: ServerProcess,
) -> None:
    streams = paths_on_both_shards("hdr/s", each=3)
    for path in streams:
        _create(workers, path)
    for _ in range(4):  # connections reach either worker
        response = requests.get(
            workers.stream_url("__ds/x-durastream/streams"),
            params={"prefix": "hdr/"},
            headers={SHARD_PAGE_HEADER: "1"},
        )
        assert response.status_code == 200
        assert _paths(response.json()) == sorted(streams)


def test_the_extension_document_advertises_the_listing_and_not_what_workers_refuse(
    workers: ServerProcess,
) -> None:
    response = requests.get(workers.stream_url("__ds/x-durastream/extensions"))
    assert response.status_code == 200
    offered = set(response.json()["extensions"])
    assert "listing" in offered
    assert not offered & extensions.NOT_WITH_WORKERS, offered
    header = {item.split("=")[0].strip() for item in response.headers[extensions.HEADER].split(",")}
    assert header == offered


def answer_while_a_worker_is_down(
    server: ServerProcess,
    resource: str,
    params: dict[str, str],
    down: int = 1,
    *,
    url: str | None = None,
    data: bytes | None = None,
    json_body: Any = None,
) -> requests.Response:
    """The answer to ``resource`` (or to ``url``, outside the stream root; a POST of ``data`` or
    ``json_body`` if given, else a GET) from the surviving worker
    while shard ``down``'s worker is dead (SIGKILLed with the parent stopped, so it is not restarted
    while the request is made); returns once the parent has restarted it."""
    down_pid = worker_of_shard(server, down)
    assert down_pid is not None
    os.kill(server.pid, signal.SIGSTOP)  # no restart while the test looks
    try:
        os.kill(down_pid, signal.SIGKILL)
        poll_until(lambda: _exited(down_pid), "the worker exited", timeout=30)
        answers: list[requests.Response] = []

        def answered() -> bool:
            try:
                answers.append(
                    requests.request(
                        "GET" if data is None and json_body is None else "POST",
                        url or server.stream_url(resource),
                        params=params,
                        data=data,
                        json=json_body,
                        timeout=60,
                    )
                )
            except requests.ConnectionError:  # made while the dead worker's listener closed
                return False
            return True

        poll_until(answered, "an answer from the surviving worker", timeout=60)
        health = requests.get(server.base_url + "/healthz").json()
        assert health["shard"]["index"] != down
    finally:
        os.kill(server.pid, signal.SIGCONT)
    poll_until(
        lambda: worker_of_shard(server, down) not in (None, down_pid),
        "the worker restarted",
        timeout=30,
    )
    return answers[0]


def test_a_listing_while_a_worker_is_down_is_503_never_a_partial_page(
    workers: ServerProcess,
) -> None:
    streams = paths_on_both_shards("down/s", each=2)
    for path in streams:
        _create(workers, path)
    response = answer_while_a_worker_is_down(
        workers, "__ds/x-durastream/streams", {"prefix": "down/"}
    )
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1"
    assert json.loads(response.content)["error"]["code"] == "SHARD_UNAVAILABLE"
    poll_until(
        lambda: (
            requests.get(
                workers.stream_url("__ds/x-durastream/streams"), params={"prefix": "down/"}
            ).status_code
            == 200
        ),
        "the listing served again",
        timeout=60,
    )
    assert _walk(workers, prefix="down/") == sorted(streams)
