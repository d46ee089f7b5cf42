"""Connection hand-off of ``--workers 2`` (``shards/handoff.py``): a connection whose next request names
a stream of the other shard moves to that shard's worker, between requests, and is served there as if
accepted there; what cannot move is forwarded (``shards/router.py``).

Each test learns which worker holds a connection from ``/healthz`` on that same connection (it names
the shard of the worker answering), and counts hand-offs with the ``shard`` document of every worker
(``handed_off``, ``adopted``, ``handoff_refused``: docs/server.md, "Worker processes").
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from durastream_server.shards.handoff import (
    COOLDOWN_REQUESTS,
    MAX_COOLDOWN_REQUESTS,
    cooldown,
    handoff_path,
    request_path,
)
from durastream_server.shards.layout import shard_of
from tests.server.http.test_cors_tls import needs_openssl, tls_server
from tests.server.workers.test_forwarding import _exchange
from tests.server.workers.test_workers import health_of_each, worker_of_shard
from tests.support.http import poll_until, sse_events
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT workers, /proc")

TEXT = "text/plain"


@pytest.fixture
def workers(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    # long-polls park for up to 30 s: a test's append always comes before the timeout
    return server_factory(extra_args=("--workers", "2"), long_poll_timeout=30)


@pytest.fixture
def connection(workers: ServerProcess) -> Iterator[http.client.HTTPConnection]:
    connection = http.client.HTTPConnection(workers.host, workers.port, timeout=30)
    yield connection
    connection.close()


def holder(connection: http.client.HTTPConnection) -> int:
    """The shard of the worker holding ``connection`` now (``/healthz`` is answered where it is)."""
    status, _, body = _exchange(connection, "GET", "/healthz")
    assert status in (200, 503), body  # 503: the whole server is unhealthy while a worker is down
    return int(json.loads(body)["shard"]["index"])


def path_of_shard(shard: int, prefix: str = "ho") -> str:
    while True:
        path = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if shard_of(path, 2) == shard:
            return path


def totals(server: ServerProcess) -> dict[str, int]:
    """Every worker's hand-off and forward counters, summed."""
    summed = {"handed_off": 0, "adopted": 0, "handoff_refused": 0, "forwarded": 0}
    for document in health_of_each(server).values():
        for key in summed:
            summed[key] += document["shard"][key]
    return summed


def grown(server: ServerProcess, before: dict[str, int]) -> dict[str, int]:
    after = totals(server)
    return {key: after[key] - before[key] for key in before}


def create(server: ServerProcess, path: str, body: bytes = b"") -> str:
    created = requests.put(server.stream_url(path), data=body, headers={"Content-Type": TEXT})
    assert created.status_code == 201, created.text
    return created.headers["Stream-Next-Offset"]


def content(server: ServerProcess, path: str) -> bytes:
    response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=30)
    assert response.status_code == 200
    return response.content


# -- the rules, without a server -------------------------------------------------------------------


def test_request_path_reads_only_a_complete_origin_form_request_line() -> None:
    assert request_path(b"POST /v1/stream/a?x=1 HTTP/1.1\r\nHost: h\r\n") == b"/v1/stream/a"
    assert request_path(b"GET /v1/stream/a%2Fb HTTP/1.1\r\n") == b"/v1/stream/a%2Fb"
    for partial in (b"", b"POST /v1/stream/a HTTP/1.1", b"POST /v1/st", b"\r\nPOST /v1/stream/a"):
        assert request_path(partial) is None, partial  # not complete: the parser sees it here
    assert request_path(b"GET http://h/v1/stream/a HTTP/1.1\r\n") is None  # absolute form
    assert request_path(b"GET /v1/stream/a#f HTTP/1.1\r\n") is None


def test_a_connection_moved_again_waits_longer_each_time() -> None:
    waits = [cooldown(hops) for hops in range(1, 20)]
    assert waits[0] == COOLDOWN_REQUESTS
    assert all(b >= a for a, b in zip(waits, waits[1:], strict=False))
    assert waits[-1] == MAX_COOLDOWN_REQUESTS


