"""Small appends served without the ASGI round trips (``http/fastpath.py``, ``DurastreamApp.direct``), on real
uvicorn servers in-process.

What must hold: every answer is byte for byte what the ordinary ASGI path answers to the same request
(successes, duplicates, errors before and after the engine staged the append); whatever the direct path
does not take (staged appends, chunked or large bodies, ``Expect``, HTTP/1.0, other routes, requests
refused by authentication) is answered by the ordinary path exactly as before; pipelined appends are
answered in order; a client that goes away does not disturb anyone else. No timings are asserted.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from durastream_server.auth import parse_token_spec
from durastream_server.engine.engine import Engine
from durastream_server.http.app import DIRECT_MAX_BODY
from durastream_server.http.fastpath import DIRECT_SUPPORTED
from tests.server.http.test_auth import RO, RW
from tests.server.http.test_fastpath import (
    ORIGIN,
    Conn,
    header,
    request,
    running,
    status,
    without_request_id,
)

JSON = b"Content-Type: application/json\r\n"

# Tests that count direct answers need a uvicorn that can hand requests over (0.50 and later); on older ones
# (make test-compat: uvicorn 0.30) every request takes the ordinary path, which the other tests still check.
needs_direct = pytest.mark.skipif(
    not DIRECT_SUPPORTED,
    reason="this uvicorn has no _start_asgi_task (0.50 and later): no direct path to test",
)


def producer(pid: str, epoch: int, seq: int) -> bytes:
    return f"Producer-Id: {pid}\r\nProducer-Epoch: {epoch}\r\nProducer-Seq: {seq}\r\n".encode()


# (method, path, body, extra headers): a session of appends whose answers cover every kind of outcome.
SESSION: list[tuple[str, str, bytes, bytes]] = [
    ("PUT", "/v1/stream/a", b"", JSON),
    ("POST", "/v1/stream/a", b'{"n":0}', JSON + producer("p", 0, 0)),  # new data: 200
    ("POST", "/v1/stream/a", b'[{"n":1},{"n":2}]', JSON + producer("p", 0, 1) + ORIGIN),  # CORS
    ("POST", "/v1/stream/a", b'{"n":1}', JSON + producer("p", 0, 1)),  # 409 tuple reused
    ("POST", "/v1/stream/a", b'[{"n":1},{"n":2}]', JSON + producer("p", 0, 1)),  # 204 duplicate
    ("POST", "/v1/stream/a", b'{"n":9}', JSON + producer("p", 0, 5)),  # 409 sequence gap
    ("POST", "/v1/stream/a", b'{"n":9}', JSON + producer("p", 7, 3)),  # 400 new epoch not at 0
    ("POST", "/v1/stream/a", b'{"plain":1}', JSON),  # 204 plain append
    ("POST", "/v1/stream/a", b'{"seq":1}', JSON + b"Stream-Seq: 0005\r\n"),
    ("POST", "/v1/stream/a", b'{"seq":0}', JSON + b"Stream-Seq: 0004\r\n"),  # 409 regression
    ("POST", "/v1/stream/a", b"[]", JSON),  # 400 empty array
    ("POST", "/v1/stream/a", b"{nope", JSON),  # 400 invalid JSON
    ("POST", "/v1/stream/a", b"text", b"Content-Type: text/plain\r\n"),  # 409 type mismatch
    ("POST", "/v1/stream/a", b"{}", b""),  # 400 no Content-Type
    ("POST", "/v1/stream/missing", b"{}", JSON),  # 404
    ("POST", "/v1/stream/a%2", b"{}", JSON),  # 400 bad path
    ("POST", "/v1/stream/a", b"", JSON + b"Stream-Closed: true\r\n" + producer("p", 0, 2)),
    ("POST", "/v1/stream/a", b'{"late":1}', JSON),  # 409 closed
    ("POST", "/v1/stream/a", b"", b"Stream-Closed: true\r\n"),  # 204 idempotent close
    ("POST", "/v1/stream/a", b"", JSON + b"Stream-Closed: true\r\n" + producer("p", 0, 2)),
]


async def _answers(
    tmp_path: Path, *, direct: bool, session: list[tuple[str, str, bytes, bytes]] = SESSION
) -> tuple[list[bytes], int]:
    async with running(tmp_path, direct=direct) as (app, port):
        answers = []
        conn = await Conn.open(port)  # one keep-alive connection, as a producer has
        for method, path, body, extra in session:
            conn.send(
                f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n".encode()
                + extra
                + b"\r\n"
                + body
            )
            answers.append(await conn.response())
        conn.close()
        return answers, app.direct_answers


def test_direct_answers_are_byte_identical_to_the_ordinary_path(tmp_path: Path) -> None:
    async def scenario() -> None:
        direct, taken = await _answers(tmp_path / "direct", direct=True)
        ordinary, none = await _answers(tmp_path / "ordinary", direct=False)
        assert none == 0
        if (
            DIRECT_SUPPORTED
        ):  # else both runs took the ordinary path: their answers must still agree
            assert taken >= 4  # the new data, the plain and Stream-Seq appends, the close
        statuses = [status(a) for a in direct]
        assert statuses[:3] == [201, 200, 200] and 204 in statuses and 409 in statuses
        assert header(direct[2], b"access-control-allow-origin") == b"http://localhost:3000"
        for n, (ours, theirs) in enumerate(zip(direct, ordinary, strict=True)):
            # Request ids differ per server run (a random prefix); every answer carries one.
            ours, theirs = without_request_id(ours), without_request_id(theirs)
            assert ours == theirs, (n, SESSION[n], ours, theirs)

    asyncio.run(scenario())


# A producer's session (issue 17, h73): its next seqs, which the engine checks, folds and stages in
# one frame (``Engine._next_of_producer``), between every answer the general path gives a producer.
PRODUCER_SESSION: list[tuple[str, str, bytes, bytes]] = [
    ("PUT", "/v1/stream/a", b"", JSON),
    ("PUT", "/v1/stream/t", b"", b"Content-Type: text/plain\r\n"),
    ("POST", "/v1/stream/a", b'{"n":0}', JSON + producer("p", 0, 0)),  # 200, a new producer
    ("POST", "/v1/stream/a", b'{"n":1}', JSON + producer("p", 0, 1)),  # 200, its next seq
    ("POST", "/v1/stream/a", b'[{"n":2},{"n":3}] ', JSON + producer("p", 0, 2) + ORIGIN),
    ("POST", "/v1/stream/a", b'{"n":2}', JSON + producer("p", 0, 2)),  # 409 tuple reused
    ("POST", "/v1/stream/a", b'[{"n":2},{"n":3}] ', JSON + producer("p", 0, 2)),  # 204 duplicate
    ("POST", "/v1/stream/a", b'{"n":9}', JSON + producer("p", 0, 7)),  # 409 sequence gap
    ("POST", "/v1/stream/a", b"text", b"Content-Type: text/plain\r\n" + producer("p", 0, 3)),
    ("POST", "/v1/stream/a", b"{nope", JSON + producer("p", 0, 3)),  # 400 invalid JSON
    ("POST", "/v1/stream/a", b'{"n":3}', JSON + producer("p", 1, 0)),  # 200, a new epoch
    ("POST", "/v1/stream/a", b'{"n":4}', JSON + producer("p", 1, 1)),  # 200, its next seq
    ("POST", "/v1/stream/a", b'{"n":5}', JSON + producer("p", 0, 2)),  # 403 stale epoch
    ("POST", "/v1/stream/t", b"x", b"Content-Type: text/plain\r\n" + producer("q", 0, 0)),
    ("POST", "/v1/stream/t", b"y", b"Content-Type: text/plain\r\n" + producer("q", 0, 1)),
    ("POST", "/v1/stream/a", b"", JSON + b"Stream-Closed: true\r\n" + producer("p", 1, 2)),
    ("POST", "/v1/stream/a", b'{"n":6}', JSON + producer("p", 1, 3)),  # 409 closed
    ("POST", "/v1/stream/a", b'{"n":4}', JSON + producer("p", 1, 1)),  # 204 duplicate, closed
]


def test_a_producers_next_appends_answer_as_the_general_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-frame path of a producer's next seq against the general path, byte for byte, both
    direct (the engine's ``_next_of_producer`` switched off for the second run)."""

    async def scenario() -> None:
        ours, _ = await _answers(tmp_path / "one-frame", direct=True, session=PRODUCER_SESSION)
        monkeypatch.setattr(Engine, "_next_of_producer", lambda self, request, loop: None)
        general, _ = await _answers(tmp_path / "general", direct=True, session=PRODUCER_SESSION)
        statuses = [status(a) for a in ours]
        assert statuses.count(200) == 7 and {204, 400, 403, 409} <= set(statuses), statuses
        for n, (a, b) in enumerate(zip(ours, general, strict=True)):
            a, b = without_request_id(a), without_request_id(b)
            assert a == b, (n, PRODUCER_SESSION[n], a, b)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        (
            "staged append",
            b"POST /v1/stream/s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n"
            b'Content-Type: application/json\r\nDurastream-Txn: h1\r\n\r\n{"n":1}',
        ),
        (
            "chunked body",
            b"POST /v1/stream/s HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            b'Content-Type: application/json\r\n\r\n7\r\n{"n":1}\r\n0\r\n\r\n',
        ),
        (
            "expect 100-continue",
            b"POST /v1/stream/s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n"
            b'Content-Type: application/json\r\nExpect: 100-continue\r\n\r\n{"n":1}',
        ),
        (
            "large body",
            b"POST /v1/stream/s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % (DIRECT_MAX_BODY + 12)
            + b'{"pad":"'
            + b"x" * (DIRECT_MAX_BODY + 2)
            + b'"}',
        ),
        (
            "subscriptions route",
            b"POST /v1/stream/__ds/subscriptions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: 2\r\nContent-Type: application/json\r\n\r\n{}",
        ),
    ],
)
def test_what_the_direct_path_leaves_to_the_ordinary_path(
    tmp_path: Path, name: str, wire: bytes
) -> None:
    async def scenario() -> None:
        async with running(tmp_path, direct=True) as (app, port):
            created = await request(port, "PUT", "/v1/stream/s", extra=JSON)
            assert status(created) == 201
            before = app.direct_answers  # the create's (direct where supported)
            conn = await Conn.open(port)
            conn.send(wire)
            answer = await conn.response()
            if name == "expect 100-continue":
                assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
                answer = await conn.response()
            expected = 404 if name == "subscriptions route" else (200, 204)  # no such control API
            assert status(answer) in ((expected,) if isinstance(expected, int) else expected)
            assert app.direct_answers == before, name
            conn.close()

    asyncio.run(scenario())


