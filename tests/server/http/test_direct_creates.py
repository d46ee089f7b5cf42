"""Creates (``PUT``) served without the ASGI round trips (``http/fastpath.py``, ``DurastreamApp.direct``),
on real uvicorn servers in-process.

What must hold: every answer is byte for byte what the ordinary ASGI path answers to the same request
(new streams 201 with their Location, idempotent re-creates 200, different configurations 409, malformed
headers and bodies 4xx with the same JSON error, forks, closed and TTL creates, with and without a body
or a Content-Length); the access log and the request counters record the same requests; pipelined creates
are answered in order. No timings are asserted.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from durastream_server.http.app import DIRECT_MAX_BODY
from durastream_server.http.fastpath import DIRECT_SUPPORTED
from tests.server.http.test_direct_appends import JSON, needs_direct
from tests.server.http.test_fastpath import (
    ORIGIN,
    Conn,
    header,
    running,
    status,
    without_request_id,
)

TEXT = b"Content-Type: text/plain\r\n"
CLOSED = b"Stream-Closed: true\r\n"
NO_LENGTH = None  # a PUT that declares no body at all (no Content-Length)

# (path, body, extra headers, Host): creates whose answers cover every kind of outcome, in order.
SESSION: list[tuple[str, bytes | None, bytes, bytes]] = [
    ("/v1/stream/a", b"", JSON, b"localhost"),  # 201
    ("/v1/stream/a", b"", JSON, b"localhost"),  # 200 idempotent
    ("/v1/stream/a", NO_LENGTH, JSON + ORIGIN, b"localhost"),  # 200, CORS
    ("/v1/stream/a", b"", TEXT, b"localhost"),  # 409 content type
    ("/v1/stream/b", NO_LENGTH, b"", b"localhost:8080"),  # 201, default type, its Host
    ("/v1/stream/c", b'[{"n":1},{"n":2}]', JSON, b"localhost"),  # 201 with data
    ("/v1/stream/c", b'{"n":3}', JSON, b"localhost"),  # 200 (the body is not compared)
    ("/v1/stream/d", b"", JSON + CLOSED, b"localhost"),  # 201 closed
    ("/v1/stream/d", b"", JSON, b"localhost"),  # 409 closed status
    ("/v1/stream/e", b"", JSON + b"Stream-TTL: 3600\r\n", b"localhost"),  # 201
    ("/v1/stream/e", b"", JSON + b"Stream-TTL: 3600\r\n", b"localhost"),  # 200
    ("/v1/stream/e", b"", JSON + b"Stream-TTL: 60\r\n", b"localhost"),  # 409 TTL
    ("/v1/stream/f", b"", JSON + b"Stream-TTL: +5\r\n", b"localhost"),  # 400 TTL syntax
    (
        "/v1/stream/f",
        b"",
        JSON + b"Stream-TTL: 5\r\nStream-Expires-At: 2099-01-01T00:00:00Z\r\n",
        b"localhost",
    ),  # 400 both
    ("/v1/stream/g", b"", JSON + b"Stream-Expires-At: 2099-01-01T00:00:00Z\r\n", b"localhost"),
    ("/v1/stream/h", b"{nope", JSON, b"localhost"),  # 400 invalid JSON (found by the engine)
    ("/v1/stream/h", b"[]", JSON, b"localhost"),  # 201, empty array allowed on create
    ("/v1/stream/i", NO_LENGTH, b"Stream-Forked-From: /v1/stream/c\r\n", b"localhost"),  # 201 fork
    ("/v1/stream/i", b"", b"Stream-Forked-From: /v1/stream/c\r\n", b"localhost"),  # 200
    ("/v1/stream/j", b"", b"Stream-Forked-From: /v1/stream/nothing\r\n", b"localhost"),  # 404
    ("/v1/stream/j", b"", b"Stream-Fork-Offset: -1\r\n", b"localhost"),  # 400 offset, no source
    ("/v1/stream/k", b"x" * 100, TEXT + b"X-Request-Id: create-k\r\n", b"localhost"),  # 201
    ("/v1/stream/k%2", b"", JSON, b"localhost"),  # 400 bad path
    ("/v1/stream/__ds/streams", b"", JSON, b"localhost"),  # not a stream: ordinary path
    # 201: the Location echoes the raw path and the Host, the Content-Type its parameters
    (
        "/v1/stream/%C3%A9t%C3%A9/l",
        b"",
        b"Content-Type: Text/Plain; charset=UTF-8\r\n",
        b"[::1]:8080",
    ),
    ("/v1/stream/m", b"1", TEXT + CLOSED, b"localhost"),  # 201 closed with data
    ("/v1/stream/m", b"", TEXT + CLOSED, b"localhost"),  # 200 closed
]


def _wire(path: str, body: bytes | None, extra: bytes, host: bytes) -> bytes:
    length = b"" if body is None else b"Content-Length: %d\r\n" % len(body)
    return b"PUT %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n%s" % (
        path.encode(),
        host,
        length,
        extra,
        body or b"",
    )


async def _session(tmp_path: Path, *, direct: bool) -> tuple[list[bytes], int, list[str], bytes]:
    """The answers, the count of direct answers, the access log's lines without their durations and
    ids, and the request counters of ``/metrics``."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    access = logging.getLogger("durastream_server.access")
    access.addHandler(handler)
    try:
        async with running(tmp_path, direct=direct, access_log=True) as (app, port):
            conn = await Conn.open(port)  # one keep-alive connection
            answers = []
            for path, body, extra, host in SESSION:
                conn.send(_wire(path, body, extra, host))
                answers.append(await conn.response())
            taken = app.direct_answers
            conn.get("/metrics")
            metrics = await conn.response()
            conn.close()
    finally:
        access.removeHandler(handler)
    log = [
        f"{r.args[0]} {r.args[1]} {r.args[3]} {r.args[5]} {r.args[6]}"  # type: ignore[index]
        for r in records
        if r.args and r.args[0] == "PUT"  # type: ignore[index]
    ]
    counters = b"\n".join(
        line
        for line in metrics.split(b"\n")
        if line.startswith(b"durastream_http_requests_total") and b'route="create"' in line
    )
    return answers, taken, log, counters


