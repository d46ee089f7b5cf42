"""The long-poll wake fast path (``http/fastpath.py``, wake groups in ``http/live.py``), on a real uvicorn
server in-process, so the test can see which answers took the fast path.

What must hold: an answer written by the fast path is byte for byte what the ordinary ASGI send would
have written for that request; the connection behaves as after any other response (keep-alive reuse,
pipelined requests); a reader that went away while parked does not disturb the others; and every case
the fast path does not cover (connection closing, HTTP/1.0, conditional requests, deleted streams) is
answered the ordinary way. No timings are asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn

from durastream_server import server as server_module
from durastream_server.config import ServerConfig
from durastream_server.http import fastpath
from durastream_server.http.app import DurastreamApp
from durastream_server.http.guard import protocol_class

FIXED_NOW = 1_800_000_000.0  # the handlers' clock (cursors), fixed so two answers can be compared
ORIGIN = b"Origin: http://localhost:3000\r\n"  # an allowed origin: the app adds CORS headers for it


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path,
    *,
    date_header: bool = False,
    long_poll_timeout: float = 20.0,
    direct: bool = False,
    limit_concurrency: int | None = None,
    keep_alive: float = 5.0,
    **settings: object,
) -> AsyncIterator[tuple[DurastreamApp, int]]:
    """A real uvicorn server in-process; ``direct``: with the direct append path (as the server runs);
    ``limit_concurrency``, ``keep_alive`` (``timeout_keep_alive``): uvicorn's settings."""
    config = ServerConfig(
        data_dir=tmp_path / "data",
        long_poll_timeout=long_poll_timeout,
        **settings,  # type: ignore[arg-type]
    )
    app = server_module.build_app(config)
    uv_config = uvicorn.Config(
        app,
        http=fastpath.with_fast_path(protocol_class(config), app if direct else None),
        ws="none",
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        date_header=date_header,
        limit_concurrency=limit_concurrency,
        timeout_keep_alive=keep_alive,
    )
    server = uvicorn.Server(uv_config)
    sock = server_module.bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), task
        await asyncio.sleep(0.01)
    app._streams._clock = lambda: FIXED_NOW  # type: ignore[union-attr]
    try:
        yield app, port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        sock.close()


class Conn:
    """A raw HTTP/1.1 connection: what is sent and received is exactly the bytes on the wire."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def get(self, target: str, extra: bytes = b"", version: bytes = b"HTTP/1.1") -> None:
        self.send(
            b"GET "
            + target.encode()
            + b" "
            + version
            + b"\r\nHost: localhost\r\n"
            + extra
            + b"\r\n"
        )

    async def response(self) -> bytes:
        """One whole response (Content-Length framed, as all of ours are), as received."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 20)
        match = re.search(rb"\r\ncontent-length: (\d+)\r\n", head)
        body = await self.reader.readexactly(int(match.group(1))) if match else b""
        return head + body

    async def closed_by_server(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 20) == b""

    def close(self) -> None:
        self.writer.close()


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def header(response: bytes, name: bytes) -> bytes | None:
    match = re.search(rb"\r\n" + name + rb": ([^\r]*)\r\n", response)
    return match.group(1) if match else None


def without_request_id(response: bytes) -> bytes:
    """The response with its ``x-request-id`` line removed: that header is the one per-request part of
    an answer (each connection's own id, ``http/requestid.py``)."""
    ids = re.findall(rb"\r\nx-request-id: [^\r]+(?=\r\n)", response)
    assert len(ids) == 1, response
    return response.replace(ids[0], b"", 1)


async def request(
    port: int, method: str, path: str, body: bytes = b"", extra: bytes = b""
) -> bytes:
    conn = await Conn.open(port)
    try:
        conn.send(
            f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n".encode()
            + extra
            + b"\r\n"
            + body
        )
        return await conn.response()
    finally:
        conn.close()


async def json_stream(port: int, name: str) -> tuple[str, str]:
    """A JSON stream with one message; its path and tail offset."""
    path = f"/v1/stream/{name}"
    created = await request(port, "PUT", path, extra=b"Content-Type: application/json\r\n")
    assert status(created) == 201, created
    appended = await append(port, path, b'{"seed":0}')
    tail = header(appended, b"stream-next-offset")
    assert tail is not None
    return path, tail.decode()


async def append(port: int, path: str, body: bytes, extra: bytes = b"") -> bytes:
    response = await request(
        port, "POST", path, body, extra=b"Content-Type: application/json\r\n" + extra
    )
    assert status(response) in (200, 204), response
    return response


