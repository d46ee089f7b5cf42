"""Staged appends against real server processes: the wire format, errors, visibility to every kind of
read, long-poll/SSE wake-ups, TTL expiry by the sweeper, and SIGKILL around a commit."""

from __future__ import annotations

import concurrent.futures
import struct
import threading
import time
import uuid
from datetime import datetime, timezone

import requests

from tests.support.http import poll_until, sse_events
from tests.support.server_process import ServerProcess

from .support import JSON, TEXT, staging_files


def unique(name: str) -> str:
    return f"staged/{name}-{uuid.uuid4().hex[:10]}"


def create(url: str, body: bytes = b"", content_type: str = TEXT) -> str:
    response = requests.put(url, data=body, headers={"Content-Type": content_type})
    assert response.status_code == 201, response.text
    return response.headers["Stream-Next-Offset"]


def producer(pid: str, epoch: int, seq: int) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


def stage(url: str, handle: str, body: bytes, content_type: str = TEXT, **headers: str):
    return requests.post(
        url,
        data=body,
        headers={"Content-Type": content_type, "Durastream-Txn": handle, **headers},
        timeout=30,
    )


def commit(url: str, handles: str, pid: str = "committer", epoch: int = 0, seq: int = 0, **extra):
    return requests.post(
        url,
        headers={"Durastream-Commit": handles, **producer(pid, epoch, seq), **extra},
        timeout=30,
    )


def error_code(response: requests.Response) -> str:
    return response.json()["error"]["code"]


def test_wire_format(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("wire"))
    tail = create(url, b"[]", JSON)
    before = time.time()
    first = stage(
        url,
        "job-1.task_7:a",
        b'[{"a":1},{"a":2}]',
        JSON,
        **{"Durastream-Txn-TTL": "60"},
        **producer("w", 0, 0),
    )
    assert first.status_code == 200, first.text
    assert "staged-append=2" in first.headers["Durastream-Extensions"]
    assert first.headers["Durastream-Txn-Messages"] == "2"
    assert first.headers["Durastream-Txn-Bytes"] == "14"
    assert first.headers["Stream-Next-Offset"] == tail
    assert (first.headers["Producer-Epoch"], first.headers["Producer-Seq"]) == ("0", "0")
    expires = datetime.fromisoformat(
        first.headers["Durastream-Txn-Expires-At"].replace("Z", "+00:00")
    )
    assert before + 59 <= expires.replace(tzinfo=timezone.utc).timestamp() <= time.time() + 61
    retry = stage(url, "job-1.task_7:a", b'[{"a":1},{"a":2}]', JSON, **producer("w", 0, 0))
    assert retry.status_code == 204
    assert retry.headers["Durastream-Txn-Messages"] == "2"
    assert stage(url, "h2", b'"x"', JSON).status_code == 200

    done = commit(url, "h2, job-1.task_7:a", "c", 4, 0)
    assert done.status_code == 200, done.text
    assert done.headers["Durastream-Txn-Messages"] == "3"
    assert (done.headers["Producer-Epoch"], done.headers["Producer-Seq"]) == ("4", "0")
    assert "Stream-Closed" not in done.headers
    again = commit(url, "h2, job-1.task_7:a", "c", 4, 0)
    assert again.status_code == 204
    assert again.headers["Stream-Next-Offset"] == done.headers["Stream-Next-Offset"]
    assert requests.get(url, params={"offset": "-1"}).json() == ["x", {"a": 1}, {"a": 2}]
    mismatch = commit(url, "job-1.task_7:a, h2", "c", 4, 0)
    assert mismatch.status_code == 409 and error_code(mismatch) == "DUPLICATE_PAYLOAD_MISMATCH"

    assert stage(url, "h3", b"1", JSON).status_code == 200
    aborted = requests.post(url, headers={"Durastream-Abort": "h3, never-staged"})
    assert aborted.status_code == 204
    assert requests.post(url, headers={"Durastream-Abort": "h3"}).status_code == 204
    refused = commit(url, "h3", "c", 4, 1)
    assert refused.status_code == 409 and error_code(refused) == "TXN_ABORTED"


