"""Waiting until a deadline on an event loop whose clock ticks in milliseconds.

uvloop's clock (``loop.time()``) and its timers have a resolution of one millisecond. A timer armed
with ``call_later(deadline - now)`` fires on the due millisecond, and ``loop.time()`` then often reads a
float a few ulps *below* the deadline (``(t + 0.1) - t < 0.1``). Code that re-arms for "the rest",
``deadline - loop.time()``, then arms a ~1e-12 s timer, which uvloop rounds to 0 ms: it fires on the
next loop pass, re-arms again, and so on until the clock ticks, up to ~1 ms of busy spinning that makes
a timer (and often a future) per pass: 176-275 timers for one wait on an idle loop. How often depends
on the timeout and the clock's magnitude (12% of ``wait`` values of 1-1000 ms, never whole seconds;
docs/benchmarks.md, h58 and h60).

The rule, in one place: **less than one clock tick left counts as expired.** So a wait of ``timeout``
answers at ``timeout`` +- 1 ms (it may return up to ``RESOLUTION`` before its deadline, never spins
on the last millisecond, and every timer it re-arms is at least ``RESOLUTION`` long). Every "wait until
a deadline" loop in the server goes through ``time_left`` or ``expired``.
"""

from __future__ import annotations

from typing import Final

# uvloop's clock and timer resolution (libuv's ``uv_now`` is in milliseconds). asyncio's own loop is
# finer, and the rule costs it nothing but answering up to this much early.
RESOLUTION: Final = 0.001


def time_left(deadline: float, now: float) -> float:
    """Seconds left until ``deadline`` as seen at ``now`` (the same clock), or 0.0 once less than
    ``RESOLUTION`` is left: a timer re-armed for the result is never shorter than one clock tick.

    A wait that re-arms for this answers at its deadline +- ``RESOLUTION`` (1 ms).
    """
    left = deadline - now
    return left if left >= RESOLUTION else 0.0


def expired(deadline: float, now: float) -> bool:
    """Whether ``deadline`` has passed as seen at ``now``, to within one clock tick (``RESOLUTION``):
    a timer that fires on the deadline's millisecond finds it expired even when the float clock reads a
    hair under it."""
    return deadline - now < RESOLUTION