def test_direct_creates_are_byte_identical_to_the_ordinary_path(tmp_path: Path) -> None:
    async def scenario() -> None:
        direct, taken, direct_log, direct_counters = await _session(
            tmp_path / "direct", direct=True
        )
        ordinary, none, ordinary_log, ordinary_counters = await _session(
            tmp_path / "ordinary", direct=False
        )
        assert none == 0
        statuses = [status(a) for a in direct]
        if (
            DIRECT_SUPPORTED
        ):  # else both runs took the ordinary path: their answers must still agree
            # Every success in one write; the engine's refusals (409, 404, invalid JSON) went out
            # through the ordinary send, the others were declined before the engine.
            assert taken == statuses.count(201) + statuses.count(200) == 17
        assert statuses == [
            *(201, 200, 200, 409, 201, 201, 200, 201, 409, 201, 200, 409, 400, 400, 201),
            *(400, 201, 201, 200, 404, 400, 201, 400, 404, 201, 201, 200),
        ]
        assert header(direct[0], b"location") == b"http://localhost/v1/stream/a"
        assert header(direct[4], b"location") == b"http://localhost:8080/v1/stream/b"
        assert header(direct[5], b"stream-next-offset") != header(direct[0], b"stream-next-offset")
        assert header(direct[7], b"stream-closed") == b"true"
        assert header(direct[2], b"access-control-allow-origin") == b"http://localhost:3000"
        assert header(direct[21], b"x-request-id") == b"create-k"
        assert header(direct[24], b"location") == b"http://[::1]:8080/v1/stream/%C3%A9t%C3%A9/l"
        assert header(direct[24], b"content-type") == b"text/plain; charset=UTF-8"
        assert header(direct[26], b"stream-closed") == b"true"
        assert b'"code": "' in direct[3] and header(direct[3], b"content-type") == (
            b"application/json"
        )
        for n, (ours, theirs) in enumerate(zip(direct, ordinary, strict=True)):
            # Request ids differ per server run (a random prefix); every answer carries one.
            ours, theirs = without_request_id(ours), without_request_id(theirs)
            assert ours == theirs, (n, SESSION[n], ours, theirs)
        assert len(direct_log) == len(SESSION)
        assert direct_log == ordinary_log
        assert direct_counters == ordinary_counters and b'code="201"' in direct_counters

    asyncio.run(scenario())