def test_errors_name_the_header_and_what_is_accepted(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("errors"))
    create(url)
    assert stage(url, "h", b"x").status_code == 200

    no_producer = requests.post(url, headers={"Durastream-Commit": "h"})
    assert no_producer.status_code == 400 and "Producer-Id" in no_producer.text
    partial = requests.post(url, headers={"Durastream-Commit": "h", "Producer-Id": "c"})
    assert partial.status_code == 400 and "Producer-Epoch" in partial.text
    bad_handle = stage(url, "no spaces", b"x")
    assert bad_handle.status_code == 400
    assert "Durastream-Txn" in bad_handle.text and "[A-Za-z0-9._:-]" in bad_handle.text
    both = requests.post(
        url, headers={"Durastream-Txn": "h", "Durastream-Commit": "h", **producer("c", 0, 0)}
    )
    assert both.status_code == 400 and "cannot be combined" in both.text
    with_body = requests.post(
        url, data=b"x", headers={"Content-Type": TEXT, "Durastream-Commit": "h"}
    )
    assert with_body.status_code == 400 and "empty body" in with_body.text
    closing = stage(url, "h", b"x", **{"Stream-Closed": "true"})
    assert closing.status_code == 400 and "Stream-Closed" in closing.text
    for ttl in ("soon", "-5", "0", "604801"):
        response = stage(url, "h-ttl", b"x", **{"Durastream-Txn-TTL": ttl})
        assert response.status_code == 400, ttl
        assert "Durastream-Txn-TTL" in response.text
    twice = commit(url, "h, h")
    assert twice.status_code == 400 and "more than once" in twice.text
    empty_stage = requests.post(url, headers={"Durastream-Txn": "h", "Content-Type": TEXT})
    assert empty_stage.status_code == 400
    unknown = commit(url, "h, ghost")
    assert unknown.status_code == 404 and error_code(unknown) == "TXN_NOT_FOUND"
    assert "ghost" in unknown.json()["error"]["message"]
    missing = stage(durastream_server.stream_url(unique("missing")), "h", b"x")
    assert missing.status_code == 404
    mismatch = stage(url, "h", b"{}", JSON)
    assert mismatch.status_code == 409 and error_code(mismatch) == "CONTENT_TYPE_MISMATCH"
    # Nothing above became visible.
    assert requests.get(url, params={"offset": "-1"}).content == b""


def test_cors_allows_and_exposes_the_staging_headers(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("cors"))
    preflight = requests.options(url)
    allowed = preflight.headers["Access-Control-Allow-Headers"]
    for name in ("Durastream-Txn", "Durastream-Txn-TTL", "Durastream-Commit", "Durastream-Abort"):
        assert name in allowed
    exposed = preflight.headers["Access-Control-Expose-Headers"]
    for name in ("Durastream-Txn-Messages", "Durastream-Txn-Bytes", "Durastream-Txn-Expires-At"):
        assert name in exposed


def _frames_count(body: bytes) -> int:
    magic, count = struct.unpack_from("<4sI", body, 0)
    assert magic == b"DSF1"
    return count


def test_no_read_sees_staged_data_and_the_commit_wakes_live_readers(server_factory) -> None:
    server = server_factory(long_poll_timeout=20.0)
    url = server.stream_url("visibility")
    tail = create(url, b"base;")
    sse_text: list[str] = []
    sse_done = threading.Event()

    def sse_reader() -> None:
        with requests.get(
            url, params={"offset": "-1", "live": "sse"}, stream=True, timeout=60
        ) as r:
            for chunk in r.iter_content(chunk_size=None, decode_unicode=True):
                sse_text.append(chunk)
                if "staged-two;" in "".join(sse_text):
                    break
        sse_done.set()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pool.submit(sse_reader)
        poll_until(lambda: "upToDate" in "".join(sse_text), "the SSE reader to catch up")
        long_poll = pool.submit(
            requests.get, url, params={"offset": tail, "live": "long-poll"}, timeout=60
        )
        poll_until(lambda: server.waiters() >= 2, "a parked long-poll and SSE reader")

        assert stage(url, "h1", b"staged-one;").status_code == 200
        assert stage(url, "h2", b"staged-two;").status_code == 200

        catch_up = requests.get(url, params={"offset": tail})
        assert catch_up.status_code == 200 and catch_up.content == b""
        assert catch_up.headers["Stream-Next-Offset"] == tail
        assert catch_up.headers["Stream-Up-To-Date"] == "true"
        assert requests.get(url, params={"offset": "-1"}).content == b"base;"
        assert requests.head(url).headers["Stream-Next-Offset"] == tail
        bounded = requests.get(url, params={"offset": "-1", "end": tail})
        assert bounded.status_code == 200 and bounded.content == b"base;"
        beyond = requests.get(
            url, params={"offset": "-1", "end": "0000000000000000_0000000000000010"}
        )
        assert beyond.status_code == 400 and beyond.headers["Stream-Next-Offset"] == tail
        lookup = requests.get(url, params={"offset": "-1", "lookup": "limit"})
        assert lookup.json()["tail"] == tail and lookup.json()["messages"] == 1
        frames = requests.get(url, params={"offset": "-1", "format": "frames"})
        assert _frames_count(frames.content) == 1
        assert not long_poll.done()
        assert "staged" not in "".join(sse_text)
        assert server.waiters() >= 2  # nobody was released by the stages

        done = commit(url, "h1, h2")
        assert done.status_code == 200
        woken = long_poll.result(timeout=30)
        assert woken.status_code == 200
        assert woken.content == b"staged-one;staged-two;"  # the whole commit, in one answer
        assert woken.headers["Stream-Next-Offset"] == done.headers["Stream-Next-Offset"]
        assert sse_done.wait(30)
    data = "".join(d for kind, d in sse_events("".join(sse_text)) if kind == "data")
    assert data == "base;staged-one;staged-two;"


