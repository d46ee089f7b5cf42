"""Stored content is inert: every read of a stream (catch-up, HEAD, long-poll, SSE, the read extensions)
carries ``Content-Security-Policy: sandbox`` and ``X-Content-Type-Options: nosniff``, so a stream of
``text/html`` opened in a browser runs no script in the server's origin. (The long-poll fast path's
answers are compared byte for byte with these in ``test_fastpath.py``.)"""

from __future__ import annotations

import threading
import uuid

import requests

from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

PAGE = b"<html><script>fetch('/v1/stream/secret').then(r => r.text()).then(alert)</script></html>"


def _assert_inert(response: requests.Response, what: str) -> None:
    assert response.headers.get("Content-Security-Policy") == "sandbox", what
    assert response.headers.get("X-Content-Type-Options") == "nosniff", what


def test_every_read_of_a_stream_is_sandboxed(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(f"inert/{uuid.uuid4().hex}")
    created = requests.put(url, data=PAGE, headers={"Content-Type": "text/html"})
    assert created.status_code == 201
    tail = created.headers["Stream-Next-Offset"]

    catch_up = requests.get(url, params={"offset": "-1"})
    assert catch_up.headers["Content-Type"].startswith("text/html") and catch_up.content == PAGE
    _assert_inert(catch_up, "catch-up read")
    _assert_inert(requests.head(url), "HEAD")
    _assert_inert(requests.get(url, params={"offset": tail, "live": "long-poll"}), "long-poll 204")

    woken: list[requests.Response] = []
    waiter = threading.Thread(
        target=lambda: woken.append(
            requests.get(url, params={"offset": tail, "live": "long-poll"}, timeout=30)
        )
    )
    waiter.start()
    poll_until(
        lambda: requests.get(durastream_server.base_url + "/healthz").json()["waiters"] >= 1,
        "the long-poll to park",
    )
    assert requests.post(url, data=PAGE, headers={"Content-Type": "text/html"}).status_code == 204
    waiter.join(30)
    assert woken[0].status_code == 200 and woken[0].content == PAGE
    _assert_inert(woken[0], "woken long-poll")

    with requests.get(url, params={"offset": "-1", "live": "sse"}, stream=True, timeout=10) as sse:
        assert sse.status_code == 200
        _assert_inert(sse, "SSE")
    _assert_inert(requests.get(url, params={"offset": "-1", "format": "frames"}), "frames")
    _assert_inert(requests.get(url, params={"offset": "-1", "end": tail}), "bounded read")
    _assert_inert(requests.get(url, params={"offset": "-1", "lookup": "limit"}), "limit lookup")
    _assert_inert(requests.get(url + "-missing", params={"offset": "-1"}), "404")