def test_http_1_0_and_connection_close_are_answered_the_ordinary_way(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, direct=True) as (app, port):
            assert status(await request(port, "PUT", "/v1/stream/c", extra=JSON)) == 201
            before = app.direct_answers
            for version, extra in ((b"HTTP/1.0", b""), (b"HTTP/1.1", b"Connection: close\r\n")):
                conn = await Conn.open(port)
                conn.send(
                    b"POST /v1/stream/c "
                    + version
                    + b"\r\nHost: localhost\r\nContent-Length: 2\r\n"
                    + JSON
                    + extra
                    + b"\r\n{}"
                )
                answer = await conn.response()
                assert status(answer) == 204
                # HTTP/1.0 closes unless asked not to: uvicorn before 0.50 does not say so in a header.
                if version == b"HTTP/1.1" or DIRECT_SUPPORTED:
                    assert b"\r\nconnection: close\r\n" in answer
                assert await conn.closed_by_server()
            assert app.direct_answers == before

    asyncio.run(scenario())


def test_uvicorns_own_503_over_the_concurrency_limit_is_not_bypassed(tmp_path: Path) -> None:
    """Over ``limit_concurrency`` uvicorn swaps the app for its 503 answer: the direct path must not serve
    the request anyway."""

    async def scenario() -> None:
        async with running(tmp_path, direct=True, limit_concurrency=2) as (app, port):
            first = await Conn.open(port)
            first.send(
                b"PUT /v1/stream/l HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                + JSON
                + b"\r\n"
            )
            assert status(await first.response()) == 201
            before = app.direct_answers
            second = await Conn.open(port)  # with the first still open: over the limit of 2
            second.send(
                b"POST /v1/stream/l HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n"
                + JSON
                + b"\r\n{}"
            )
            assert status(await second.response()) == 503
            assert app.direct_answers == before
            second.close()
            first.close()

    asyncio.run(scenario())


