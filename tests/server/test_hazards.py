"""One test per server-side scenario of ../shared/hazards.md, named after its item.

Each test runs against a real server process. Tests that need to kill, restart or fault a server start a
private one (``server_factory``); the rest share the session server.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from durastream_server.offsets import format_offset, parse_position
from tests.support.http import poll_until, sse_events

JSON = "application/json"
TEXT = "text/plain"


def unique(name: str) -> str:
    return f"hazard/{name}-{uuid.uuid4().hex[:10]}"


def create(url: str, content_type: str = TEXT, body: bytes | str = b"", **headers: str):
    response = requests.put(url, data=body, headers={"Content-Type": content_type, **headers})
    assert response.status_code in (200, 201), response.text
    return response


def producer(pid: str, epoch: int, seq: int) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


def produce(
    url: str, body: bytes, pid: str, epoch: int, seq: int, **headers: str
) -> requests.Response:
    """POST ``body`` as a text append with producer headers (and any extra headers)."""
    return requests.post(
        url, data=body, headers={"Content-Type": TEXT, **producer(pid, epoch, seq), **headers}
    )


def kill_when_synced(server) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL ``server`` once its write-ahead log is checkpointed (it does that when idle): every
    acknowledged byte is then synced in its segment file, and damage done to a segment below is damage
    to synced data, which recovery must detect. Acknowledged bytes the WAL still held would be put back
    by the start-up replay (storage/wal.py; tests/server/storage/test_wal.py)."""
    wal = Path(server.data_dir) / "wal"
    poll_until(lambda: not any(wal.glob("*.wal")), "the WAL checkpoint", timeout=30)
    server.kill()


def read_all(url: str) -> requests.Response:
    response = requests.get(url, params={"offset": "-1"})
    assert response.status_code == 200, response.text
    return response


def test_hazard_04_duplicate_tuple_with_different_payload_is_not_absorbed(
    durastream_server,
) -> None:
    url = durastream_server.stream_url(unique("h04"))
    create(url)
    first = produce(url, b"A", "p", 0, 0)
    assert first.status_code == 200
    same = produce(url, b"A", "p", 0, 0)
    assert same.status_code == 204
    different = produce(url, b"B", "p", 0, 0)
    assert different.status_code == 409
    assert different.json()["error"]["code"] == "DUPLICATE_PAYLOAD_MISMATCH"
    assert read_all(url).content == b"A"


