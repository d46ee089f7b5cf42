"""The connection guard's timers (``http/guard.py``) cost nothing for a request that arrives whole.

Issue 17: a small append is a few hundred bytes that arrive in one read. The guard used to arm a header
timer at its first byte and a body timer at the end of its headers, and cancel both a moment later in the
same read: two loop timers created and cancelled per request. Now a timer is armed only when, after the
bytes at hand are parsed, a request is still incomplete, which is the only time it can matter. What it
protects against (slow headers, trickled bodies) is tested in ``test_fuzz.py``; here the real server runs
in-process and the test counts the guard's timers armed on the real event loop (it wraps ``call_later``
to watch it, and changes nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durastream_server.http.guard import LAZY_KEEP_ALIVE
from tests.server.http.test_fastpath import Conn, running, status

APPEND = (
    b"POST /v1/stream/t HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: 7\r\n\r\n"
)
BODY = b'{"n":1}'
GUARD_DEADLINES = ("_header_deadline", "_body_deadline")
KEEP_ALIVE = ("_keep_alive_deadline", "timeout_keep_alive_handler")  # ours, uvicorn's


class TimerWatch:
    """Counts the guard's deadline timers armed through ``loop.call_later`` while installed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.armed: list[str] = []
        self._original = loop.call_later

    def __enter__(self) -> TimerWatch:
        original = self._original

        def call_later(delay: float, callback: Callable[..., Any], *args: Any, **kw: Any) -> Any:
            name = getattr(callback, "__name__", "")
            if name in GUARD_DEADLINES or name in KEEP_ALIVE:
                self.armed.append(name)
            return original(delay, callback, *args, **kw)

        self.loop.call_later = call_later  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.loop.call_later  # the loop's own method again


async def _twenty_whole_appends(conn: Conn) -> TimerWatch:
    """Create the stream, then send 20 appends each in one write (the server reads each whole),
    watching the timers armed meanwhile; the watch is returned still installed (a ``with`` ends it)."""
    conn.send(b"PUT /v1/stream/t HTTP/1.1\r\nHost: localhost\r\n")
    conn.send(b"Content-Type: application/json\r\nContent-Length: 0\r\n\r\n")
    assert status(await conn.response()) == 201
    watch = TimerWatch(asyncio.get_running_loop()).__enter__()
    for _ in range(20):
        conn.send(APPEND + BODY)
        assert status(await conn.response()) == 204
    return watch


def test_whole_requests_arm_no_timer_and_split_ones_still_do(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, direct=True) as (_, port):
            conn = await Conn.open(port)
            with await _twenty_whole_appends(conn) as watch:
                whole = [name for name in watch.armed if name in GUARD_DEADLINES]
                # Headers now, the body only once they were answered by nothing: a body timer must
                # run while the body is missing (a trickling client is cut off by it).
                conn.send(APPEND)
                await conn.writer.drain()
                while "_body_deadline" not in watch.armed:  # armed once the headers were parsed
                    await asyncio.sleep(0.01)
                conn.send(BODY)
                assert status(await conn.response()) == 204
                # The head of a request split in two: a header timer until the rest arrives.
                conn.send(APPEND[:20])
                await conn.writer.drain()
                while "_header_deadline" not in watch.armed:
                    await asyncio.sleep(0.01)
                conn.send(APPEND[20:] + BODY)
                assert status(await conn.response()) == 204
            conn.close()
        assert whole == []  # main armed two per request: 40

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_keep_alive_arms_one_timer_per_idle_period_and_still_closes_idle_connections(
    tmp_path: Path,
) -> None:
    """uvicorn armed a keep-alive timer after every response (cancelled by the next request): now
    one timer per keep-alive period, which closes a connection idle for that long and lets a busy
    one be (it re-arms for the rest of the period, or when the next answer completes)."""

    async def scenario() -> None:
        async with running(tmp_path, direct=True, keep_alive=0.5) as (_, port):
            conn = await Conn.open(port)
            with await _twenty_whole_appends(conn) as watch:
                armed = [name for name in watch.armed if name in KEEP_ALIVE]
                # Busy across more than two keep-alive periods: requests paced under the period.
                for _ in range(6):
                    await asyncio.sleep(0.2)
                    conn.send(APPEND + BODY)
                    assert status(await conn.response()) == 204
            # The timer armed by the create still runs (uvicorn armed 20). Before uvicorn 0.50
            # (test-compat) the guard keeps uvicorn's own timer per response.
            assert armed == ([] if LAZY_KEEP_ALIVE else ["timeout_keep_alive_handler"] * 20)
            # Idle now: closed once the period has passed without a request.
            assert await conn.closed_by_server()
            conn.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
