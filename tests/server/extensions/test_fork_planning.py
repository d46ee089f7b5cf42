"""Fork creation now checks boundaries off the event loop (``StreamLog.is_boundary``/``boundary_after``
are async). The source can change while those checks run; the plan must notice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durastream_server.engine.api import AppendRequest, CreateRequest, ReadRequest
from durastream_server.errors import Conflict
from durastream_server.storage.log import StreamLog
from tests.server.engine.support import close_engine, open_engine
from tests.server.extensions.support import token

JSON = "application/json"


def test_fork_sub_offset_resolves_across_many_messages(tmp_path: Path) -> None:
    async def go() -> None:
        data, engine = await open_engine(tmp_path)
        try:
            await engine.create(CreateRequest(path="src", content_type=JSON))
            for i in range(300):  # more records than the in-memory recent window
                await engine.append(AppendRequest("src", JSON, b'["%03d",1]' % i))
            # messages alternate 5 and 1 bytes: message 2k starts at 6k
            await engine.create(
                CreateRequest(
                    path="f",
                    content_type=JSON,
                    forked_from="src",
                    fork_offset=token(6),
                    fork_sub_offset=401,
                )
            )
            result = await engine.read(ReadRequest("f", "-1", 1 << 20))
            assert len(result.messages) == 2 + 401
            assert result.next_offset == token(6 + 200 * 6 + 5)
        finally:
            await close_engine(data, engine)

    asyncio.run(go())


def test_source_deleted_while_the_fork_is_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        data, engine = await open_engine(tmp_path)
        try:
            await engine.create(CreateRequest(path="src", content_type=JSON, body=b"[1,2,3]"))
            real = StreamLog.message_starts

            async def delete_meanwhile(self: StreamLog, ordinals: list[int]) -> list[int]:
                answer = await real(self, ordinals)
                await engine.delete("src")  # lands while the fork request is suspended
                return answer

            monkeypatch.setattr(StreamLog, "message_starts", delete_meanwhile)
            with pytest.raises(Conflict, match="deleted"):
                await engine.create(
                    CreateRequest(
                        path="f",
                        content_type=JSON,
                        forked_from="src",
                        fork_offset=token(0),
                        fork_sub_offset=1,
                    )
                )
            monkeypatch.undo()
            assert [s.path for s in engine.list_streams()] == []
        finally:
            await close_engine(data, engine)

    asyncio.run(go())
