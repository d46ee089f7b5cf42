"""A wait that times out arms one timer, not hundreds (``server/durastream_server/timers.py``).

uvloop's clock ticks in milliseconds. A wait's timer fires on its deadline's millisecond, when
``loop.time()`` may read a few ulps *below* the deadline; the waits re-armed for ``deadline -
loop.time()`` (~1e-12 s, a 0 ms timer for uvloop) and fired again every loop pass until the clock
ticked: 240-275 timers for one expiry on this machine. These tests run on a real uvloop loop and place
each deadline one ulp past the clock's reading at the millisecond its timer fires on (the wrong way
round), then count the timers the wait armed through ``loop.call_later`` (a wrapper that counts and
changes nothing). On main about half of such waits spun (the timer sometimes fires a millisecond late on
a busy machine, which hides it); ten waits with one spin among them fail.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import pytest

from durastream_server.engine.changes import ChangeFeed
from durastream_server.engine.waiters import WaitSet
from durastream_server.timers import RESOLUTION, expired, time_left
from tests.support.loop_timers import TimerCount

uvloop = pytest.importorskip("uvloop")

WAITS = 10
TIMEOUT_MS = 20


def wrong_way_timeout(loop: asyncio.AbstractEventLoop, milliseconds: int) -> tuple[float, float]:
    """At the start of a fresh clock millisecond, a timeout whose deadline (``loop.time() + timeout``,
    as the waits compute it, in this same millisecond) lies one ulp past what ``loop.time()`` reads on
    the millisecond ``milliseconds`` later, which is when its timer fires. Returns (deadline, timeout)."""
    start = loop.time()
    while (now := loop.time()) == start:  # uvloop reads a fresh millisecond clock per call
        pass
    fires_at = (round(now * 1000) + milliseconds) / 1000
    deadline = math.nextafter(fires_at, math.inf)
    timeout = deadline - now
    while now + timeout <= fires_at:
        timeout = math.nextafter(timeout, math.inf)
    return now + timeout, timeout


def timers_per_wait(wait: Callable[[float], Awaitable[bool]]) -> list[int]:
    """Run ``WAITS`` timed-out waits on uvloop, each placed the wrong way round; timers armed by each.
    Each wait must time out (False) and not return more than one clock tick before its deadline."""

    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        counts = []
        with TimerCount(loop) as count:
            for _ in range(WAITS):
                before = count.armed
                deadline, timeout = wrong_way_timeout(loop, TIMEOUT_MS)
                assert await wait(timeout) is False
                assert expired(deadline, loop.time())  # at its deadline +- 1 ms, never earlier
                counts.append(count.armed - before)
        return counts

    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(scenario(), 60))
    finally:
        loop.close()


def test_a_stream_wait_arms_one_timer_when_its_deadline_rounds_the_wrong_way() -> None:
    waits = WaitSet()
    counts = timers_per_wait(lambda timeout: waits.wait_until(lambda: False, timeout))
    assert counts == [1] * WAITS  # main: e.g. [1, 242, 1, 241, 1, 1, 269, 275, 1, 249]
    assert len(waits) == 0


def test_a_change_query_wait_arms_one_timer_when_its_deadline_rounds_the_wrong_way() -> None:
    feed = ChangeFeed()
    feed.touch_all(["a/1"])
    since = feed.cursor
    counts = timers_per_wait(lambda timeout: feed.wait(since, None, timeout, examine=100))
    assert counts == [1] * WAITS
    assert feed.waiting == 0


def test_less_than_a_clock_tick_left_is_expired() -> None:
    assert time_left(10.0, 9.5) == 0.5
    assert time_left(10.0, 10.0 - 2 * RESOLUTION) == pytest.approx(2 * RESOLUTION)
    assert time_left(10.0, math.nextafter(10.0, 0.0)) == 0.0  # the spin's case: a hair left
    assert time_left(10.0, 10.5) == 0.0
    assert expired(10.0, 10.0) and expired(10.0, 10.0 - RESOLUTION / 2)
    assert not expired(10.0, 10.0 - 2 * RESOLUTION)