def test_hazard_15_cors_exposes_sse_data_encoding(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h15"))
    create(url, "application/octet-stream", b"\x00\x01")
    with requests.get(
        url,
        params={"offset": "-1", "live": "sse"},
        headers={"Origin": "http://localhost:3000"},
        stream=True,
        timeout=10,
    ) as response:
        assert response.status_code == 200
        assert response.headers["stream-sse-data-encoding"] == "base64"
        exposed = {
            h.strip().lower() for h in response.headers["access-control-expose-headers"].split(",")
        }
    for header in (
        "stream-sse-data-encoding",
        "stream-next-offset",
        "stream-cursor",
        "stream-up-to-date",
        "stream-closed",
        "producer-epoch",
        "producer-seq",
        "producer-expected-seq",
        "producer-received-seq",
        "etag",
    ):
        assert header in exposed, header


def test_hazard_16_long_poll_woken_by_append_and_close_gets_the_data(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h16"))
    tail = create(url, TEXT, b"before").headers["Stream-Next-Offset"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            requests.get, url, params={"offset": tail, "live": "long-poll"}, timeout=30
        )
        _wait_until_waiting(durastream_server, url, tail)
        closing = requests.post(
            url, data=b"X", headers={"Content-Type": TEXT, "Stream-Closed": "true"}
        )
        assert closing.status_code == 204
        result = pending.result(timeout=30)
    assert result.status_code == 200
    assert result.content == b"X"
    assert result.headers["Stream-Closed"] == "true"
    assert result.headers["Stream-Next-Offset"] == closing.headers["Stream-Next-Offset"]
    eof = requests.get(
        url, params={"offset": result.headers["Stream-Next-Offset"], "live": "long-poll"}
    )
    assert eof.status_code == 204
    assert eof.headers["Stream-Closed"] == "true"


def test_hazard_16_sse_reader_woken_by_append_and_close_gets_the_data(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h16sse"))
    tail = create(url, TEXT, b"before").headers["Stream-Next-Offset"]
    received: list[str] = []
    done = threading.Event()

    def reader() -> None:
        with requests.get(
            url, params={"offset": tail, "live": "sse"}, stream=True, timeout=30
        ) as response:
            for chunk in response.iter_content(chunk_size=None, decode_unicode=True):
                received.append(chunk)
                if '"streamClosed":true' in "".join(received).replace(" ", ""):
                    break
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    poll_until(lambda: "".join(received).count("event: control") >= 1, "first SSE control event")
    requests.post(url, data=b"X", headers={"Content-Type": TEXT, "Stream-Closed": "true"})
    assert done.wait(30), "SSE reader never saw streamClosed"
    events = sse_events("".join(received))
    assert ("data", "X") in events
    last_control = json.loads([data for kind, data in events if kind == "control"][-1])
    assert last_control.get("streamClosed") is True


def _append_racing_close(
    url: str, index: int, close_acked: threading.Event, violations: list[str]
) -> None:
    for n in range(10):
        acked_before = close_acked.is_set()
        response = requests.post(url, data=f"{index}-{n}", headers={"Content-Type": TEXT})
        if acked_before and response.status_code != 409:
            violations.append(f"append after close got {response.status_code}")
        if response.status_code == 409:
            assert response.headers["Stream-Closed"] == "true"


def test_hazard_17_close_racing_appends_is_monotonic(durastream_server) -> None:
    for round_ in range(20):
        url = durastream_server.stream_url(unique(f"h17-{round_}"))
        create(url)
        close_acked = threading.Event()
        violations: list[str] = []

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(_append_racing_close, url, i, close_acked, violations) for i in range(3)
            ]
            closing = requests.post(
                url, headers={"Stream-Closed": "true", **producer("closer", 0, 0)}
            )
            assert closing.status_code in (200, 204)
            close_acked.set()
            for _ in range(5):
                assert requests.head(url).headers.get("Stream-Closed") == "true"
            for future in futures:
                future.result()
        assert not violations, violations
        retry = requests.post(url, headers={"Stream-Closed": "true", **producer("closer", 0, 0)})
        assert retry.status_code == 204
        assert retry.headers["Stream-Closed"] == "true"


def test_hazard_18_torn_tail_is_truncated_before_new_appends(server_factory) -> None:
    # Segment files to damage (packed streams' records: tests/server/storage/test_packed_records.py).
    server = server_factory(extra_args=("--no-packed-appends",))
    url = server.stream_url("h18/stream")
    create(url, TEXT)
    for record in (b"one", b"two", b"three"):
        assert requests.post(url, data=record, headers={"Content-Type": TEXT}).status_code == 204
    kill_when_synced(server)
    segments = sorted(Path(server.data_dir, "streams").glob("*/*.seg"))
    assert len(segments) == 1
    with open(segments[0], "r+b") as handle:
        handle.seek(0, 2)
        handle.truncate(handle.tell() - 3)
    server.restart()
    assert requests.post(url, data=b"new", headers={"Content-Type": TEXT}).status_code == 204
    assert read_all(url).content == b"onetwonew"


def test_hazard_18_mid_file_corruption_is_never_served(server_factory) -> None:
    # Segment files to damage (packed streams' records: tests/server/storage/test_packed_records.py).
    server = server_factory(extra_args=("--no-packed-appends",))
    url = server.stream_url("h18/corrupt")
    create(url, TEXT)
    for record in (b"A" * 100, b"B" * 100, b"C" * 100):
        requests.post(url, data=record, headers={"Content-Type": TEXT})
    kill_when_synced(server)
    segment = next(Path(server.data_dir, "streams").glob("*/*.seg"))
    data = bytearray(segment.read_bytes())
    middle = data.index(b"B" * 100) + 50
    data[middle] ^= 0xFF
    segment.write_bytes(bytes(data))
    server.restart()
    response = requests.get(url, params={"offset": "-1"})
    assert response.status_code >= 500
    assert b"A" * 100 not in response.content or b"B" not in response.content
    assert requests.get(server.base_url + "/healthz").status_code == 200


def test_hazard_19_crash_after_append_keeps_dedup_and_closure(server_factory) -> None:
    server = server_factory()
    url = server.stream_url("h19/stream")
    create(url, TEXT)
    assert produce(url, b"a", "p", 0, 0).status_code == 200
    closing = produce(url, b"b", "p", 0, 1, **{"Stream-Closed": "true"})
    assert closing.status_code == 200
    server.kill()
    server.restart()
    retry = produce(url, b"b", "p", 0, 1, **{"Stream-Closed": "true"})
    assert retry.status_code == 204
    assert retry.headers["Stream-Closed"] == "true"
    assert produce(url, b"a", "p", 0, 0).status_code == 204
    assert read_all(url).content == b"ab"
    assert requests.head(url).headers["Stream-Closed"] == "true"


def test_hazard_20_failed_json_create_leaves_no_stream(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h20"))
    response = requests.put(url, data=b"{bad", headers={"Content-Type": JSON})
    assert response.status_code == 400
    assert requests.head(url).status_code == 404


def test_hazard_20_stream_created_closed_never_accepts_a_racing_post(durastream_server) -> None:
    for _ in range(20):
        url = durastream_server.stream_url(unique("h20race"))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            put = pool.submit(
                requests.put,
                url,
                data=b"final",
                headers={"Content-Type": TEXT, "Stream-Closed": "true"},
            )
            posts = [
                pool.submit(requests.post, url, data=b"late", headers={"Content-Type": TEXT})
                for _ in range(3)
            ]
            assert put.result().status_code == 201
            for post in posts:
                assert post.result().status_code in (404, 409)
        assert read_all(url).content == b"final"


def test_hazard_21_fork_with_mismatched_type_leaks_no_reference(durastream_server) -> None:
    source_path = unique("h21src")
    source = durastream_server.stream_url(source_path)
    create(source, TEXT, b"data")
    fork = requests.put(
        durastream_server.stream_url(unique("h21fork")),
        headers={"Content-Type": JSON, "Stream-Forked-From": f"/v1/stream/{source_path}"},
    )
    assert fork.status_code == 409
    assert requests.delete(source).status_code == 204
    assert requests.put(source, headers={"Content-Type": TEXT}).status_code == 201


def test_hazard_22_non_canonical_offsets_are_rejected(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h22"))
    create(url, TEXT, b"hello")
    for bad in ("0_5", "1_0", "0000000000000000_5", "00000000000000000_0000000000000001"):
        assert requests.get(url, params={"offset": bad}).status_code == 400, bad


def test_hazard_22_fork_inside_a_json_message_is_rejected(durastream_server) -> None:
    source_path = unique("h22fork")
    source = durastream_server.stream_url(source_path)
    create(source, JSON, b'[{"a":1},{"b":2}]')
    inside = format_offset(3)  # inside the first message, which is 7 bytes long
    fork = requests.put(
        durastream_server.stream_url(unique("h22forked")),
        headers={
            "Content-Type": JSON,
            "Stream-Forked-From": f"/v1/stream/{source_path}",
            "Stream-Fork-Offset": inside,
        },
    )
    assert fork.status_code == 400


def test_hazard_23_closed_stream_read_below_tail_returns_the_rest(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h23"))
    first = create(url, TEXT, b"one").headers["Stream-Next-Offset"]
    requests.post(url, data=b"two", headers={"Content-Type": TEXT, "Stream-Closed": "true"})
    response = requests.get(url, params={"offset": first, "live": "long-poll"})
    assert response.status_code == 200
    assert response.content == b"two"
    start = requests.get(url, params={"offset": "-1", "live": "long-poll"})
    assert start.status_code == 200
    assert start.content == b"onetwo"


def test_hazard_24_second_server_on_same_data_dir_refuses(server_factory) -> None:
    server = server_factory()
    second = server.start_second_on_same_data_dir()
    assert second.returncode != 0
    assert "lock" in second.stderr.lower()
    assert requests.get(server.base_url + "/healthz").status_code == 200


def test_hazard_25_oversized_body_gets_413(server_factory) -> None:
    server = server_factory(max_body_bytes=1024)
    url = server.stream_url("h25")
    create(url, "application/octet-stream")
    response = requests.post(
        url, data=b"x" * 4096, headers={"Content-Type": "application/octet-stream"}
    )
    assert response.status_code == 413
    chunked = requests.post(
        url,
        data=iter([b"x" * 512] * 8),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert chunked.status_code == 413
    assert read_all(url).content == b""
    ok = requests.post(url, data=b"small", headers={"Content-Type": "application/octet-stream"})
    assert ok.status_code == 204


def test_hazard_26_long_polling_readers_keep_a_ttl_stream_alive(server_factory) -> None:
    server = server_factory(long_poll_timeout=2.0)
    url = server.stream_url("h26")
    tail = create(url, TEXT, b"x", **{"Stream-TTL": "1"}).headers["Stream-Next-Offset"]
    deadline = time.monotonic() + 7
    while time.monotonic() < deadline:
        response = requests.get(url, params={"offset": tail, "live": "long-poll"}, timeout=10)
        assert response.status_code == 204, response.status_code
    assert requests.head(url).status_code == 200


def test_hazard_29_sse_text_round_trips_carriage_returns(durastream_server) -> None:
    """Plain SSE cannot carry a bare CR (it ends a line) and the conformance suite requires text streams
    to arrive as text, so by default CR and CRLF arrive as LF with nothing injected. A reader that needs
    the exact bytes asks for ``sse_encoding=base64`` and gets them."""
    import base64

    url = durastream_server.stream_url(unique("h29"))
    payload = b"a\r\nb\rc"
    create(url, TEXT, payload)
    requests.post(url, headers={"Stream-Closed": "true"})
    assert read_all(url).content == payload

    params = {"offset": "-1", "live": "sse", "sse_encoding": "base64"}
    with requests.get(url, params=params, stream=True, timeout=10) as exact:
        assert exact.headers["stream-sse-data-encoding"] == "base64"
        events = sse_events(exact.content.decode())
    data = "".join(d for kind, d in events if kind == "data")
    assert base64.b64decode("".join(data.split())) == payload

    with requests.get(url, params={"offset": "-1", "live": "sse"}, stream=True, timeout=10) as text:
        assert "stream-sse-data-encoding" not in text.headers
        events = sse_events(text.content.decode())
    assert [kind for kind, _ in events] == ["data", "control"]
    assert events[0][1] == "a\nb\nc"


def test_hazard_31_fork_survives_source_delete_under_append_load(durastream_server) -> None:
    source_path = unique("h31src")
    source = durastream_server.stream_url(source_path)
    create(source, TEXT, b"base|")
    fork_url = durastream_server.stream_url(unique("h31fork"))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        appends = [
            pool.submit(requests.post, source, data=f"{i}|", headers={"Content-Type": TEXT})
            for i in range(200)
        ]
        fork = requests.put(
            fork_url,
            headers={"Content-Type": TEXT, "Stream-Forked-From": f"/v1/stream/{source_path}"},
        )
        for future in appends:
            assert future.result().status_code == 204
    assert fork.status_code == 201
    inherited = read_all(fork_url).content
    assert inherited.startswith(b"base|")
    assert requests.delete(source).status_code == 204
    assert requests.head(source).status_code == 410
    assert read_all(fork_url).content == inherited


def test_hazard_32_corrupt_stream_is_quarantined_never_reset(server_factory) -> None:
    # Segment files to damage (packed streams' records: tests/server/storage/test_packed_records.py).
    server = server_factory(extra_args=("--no-packed-appends",))
    url = server.stream_url("h32")
    create(url, TEXT)
    for n in range(5):
        requests.post(url, data=b"%d" % n * 50, headers={"Content-Type": TEXT})
    tail = requests.head(url).headers["Stream-Next-Offset"]
    kill_when_synced(server)
    segment = next(Path(server.data_dir, "streams").glob("*/*.seg"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    server.restart()
    head = requests.head(url)
    assert head.status_code >= 500
    assert head.headers.get("Stream-Next-Offset") != format_offset(0)
    assert requests.post(url, data=b"x", headers={"Content-Type": TEXT}).status_code >= 500
    assert parse_position(tail) > 0


def test_hazard_33_long_poll_on_deleted_stream_is_not_up_to_date(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h33"))
    tail = create(url, TEXT, b"x").headers["Stream-Next-Offset"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            requests.get, url, params={"offset": tail, "live": "long-poll"}, timeout=30
        )
        _wait_until_waiting(durastream_server, url, tail)
        assert requests.delete(url).status_code == 204
        result = pending.result(timeout=30)
    assert result.status_code in (404, 410)


def test_hazard_34_producer_state_survives_restart(server_factory) -> None:
    """Within --producer-expiry-seconds (7 days); after it, a retry is refused for clients that ask:
    tests/server/http/test_producer_expiry.py."""
    server = server_factory()
    url = server.stream_url("h34")
    create(url, TEXT)
    assert produce(url, b"a", "p", 3, 0).status_code == 200
    server.kill()
    server.restart()
    duplicate = produce(url, b"a", "p", 3, 0)
    assert duplicate.status_code == 204
    stale = produce(url, b"z", "p", 2, 0)
    assert stale.status_code == 403
    assert stale.headers["Producer-Epoch"] == "3"
    resumed = produce(url, b"b", "p", 3, 1)
    assert resumed.status_code == 200
    assert read_all(url).content == b"ab"


def test_hazard_35_retry_of_pre_close_batch_after_close(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h35"))
    create(url)
    ok = produce(url, b"a", "p", 1, 0)
    assert ok.status_code == 200
    closing = requests.post(url, headers={"Stream-Closed": "true", **producer("p", 1, 1)})
    assert closing.status_code in (200, 204)
    retry = produce(url, b"a", "p", 1, 0)
    assert retry.status_code == 204
    stale = produce(url, b"a", "p", 0, 0)
    assert stale.status_code == 403
    other = produce(url, b"z", "q", 0, 0)
    assert other.status_code == 409
    assert other.headers["Stream-Closed"] == "true"


def test_hazard_37_concurrent_identical_creates_yield_one_201(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h37"))
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        statuses = list(
            pool.map(
                lambda _: requests.put(url, headers={"Content-Type": TEXT}).status_code, range(20)
            )
        )
    assert sorted(statuses) == [200] * 19 + [201]


@pytest.mark.parametrize(
    ("first", "second"),
    [("application/json; charset=utf-8", "application/json"), ("TEXT/Plain", "text/plain")],
)
def test_hazard_37_content_type_parameters_answer_consistently(
    durastream_server, first: str, second: str
) -> None:
    a = durastream_server.stream_url(unique("h37ct"))
    b = durastream_server.stream_url(unique("h37ct"))
    requests.put(a, headers={"Content-Type": first})
    requests.put(b, headers={"Content-Type": second})
    forward = requests.put(a, headers={"Content-Type": second}).status_code
    backward = requests.put(b, headers={"Content-Type": first}).status_code
    assert forward == backward
    assert forward in (200, 409)


def test_hazard_41_if_none_match_lists_and_weak_tags(durastream_server) -> None:
    url = durastream_server.stream_url(unique("h41"))
    create(url, TEXT, b"data")
    first = read_all(url)
    etag = first.headers["ETag"]
    again = requests.get(url, params={"offset": "-1"}, headers={"If-None-Match": f'W/"x", {etag}'})
    assert again.status_code == 304
    assert again.content == b""
    no_gzip = requests.get(url, params={"offset": "-1"}, headers={"Accept-Encoding": "gzip;q=0"})
    assert "gzip" not in no_gzip.headers.get("Content-Encoding", "")
    preflight = requests.options(
        url,
        headers={
            "Origin": "http://localhost:5173",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "if-none-match",
        },
    )
    assert preflight.status_code in (200, 204)
    allowed = preflight.headers["Access-Control-Allow-Headers"].lower()
    assert "if-none-match" in allowed


def _wait_until_waiting(server, url: str, offset: str) -> None:
    """Wait until the server reports a parked reader (``/healthz`` counts waiters), so the test's write
    really races a waiting long-poll instead of a request still in flight."""
    poll_until(lambda: server.waiters() >= 1, f"a long-poll at {offset} on {url} to be parked")