@needs_direct
def test_pipelined_creates_are_answered_in_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, direct=True) as (app, port):
            conn = await Conn.open(port)
            conn.send(
                b"".join(
                    _wire(f"/v1/stream/p{n}", b'{"n":%d}' % n, JSON, b"localhost") for n in range(5)
                )
                + _wire("/v1/stream/p0", b"", JSON, b"localhost")
            )
            answers = [await conn.response() for _ in range(6)]
            assert [status(a) for a in answers] == [201] * 5 + [200]
            assert [header(a, b"location") for a in answers[:5]] == [
                b"http://localhost/v1/stream/p%d" % n for n in range(5)
            ]
            assert app.direct_answers == 6
            conn.get("/v1/stream/p3?offset=-1")  # the connection goes on after them
            assert (await conn.response()).endswith(b'[{"n":3}]')
            conn.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        ("large body", _wire("/v1/stream/l", b"x" * (DIRECT_MAX_BODY + 1), TEXT, b"localhost")),
        (
            "chunked body",
            b"PUT /v1/stream/l HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            + TEXT
            + b"\r\n2\r\nab\r\n0\r\n\r\n",
        ),
    ],
)
def test_what_the_direct_path_leaves_to_the_ordinary_path(
    tmp_path: Path, name: str, wire: bytes
) -> None:
    async def scenario() -> None:
        async with running(tmp_path, direct=True) as (app, port):
            conn = await Conn.open(port)
            conn.send(wire)
            assert status(await conn.response()) == 201, name
            assert app.direct_answers == 0, name
            conn.close()

    asyncio.run(scenario())


def test_a_storage_failure_of_a_create_answers_as_on_the_ordinary_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create the engine started and storage failed (its directory could not be made) is answered
    through the ordinary send, with the same status and JSON error; the server goes on serving."""
    real = os.mkdir

    def broken(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if "streams" in str(path):
            raise OSError(errno.EIO, "injected")
        return real(path, *args, **kwargs)

    async def answers(root: Path, *, direct: bool) -> list[bytes]:
        async with running(root, direct=direct) as (app, port):
            conn = await Conn.open(port)
            got = []
            with monkeypatch.context() as patch:
                patch.setattr(os, "mkdir", broken)
                # With more data than a packed create carries (64 KiB): a directory to make
                # (without, or with a small body, the create is packed: no mkdir).
                conn.send(
                    _wire("/v1/stream/broken", b"[" + b"1," * 40_000 + b"1]", JSON, b"localhost")
                )
                got.append(await conn.response())
            for path in ("/v1/stream/broken", "/v1/stream/fine"):
                conn.send(_wire(path, b"[1]", JSON, b"localhost"))
                got.append(await conn.response())
            conn.get("/healthz")
            got.append(await conn.response())
            conn.close()
            return got

    async def scenario() -> None:
        direct = await answers(tmp_path / "direct", direct=True)
        ordinary = await answers(tmp_path / "ordinary", direct=False)
        assert [status(a) for a in direct] == [503, 201, 201, 200]
        assert b'"code": "STORAGE_FAILURE"' in direct[0]
        for ours, theirs in zip(direct[:3], ordinary[:3], strict=True):
            assert without_request_id(ours) == without_request_id(theirs)

    asyncio.run(scenario())