@needs_direct
def test_pipelined_appends_are_answered_in_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, direct=True) as (app, port):
            assert status(await request(port, "PUT", "/v1/stream/p", extra=JSON)) == 201
            before = app.direct_answers
            conn = await Conn.open(port)
            conn.send(
                b"".join(
                    b"POST /v1/stream/p HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n"
                    + JSON
                    + producer("q", 0, seq)
                    + b'\r\n{"s":%d}' % seq
                    for seq in range(5)
                )
            )
            answers = [await conn.response() for _ in range(5)]
            assert [status(a) for a in answers] == [200] * 5
            assert [header(a, b"producer-seq") for a in answers] == [b"%d" % s for s in range(5)]
            offsets = [header(a, b"stream-next-offset") for a in answers]
            assert offsets == sorted(offsets) and len(set(offsets)) == 5
            assert app.direct_answers == before + 5
            conn.get("/v1/stream/p?offset=-1")  # the connection goes on after them
            assert (await conn.response()).endswith(b'[{"s":0},{"s":1},{"s":2},{"s":3},{"s":4}]')
            conn.close()

    asyncio.run(scenario())


def test_a_client_gone_before_its_commit_disturbs_nobody(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, direct=True) as (app, port):
            assert status(await request(port, "PUT", "/v1/stream/g", extra=JSON)) == 201
            gone = await Conn.open(port)
            gone.send(
                b"POST /v1/stream/g HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n"
                + JSON
                + producer("g", 0, 0)
                + b'\r\n{"g":1}'
            )
            gone.close()
            kept = await request(port, "POST", "/v1/stream/g", b'{"kept":1}', extra=JSON)
            assert status(kept) == 204
            read = await request(port, "GET", "/v1/stream/g?offset=-1")
            assert read.endswith(b'{"kept":1}]')  # the first append may or may not have landed

    asyncio.run(scenario())


