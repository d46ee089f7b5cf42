"""A request answered by the server leaves no reference cycle behind (``fastpath.responder``).

The raw responder offered in a request's scope holds uvicorn's request cycle, which holds the scope: as
long as the responder stayed in the scope, every request's cycle, scope, headers and answer were a
reference cycle that only the cyclic GC could free (~13 objects a request, ~10% of a create's event-loop
CPU in collections, docs/benchmarks.md). Taken out of the scope once the app has it, they are freed by
reference counting when the request is done. Real uvicorn servers in-process, on the direct path and on
the ordinary one; the collector saves what it finds (``gc.DEBUG_SAVEALL``) instead of freeing it.
"""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from durastream_server.http.fastpath import Prepared, RawResponder
from tests.server.http.test_direct_appends import JSON
from tests.server.http.test_fastpath import Conn, request, running, status

# Per round (%d: the round's stream): a create, a re-create, an append, a read, a HEAD, a long-poll
# answered at once, and two refusals by the engine (a create of another content type, an append of one).
REQUESTS = [
    (b"PUT /v1/stream/g/%d HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n" + JSON, 201),
    (b"PUT /v1/stream/g/%d HTTP/1.1\r\nHost: localhost\r\n" + JSON, 200),
    (b"POST /v1/stream/g/%d HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n" + JSON, 204),
    (b"GET /v1/stream/g/%d?offset=-1 HTTP/1.1\r\nHost: localhost\r\n", 200),
    (b"HEAD /v1/stream/g/%d HTTP/1.1\r\nHost: localhost\r\n", 200),
    (b"GET /v1/stream/g/%d?offset=-1&live=long-poll HTTP/1.1\r\nHost: localhost\r\n", 200),
    (b"PUT /v1/stream/g/%d HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n", 409),
    (
        b"POST /v1/stream/g/%d HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n"
        b"Content-Type: text/plain\r\n",
        409,
    ),
]
BODIES = {b"POST": b'{"n":1}'}
_REQUEST_TYPES = (RequestResponseCycle, RawResponder, Prepared)


@pytest.mark.parametrize("direct", [True, False])
def test_answered_requests_leave_no_reference_cycles(tmp_path: Path, direct: bool) -> None:
    async def scenario() -> list[object]:
        async with running(tmp_path, direct=direct) as (_, port):
            conn = await Conn.open(port)  # one keep-alive connection, open throughout
            try:
                for round_ in range(2):  # the first round warms up (caches, lazily made objects)
                    if round_ == 1:
                        gc.collect()
                        gc.set_debug(gc.DEBUG_SAVEALL)
                    for head, expected in REQUESTS:
                        body = BODIES.get(head.split(b" ", 1)[0], b"")
                        conn.send(head.replace(b"%d", b"%d" % round_) + b"\r\n" + body)
                        answer = await conn.response()
                        assert status(answer) == expected, answer
                    # A last request, so that the cycles above are no longer the connection's own.
                    conn.send(b"HEAD /v1/stream/g/%d HTTP/1.1\r\nHost: localhost\r\n\r\n" % round_)
                    assert status(await conn.response()) == 200
                    await asyncio.sleep(0)  # let the server finish its request bookkeeping
                gc.collect()
                return [o for o in gc.garbage if isinstance(o, _REQUEST_TYPES)]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                conn.close()

    left = asyncio.run(scenario())
    assert left == [], f"{len(left)} request objects were only freed by the cyclic GC"


async def _parked(port: int) -> None:
    """Until the server reports a parked long-poll (``/healthz``'s ``waiters``), with a deadline."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        answer = await request(port, "GET", "/healthz")
        if json.loads(answer.split(b"\r\n\r\n", 1)[1])["waiters"] >= 1:
            return
        assert asyncio.get_running_loop().time() < deadline, answer
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("direct", [True, False])
def test_a_woken_long_poll_leaves_no_reference_cycles(tmp_path: Path, direct: bool) -> None:
    """A long-poll parked until an append wakes it (the live readers of issue 17's 10,000 streams)."""

    async def scenario() -> list[object]:
        async with running(tmp_path, direct=direct) as (_, port):
            writer, reader = await Conn.open(port), await Conn.open(port)
            try:
                writer.send(b"PUT /v1/stream/w HTTP/1.1\r\nHost: localhost\r\n" + JSON + b"\r\n")
                assert status(await writer.response()) == 201
                for round_ in range(2):  # the first round warms up
                    if round_ == 1:
                        gc.collect()
                        gc.set_debug(gc.DEBUG_SAVEALL)
                    reader.get("/v1/stream/w?offset=now&live=long-poll")
                    parked = asyncio.ensure_future(reader.response())
                    await _parked(port)
                    append = b"POST /v1/stream/w HTTP/1.1\r\nHost: localhost\r\n"
                    writer.send(append + b"Content-Length: 7\r\n" + JSON + b"\r\n" + b'{"n":1}')
                    assert status(await writer.response()) == 204
                    assert status(await parked) == 200
                    for conn in (reader, writer):  # the cycles above are no longer theirs
                        conn.send(b"HEAD /v1/stream/w HTTP/1.1\r\nHost: localhost\r\n\r\n")
                        assert status(await conn.response()) == 200
                    await asyncio.sleep(0)
                gc.collect()
                return [o for o in gc.garbage if isinstance(o, _REQUEST_TYPES)]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                reader.close()
                writer.close()

    left = asyncio.run(scenario())
    assert left == [], f"{len(left)} request objects were only freed by the cyclic GC"
