"""When to drop the hot tails of logs no commit has added to for a while: one timer for all of them.

A log keeps what a commit made durable in memory for a moment (``StreamLog._keep_hot``), for the readers
that commit wakes. Each log used to arm a timer of its own for that (``call_later`` on its first commit
after an idle spell, then a callback that re-armed or dropped it): a timer made, fired and dropped per
stream that is written now and then, which is most of them when many streams each get a message (issue
17: a stream's first append cost a timer, a ``_Rare`` and a callback more than a later one). Here the
logs are listed in two generations instead, and one timer for the whole data directory moves them on
every ``HOT_SECONDS``: a log listed as ``fresh`` when the timer fires becomes ``aging``; one still
``aging`` at the next firing (no commit since) has its hot tail dropped. So a tail lives between one and
two intervals after its last commit (it was exactly one), and a commit costs a dict store, not a timer.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class HotLog(Protocol):
    def expire_hot(self) -> None:
        """No commit added to the hot tail for a whole interval: drop it."""


class HotSweep:
    """The logs holding a hot tail, and the one timer that drops those that stayed idle."""

    __slots__ = ("_interval", "_fresh", "_aging", "_timer")

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._fresh: dict[HotLog, None] = {}  # committed since the timer last fired
        self._aging: dict[HotLog, None] = {}  # listed before that: dropped next time unless fresh
        self._timer: asyncio.TimerHandle | None = None

    def touch(self, log: HotLog) -> None:
        """``log`` added to its hot tail now (on the loop)."""
        self._fresh[log] = None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._sweep)

    def forget(self, log: HotLog) -> None:
        """``log`` dropped its hot tail itself (idle, closed, deleted): nothing to do for it."""
        if log in self._fresh:
            del self._fresh[log]
        if log in self._aging:
            del self._aging[log]

    def __len__(self) -> int:
        return len(self._fresh) + len(self._aging)

    def _sweep(self) -> None:
        self._timer = None
        aging, fresh = self._aging, self._fresh
        self._aging, self._fresh = fresh, {}
        for log in aging:
            if log not in fresh:
                # ``forget`` (from the log's drop) only touches the new dicts, not this one.
                log.expire_hot()
        if self._aging:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._sweep)

    def close(self) -> None:
        """The data directory is closing: no timer left behind (the logs drop their tails themselves)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._fresh.clear()
        self._aging.clear()