def test_a_storage_failure_after_staging_is_a_503_with_a_json_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwritev

    def broken(fd: int, buffers, offset: int) -> int:  # type: ignore[no-untyped-def]
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".seg"):
            raise OSError(errno.EIO, "injected")
        return real(fd, buffers, offset)

    async def scenario() -> None:
        # A segment write that fails: the stream needs a directory (packed appends write none).
        async with running(tmp_path, direct=True, packed_appends=False) as (app, port):
            assert status(await request(port, "PUT", "/v1/stream/f", extra=JSON)) == 201
            monkeypatch.setattr(os, "pwritev", broken)
            answer = await request(port, "POST", "/v1/stream/f", b"{}", extra=JSON)
            monkeypatch.undo()
            assert status(answer) == 503
            assert b'"code": "STORAGE_FAILURE"' in answer
            assert header(answer, b"content-type") == b"application/json"
            health = await request(port, "GET", "/healthz")
            assert status(health) == 200

    asyncio.run(scenario())


@needs_direct
def test_tokens_are_checked_on_the_direct_path(tmp_path: Path) -> None:
    async def scenario() -> None:
        tokens = (parse_token_spec(f"{RW}:read-write"), parse_token_spec(f"{RO}:read-only"))
        async with running(tmp_path, direct=True, auth_tokens=tokens) as (app, port):
            rw = f"Authorization: Bearer {RW}\r\n".encode()
            ro = f"Authorization: Bearer {RO}\r\n".encode()
            assert status(await request(port, "PUT", "/v1/stream/t", extra=JSON + rw)) == 201
            before = app.direct_answers
            assert status(await request(port, "POST", "/v1/stream/t", b"{}", extra=JSON)) == 401
            assert (
                status(await request(port, "POST", "/v1/stream/t", b"{}", extra=JSON + ro)) == 403
            )
            assert app.direct_answers == before
            assert (
                status(await request(port, "POST", "/v1/stream/t", b"{}", extra=JSON + rw)) == 204
            )
            assert app.direct_answers == before + 1

    asyncio.run(scenario())
