"""Issue 14 item 5: producer state is bounded (quiet producers compacted, idle ones forgotten, snapshots
serialised off the loop) and exactly-once stays loud (a request that may repeat a forgotten producer's is
refused when the client asks). docs/decisions/0005-producer-state.md."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from durastream_server.engine import producer_sweep, producers
from durastream_server.engine.engine import Engine
from durastream_server.engine.producer_sweep import ProducerPolicy
from durastream_server.errors import DuplicateMismatch, ProducerForgotten, StaleEpoch
from durastream_server.storage import log as storage_log
from durastream_server.storage.records import AppendEntry, ProducerTuple
from durastream_server.storage.snapshot import SNAPSHOT_NAME
from durastream_server.storage.state import (
    ForgottenGroup,
    StreamState,
    apply_entry,
    compact_producer,
    forget_producer,
    producer_group,
)
from tests.server.engine.support import (
    FakeClock,
    append,
    close_engine,
    create,
    open_engine,
    run,
    text,
)
from tests.server.staged.support import commit, stage
from tests.server.storage.snapshots import legacy_v1_state, snapshot_round_trip

POLICY = ProducerPolicy(quiet_seconds=60, expiry_seconds=600, group_expiry_seconds=3600)


def _state(engine: Engine, path: str) -> StreamState:
    return engine._lookup(path).log.state


async def _refused(engine: Engine, path: str, producer: tuple[str, int, int]) -> ProducerForgotten:
    with pytest.raises(ProducerForgotten) as err:
        await append(engine, path, b"again", producer=producer, refuse_forgotten=True)
    return err.value


def test_quiet_producer_is_compacted_and_its_replays_are_still_checked(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        for seq in range(3):
            await append(engine, "s", b"r%d" % seq, producer=("q-1", 4, seq))
        clock.advance(59)
        assert (await engine.sweep_producers()).compacted == 0
        clock.advance(2)
        assert (await engine.sweep_producers()).compacted == 1
        quiet = _state(engine, "s").producers["q-1"]
        assert quiet.quiet and (quiet.epoch, quiet.last_seq) == (4, 2)
        assert len(quiet.digest(0) or b"") == 8
        with pytest.raises(DuplicateMismatch):  # a reordered replay is still caught
            await append(engine, "s", b"r1", producer=("q-1", 4, 0))
        assert (await append(engine, "s", b"r0", producer=("q-1", 4, 0))).verified
        await append(engine, "s", b"r3", producer=("q-1", 4, 3))  # it resumes its epoch
        with pytest.raises(DuplicateMismatch):
            await append(engine, "s", b"r2", producer=("q-1", 4, 1))
        assert (await append(engine, "s", b"r3", producer=("q-1", 4, 3))).verified
        assert await text(engine, "s") == b"r0r1r2r3"

    run(tmp_path, scenario, clock=clock, policy=POLICY)


def test_a_forgotten_producers_replay_is_refused_when_the_client_asks(tmp_path: Path) -> None:
    """The hard case: a request that may repeat a forgotten producer's (a Spark batch replayed after
    its producers expired) is 409 PRODUCER_FORGOTTEN for a client that asks, not new data."""
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        await append(engine, "s", b"batch5", producer=("spark-q1-0", 5, 0))
        await append(engine, "s", b"other", producer=("spark-q1-1", 3, 0))
        clock.advance(601)
        counts = await engine.sweep_producers()
        assert counts.forgotten == 2
        state = _state(engine, "s")
        assert state.producers == {}
        assert state.forgotten == {"spark-q1": ForgottenGroup(5, state.last_timestamp_ms)}
        refused = await _refused(engine, "s", ("spark-q1-0", 5, 0))
        assert refused.headers == {"Durastream-Forgotten-Epoch": "5"}
        await _refused(engine, "s", ("spark-q1-1", 4, 0))  # epoch 4 <= 5: may be a zombie's
        # A new partition of the query at a later batch, and another query: new producers, accepted.
        assert not (
            await append(engine, "s", b"p7", producer=("spark-q1-7", 6, 0), refuse_forgotten=True)
        ).duplicate
        await append(engine, "s", b"q2", producer=("spark-q2-0", 2, 0), refuse_forgotten=True)
        assert await text(engine, "s") == b"batch5otherp7q2"
        # A client that does not ask gets the protocol's rule: an unknown producer is new.
        await append(engine, "s", b"batch5", producer=("spark-q1-0", 5, 0))
        assert await text(engine, "s") == b"batch5otherp7q2batch5"

    run(tmp_path, scenario, clock=clock, policy=POLICY)


def test_a_forgotten_producers_commit_is_refused_when_the_client_asks(tmp_path: Path) -> None:
    """The Spark sink's transactional commit: (prefix-query-partition, batch, 0) naming new handles."""
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        await stage(engine, "s", "h1", b"rows", producer=("h1", 0, 0))
        await commit(engine, "s", "h1", producer=("spark-q-0", 0, 0), refuse_forgotten=True)
        clock.advance(601)
        await engine.sweep_producers()
        await stage(engine, "s", "h2", b"rows", producer=("h2", 0, 0))
        with pytest.raises(ProducerForgotten):
            await commit(engine, "s", "h2", producer=("spark-q-0", 0, 0), refuse_forgotten=True)
        assert await text(engine, "s") == b"rows"

    run(tmp_path, scenario, clock=clock, policy=POLICY)


