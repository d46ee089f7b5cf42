"""Time lookups (``docs/extensions.md`` section 7) in the engine, against a model.

Hypothesis drives random histories on a real data directory with a tiny index interval (so every answer
crosses index points): appends at equal times and with a clock that steps back (also across restarts,
with and without snapshots), staged-append commits, close-only records, closed and empty streams and fork
chains. The model says which time every message must get (``max(clock, the stream's last time)``, a fork
starting at its source's last time) and answers each lookup by walking the messages; the server must
agree, and its frames reads must report exactly the model's times (so they never go backwards).
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durastream_server.engine.api import (
    AppendRequest,
    CreateRequest,
    ReadRequest,
    TimeRequest,
)
from durastream_server.engine.engine import Engine
from durastream_server.engine.txnapi import CommitRequest, StageRequest
from durastream_server.errors import InvalidEnd, InvalidReadOffset
from durastream_server.offsets import format_offset, parse_position
from durastream_server.storage import DataDir, Durability, StorageConfig
from durastream_server.storage.records import ProducerTuple
from durastream_server.storage.snapshot import SNAPSHOT_NAME, decode_snapshot
from tests.server.extensions.test_ordinals_storage import legacy_snapshot

JSON = "application/json"
BASE_MS = 1_800_000_000_000


class Clock:
    """The engine's injected wall clock, in milliseconds, stepped by the test (also backwards)."""

    def __init__(self) -> None:
        self.ms = BASE_MS

    def __call__(self) -> float:
        return self.ms / 1000


@dataclass
class Stream:
    messages: list[tuple[int, int]] = field(default_factory=list)  # (position, append time)
    tail: int = 0
    last_ms: int = 0  # the stream's last append time (its floor before any message)


class Model:
    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}

    def append(self, path: str, sizes: list[int], now_ms: int) -> None:
        stream = self.streams[path]
        stream.last_ms = max(now_ms, stream.last_ms)
        for size in sizes:
            stream.messages.append((stream.tail, stream.last_ms))
            stream.tail += size

    def close(self, path: str, now_ms: int) -> None:
        stream = self.streams[path]
        stream.last_ms = max(now_ms, stream.last_ms)

    def fork(self, path: str, source: str, at_index: int) -> int:
        parent = self.streams[source]
        inherited = parent.messages[:at_index]
        at = parent.messages[at_index][0] if at_index < len(parent.messages) else parent.tail
        self.streams[path] = Stream(list(inherited), at, parent.last_ms)
        return at

    def lookup(self, path: str, start: int, end: int, at_ms: int) -> int | None:
        for position, time_ms in self.streams[path].messages:
            if start <= position < end and time_ms >= at_ms:
                return position
        return None


def value(size: int) -> bytes:
    return b'"' + b"x" * (size - 2) + b'"'


async def open_engine(root: Path, clock: Clock, snapshots: bool) -> tuple[DataDir, Engine]:
    config = StorageConfig(
        root=root,
        durability=Durability.NONE,
        index_interval_bytes=48,
        snapshot_interval_entries=2 if snapshots else 1_000_000,
    )
    data = await DataDir.open(config)
    engine = Engine(data, clock=clock, sweep_interval=0)
    await engine.start()
    return data, engine


