"""The one-frame path of a producer's next append (``Engine._next_of_producer``, issue 17) against the
general path it stands in for.

What must hold: a session of appends covering every outcome a producer's request can have (its next
seq, a duplicate, a reused tuple, a gap, a stale epoch, a new epoch, a content type mismatch, invalid
JSON, a closed stream, a stream with a TTL, Stream-Seq, plain appends) gets the same outcome, result
for result and error for error (type, message and headers), leaves the same bytes in every stream and
the same producer state, with the one-frame path taken and with it switched off (every request then
goes the general way), with fsync durability; and the one-frame path takes the requests it is for.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from durastream_server.engine.api import AppendRequest, CreateRequest
from durastream_server.engine.engine import Engine
from durastream_server.errors import ProtocolError
from durastream_server.storage import Durability
from durastream_server.storage.records import ProducerTuple
from tests.server.engine.support import FakeClock, Recorder, close_engine, open_engine, read_all

JSON = "application/json"
TEXT = "text/plain"


def _post(
    path: str, body: bytes, ctype: str | None = JSON, tuple_=None, **kw: Any
) -> AppendRequest:
    return AppendRequest(
        path=path,
        content_type=ctype,
        body=body,
        producer=ProducerTuple(*tuple_) if tuple_ else None,
        **kw,
    )


# Appends in order, after the creates below: each comment says what the general path answers.
SESSION: list[AppendRequest] = [
    _post("j", b'{"n":0}', tuple_=("p", 0, 0)),  # new producer (general: unknown)
    _post("j", b'{"n":1}', tuple_=("p", 0, 1)),  # next seq: one frame
    _post("j", b'{"n":2}  \n', tuple_=("p", 0, 2)),  # next seq, trailing whitespace trimmed
    _post("j", b'[{"n":3},{"n":4}]', tuple_=("p", 0, 3)),  # next seq, an array
    _post("j", b'{"n":3}', tuple_=("p", 0, 3)),  # 409 reused tuple
    _post("j", b'[{"n":3},{"n":4}]', tuple_=("p", 0, 3)),  # 204 duplicate
    _post("j", b'{"n":9}', tuple_=("p", 0, 9)),  # 409 gap
    _post("j", b'{"n":5}', "application/json; charset=utf-8", ("p", 0, 4)),  # next, params
    _post("j", b"plain", TEXT, ("p", 0, 5)),  # 409 content type mismatch
    _post("j", b"{nope", tuple_=("p", 0, 5)),  # 400 invalid JSON
    _post("j", b"[]", tuple_=("p", 0, 5)),  # 400 empty array
    _post("j", b'{"s":"\\ud800"}', tuple_=("p", 0, 5)),  # next seq; the stdlib's verdict (valid)
    _post("j", '{"é":"ü"}'.encode(), tuple_=("p", 0, 6)),  # non-ASCII
    _post("j", b'{"n":7}', None, ("p", 0, 7)),  # 400 no Content-Type
    _post("j", b'{"n":7}', "nonsense", ("p", 0, 7)),  # 400 invalid Content-Type
    _post("j", b'{"n":7}', tuple_=("p", 1, 3)),  # 400 new epoch not at 0
    _post("j", b'{"n":7}', tuple_=("p", 1, 0)),  # new epoch (general)
    _post("j", b'{"n":8}', tuple_=("p", 1, 1)),  # next seq of the new epoch
    _post("j", b'{"n":8}', tuple_=("p", 0, 9)),  # 403 stale epoch
    _post("j", b'{"n":9}', tuple_=("p", 1, 2), stream_seq="0005"),  # Stream-Seq (general)
    _post("j", b'{"n":9}', tuple_=("p", 1, 3), stream_seq="0004"),  # 409 regression
    _post("j", b'{"n":9}', tuple_=("p", 1, 3), refuse_forgotten=True),  # next seq
    _post("j", b'{"n":10}', tuple_=("q", 0, 1)),  # 409 unknown producer not at 0
    _post("j", b'{"plain":1}'),  # plain append (general)
    _post("missing", b'{"n":0}', tuple_=("p", 0, 0)),  # 404
    _post("t", b"a", TEXT, ("p", 0, 0)),
    _post("t", b"b", TEXT, ("p", 0, 1)),  # next seq on a byte stream
    _post("t", b"c", "TEXT/Plain", ("p", 0, 2)),  # next seq, the type's case differs
    _post("t", b"x" * (20 << 10), TEXT, ("p", 0, 3)),  # large body (general, offloaded)
    _post("ttl", b'{"n":0}', tuple_=("p", 0, 0)),
    _post("ttl", b'{"n":1}', tuple_=("p", 0, 1)),  # a TTL stream (general)
    _post("j", b"", None, ("p", 1, 4), close=True),  # close (general)
    _post("j", b'{"n":11}', tuple_=("p", 1, 5)),  # 409 closed
    _post("j", b'{"n":9}', tuple_=("p", 1, 3)),  # 204 duplicate on a closed stream
]

CREATES = [
    CreateRequest(path="j", content_type=JSON, body=b""),
    CreateRequest(path="t", content_type=TEXT, body=b""),
    CreateRequest(path="ttl", content_type=JSON, body=b"", ttl_seconds=3600),
]


def _outcome(result: Any) -> Any:
    if isinstance(result, ProtocolError):
        return (type(result).__name__, str(result), result.headers)
    return result


async def _session(root: Path, *, one_frame: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    taken: list[str] = []
    original = Engine._next_of_producer

    def counted(self: Engine, request: AppendRequest, loop: Any) -> Any:
        staged = original(self, request, loop) if one_frame else None
        if staged is not None:
            taken.append(request.path)
        return staged

    monkeypatch.setattr(Engine, "_next_of_producer", counted)
    data, engine = await open_engine(root, FakeClock(), durability=Durability.FSYNC)
    recorder = Recorder()
    engine.add_observer(recorder)
    try:
        for create in CREATES:
            await engine.create(create)
        outcomes = []
        for request in SESSION:
            try:
                outcomes.append(_outcome(await engine.append(request)))
            except ProtocolError as exc:
                outcomes.append(_outcome(exc))
        contents = {path: await read_all(engine, path) for path in ("j", "t", "ttl")}
        states = {}
        for path in ("j", "t", "ttl"):
            state = engine._lookup(path).log.state
            states[path] = (
                state.tail,
                state.entries,
                state.last_timestamp_ms,
                state.last_stream_seq,
                state.closed,
                {pid: state.producers.get(pid) for pid in ("p", "q")},
            )
        # Storage ids are random per run: the rest of each stream's metadata.
        heads = [
            dataclasses.replace(engine.head(path), storage_id="") for path in ("j", "t", "ttl")
        ]
    finally:
        monkeypatch.setattr(Engine, "_next_of_producer", original)
        await close_engine(data, engine)
    return outcomes, contents, states, heads, recorder.events, taken


def test_the_one_frame_path_answers_as_the_general_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        ours = await _session(tmp_path / "one-frame", one_frame=True, monkeypatch=monkeypatch)
        general = await _session(tmp_path / "general", one_frame=False, monkeypatch=monkeypatch)
        for name, a, b in zip(
            ("outcomes", "contents", "states", "heads", "observer events"),
            ours[:5],
            general[:5],
            strict=True,
        ):
            if name == "outcomes":
                for n, (x, y) in enumerate(zip(a, b, strict=True)):
                    assert x == y, (n, SESSION[n], x, y)
            assert a == b, name
        assert general[5] == []
        # The next seqs of the JSON stream (1, 2, 3, 4 with parameters, the lone surrogate's 5, the
        # non-ASCII 6, the new epoch's 1, the refuse_forgotten 3) and of the byte stream (1, 2)
        # took the one frame.
        assert ours[5] == ["j"] * 8 + ["t"] * 2, ours[5]

    asyncio.run(scenario())
