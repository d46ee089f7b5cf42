"""Long-poll and SSE against the real server: timeouts, EOF, wake-ups, deletes, reconnects and shutdown."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading
import time
import uuid

import requests

from tests.support.http import poll_until, sse_events
from tests.support.server_process import ServerProcess

TEXT = "text/plain"


def unique(name: str) -> str:
    return f"live/{name}-{uuid.uuid4().hex[:10]}"


def create(url: str, body: bytes = b"", content_type: str = TEXT) -> str:
    response = requests.put(url, data=body, headers={"Content-Type": content_type})
    assert response.status_code == 201, response.text
    return response.headers["Stream-Next-Offset"]


def test_long_poll_timeout_answers_204_with_cursor(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("timeout"))
    tail = create(url, b"x")
    started = time.monotonic()
    response = requests.get(url, params={"offset": tail, "live": "long-poll"}, timeout=10)
    elapsed = time.monotonic() - started
    assert response.status_code == 204
    assert elapsed >= 0.4  # it waited for the server's 0.5 s timeout (a lower bound cannot flake)
    assert response.headers["Stream-Next-Offset"] == tail
    assert response.headers["Stream-Up-To-Date"] == "true"
    assert response.headers["Stream-Cursor"].isdigit()
    assert response.headers["Cache-Control"] == "no-store"
    assert "Stream-Closed" not in response.headers
    echoed = requests.get(
        url,
        params={"offset": tail, "live": "long-poll", "cursor": response.headers["Stream-Cursor"]},
    )
    assert int(echoed.headers["Stream-Cursor"]) > int(response.headers["Stream-Cursor"])


def test_long_poll_at_tail_of_closed_stream_returns_at_once(server_factory) -> None:
    # A server whose long-poll timeout (120 s) far exceeds the client's (20 s): had the server waited,
    # the request would time out instead of answering.
    server = server_factory(long_poll_timeout=120.0)
    url = server.stream_url("closed")
    create(url, b"x")
    tail = requests.post(url, headers={"Stream-Closed": "true"}).headers["Stream-Next-Offset"]
    for offset in (tail, "now"):
        response = requests.get(url, params={"offset": offset, "live": "long-poll"}, timeout=20)
        assert response.status_code == 204
        assert response.headers["Stream-Closed"] == "true"
        assert response.headers["Stream-Up-To-Date"] == "true"
        assert response.headers["Stream-Next-Offset"] == tail


def test_parked_long_poll_gets_data_appended_with_the_close(server_factory) -> None:
    server = server_factory(long_poll_timeout=20.0)
    url = server.stream_url("wake")
    tail = create(url, b"before")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            requests.get, url, params={"offset": tail, "live": "long-poll"}, timeout=30
        )
        poll_until(lambda: server.waiters() >= 1, "a parked long-poll")
        closing = requests.post(
            url, data=b"X", headers={"Content-Type": TEXT, "Stream-Closed": "true"}
        )
        result = pending.result(timeout=30)
    assert result.status_code == 200
    assert result.content == b"X"
    assert result.headers["Stream-Closed"] == "true"
    assert result.headers["Stream-Next-Offset"] == closing.headers["Stream-Next-Offset"]
    assert "ETag" in result.headers


def test_parked_long_poll_on_deleted_stream_is_404(server_factory) -> None:
    server = server_factory(long_poll_timeout=20.0)
    url = server.stream_url("deleted")
    tail = create(url, b"x")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            requests.get, url, params={"offset": tail, "live": "long-poll"}, timeout=30
        )
        poll_until(lambda: server.waiters() >= 1, "a parked long-poll")
        assert requests.delete(url).status_code == 204
        result = pending.result(timeout=30)
    assert result.status_code in (404, 410)
    assert result.json()["error"]["code"] in ("NOT_FOUND", "GONE")


def test_sigterm_releases_parked_readers_and_exits_zero(server_factory) -> None:
    # Readers time out after 20 s, the server's long-poll after 120 s: only the shutdown can answer them.
    server = server_factory(long_poll_timeout=120.0)
    url = server.stream_url("shutdown")
    tail = create(url, b"x")
    lines: list[bytes] = []

    def sse_reader() -> None:
        with requests.get(
            url, params={"offset": tail, "live": "sse"}, stream=True, timeout=20
        ) as r:
            lines.extend(r.iter_lines())

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        polls = [
            pool.submit(requests.get, url, params={"offset": tail, "live": "long-poll"}, timeout=20)
            for _ in range(2)
        ]
        sse = pool.submit(sse_reader)
        poll_until(lambda: server.waiters() >= 3, "three parked readers")
        assert server.terminate() == 0
        for poll in polls:
            response = poll.result(timeout=10)
            assert response.status_code == 204
            assert response.headers["Stream-Next-Offset"] == tail
        sse.result(timeout=10)
    assert any(line.startswith(b"data:") for line in lines)
    # The data survived the graceful shutdown.
    server.restart()
    assert requests.get(url).content == b"x"


def test_sse_connection_is_recycled_after_the_reconnect_interval(server_factory) -> None:
    server = server_factory(extra_args=["--sse-reconnect-seconds", "1"], long_poll_timeout=0.3)
    url = server.stream_url("recycle")
    tail = create(url, b"x")
    started = time.monotonic()
    with requests.get(url, params={"offset": tail, "live": "sse"}, stream=True, timeout=10) as r:
        text = r.content.decode()  # returns only when the server ends the response
    elapsed = time.monotonic() - started
    assert (
        elapsed >= 0.9
    )  # ended by the 1 s recycle, not at once (the client timeout bounds it above)
    controls = [json.loads(data) for kind, data in sse_events(text) if kind == "control"]
    assert len(controls) >= 2  # the first state, then keep-alives
    assert all(c["streamNextOffset"] == tail and c["upToDate"] is True for c in controls)
    assert not any(c.get("streamClosed") for c in controls)


def test_sse_delivers_appends_then_closure_and_ends(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("sse"))
    create(url, b"one\n")
    received: list[str] = []
    done = threading.Event()

    def reader() -> None:
        with requests.get(
            url, params={"offset": "-1", "live": "sse"}, stream=True, timeout=30
        ) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            assert "Content-Length" not in r.headers
            for chunk in r.iter_content(chunk_size=None, decode_unicode=True):
                received.append(chunk)
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    poll_until(lambda: "upToDate" in "".join(received), "the first up-to-date control event")
    requests.post(url, data=b" two", headers={"Content-Type": TEXT})
    requests.post(url, data=b"three", headers={"Content-Type": TEXT, "Stream-Closed": "true"})
    assert done.wait(10), "the SSE response did not end after closure"
    events = sse_events("".join(received))
    data = "".join(d for kind, d in events if kind == "data")
    assert data == "one\n twothree"  # the leading space of " two" survived
    kinds = [kind for kind, _ in events]
    assert all(kinds[i + 1] == "control" for i, k in enumerate(kinds) if k == "data")
    final = json.loads(events[-1][1])
    assert final["streamClosed"] is True and "streamCursor" not in final


def test_sse_text_with_carriage_returns(durastream_server: ServerProcess) -> None:
    """Hazard 29. Plain text SSE cannot carry CR (every CR ends a line) and the conformance suite requires
    text framing there, so: by default no event can be injected; with ``sse_encoding=base64`` the
    bytes round-trip exactly."""
    url = durastream_server.stream_url(unique("cr"))
    payload = b'a\r\nb\rc\r\n\r\nevent: control\r\ndata: {"injected":true}'
    create(url, payload)
    requests.post(url, headers={"Stream-Closed": "true"})
    assert requests.get(url).content == payload

    text = requests.get(url, params={"offset": "-1", "live": "sse"}, timeout=10)
    assert "Stream-SSE-Data-Encoding" not in text.headers
    events = sse_events(text.content.decode())
    assert [kind for kind, _ in events] == ["data", "control"]
    assert "injected" not in json.loads(events[1][1])
    assert events[0][1] == payload.decode().replace("\r\n", "\n").replace("\r", "\n")

    exact = requests.get(
        url, params={"offset": "-1", "live": "sse", "sse_encoding": "base64"}, timeout=10
    )
    assert exact.headers["Stream-SSE-Data-Encoding"] == "base64"
    events = sse_events(exact.content.decode())
    assert base64.b64decode("".join(d for kind, d in events if kind == "data")) == payload


def test_sse_on_missing_stream_is_a_real_404(durastream_server: ServerProcess) -> None:
    response = requests.get(
        durastream_server.stream_url(unique("nope")), params={"offset": "-1", "live": "sse"}
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"


def test_sse_ends_when_the_stream_is_deleted(server_factory) -> None:
    server = server_factory(long_poll_timeout=20.0)
    url = server.stream_url("sse-deleted")
    tail = create(url, b"x")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            lambda: requests.get(url, params={"offset": tail, "live": "sse"}, timeout=30).content
        )
        poll_until(lambda: server.waiters() >= 1, "a parked SSE reader")
        assert requests.delete(url).status_code == 204
        body = pending.result(timeout=10)
    assert b"event: control" in body
    assert b"streamClosed" not in body  # a delete is not EOF
