"""A ``PUT`` with a body is a packed create carrying its data (issue 17, ``features.PACKED_CREATE_DATA``).

The create's header frame and its initial data's frame are ONE record of the packed create's WAL entry,
so one CRC covers both. These tests SIGKILL a real server while clients create streams with bodies and
check that every acknowledged stream comes back with exactly its data, and that an unacknowledged one is
either absent or there with exactly its data: never created without it (its client's retry would get an
idempotent 200 and the data would be gone). They also check that the answers are the ones the
unpacked create (``--no-packed-appends``) gives, and that such a stream keeps working after the
checkpoint moved it into a pack, after a restart, and when later appends grow it.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading

import requests

from durastream_server.storage import features
from tests.server.test_crash import JSON, _read_all_messages
from tests.server.test_crash_packed import _checkpointed, _directories, _pack_files
from tests.support.server_process import ServerProcess, kill_under_load

CLIENTS = 6
ACKS = 150
TEXT = "text/plain"


def _body(url: str, n: int) -> tuple[str, bytes]:
    """Content type and body of a client's n-th create: JSON arrays (one or two messages) and text."""
    if n % 3 == 2:
        return TEXT, f"text of {url}".encode()
    messages = [{"url": url, "i": i} for i in range(1 + n % 2)]
    return JSON, json.dumps(messages).encode()


def _expected(url: str, n: int) -> bytes | list[dict]:
    content_type, body = _body(url, n)
    return body if content_type == TEXT else json.loads(body)


def _read(url: str, n: int) -> bytes | list[dict]:
    if _body(url, n)[0] == TEXT:
        response = requests.get(url, params={"offset": "-1"}, timeout=10)
        assert response.status_code == 200, url
        return response.content
    return _read_all_messages(url)


def _create_loop(base: str, client: int, stop: threading.Event, acked: list, unacked: list) -> None:
    n = 0
    with requests.Session() as session:
        while not stop.is_set():
            url = f"{base}/c{client}/{n}"
            content_type, body = _body(url, n)
            try:
                response = session.put(
                    url, data=body, headers={"Content-Type": content_type}, timeout=10
                )
            except requests.RequestException:
                unacked.append((url, n))
                return
            (acked if response.status_code == 201 else unacked).append((url, n))
            if response.status_code != 201:
                return
            n += 1


def _check_all_or_nothing(acked: list, unacked: list) -> None:
    for url, n in acked:
        assert _read(url, n) == _expected(url, n), url
    for url, n in unacked:
        status = requests.head(url, timeout=10).status_code
        assert status in (200, 404), url
        if status == 200:  # made durable before the kill: with its data, never without it
            assert _read(url, n) == _expected(url, n), url


def test_sigkill_while_putting_with_bodies_keeps_each_create_with_exactly_its_data(
    server_factory,
) -> None:
    server = server_factory()
    assert features.PACKED_CREATE_DATA in features.read(server.data_dir)
    acked: list[list[tuple[str, int]]] = [[] for _ in range(CLIENTS)]
    unacked: list[list[tuple[str, int]]] = [[] for _ in range(CLIENTS)]
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        futures = [
            pool.submit(_create_loop, server.stream_url("b"), c, stop, acked[c], unacked[c])
            for c in range(CLIENTS)
        ]
        kill_under_load(server, futures, stop, lambda: sum(map(len, acked)), ACKS, "PUTs")
    server.restart()
    assert server.health()["quarantined"] == []
    assert not _directories(server), "a PUT with a small body made a directory"
    all_acked = [item for items in acked for item in items]
    all_unacked = [item for items in unacked for item in items]
    _check_all_or_nothing(all_acked, all_unacked)
    # A client's retry of an unacknowledged PUT: created now (201) or found with its data (200).
    for url, n in all_unacked:
        content_type, body = _body(url, n)
        response = requests.put(url, data=body, headers={"Content-Type": content_type}, timeout=10)
        assert response.status_code in (200, 201), (url, response.status_code, response.text)
        assert _read(url, n) == _expected(url, n), url
    # Checkpointed into packs, killed and restarted: still each with its data.
    _checkpointed(server)
    assert _pack_files(server)
    server.kill()
    server.restart()
    _check_all_or_nothing(all_acked, [])


def _answers(server: ServerProcess) -> list[tuple]:
    """What the server answers to creates with bodies, the same creates again, reads and appends
    (the storage id, which differs between any two servers, taken out of the ETags)."""
    out: list[tuple] = []
    cases = [
        ("json1", JSON, b'{"a":1}'),
        ("json2", JSON, b'[{"a":1},{"b":[2,3]}]'),
        ("empty", JSON, b"[]"),
        ("text", TEXT, b"hello"),
        ("bad", JSON, b'[{"a":'),
    ]
    for name, content_type, body in cases:
        url = server.stream_url(f"eq/{name}")
        for _ in range(2):  # created, then the idempotent repeat
            response = requests.put(
                url, data=body, headers={"Content-Type": content_type}, timeout=10
            )
            location = response.headers.get("Location", "").replace(server.base_url, "")
            out.append(
                (
                    name,
                    response.status_code,
                    response.headers.get("Content-Type"),
                    response.headers.get("Stream-Next-Offset"),
                    location,
                    response.content if response.status_code >= 400 else b"",
                )
            )
        if name == "bad":
            continue
        requests.post(
            url,
            data=b'{"later":1}' if content_type == JSON else b"!",
            headers={"Content-Type": content_type},
            timeout=10,
        ).raise_for_status()
        read = requests.get(url, params={"offset": "-1"}, timeout=10)
        storage = requests.head(url, timeout=10).headers.get("ETag", "")
        out.append(
            (
                name,
                read.status_code,
                read.content,
                read.headers.get("Stream-Next-Offset"),
                read.headers.get("Content-Type"),
                len(storage),
            )
        )
    # A fork of a stream created with its data, and that stream grown past the packed threshold
    # (promoted to a directory, its header record's data carried over).
    fork = requests.put(
        server.stream_url("eq/fork"),
        headers={"Content-Type": JSON, "Stream-Forked-From": "eq/json2"},
        timeout=10,
    )
    out.append(("fork", fork.status_code, fork.headers.get("Stream-Next-Offset")))
    big = json.dumps([{"n": i, "pad": "x" * 100} for i in range(3000)]).encode()  # > 256 KiB
    requests.post(
        server.stream_url("eq/json1"), data=big, headers={"Content-Type": JSON}, timeout=10
    ).raise_for_status()
    for name in ("fork", "json1"):
        read = _read_all_messages(server.stream_url(f"eq/{name}"))
        out.append((name, len(read), read[:3], read[-1]))
    return out


def test_a_packed_put_with_a_body_answers_as_the_unpacked_one(server_factory) -> None:
    packed = server_factory()
    unpacked = server_factory(extra_args=("--no-packed-appends",))
    assert _answers(packed) == _answers(unpacked)
    # The fork, its source (a fork reads its source's files) and the grown stream; the rest packed.
    assert len(_directories(packed)) == 3
    assert len(_directories(unpacked)) >= 5