# -- one connection, both shards -------------------------------------------------------------------


def test_one_connection_alternating_shards_moves_a_bounded_number_of_times(
    workers: ServerProcess, connection: http.client.HTTPConnection
) -> None:
    here = holder(connection)
    own, other = path_of_shard(here), path_of_shard(1 - here)
    create(workers, own)
    create(workers, other)
    before = totals(workers)
    sequence = [other, own] * 20  # B, A, B, A... starting with the other shard's stream
    for n, path in enumerate(sequence):
        status, _, body = _exchange(
            connection, "POST", f"/v1/stream/{path}", f"{n};".encode(), {"Content-Type": TEXT}
        )
        assert status == 204, (n, path, body)
        if n == 0:  # the first request moved the connection to the owner of its stream
            assert holder(connection) == 1 - here
    for path in (own, other):
        expected = "".join(f"{n};" for n, p in enumerate(sequence) if p == path).encode()
        assert content(workers, path) == expected, path
    moved = grown(workers, before)
    assert moved["handed_off"] == moved["adopted"] >= 1, moved
    # each move makes the connection wait COOLDOWN_REQUESTS (then twice that, ...) before the next
    assert moved["handed_off"] <= 1 + len(sequence) // COOLDOWN_REQUESTS, moved
    assert moved["forwarded"] > 0, moved  # meanwhile the other shard's requests were forwarded


def test_a_producer_keeps_its_connection_at_the_owner_and_dedups_across_sigkill(
    workers: ServerProcess, connection: http.client.HTTPConnection
) -> None:
    accepted_by = holder(connection)
    path = path_of_shard(1 - accepted_by, "prod")
    create(workers, path)
    url = f"/v1/stream/{path}"

    def produce(conn: http.client.HTTPConnection, seq: int) -> int:
        headers = {
            "Content-Type": TEXT,
            "Producer-Id": "p1",
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
        }
        return _exchange(conn, "POST", url, f"m{seq};".encode(), headers)[0]

    before = totals(workers)
    for seq in range(10):
        assert produce(connection, seq) == 200, seq  # 200: appended (204: a duplicate)
    assert holder(connection) == 1 - accepted_by  # moved once, then stayed with the owner
    moved = grown(workers, before)
    assert (moved["handed_off"], moved["adopted"], moved["forwarded"]) == (1, 1, 0), moved

    # The worker that accepted the connection dies: the connection lives in the owner now.
    accepting_pid = worker_of_shard(workers, accepted_by)
    assert accepting_pid is not None
    os.kill(accepting_pid, signal.SIGKILL)
    assert produce(connection, 10) == 200
    poll_until(
        lambda: (
            worker_of_shard(workers, accepted_by) not in (None, accepting_pid)
            and _answers_both(workers)
        ),
        "the killed worker restarted",
        timeout=30,
    )

    # The owner dies: the connection goes with it; a retry on a new one is a duplicate.
    owner_pid = worker_of_shard(workers, 1 - accepted_by)
    assert owner_pid is not None
    os.kill(owner_pid, signal.SIGKILL)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        produce(connection, 11)
    connection.close()

    def produce_retrying(seq: int) -> int:
        """As a producer does: on a new connection, again until answered (one made while the killed
        owner's listening socket closes is reset), and again after a 503 (a forward that waited
        ``OWNER_WAIT_SECONDS`` for the restarting owner: longer than that on a loaded machine)."""
        answer: list[int] = []

        def attempt() -> bool:
            retry = http.client.HTTPConnection(workers.host, workers.port, timeout=30)
            try:
                status = produce(retry, seq)
            except (ConnectionError, http.client.HTTPException):
                return False
            finally:
                retry.close()
            if status == 503:
                return False
            answer.append(status)
            return True

        poll_until(attempt, f"an answer to seq {seq}", timeout=30)
        return answer[0]

    assert produce_retrying(10) == 204  # acknowledged before the kill: a duplicate
    assert produce_retrying(11) in (200, 204)  # may or may not have been committed before the kill
    assert produce_retrying(12) == 200
    assert content(workers, path) == b"".join(f"m{seq};".encode() for seq in range(13))


