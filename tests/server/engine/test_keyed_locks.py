"""``KeyedLocks``: creates of one path (and staged requests of one handle) take turns; other keys never
wait; a holder that fails or a waiter that is cancelled leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest

from durastream_server.engine.registry import KeyedLocks


def test_holders_of_one_key_take_turns_and_other_keys_do_not_wait() -> None:
    async def scenario() -> None:
        locks = KeyedLocks()
        inside: list[str] = []
        order: list[str] = []
        release = asyncio.Event()

        async def holder(key: str, name: str) -> None:
            async with locks.hold(key):
                inside.append(name)
                assert [n for n in inside if n.startswith(key)] == [name]  # alone on its key
                order.append(name)
                if name == "a1":
                    await release.wait()
                inside.remove(name)

        first = asyncio.create_task(holder("a", "a1"))
        second = asyncio.create_task(holder("a", "a2"))
        other = asyncio.create_task(holder("b", "b1"))
        await other  # "b" is not held up by "a1"
        for _ in range(10):
            await asyncio.sleep(0)
        assert order == ["a1", "b1"]  # "a2" waits for "a1"
        release.set()
        await asyncio.gather(first, second)
        assert order == ["a1", "b1", "a2"]
        assert locks._locks == {}  # dropped when unused

    asyncio.run(scenario())


def test_a_failing_holder_and_a_cancelled_waiter_leave_nothing_behind() -> None:
    async def scenario() -> None:
        locks = KeyedLocks()
        with pytest.raises(ValueError, match="boom"):
            async with locks.hold("k"):
                raise ValueError("boom")
        assert locks._locks == {}

        entered = asyncio.Event()
        release = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("k"):
                entered.set()
                await release.wait()

        held = asyncio.create_task(holder())
        await entered.wait()
        waiter = asyncio.create_task(locks.hold("k").__aenter__())
        for _ in range(10):
            await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await held
        assert locks._locks == {}
        async with locks.hold("k"):  # and the key can be held again at once
            pass

    asyncio.run(scenario())


def test_a_claim_holds_off_holders_until_released_and_is_refused_while_held() -> None:
    """``claim`` (a holder that is not a task): taken at once on a free key, refused on a key that is
    held, waited for or claimed; a ``hold`` of a claimed key waits for ``release``, and a cancelled
    waiter does not disturb the others."""

    async def scenario() -> None:
        locks = KeyedLocks()
        assert locks.claim("k")
        assert not locks.claim("k")
        order: list[str] = []

        async def holder(name: str) -> None:
            async with locks.hold("k"):
                order.append(name)

        first = asyncio.create_task(holder("h1"))
        cancelled = asyncio.create_task(holder("cancelled"))
        second = asyncio.create_task(holder("h2"))
        for _ in range(10):
            await asyncio.sleep(0)
        assert order == []  # all wait for the claim
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        locks.release("k")
        assert not locks.claim("k")  # the waiters come first
        await asyncio.gather(first, second)
        assert order == ["h1", "h2"]
        assert locks._locks == {} and locks._claims == {}
        assert locks.claim("k")  # free again
        locks.release("k")
        async with locks.hold("k"):
            assert not locks.claim("k")  # held

    asyncio.run(scenario())
