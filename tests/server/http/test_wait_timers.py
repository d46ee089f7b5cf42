"""A change query's ``wait`` on the real server, on uvloop, arms one timer per wait
(``server/durastream_server/timers.py``).

The server runs in-process on a uvloop loop, as ``durastream-server`` runs, and clients ask change
queries with ``wait=20`` (ms) that time out with nothing changed. Each wait's timer fires on its
deadline's millisecond; before ``timers.py`` about one wait in six found ``loop.time()`` a few ulps
short of the deadline there and re-armed a 0 ms timer every loop pass until uvloop's clock ticked
(hundreds of timers, about a millisecond of the server's CPU, per such wait). The test counts the wait
timers (``waiters._wake``) armed through ``loop.call_later`` (a wrapper that counts and changes
nothing): the server's work for N waits bounded by a count, not by time.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.server.http.test_fastpath import Conn, running, status
from tests.support.loop_timers import TimerCount

uvloop = pytest.importorskip("uvloop")

CHANGES = "/v1/stream/__ds/x-durastream/changes"
CONNECTIONS = 8
WAITS_EACH = 15
WAIT_MS = 20


def _body(response: bytes) -> dict[str, Any]:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])  # type: ignore[no-any-return]


async def _waits(port: int, cursor: str) -> None:
    """``WAITS_EACH`` change queries with a wait, one after the other on one connection: each must
    answer 200, nothing changed, the same cursor."""
    conn = await Conn.open(port)
    try:
        for _ in range(WAITS_EACH):
            conn.get(f"{CHANGES}?since={cursor}&wait={WAIT_MS}")
            response = await conn.response()
            assert status(response) == 200, response
            page = _body(response)
            assert page["changes"] == [] and page["cursor"] == cursor and not page["reset"]
    finally:
        conn.close()


def test_timed_out_change_query_waits_arm_one_timer_each(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, port):
            conn = await Conn.open(port)
            conn.get(CHANGES)
            snapshot = await conn.response()
            conn.close()
            assert status(snapshot) == 200
            cursor = _body(snapshot)["cursor"]
            with TimerCount(asyncio.get_running_loop(), "_wake") as timers:
                await asyncio.gather(*(_waits(port, cursor) for _ in range(CONNECTIONS)))
            # One timer per wait; main armed ~200 more for each wait that hit the wrong rounding.
            assert timers.armed == CONNECTIONS * WAITS_EACH

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario(), 60))
    finally:
        loop.close()
