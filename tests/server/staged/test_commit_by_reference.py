"""Commit by reference: a commit moves large staging files into the stream's log as segments (their
records rewritten in place) instead of copying their payload (docs/decisions/0003-staged-appends.md).

Covered: what readers see, what the directory holds, restarts, a move that fails half-way (moved files
go back and the commit is retried), a crash after the moves but before the group's last record (the
group is truncated whole), and SIGKILL of a real server between staging and commit and right after the
commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests

from durastream_server import errors
from durastream_server.storage import group
from durastream_server.storage.segments import SEGMENT_RE

from ..engine.support import append, create, read_all, run
from .support import commit, stage, staging_files


def segments(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("streams/*/*.seg") if SEGMENT_RE.match(p.name))


@pytest.fixture
def move_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Staging files of 8 bytes and more are moved; smaller ones are copied."""
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)


def test_large_handles_are_moved_small_ones_copied_and_all_survive_a_restart(
    tmp_path: Path, move_small: None
) -> None:
    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        before = segments(tmp_path)
        await stage(engine, "s", "h1", b"first-part;", producer=("h1", 0, 0))
        await stage(engine, "s", "h1", b"more-of-h1;", producer=("h1", 0, 1))
        await stage(engine, "s", "h2", b"second-part;")
        await stage(engine, "s", "h3", b"tiny;")  # < 8 bytes: copied after the moved ones
        done = await commit(engine, "s", "h1", "h2", "h3", producer=("c", 0, 0))
        assert done.messages == 4
        assert not staging_files(tmp_path)
        assert len(segments(tmp_path)) == len(before) + 2  # h1 and h2 are segments now
        await append(engine, "s", b"after;")
        assert await read_all(engine, "s") == b"base;first-part;more-of-h1;second-part;tiny;after;"

    async def second(engine) -> None:
        assert await read_all(engine, "s") == b"base;first-part;more-of-h1;second-part;tiny;after;"
        assert (await commit(engine, "s", "h1", "h2", "h3", producer=("c", 0, 0))).duplicate
        with pytest.raises(errors.TxnAlreadyCommitted):
            await commit(engine, "s", "h1", producer=("c", 0, 1))
        await append(engine, "s", b"later;")
        assert (await read_all(engine, "s")).endswith(b"after;later;")

    run(tmp_path, first)
    run(tmp_path, second)


def test_a_move_that_fails_half_way_is_undone_and_the_commit_succeeds_after_a_restart(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second rename fails: the first moved file goes back to txn/ (with its positions already
    rewritten), the commit fails, and after a restart the same commit succeeds exactly once."""
    real_rename = os.rename
    calls = {"n": 0}

    def failing_rename(src: str, dst: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "injected I/O error")
        real_rename(src, dst)

    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        await stage(engine, "s", "a", b"aaaaaaaaaa;")
        await stage(engine, "s", "b", b"bbbbbbbbbb;")
        monkeypatch.setattr(group.os, "rename", failing_rename)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        monkeypatch.setattr(group.os, "rename", real_rename)
        assert len(staging_files(tmp_path)) == 2

    async def second(engine) -> None:
        assert await read_all(engine, "s") == b"base;"
        done = await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        assert not done.duplicate and done.messages == 2
        assert await read_all(engine, "s") == b"base;aaaaaaaaaa;bbbbbbbbbb;"

    run(tmp_path, first)
    run(tmp_path, second)


def test_a_crash_after_the_moves_truncates_the_group_whole(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging files became segments, then the process died before the group's last record was
    written: recovery cuts the incomplete group away, the log stays usable, and the handles are gone,
    so a retried commit fails loudly (the sink's batch is then replayed) instead of half-committing."""

    def fail_before_last_record(*args: object, **kwargs: object) -> list:
        raise OSError(5, "injected I/O error")

    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        await stage(engine, "s", "a", b"aaaaaaaaaa;")
        await stage(engine, "s", "b", b"bbbbbbbbbb;")
        monkeypatch.setattr(group.codec, "encode_append_parts", fail_before_last_record)
        monkeypatch.setattr(group, "_move_back", lambda target, moved: None)  # as if killed
        monkeypatch.setattr(group, "_undo", lambda target, written: None)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        assert not staging_files(tmp_path)  # both moved into the log

    async def second(engine) -> None:
        assert await read_all(engine, "s") == b"base;"
        await append(engine, "s", b"next;")
        assert await read_all(engine, "s") == b"base;next;"
        with pytest.raises(errors.TxnNotFound):
            await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        # The writer stages again (the sink replays its batch) and commits under the same tuple.
        await stage(engine, "s", "a2", b"aaaaaaaaaa;")
        await stage(engine, "s", "b2", b"bbbbbbbbbb;")
        await commit(engine, "s", "a2", "b2", producer=("c", 0, 0))
        assert await read_all(engine, "s") == b"base;next;aaaaaaaaaa;bbbbbbbbbb;"

    async def third(engine) -> None:
        assert await read_all(engine, "s") == b"base;next;aaaaaaaaaa;bbbbbbbbbb;"

    run(tmp_path, first)
    monkeypatch.undo()
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)
    run(tmp_path, second)
    run(tmp_path, third)