def test_commit_retried_after_sigkill_is_a_duplicate_and_data_is_present_once(
    server_factory,
) -> None:
    server = server_factory()
    url = server.stream_url("crash")
    create(url, b"[]", JSON)
    for i, handle in enumerate(("attempt-a", "attempt-b")):
        response = stage(url, handle, f'[{{"row":{i}}}]'.encode(), JSON, **producer(handle, 0, 0))
        assert response.status_code == 200
    server.kill()  # staged data survives a crash: it was acknowledged, hence durable
    server.restart()
    retry_stage = stage(url, "attempt-a", b'[{"row":0}]', JSON, **producer("attempt-a", 0, 0))
    assert retry_stage.status_code == 204
    done = commit(url, "attempt-a, attempt-b", "query-partition-0", 17, 0)
    assert done.status_code == 200
    server.kill()  # right after the 200
    server.restart()
    retry = commit(url, "attempt-a, attempt-b", "query-partition-0", 17, 0)
    assert retry.status_code == 204, retry.text
    assert retry.headers["Stream-Next-Offset"] == done.headers["Stream-Next-Offset"]
    assert requests.get(url, params={"offset": "-1"}).json() == [{"row": 0}, {"row": 1}]
    poll_until(lambda: staging_files(server.data_dir) == [], "staging files to be reclaimed")
    replay = commit(url, "attempt-a", "query-partition-0", 18, 0)
    assert replay.status_code == 409 and error_code(replay) == "TXN_ALREADY_COMMITTED"


def test_handle_expires_by_ttl_and_the_sweeper_reclaims_it(server_factory) -> None:
    server = server_factory()
    url = server.stream_url("expiry")
    create(url)
    assert stage(url, "short", b"x", **{"Durastream-Txn-TTL": "1"}).status_code == 200
    assert len(staging_files(server.data_dir)) == 1
    poll_until(lambda: staging_files(server.data_dir) == [], "the sweeper to reclaim the handle")
    expired = commit(url, "short")
    assert expired.status_code == 410 and error_code(expired) == "TXN_EXPIRED"
    assert requests.get(url, params={"offset": "-1"}).content == b""


def test_stream_closed_or_deleted_between_stage_and_commit(
    durastream_server: ServerProcess,
) -> None:
    closed_url = durastream_server.stream_url(unique("closed"))
    create(closed_url, b"a")
    assert stage(closed_url, "h", b"b").status_code == 200
    final = requests.post(closed_url, headers={"Stream-Closed": "true"})
    refused = commit(closed_url, "h")
    assert refused.status_code == 409 and error_code(refused) == "STREAM_CLOSED"
    assert refused.headers["Stream-Closed"] == "true"
    assert refused.headers["Stream-Next-Offset"] == final.headers["Stream-Next-Offset"]
    late = stage(closed_url, "h2", b"c")
    assert late.status_code == 409 and late.headers["Stream-Closed"] == "true"
    assert requests.get(closed_url, params={"offset": "-1"}).content == b"a"

    deleted_url = durastream_server.stream_url(unique("deleted"))
    create(deleted_url)
    assert stage(deleted_url, "h", b"b").status_code == 200
    assert requests.delete(deleted_url).status_code == 204
    assert commit(deleted_url, "h").status_code == 404
    assert stage(deleted_url, "h", b"b").status_code == 404


def test_commit_can_close_the_stream(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("close"))
    create(url)
    assert stage(url, "h", b"last").status_code == 200
    done = commit(url, "h", **{"Stream-Closed": "true"})
    assert done.status_code == 200 and done.headers["Stream-Closed"] == "true"
    retry = commit(url, "h", **{"Stream-Closed": "true"})
    assert retry.status_code == 204 and retry.headers["Stream-Closed"] == "true"
    read = requests.get(url, params={"offset": "-1"})
    assert read.content == b"last" and read.headers["Stream-Closed"] == "true"
