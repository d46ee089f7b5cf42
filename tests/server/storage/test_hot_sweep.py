"""The hot tails' one timer (storage/hot.py): a log's tail is dropped once a whole interval passed with no
commit to it, kept while commits come, and the timer runs only while some log holds a tail. The sweeps
are driven by hand (``_sweep``) so that nothing here depends on the machine's timing (real logs going idle
by the timer alone: ``test_packed_reads``, which waits for it with a deadline)."""

from __future__ import annotations

import asyncio

from durastream_server.storage.hot import HotSweep


class _Log:
    def __init__(self, name: str, expired: list[str]) -> None:
        self.name = name
        self._expired = expired

    def expire_hot(self) -> None:
        self._expired.append(self.name)


def test_a_tail_is_dropped_after_a_whole_interval_without_a_commit() -> None:
    async def scenario() -> None:
        expired: list[str] = []
        sweep = HotSweep(3600.0)  # the timer never fires by itself here
        a, b = _Log("a", expired), _Log("b", expired)
        sweep.touch(a)
        sweep.touch(b)
        sweep._sweep()
        assert expired == []  # committed during the interval just ended: kept
        sweep.touch(a)  # a commits again; b does not
        sweep._sweep()
        assert expired == ["b"]
        assert len(sweep) == 1
        sweep._sweep()
        assert expired == ["b", "a"]
        assert len(sweep) == 0 and sweep._timer is None  # nobody listed: no timer left armed
        sweep.touch(a)
        assert sweep._timer is not None
        sweep.close()
        assert sweep._timer is None and len(sweep) == 0

    asyncio.run(scenario())


def test_a_log_that_dropped_its_tail_itself_is_not_expired_again() -> None:
    async def scenario() -> None:
        expired: list[str] = []
        sweep = HotSweep(3600.0)
        a, b = _Log("a", expired), _Log("b", expired)
        sweep.touch(a)
        sweep.touch(b)
        sweep._sweep()
        sweep.forget(a)  # e.g. closed or deleted meanwhile
        sweep._sweep()
        assert expired == ["b"]
        sweep.close()

    asyncio.run(scenario())
