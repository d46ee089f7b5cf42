"""Limit lookups in the engine against a model, over plain streams and fork chains (including a
byte-stream fork that cuts a message short), with a tiny index interval so that every answer crosses
index points."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path

import pytest

from durastream_server.engine.api import AppendRequest, CreateRequest, LimitRequest
from durastream_server.engine.engine import Engine
from durastream_server.errors import EndBeyondTail, InvalidEnd, InvalidReadOffset
from durastream_server.storage import DataDir, Durability, StorageConfig
from tests.server.extensions.support import token

JSON = "application/json"
TEXT = "text/plain"
Table = list[tuple[int, int]]  # (position, length) of each message as the view sees it


def expected(
    table: Table, start: int, end: int, max_messages: int | None, max_bytes: int | None
) -> tuple[int, int]:
    """The doc's rule, literally: admit whole messages from ``start`` while both budgets allow;
    the byte budget is soft for the first message when it is at least 1."""
    admitted, used = 0, 0
    for position, length in table:
        if position < start or position + length > end:
            continue
        if max_messages is not None and admitted >= max_messages:
            break
        over = max_bytes is not None and used + length > max_bytes
        if over and not (admitted == 0 and max_bytes >= 1):  # type: ignore[operator]
            break
        admitted += 1
        used += length
    return start + used, admitted


class Model:
    def __init__(self, engine: Engine, rng: random.Random) -> None:
        self.engine = engine
        self.rng = rng
        self.tables: dict[str, Table] = {}

    def tail(self, path: str) -> int:
        table = self.tables[path]
        return table[-1][0] + table[-1][1] if table else 0

    async def create(self, path: str, content_type: str) -> None:
        await self.engine.create(CreateRequest(path=path, content_type=content_type))
        self.tables[path] = []

    async def fork(self, path: str, source: str, at: int, content_type: str) -> None:
        await self.engine.create(
            CreateRequest(
                path=path, content_type=content_type, forked_from=source, fork_offset=token(at)
            )
        )
        inherited = []
        for position, length in self.tables[source]:
            if position >= at:
                break
            inherited.append((position, min(length, at - position)))  # a cut message ends at `at`
        self.tables[path] = inherited

    async def append_json(self, path: str, count: int) -> None:
        values = [b'"' + b"v" * self.rng.randint(0, 40) + b'"' for _ in range(count)]
        await self.engine.append(
            AppendRequest(path=path, content_type=JSON, body=b"[" + b",".join(values) + b"]")
        )
        at = self.tail(path)
        for value in values:
            self.tables[path].append((at, len(value)))
            at += len(value)

    async def append_bytes(self, path: str) -> None:
        body = b"b" * self.rng.randint(1, 60)
        await self.engine.append(AppendRequest(path=path, content_type=TEXT, body=body))
        self.tables[path].append((self.tail(path), len(body)))


async def build(root: Path) -> tuple[DataDir, Engine, Model]:
    data = await DataDir.open(
        StorageConfig(root=root, durability=Durability.NONE, index_interval_bytes=48)
    )
    engine = Engine(data, sweep_interval=0)
    await engine.start()
    model = Model(engine, random.Random(11))
    await model.create("src", JSON)
    for _ in range(30):
        await model.append_json("src", model.rng.randint(1, 4))
    boundary = model.tables["src"][40][0]
    await model.fork("f1", "src", boundary, JSON)
    for _ in range(10):
        await model.append_json("f1", model.rng.randint(1, 4))
    inner = model.tables["src"][20][0]  # inside f1's inherited range
    await model.fork("f2", "f1", inner, JSON)
    await model.append_json("f2", 3)
    await model.create("bytes", TEXT)
    for _ in range(25):
        await model.append_bytes("bytes")
    position, length = model.tables["bytes"][12]
    await model.fork("bfork", "bytes", position + length // 2, TEXT)  # inside an append
    for _ in range(5):
        await model.append_bytes("bfork")
    return data, engine, model


def test_lookups_match_the_model(tmp_path: Path) -> None:
    async def go() -> None:
        data, engine, model = await build(tmp_path)
        try:
            rng = random.Random(5)
            checked = 0
            for path, table in model.tables.items():
                tail = model.tail(path)
                boundaries = [position for position, _ in table] + [tail]
                for start in rng.sample(boundaries, min(12, len(boundaries))):
                    ends = [None, *rng.sample([b for b in boundaries if b >= start], 1)]
                    for end, n, b in itertools.product(
                        ends, [None, 0, 1, 2, 7, 10_000], [None, 0, 1, 25, 130, 10**9]
                    ):
                        got = await engine.lookup_limit(
                            LimitRequest(
                                path=path,
                                offset=token(start),
                                end_offset=None if end is None else token(end),
                                max_messages=n,
                                max_bytes=b,
                            )
                        )
                        want_end, want_messages = expected(
                            table, start, tail if end is None else end, n, b
                        )
                        context = (path, start, end, n, b)
                        assert got.end_offset == token(want_end), context
                        assert got.messages == want_messages, context
                        assert got.bytes == want_end - start, context
                        assert got.tail_offset == token(tail) and not got.closed
                        checked += 1
            assert checked > 1000
        finally:
            await engine.close()
            await data.close()

    asyncio.run(go())


def test_lookup_errors(tmp_path: Path) -> None:
    async def go() -> None:
        data, engine, model = await build(tmp_path)
        try:
            first, second = model.tables["src"][0], model.tables["src"][1]
            inside = first[0] + 1
            with pytest.raises(InvalidReadOffset):
                await engine.lookup_limit(LimitRequest("src", token(inside), max_messages=1))
            with pytest.raises(InvalidEnd):
                await engine.lookup_limit(
                    LimitRequest("src", "-1", end_offset=token(second[0] + 1))
                )
            with pytest.raises(InvalidEnd):
                await engine.lookup_limit(LimitRequest("src", token(second[0]), token(first[0])))
            with pytest.raises(EndBeyondTail):
                await engine.lookup_limit(
                    LimitRequest("src", "-1", end_offset=token(model.tail("src") + 1))
                )
            at_now = await engine.lookup_limit(LimitRequest("src", "now", max_messages=5))
            assert at_now.start_offset == at_now.end_offset == token(model.tail("src"))
        finally:
            await engine.close()
            await data.close()

    asyncio.run(go())