async def check_stream(engine: Engine, model: Model, path: str, probes: list[int]) -> None:
    stream = model.streams[path]
    read = await engine.read_messages(
        ReadRequest(path=path, offset="-1", max_bytes=1 << 20, end_offset=None)
    )
    times = []
    for item in read.slices:
        count = len(getattr(item, "lengths", (0,)))
        times.extend([item.timestamp_ms] * count)
    assert times == [t for _, t in stream.messages]  # the frames report the model's times
    assert times == sorted(times)
    boundaries = [p for p, _ in stream.messages] + [stream.tail]
    for at_ms in probes:
        for start in boundaries[:: max(1, len(boundaries) // 3)]:
            for end in {stream.tail, boundaries[len(boundaries) // 2]}:
                if end < start:
                    continue
                got = await engine.lookup_time(
                    TimeRequest(
                        path=path,
                        offset=format_offset(start),
                        at_ms=at_ms,
                        end_offset=format_offset(end),
                    )
                )
                want = model.lookup(path, start, end, at_ms)
                assert got.found == (want is not None), (path, start, end, at_ms)
                assert parse_position(got.offset) == (end if want is None else want)
                assert parse_position(got.end_offset) == end


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.integers(0, 3),
            st.lists(st.integers(2, 30), min_size=1, max_size=4),
        ),
        st.tuples(st.just("clock"), st.integers(-5_000, 5_000)),
        st.tuples(st.just("stage"), st.integers(0, 3), st.integers(1, 5)),
        st.tuples(st.just("fork"), st.integers(0, 3), st.integers(0, 40)),
        st.tuples(st.just("close"), st.integers(0, 3)),
        st.tuples(st.just("restart"), st.integers(-60_000, 0)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=ops,
    snapshots=st.booleans(),
    probes=st.lists(st.integers(-5_000, 20_000), min_size=1, max_size=4),
)
def test_lookups_and_append_times_match_the_model(
    history: list[tuple], snapshots: bool, probes: list[int]
) -> None:
    async def go(root: Path) -> None:
        clock = Clock()
        model = Model()
        data, engine = await open_engine(root, clock, snapshots)
        paths = ["s0"]
        closed: set[str] = set()
        await engine.create(CreateRequest(path="s0", content_type=JSON))
        model.streams["s0"] = Stream()
        try:
            for step, op in enumerate(history):
                kind = op[0]
                if kind == "clock":
                    clock.ms += op[1]
                elif kind == "restart":
                    await engine.close()
                    await data.close()
                    clock.ms += op[1]  # the wall clock may step back across a restart
                    data, engine = await open_engine(root, clock, snapshots)
                else:
                    path = paths[op[1] % len(paths)]
                    if kind in ("append", "stage", "close") and path in closed:
                        continue
                    if kind == "append":
                        body = b"[" + b",".join(value(s) for s in op[2]) + b"]"
                        await engine.append(AppendRequest(path=path, content_type=JSON, body=body))
                        model.append(path, op[2], clock.ms)
                    elif kind == "stage":
                        sizes = [3 + i for i in range(op[2])]
                        body = b"[" + b",".join(value(s) for s in sizes) + b"]"
                        handle = f"h{step}"
                        await engine.stage(StageRequest(path, handle, JSON, body))
                        clock.ms += 7  # the commit's time is what the messages get
                        await engine.commit(
                            CommitRequest(path, (handle,), ProducerTuple(f"p{step}", 0, 0))
                        )
                        model.append(path, sizes, clock.ms)
                    elif kind == "close":
                        await engine.append(
                            AppendRequest(path=path, content_type=None, body=b"", close=True)
                        )
                        model.close(path, clock.ms)
                        closed.add(path)
                    elif kind == "fork" and len(paths) < 6:
                        new = f"f{step}"
                        source = model.streams[path]
                        at = model.fork(new, path, min(op[2], len(source.messages)))
                        await engine.create(
                            CreateRequest(
                                path=new,
                                content_type=JSON,
                                forked_from=path,
                                fork_offset=format_offset(at),
                            )
                        )
                        paths.append(new)
            for path in paths:
                await check_stream(engine, model, path, [BASE_MS + p for p in probes])
        finally:
            await engine.close()
            await data.close()

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(go(Path(root)))


def test_lookup_errors_and_empty_streams(tmp_path: Path) -> None:
    async def go() -> None:
        clock = Clock()
        data, engine = await open_engine(tmp_path, clock, snapshots=False)
        try:
            await engine.create(CreateRequest(path="empty", content_type=JSON))
            got = await engine.lookup_time(TimeRequest(path="empty", offset="-1", at_ms=0))
            assert (got.found, got.offset, got.closed) == (False, format_offset(0), False)
            await engine.create(CreateRequest(path="s", content_type=JSON))
            await engine.append(AppendRequest(path="s", content_type=JSON, body=b'["abc","de"]'))
            with pytest.raises(InvalidReadOffset):
                await engine.lookup_time(TimeRequest(path="s", offset=format_offset(2), at_ms=0))
            with pytest.raises(InvalidEnd):
                await engine.lookup_time(
                    TimeRequest(path="s", offset="-1", at_ms=0, end_offset=format_offset(1))
                )
            await engine.append(AppendRequest(path="s", content_type=None, body=b"", close=True))
            got = await engine.lookup_time(TimeRequest(path="s", offset="-1", at_ms=BASE_MS))
            assert (got.found, got.offset, got.closed) == (True, format_offset(0), True)
            got = await engine.lookup_time(TimeRequest(path="s", offset="-1", at_ms=BASE_MS + 1))
            assert (got.found, got.offset, got.tail_offset) == (
                False,
                format_offset(9),
                format_offset(9),
            )
        finally:
            await engine.close()
            await data.close()

    asyncio.run(go())


def test_a_snapshot_without_append_times_is_replayed_over(tmp_path: Path) -> None:
    async def go() -> None:
        clock = Clock()
        data, engine = await open_engine(tmp_path, clock, snapshots=True)
        await engine.create(CreateRequest(path="s", content_type=JSON))
        for _ in range(20):
            clock.ms += 10
            await engine.append(AppendRequest(path="s", content_type=JSON, body=b'["abcdefgh"]'))
        log_id = engine._registry.by_path["s"].id
        await engine.close()
        await data.close()
        snapshot = tmp_path / "streams" / log_id / SNAPSHOT_NAME
        legacy_snapshot(snapshot, key="index_last_time", arrays=3)
        with pytest.raises(ValueError, match="predates indexed append times"):
            decode_snapshot(snapshot.read_bytes())
        data, engine = await open_engine(tmp_path, clock, snapshots=True)
        try:
            assert data.logs[log_id]._snapshot_end == 0  # ignored: the whole log was replayed
            for i in range(20):
                got = await engine.lookup_time(
                    TimeRequest(path="s", offset="-1", at_ms=BASE_MS + 10 * i + 5)
                )
                assert parse_position(got.offset) == 10 * i
        finally:
            await engine.close()
            await data.close()

    asyncio.run(go())


def test_a_fork_never_gets_times_before_its_source_even_when_the_clock_steps_back(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        clock = Clock()
        data, engine = await open_engine(tmp_path, clock, snapshots=False)
        try:
            await engine.create(CreateRequest(path="s", content_type=JSON))
            clock.ms += 1000
            await engine.append(AppendRequest(path="s", content_type=JSON, body=b'["ab"]'))
            clock.ms -= 5000  # the wall clock steps back
            await engine.create(
                CreateRequest(path="f", content_type=JSON, forked_from="s", body=b'["cd"]')
            )
            await engine.append(AppendRequest(path="f", content_type=JSON, body=b'["ef"]'))
            read = await engine.read_messages(ReadRequest(path="f", offset="-1", max_bytes=1 << 20))
            assert [item.timestamp_ms for item in read.slices] == [BASE_MS + 1000] * 3
            got = await engine.lookup_time(TimeRequest(path="f", offset="-1", at_ms=BASE_MS + 1))
            assert parse_position(got.offset) == 0  # the inherited message is the first that late
            await engine.create(CreateRequest(path="e", content_type=JSON, forked_from="s"))
            await engine.close()
            await data.close()
            # The floor is in the fork's header: a restarted server keeps it for a fork that has no
            # message of its own yet.
            data, engine = await open_engine(tmp_path, clock, snapshots=False)
            await engine.append(AppendRequest(path="e", content_type=JSON, body=b'["gh"]'))
            read = await engine.read_messages(ReadRequest(path="e", offset="-1", max_bytes=1 << 20))
            assert [item.timestamp_ms for item in read.slices] == [BASE_MS + 1000] * 2
        finally:
            await engine.close()
            await data.close()

    asyncio.run(go())