async def parked(app: DurastreamApp, count: int) -> None:
    live = app._live
    assert live is not None
    for _ in range(2000):
        if live.parked == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{live.parked} parked, expected {count}")


def fast_answers(app: DurastreamApp) -> int:
    assert app._live is not None
    return app._live.fast_answers


def test_woken_answers_are_byte_identical_to_the_ordinary_path(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            path, tail = await json_stream(port, "identical")
            target = f"{path}?offset={tail}&live=long-poll"
            fast = [await Conn.open(port) for _ in range(5)]
            for conn in fast:
                conn.get(target, ORIGIN)
            # A conditional request is answered the ordinary way; its ETag does not match, so its
            # answer is the same as everyone else's.
            ordinary = await Conn.open(port)
            ordinary.get(target, ORIGIN + b'If-None-Match: "no-such-etag"\r\n')
            await parked(app, 6)
            await append(port, path, json.dumps({"event": 1, "text": "\u00e9"}).encode())
            answers = [await conn.response() for conn in fast]
            reference = await ordinary.response()
            assert fast_answers(app) == 5
            assert status(reference) == 200
            assert header(reference, b"access-control-allow-origin") == b"http://localhost:3000"
            assert header(reference, b"stream-cursor") is not None
            assert header(reference, b"content-security-policy") == b"sandbox"  # stored content
            assert header(reference, b"x-content-type-options") == b"nosniff"  # is inert
            assert reference.endswith(b'[{"event": 1, "text": "\\u00e9"}]')
            # Byte for byte the same, but for each connection's own request id (all distinct).
            assert all(
                without_request_id(answer) == without_request_id(reference) for answer in answers
            )
            ids = {header(response, b"x-request-id") for response in [*answers, reference]}
            assert len(ids) == 6
            for conn in [*fast, ordinary]:
                conn.close()

    asyncio.run(scenario())


def test_answer_to_a_closing_stream_is_identical_too(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            path, tail = await json_stream(port, "closing")
            target = f"{path}?offset={tail}&live=long-poll"
            fast, ordinary = await Conn.open(port), await Conn.open(port)
            fast.get(target)
            ordinary.get(target, b'If-None-Match: "x"\r\n')
            await parked(app, 2)
            closed = await request(port, "POST", path, extra=b"Stream-Closed: true\r\n")
            assert status(closed) in (200, 204), closed
            answer, reference = await fast.response(), await ordinary.response()
            assert fast_answers(app) == 1
            assert status(reference) == 204
            assert header(reference, b"stream-closed") == b"true"
            assert without_request_id(answer) == without_request_id(reference)
            fast.close()
            ordinary.close()

    asyncio.run(scenario())


def test_date_header_is_the_servers_and_stays_in_place(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, date_header=True) as (app, port):
            path, tail = await json_stream(port, "dated")
            target = f"{path}?offset={tail}&live=long-poll"
            fast, ordinary = await Conn.open(port), await Conn.open(port)
            fast.get(target)
            ordinary.get(target, b'If-None-Match: "x"\r\n')
            await parked(app, 2)
            await append(port, path, b'{"n":1}')
            answer, reference = await fast.response(), await ordinary.response()
            assert fast_answers(app) == 1
            for response in (answer, reference):
                assert re.match(rb"HTTP/1\.1 200 OK\r\ndate: [^\r]+ GMT\r\n", response)
            # The Date value is the one uvicorn had when each request arrived: compare without it.
            undated = [
                re.sub(rb"\r\ndate: [^\r]*", b"", without_request_id(r))
                for r in (answer, reference)
            ]
            assert undated[0] == undated[1]
            fast.close()
            ordinary.close()

    asyncio.run(scenario())


def test_connection_is_reused_after_a_fast_path_answer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            path, tail = await json_stream(port, "keepalive")
            conn = await Conn.open(port)
            offset = tail
            for event in range(3):  # park, wake, park again on the same connection
                conn.get(f"{path}?offset={offset}&live=long-poll")
                await parked(app, 1)
                await append(port, path, b'{"event":%d}' % event)
                answer = await conn.response()
                assert status(answer) == 200
                offset = header(answer, b"stream-next-offset").decode()  # type: ignore[union-attr]
            assert fast_answers(app) == 3
            conn.get(f"{path}?offset=-1")  # and an ordinary request after them
            catch_up = await conn.response()
            assert status(catch_up) == 200
            assert catch_up.endswith(b'[{"seed":0},{"event":0},{"event":1},{"event":2}]')
            conn.close()

    asyncio.run(scenario())


def test_pipelined_request_is_answered_after_the_fast_path_answer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            path, tail = await json_stream(port, "pipelined")
            conn = await Conn.open(port)
            # Two requests in one write: the second waits in uvicorn's pipeline until the first,
            # parked, is answered.
            conn.get(f"{path}?offset={tail}&live=long-poll")
            conn.get(f"{path}?offset=-1")
            await parked(app, 1)
            await append(port, path, b'{"n":1}')
            first, second = await conn.response(), await conn.response()
            assert fast_answers(app) == 1
            assert status(first) == 200 and first.endswith(b'[{"n":1}]')
            assert status(second) == 200 and second.endswith(b'[{"seed":0},{"n":1}]')
            conn.close()

    asyncio.run(scenario())


def test_reader_gone_while_parked_does_not_break_the_burst(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            path, tail = await json_stream(port, "gone")
            target = f"{path}?offset={tail}&live=long-poll"
            conns = [await Conn.open(port) for _ in range(6)]
            for conn in conns:
                conn.get(target)
            await parked(app, 6)
            for conn in conns[::2]:  # three readers hang up while parked
                conn.writer.transport.abort()
            await append(port, path, b'{"n":1}')
            for conn in conns[1::2]:
                assert status(await conn.response()) == 200
            await parked(app, 0)
            assert 3 <= fast_answers(app) <= 6  # a hang-up not yet noticed may still be written to
            # The server carries on: a new reader parks and is woken.
            now_tail = header(await request(port, "HEAD", path), b"stream-next-offset")
            assert now_tail is not None
            late = await Conn.open(port)
            late.get(f"{path}?offset={now_tail.decode()}&live=long-poll")
            await parked(app, 1)
            await append(port, path, b'{"n":2}')
            assert (await late.response()).endswith(b'[{"n":2}]')
            for conn in [*conns[1::2], late]:
                conn.close()

    asyncio.run(scenario())


def test_closing_connections_and_http_1_0_take_the_ordinary_path(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            path, tail = await json_stream(port, "closing-conn")
            target = f"{path}?offset={tail}&live=long-poll"
            closing, old, fast = await Conn.open(port), await Conn.open(port), await Conn.open(port)
            closing.get(target, b"Connection: close\r\n")
            old.get(target, version=b"HTTP/1.0")
            fast.get(target)
            await parked(app, 3)
            await append(port, path, b'{"n":1}')
            for conn in (closing, old):
                answer = await conn.response()
                assert status(answer) == 200
                # Whether uvicorn also sends "Connection: close" depends on its version (0.30 does
                # not); what matters is that the server closes the connection after the answer.
                assert await conn.closed_by_server()
            assert status(await fast.response()) == 200
            assert fast_answers(app) == 1
            for conn in (closing, old, fast):
                conn.close()

    asyncio.run(scenario())


def test_stream_deleted_while_parked_answers_each_reader_404(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            path, tail = await json_stream(port, "deleted")
            conns = [await Conn.open(port) for _ in range(3)]
            for conn in conns:
                conn.get(f"{path}?offset={tail}&live=long-poll")
            await parked(app, 3)
            assert status(await request(port, "DELETE", path)) == 204
            for conn in conns:
                answer = await conn.response()
                assert status(answer) == 404, answer
                assert b'"code"' in answer
                conn.close()
            assert fast_answers(app) == 0

    asyncio.run(scenario())


def test_timeouts_still_answer_204_and_leave_no_group_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, long_poll_timeout=0.3) as (app, port):
            path, tail = await json_stream(port, "timeout")
            conns = [await Conn.open(port) for _ in range(3)]
            for conn in conns:
                conn.get(f"{path}?offset={tail}&live=long-poll")
            for conn in conns:
                answer = await conn.response()
                assert status(answer) == 204
                assert header(answer, b"stream-cursor") is not None
                conn.close()
            assert app._live is not None
            await parked(app, 0)
            assert app._live._groups == {}

    asyncio.run(scenario())


def test_readers_parked_on_many_streams_hold_nothing_shared_and_drain_releases_each(
    tmp_path: Path,
) -> None:
    """Issue 17's 10,000 readers on 10,000 streams: each parked long-poll (and its wake group's leader,
    and an SSE wait) must cost O(1) to park and to leave. A done-callback per reader on one shared
    drain future did not: asyncio scans the callback list to remove one, so every wake-up and timeout
    cost O(parked readers). Drain must still release every one of them."""

    async def scenario() -> None:
        async with running(tmp_path) as (app, port):
            live = app._live
            assert live is not None
            streams = [await json_stream(port, f"many-{i}") for i in range(30)]
            polls = []
            for path, tail in streams:
                conn = await Conn.open(port)
                conn.get(f"{path}?offset={tail}&live=long-poll")
                polls.append(conn)
            sse = await Conn.open(port)
            sse.get(f"{streams[0][0]}?offset={streams[0][1]}&live=sse")
            await parked(app, 31)
            shared = [v for v in vars(live).values() if isinstance(v, asyncio.Future)]
            assert [f for f in shared if len(f._callbacks or ()) >= 31] == []
            app.begin_drain()
            for conn in polls:
                assert status(await conn.response()) == 204
            assert await asyncio.wait_for(sse.reader.read(), 20) != b""  # its head, then the end
            await parked(app, 0)
            assert live._on_drain == set()
            assert live._groups == {}
            for conn in (*polls, sse):
                conn.close()

    asyncio.run(scenario())


def test_prepared_bytes_match_uvicorns_send() -> None:
    """The encoder against uvicorn's own send, with a recording transport (no server)."""

    class Transport:
        def __init__(self) -> None:
            self.data = b""

        def write(self, data: bytes) -> None:
            self.data += data

        def writelines(self, parts: tuple[bytes, ...]) -> None:
            self.data += b"".join(parts)

        def is_closing(self) -> bool:
            return False

    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from durastream_server.http import responses

    def cycle(transport: Transport, defaults: list[tuple[bytes, bytes]]) -> RequestResponseCycle:
        return RequestResponseCycle(
            scope={"type": "http", "method": "GET", "headers": []},  # type: ignore[typeddict-item]
            transport=transport,  # type: ignore[arg-type]
            flow=FlowControl(transport),  # type: ignore[arg-type]
            logger=None,  # type: ignore[arg-type]
            access_logger=None,  # type: ignore[arg-type]
            access_log=False,
            default_headers=defaults,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=True,
            on_response=lambda: None,
        )

    async def scenario() -> None:
        defaults = [(b"date", b"Thu, 26 Nov 2026 01:00:00 GMT")]
        headers = [("Content-Type", "application/json"), ("Stream-Next-Offset", "0_1")]
        body = b'[{"a":1}]'
        ordinary = Transport()
        via_send = cycle(ordinary, defaults)
        await responses.send_response(via_send.send, 200, headers, body)
        written = Transport()
        via_fast_path = cycle(written, defaults)
        prepared = fastpath.prepare(200, responses.response_headers(200, headers, body), body)
        assert prepared is not None
        assert fastpath.RawResponder(via_fast_path).send(prepared)
        assert written.data == ordinary.data
        assert via_fast_path.response_complete and via_fast_path.response_started
        assert not fastpath.RawResponder(via_fast_path).send(prepared)  # only once per request
        # A header uvicorn would refuse is not prepared; the ordinary send reports it.
        bad = [("Stream-Cursor", "1\r\nx: y")]
        assert fastpath.prepare(204, responses.response_headers(204, bad, b""), b"") is None

    asyncio.run(scenario())


def test_default_header_lines_follow_uvicorns_current_list() -> None:
    """The default headers' lines are shared by the answers of one list (uvicorn swaps the list each
    second, for the date): a new list, even an equal-looking one, gets its own lines."""
    first = [(b"date", b"Thu, 26 Nov 2026 01:00:00 GMT")]
    second = [(b"date", b"Thu, 26 Nov 2026 01:00:01 GMT")]
    head = fastpath.prepare_lines(204, b"x-a: 1\r\n", [])
    assert head is not None
    assert (
        head.head(first)
        == b"HTTP/1.1 204 No Content\r\ndate: Thu, 26 Nov 2026 01:00:00 GMT\r\nx-a: 1\r\n"
    )
    other = fastpath.prepare_lines(204, b"x-a: 1\r\n", [(b"x-b", b"2")])
    assert other is not None
    assert other.head(second) == (
        b"HTTP/1.1 204 No Content\r\ndate: Thu, 26 Nov 2026 01:00:01 GMT\r\nx-a: 1\r\nx-b: 2\r\n"
    )
    assert fastpath.prepare_lines(204, b"", [(b"x-b", b"1\r\nx: y")]) is None  # refused as prepare