def _answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """Read ``count`` HTTP/1.1 answers (Content-Length framed, as the server frames these) from
    ``sock``."""
    stream = sock.makefile("rb")
    answers = []
    for _ in range(count):
        status = int(stream.readline().split(b" ", 2)[1])
        length = 0
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        answers.append((status, stream.read(length)))
    return answers


def _post(path: str, body: bytes) -> bytes:
    return (
        f"POST /v1/stream/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {TEXT}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize("other_first", [True, False], ids=["other-first", "own-first"])
def test_pipelined_requests_for_both_shards_in_one_write(
    workers: ServerProcess, other_first: bool
) -> None:
    with socket.create_connection((workers.host, workers.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        [(status, body)] = _answers(sock, 1)
        here = json.loads(body)["shard"]["index"]
        own, other = path_of_shard(here, "pipe"), path_of_shard(1 - here, "pipe")
        create(workers, own)
        create(workers, other)
        first, second = (other, own) if other_first else (own, other)
        sock.sendall(_post(first, b"one") + _post(second, b"two") + _post(first, b"three"))
        assert [status for status, _ in _answers(sock, 3)] == [204, 204, 204]
        # other-first: the three requests moved with the connection (the second was forwarded back
        # from there, as it came while the first was being answered); own-first: nothing moved
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        [(_, body)] = _answers(sock, 1)
        assert json.loads(body)["shard"]["index"] == (1 - here if other_first else here)
    assert content(workers, first) == b"onethree"
    assert content(workers, second) == b"two"


def test_a_hand_off_to_an_owner_that_is_down_falls_back_to_503_then_moves(
    workers: ServerProcess,
) -> None:
    """The owner is killed and not restarted (the parent is stopped): the request is forwarded, the
    forward gives up with 503, and the connection stays open; once the owner is back it moves."""
    owner = 1
    path = path_of_shard(owner, "down")
    create(workers, path, b"a")
    owner_pid = worker_of_shard(workers, owner)
    assert owner_pid is not None
    owner_handoff = handoff_path(_shard_sockets(owner_pid), owner)
    os.kill(workers.pid, signal.SIGSTOP)
    try:
        os.kill(owner_pid, signal.SIGKILL)
        # its main thread a zombie is not enough: until its last thread is gone its hand-off socket
        # still takes a connection, which is then lost with it (decision 0009, "What is left"): this
        # test is about an owner that is down
        poll_until(
            lambda: _exited(owner_pid) and _refuses(owner_handoff),
            "the owner exited and its hand-off socket closed",
            timeout=30,
        )
        # only the other worker listens once the owner's threads are all gone: every connection
        # reaches it (one made as the owner's listening socket closes is reset: try again)
        connection = http.client.HTTPConnection(workers.host, workers.port, timeout=60)
        before: dict = {}

        def survivor_answers() -> bool:
            try:
                before.update(json.loads(_exchange(connection, "GET", "/healthz")[2])["shard"])
            except (ConnectionError, http.client.HTTPException):
                connection.close()
                return False
            return True

        poll_until(survivor_answers, "the other worker answering alone", timeout=30)
        assert before["index"] == 1 - owner
        status, headers, body = _exchange(
            connection, "POST", f"/v1/stream/{path}", b"b", {"Content-Type": TEXT}
        )
        assert status == 503, body
        assert headers["Retry-After"] == "1"
        assert json.loads(body)["error"]["code"]
        assert holder(connection) == 1 - owner  # still open, still here
        after = json.loads(_exchange(connection, "GET", "/healthz")[2])["shard"]
        assert after["handoff_refused"] > before["handoff_refused"], (before, after)
        assert after["handed_off"] == before["handed_off"], (before, after)
    finally:
        os.kill(workers.pid, signal.SIGCONT)
    poll_until(
        lambda: worker_of_shard(workers, owner) not in (None, owner_pid) and _answers_both(workers),
        "the owner restarted",
        timeout=30,
    )
    status, _, body = _exchange(
        connection, "POST", f"/v1/stream/{path}", b"c", {"Content-Type": TEXT}
    )
    assert status == 204, body
    assert holder(connection) == owner
    connection.close()
    assert content(workers, path) == b"ac"


def _shard_sockets(pid: int) -> Path:
    """The ``--shard-sockets`` directory a worker was started with (its forward and hand-off sockets)."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(os.fsdecode(args[args.index(b"--shard-sockets") + 1]))


def _refuses(path: Path) -> bool:
    """Whether the datagram socket bound at ``path`` is closed (a send there would be refused)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    finally:
        probe.close()
    return False


def _exited(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _answers_both(server: ServerProcess) -> bool:
    try:
        return len(health_of_each(server)) == 2
    except (OSError, AssertionError):
        return False


@needs_openssl
def test_tls_connections_are_forwarded_not_handed_over(tmp_path: Path) -> None:
    with tls_server(tmp_path, "--workers", "2") as server, requests.Session() as session:
        verify = str(server.cert)

        def shard_document() -> dict:
            response = session.get(server.base + "/healthz", verify=verify, timeout=10)
            return response.json()["shard"]

        before = shard_document()
        assert "handed_off" not in before  # no hand-off at all over TLS
        url = f"{server.base}/v1/stream/{path_of_shard(1 - before['index'], 'tls')}"
        kwargs = {"headers": {"Content-Type": TEXT}, "verify": verify, "timeout": 10}
        assert session.put(url, **kwargs).status_code == 201
        assert session.post(url, data=b"x", **kwargs).status_code == 204
        assert session.get(url, params={"offset": "-1"}, verify=verify, timeout=10).content == b"x"
        after = shard_document()
        assert after["index"] == before["index"]  # the same connection, the same worker
        assert after["forwarded"] - before["forwarded"] == 3


# -- live reads on a connection that moved --------------------------------------------------------


def test_a_long_poll_carried_by_a_hand_off_is_woken_by_an_append(
    workers: ServerProcess, connection: http.client.HTTPConnection
) -> None:
    here = holder(connection)
    path = path_of_shard(1 - here, "lp")
    tail = create(workers, path, b"a")
    before = totals(workers)
    # The long-poll is the request the hand-off carries: the owner parks it.
    connection.request("GET", f"/v1/stream/{path}?offset={tail}&live=long-poll")
    poll_until(lambda: grown(workers, before)["adopted"] == 1, "the owner adopted the connection")
    posted = requests.post(workers.stream_url(path), data=b"later", headers={"Content-Type": TEXT})
    assert posted.status_code == 204
    response = connection.getresponse()
    assert (response.status, response.read()) == (200, b"later")
    assert holder(connection) == 1 - here


def test_sse_carried_by_a_hand_off_streams_appends(
    workers: ServerProcess, connection: http.client.HTTPConnection
) -> None:
    here = holder(connection)
    path = path_of_shard(1 - here, "sse")
    tail = create(workers, path, b"a")
    before = totals(workers)
    connection.request("GET", f"/v1/stream/{path}?offset={tail}&live=sse")
    response = connection.getresponse()
    assert response.status == 200
    assert grown(workers, before)["adopted"] == 1
    received: list[bytes] = []

    def read() -> None:
        while b"later" not in b"".join(received):
            piece = response.read1(64 * 1024)  # de-chunked
            if not piece:
                return
            received.append(piece)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    poll_until(lambda: b"event: control" in b"".join(received), "the SSE stream started")
    posted = requests.post(workers.stream_url(path), data=b"later", headers={"Content-Type": TEXT})
    assert posted.status_code == 204
    reader.join(30)
    assert not reader.is_alive()
    assert ("data", "later") in sse_events(b"".join(received).decode())