def test_known_producers_are_judged_as_before_whatever_the_header(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        await append(engine, "s", b"a", producer=("g-0", 5, 0), refuse_forgotten=True)
        again = await append(engine, "s", b"a", producer=("g-0", 5, 0), refuse_forgotten=True)
        assert again.duplicate and again.verified
        with pytest.raises(StaleEpoch):
            await append(engine, "s", b"z", producer=("g-0", 4, 0), refuse_forgotten=True)
        clock.advance(599)
        await engine.sweep_producers()  # not idle long enough
        assert (await append(engine, "s", b"a", producer=("g-0", 5, 0))).duplicate

    run(tmp_path, scenario, clock=clock, policy=POLICY)


def test_forgotten_groups_are_dropped_after_their_own_expiry(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        await append(engine, "s", b"a", producer=("g-0", 5, 0))
        clock.advance(601)
        await engine.sweep_producers()
        assert "g" in _state(engine, "s").forgotten
        clock.advance(3600 - 601 - 1)
        assert (await engine.sweep_producers()).groups_dropped == 0
        clock.advance(2)
        assert (await engine.sweep_producers()).groups_dropped == 1
        assert _state(engine, "s").forgotten == {}

    run(tmp_path, scenario, clock=clock, policy=POLICY)


def test_the_closing_producer_can_be_forgotten_and_its_retry_is_still_a_duplicate(
    tmp_path: Path,
) -> None:
    clock = FakeClock()

    async def scenario(engine: Engine) -> None:
        await create(engine, "s")
        await append(engine, "s", b"last", producer=("c-0", 0, 0), close=True)
        clock.advance(601)
        assert (await engine.sweep_producers()).forgotten == 1
        retry = await append(engine, "s", b"last", producer=("c-0", 0, 0), close=True)
        assert retry.duplicate and retry.closed

    run(tmp_path, scenario, clock=clock, policy=POLICY)


def test_forgetting_holds_across_restarts_and_what_comes_back_is_harmless(tmp_path: Path) -> None:
    """Forgetting is not in the log. A snapshot taken after it keeps it; without one, the full replay
    brings the producer back with its true state (so its replay is a duplicate, never new data), and the
    next sweep forgets it again. Either way the stream holds one copy."""
    clock = FakeClock()

    async def main() -> None:
        data, engine = await open_engine(tmp_path, clock, policy=POLICY)
        await create(engine, "s")
        await append(engine, "s", b"batch5", producer=("g-0", 5, 0))
        directory = engine._lookup("s").log.directory
        clock.advance(601)
        await engine.sweep_producers()
        await close_engine(data, engine)  # the shutdown snapshot holds the forgotten state

        data, engine = await open_engine(tmp_path, clock, policy=POLICY)
        await _refused(engine, "s", ("g-0", 5, 0))
        await close_engine(data, engine)

        os.unlink(os.path.join(directory, SNAPSHOT_NAME))  # full replay: the producer comes back
        data, engine = await open_engine(tmp_path, clock, policy=POLICY)
        replay = await append(engine, "s", b"batch5", producer=("g-0", 5, 0), refuse_forgotten=True)
        assert replay.duplicate and replay.verified
        await engine.sweep_producers()
        await _refused(engine, "s", ("g-0", 5, 0))
        assert await text(engine, "s") == b"batch5"
        await close_engine(data, engine)

    asyncio.run(main())


def test_snapshots_are_encoded_off_the_event_loop(tmp_path: Path, monkeypatch) -> None:
    """The loop only takes shallow copies; encoding (proportional to producers) runs in a worker
    thread. Issue 14: 6,000 producers took 64 ms of loop time per snapshot."""
    threads: list[int] = []
    encode = storage_log.snapshot_pieces

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        threads.append(threading.get_ident())
        return encode(*args, **kwargs)

    monkeypatch.setattr(storage_log, "snapshot_pieces", spy)

    async def main() -> None:
        data, engine = await open_engine(tmp_path, policy=POLICY)
        await create(engine, "s")
        for n in range(300):  # enough for a snapshot at shutdown
            await append(engine, "s", b"x", producer=(f"p-{n}", 1, 0))
        loop_thread = threading.get_ident()
        await close_engine(data, engine)  # snapshot at shutdown
        assert threads and loop_thread not in threads
        data, engine = await open_engine(tmp_path, policy=POLICY)
        assert len(_state(engine, "s").producers) == 300
        assert engine._lookup("s").log._snapshot_end > 0  # recovered from the snapshot
        await close_engine(data, engine)

    asyncio.run(main())


# ---------------------------------------------------------------------------------- pure state


def _entry(state: StreamState, producer: tuple[str, int, int], ts: int, body: bytes) -> None:
    apply_entry(
        state,
        AppendEntry(
            position=state.tail,
            messages=(body,),
            timestamp_ms=ts,
            producer=ProducerTuple(*producer),
            digest=producers.request_digest("text/plain", body, False),
        ),
    )


def test_groups_are_the_id_up_to_its_last_dash() -> None:
    assert producer_group("spark-1b4e-28ba-2fa1-7") == "spark-1b4e-28ba-2fa1"
    assert producer_group("solo") == "solo"
    assert producer_group("a-") == "a"


def test_snapshots_keep_write_times_short_digests_and_forgotten_groups() -> None:
    state = StreamState(tail=0)
    _entry(state, ("a-0", 2, 0), 1000, b"x")
    _entry(state, ("a-0", 2, 1), 2000, b"y")
    _entry(state, ("b-0", 7, 0), 3000, b"z")
    _entry(state, ("c-0", 1, 0), 4000, b"w")
    compact_producer(state, "b-0")
    forget_producer(state, "c-0")
    restored = snapshot_round_trip(state)
    assert restored.producers == state.producers
    assert restored.producers["a-0"].last_ms == 2000
    assert restored.forgotten == {"c": ForgottenGroup(1, 4000)}
    # The next request of a restored producer grows a window of its own, keeping the old digests.
    _entry(restored, ("a-0", 2, 2), 5000, b"v")
    assert restored.producers["a-0"].digest(0) == state.producers["a-0"].digest(0)


def test_snapshots_of_earlier_versions_are_still_read() -> None:
    """``DSSNAP01``: no write times (the stream's last one is used: forgotten no sooner than due)."""
    state = StreamState(tail=0)
    _entry(state, ("a-0", 2, 0), 1000, b"x")
    _entry(state, ("b-0", 3, 0), 9000, b"y")
    legacy = legacy_v1_state(state)
    assert set(legacy.producers) == {"a-0", "b-0"}
    assert legacy.producers["a-0"].last_ms == 9000
    assert legacy.producers["a-0"].digest(0) == state.producers["a-0"].digest(0)


def test_the_sweep_yields_to_the_loop_between_slices() -> None:
    state = StreamState(tail=0)
    count = 3 * producer_sweep.SLICE
    for n in range(count):
        _entry(state, (f"p-{n}", 0, 0), 1000, b"x")
    stand_in = SimpleNamespace(state=state, note_pruned=lambda: None)  # all the sweep uses
    policy = ProducerPolicy(quiet_seconds=1, expiry_seconds=1, group_expiry_seconds=10)

    async def main() -> tuple[int, int]:
        ticks = 0
        done = False

        async def other_work() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = ticks
        counts = await producer_sweep.sweep([stand_in], 10_000, policy)  # type: ignore[list-item]
        during = ticks - before
        done = True
        await other
        return counts.forgotten, during

    forgotten, during = asyncio.run(main())
    assert forgotten == count and state.producers == {}
    assert during >= 2  # the loop ran other work while the sweep went through the producers