def test_a_commit_right_after_a_truncated_group_copies_then_the_next_one_moves(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery can leave an empty last segment (a truncated group started it); its name is taken, so
    the next commit copies into it, and the one after moves again."""

    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        await stage(engine, "s", "a", b"aaaaaaaaaa;")
        monkeypatch.setattr(group.codec, "encode_append_parts", lambda *a, **k: 1 / 0)
        monkeypatch.setattr(group, "_move_back", lambda target, moved: None)
        monkeypatch.setattr(group, "_undo", lambda target, written: None)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", producer=("c", 0, 0))

    async def second(engine) -> None:
        before = segments(tmp_path)
        assert before[-1].stat().st_size == 0  # the truncated group's segment
        await stage(engine, "s", "b", b"bbbbbbbbbb;")
        await commit(engine, "s", "b", producer=("c", 0, 0))
        assert segments(tmp_path) == before  # copied into the empty segment
        await stage(engine, "s", "d", b"dddddddddd;")
        await commit(engine, "s", "d", producer=("c", 0, 1))
        assert len(segments(tmp_path)) == len(before) + 1  # moved
        assert await read_all(engine, "s") == b"base;bbbbbbbbbb;dddddddddd;"

    run(tmp_path, first)
    monkeypatch.undo()
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)
    run(tmp_path, second)


# ---- a real server, SIGKILL -----------------------------------------------------------------------------

ROW = '{"id":%d,"payload":"' + "p" * 1000 + '"}'


def _body(first: int, count: int) -> bytes:
    return ("[" + ",".join(ROW % i for i in range(first, first + count)) + "]").encode()


def _stage(url: str, handle: str, body: bytes) -> None:
    response = requests.post(
        url,
        data=body,
        headers={
            "Content-Type": "application/json",
            "Durastream-Txn": handle,
            "Producer-Id": handle,
            "Producer-Epoch": "0",
            "Producer-Seq": "0",
        },
        timeout=30,
    )
    assert response.status_code == 200, response.text


def _commit(url: str, handles: list[str]) -> requests.Response:
    return requests.post(
        url,
        headers={
            "Durastream-Commit": ", ".join(handles),
            "Producer-Id": "committer",
            "Producer-Epoch": "7",
            "Producer-Seq": "0",
        },
        timeout=30,
    )


def _ids(url: str) -> list[int]:
    ids: list[int] = []
    offset = "-1"
    while True:
        response = requests.get(url, params={"offset": offset}, timeout=30)
        assert response.status_code == 200
        ids.extend(m["id"] for m in json.loads(response.content))
        if response.headers.get("Stream-Up-To-Date") == "true":
            return ids
        offset = response.headers["Stream-Next-Offset"]


@pytest.mark.parametrize("kill", ["between_staging_and_commit", "right_after_the_commit"])
def test_sigkill_around_a_commit_by_reference(server_factory, kill: str) -> None:
    """Three 300-row handles (~300 KiB each, above MOVE_MIN_BYTES: moved) and one 5-row handle
    (copied). SIGKILL before the commit: the restarted server commits them exactly once. SIGKILL
    right after the commit's 200: the data is there exactly once, the retry is a duplicate and the
    handles can never be committed again."""
    assert len(_body(0, 300)) > group.MOVE_MIN_BYTES
    server = server_factory()
    url = server.stream_url("txn/by-reference")
    assert requests.put(url, headers={"Content-Type": "application/json"}).status_code == 201
    handles = ["h0", "h1", "h2", "h3"]
    for i, handle in enumerate(handles[:3]):
        _stage(url, handle, _body(300 * i, 300))
    _stage(url, "h3", _body(900, 5))
    expected = list(range(905))
    if kill == "between_staging_and_commit":
        server.kill()
        server.restart()
        assert _ids(url) == []
        assert _commit(url, handles).status_code == 200
    else:
        assert _commit(url, handles).status_code == 200
        server.kill()
        server.restart()
    assert _ids(url) == expected
    assert _commit(url, handles).status_code == 204
    again = requests.post(
        url,
        headers={
            "Durastream-Commit": "h0",
            "Producer-Id": "committer",
            "Producer-Epoch": "7",
            "Producer-Seq": "1",
        },
        timeout=30,
    )
    assert again.status_code == 409 and "TXN_ALREADY_COMMITTED" in again.text
    server.kill()
    server.restart()
    assert _ids(url) == expected


def test_a_staging_file_of_the_earlier_layout_is_recovered_and_committed_by_copy(
    tmp_path: Path, move_small: None
) -> None:
    """Files written before commit by reference start with a TXN_HEADER record: they are still read at
    start-up and committed (by copying them)."""
    from durastream_server.storage import codec, txnfile

    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        await stage(engine, "s", "new", b"placeholder")  # creates the txn/ directory
        (path,) = staging_files(tmp_path)
        header = json.dumps({"handle": "old", "created_ms": 10**13, "ttl": 3600}).encode()
        record = codec.AppendEntry(position=0, messages=(b"legacy-bytes;",), timestamp_ms=1)
        frames = [codec.encode_frame(codec.Kind.TXN_HEADER, header), codec.encode_append(record)]
        legacy = path.parent / txnfile.staging_file_name("old")
        txnfile.create_staging_file(str(legacy), frames, sync=False)

    async def second(engine) -> None:
        done = await commit(engine, "s", "old", producer=("c", 0, 0))
        assert done.messages == 1
        assert await read_all(engine, "s") == b"base;legacy-bytes;"
        assert [p.name for p in staging_files(tmp_path)] == [txnfile.staging_file_name("new")]

    run(tmp_path, first)
    run(tmp_path, second)
