"""Commit by reference: a commit moves large staging files into the stream's log as segments (their
records rewritten in place) instead of copying their payload (docs/decisions/0003-staged-appends.md).

Covered: what readers see, what the directory holds, restarts, a move that fails half-way (the linked
files leave the log and the commit is retried), a crash in the middle of the in-place rewrite (also with
the header's rewrite lost), a crash after the moves but before the group's last record (the group is
truncated whole and the handles stay staged: the retried commit succeeds), and SIGKILL of a real server
between staging and commit, at four points inside the commit, and right after the commit."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest
import requests

from durastream_server import errors
from durastream_server.storage import group
from durastream_server.storage.records import MESSAGE_OVERHEAD
from durastream_server.storage.segments import SEGMENT_RE
from durastream_server.storage.txnfile import staging_file_name

from ..engine.support import append, create, read, read_all, run
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
        # h1 and h2 are segments now, and h3 and the group's last record went to a new one
        after = segments(tmp_path)
        assert len(after) == len(before) + 3
        assert all(p.stat().st_nlink == 1 for p in after)  # the staging names are gone
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
    """The second link fails: the first linked file leaves the log again (its staging name never went
    away; its positions are already rewritten), the commit fails, and after a restart the same commit
    succeeds exactly once."""
    real_link = os.link
    calls = {"n": 0}

    def failing_link(src: str, dst: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "injected I/O error")
        real_link(src, dst)

    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        before = segments(tmp_path)
        await stage(engine, "s", "a", b"aaaaaaaaaa;")
        await stage(engine, "s", "b", b"bbbbbbbbbb;")
        monkeypatch.setattr(group.os, "link", failing_link)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        monkeypatch.setattr(group.os, "link", real_link)
        assert len(staging_files(tmp_path)) == 2
        assert segments(tmp_path) == before

    async def second(engine) -> None:
        assert await read_all(engine, "s") == b"base;"
        done = await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        assert not done.duplicate and done.messages == 2
        assert await read_all(engine, "s") == b"base;aaaaaaaaaa;bbbbbbbbbb;"

    run(tmp_path, first)
    run(tmp_path, second)


def test_a_crash_after_the_moves_leaves_the_handles_staged_and_the_retry_succeeds(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging files became segments (linked into the log), then the process died before the
    group's last record was written: recovery cuts the incomplete group away without touching the
    files, the handles are still staged (one even takes another stage), and the retried commit
    succeeds, exactly once; a second retry is a duplicate."""

    def fail_before_last_record(*args: object, **kwargs: object) -> list:
        raise OSError(5, "injected I/O error")

    async def first(engine) -> None:
        await create(engine, "s", b"base;")
        await stage(engine, "s", "a", b"aaaaaaaaaa;", producer=("a", 0, 0))
        await stage(engine, "s", "b", b"bbbbbbbbbb;")
        before = segments(tmp_path)
        monkeypatch.setattr(group.codec, "encode_append_parts", fail_before_last_record)
        monkeypatch.setattr(group, "_move_back", lambda target, moved: None)  # as if killed
        monkeypatch.setattr(group, "_undo", lambda target, written: None)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        assert len(staging_files(tmp_path)) == 2  # still there, and linked into the log
        assert len(segments(tmp_path)) == len(before) + 3  # a, b and the group's new segment
        assert all(p.stat().st_nlink == 2 for p in staging_files(tmp_path))
        # While a staging file is still linked into the log, it takes no stage (nothing is written).
        with pytest.raises(errors.StorageFailure):
            await stage(engine, "s", "b", b"late;")

    async def second(engine) -> None:
        assert await read_all(engine, "s") == b"base;"
        assert all(p.stat().st_nlink == 1 for p in staging_files(tmp_path))
        await append(engine, "s", b"next;")
        assert await read_all(engine, "s") == b"base;next;"
        # The rewritten file takes another stage (its dedupe state survived the rewrite).
        assert (await stage(engine, "s", "a", b"aaaaaaaaaa;", producer=("a", 0, 0))).duplicate
        await stage(engine, "s", "a", b"AAAAAAAAAA;", producer=("a", 0, 1))

    async def third(engine) -> None:
        done = await commit(engine, "s", "a", "b", producer=("c", 0, 0))
        assert not done.duplicate and done.messages == 3
        assert await read_all(engine, "s") == b"base;next;aaaaaaaaaa;AAAAAAAAAA;bbbbbbbbbb;"
        assert (await commit(engine, "s", "a", "b", producer=("c", 0, 0))).duplicate
        assert not staging_files(tmp_path)

    async def fourth(engine) -> None:
        assert await read_all(engine, "s") == b"base;next;aaaaaaaaaa;AAAAAAAAAA;bbbbbbbbbb;"
        assert (await commit(engine, "s", "a", "b", producer=("c", 0, 0))).duplicate
        with pytest.raises(errors.TxnAlreadyCommitted):
            await commit(engine, "s", "a", producer=("c", 0, 1))

    run(tmp_path, first)
    monkeypatch.undo()
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)
    run(tmp_path, second)
    run(tmp_path, third)
    run(tmp_path, fourth)


def _dying_pwrite_all(monkeypatch: pytest.MonkeyPatch, die_at: int, header_lost: bool) -> None:
    """Make the commit's in-place rewrite stop (as if the process died) at its ``die_at``-th write;
    with ``header_lost`` the header's rewrite never reaches the file (a power loss kept the other
    pages but not that one)."""
    real_pwrite_all = group.pwrite_all
    calls = {"n": 0}

    def dying_pwrite_all(fd: int, buffers: list, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == die_at:
            raise OSError(5, "injected I/O error")  # the process is gone from here on
        if header_lost and offset == 0:
            return 0
        return real_pwrite_all(fd, buffers, offset)

    monkeypatch.setattr(group, "pwrite_all", dying_pwrite_all)


async def _base_and_three_staged(engine) -> None:
    """Stream ``s`` holding ``base;``, and handle ``a`` with three staged records."""
    await create(engine, "s", b"base;")
    for i, body in enumerate([b"one;", b"two;", b"three;"]):
        await stage(engine, "s", "a", body, producer=("a", 0, i))


@pytest.mark.parametrize("header_lost", [False, True])
def test_a_crash_in_the_middle_of_the_rewrite_leaves_the_handle_committable(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch, header_lost: bool
) -> None:
    """The process dies after the header and the first staged record were rewritten in place, the
    others not (``header_lost``: the record's rewrite persisted, the header's did not): the handle is
    recovered whole from the mixed file and the retried commit succeeds exactly once."""

    async def first(engine) -> None:
        await _base_and_three_staged(engine)
        _dying_pwrite_all(monkeypatch, 3, header_lost)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", producer=("c", 0, 0))

    async def second(engine) -> None:
        assert await read_all(engine, "s") == b"base;"
        assert (await stage(engine, "s", "a", b"three;", producer=("a", 0, 2))).duplicate
        done = await commit(engine, "s", "a", producer=("c", 0, 0))
        assert not done.duplicate and done.messages == 3
        assert (await commit(engine, "s", "a", producer=("c", 0, 0))).duplicate

    async def third(engine) -> None:
        assert await read_all(engine, "s") == b"base;one;two;three;"
        assert (await commit(engine, "s", "a", producer=("c", 0, 0))).duplicate

    run(tmp_path, first)
    monkeypatch.undo()
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)
    run(tmp_path, second)
    run(tmp_path, third)


def test_two_interrupted_rewrites_at_different_positions_leave_the_handle_committable(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first commit dies after rewriting the header and two records; the stream moves on (an
    append, so the next group position differs); a second commit dies after rewriting only the header
    and the first record; a stage arrives in between. The file then holds records rewritten for
    two positions and original ones: the third commit succeeds, exactly once."""

    async def first(engine) -> None:
        await _base_and_three_staged(engine)
        _dying_pwrite_all(monkeypatch, 4, False)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", producer=("c", 0, 0))

    async def second(engine) -> None:
        await append(engine, "s", b"other;")
        await stage(engine, "s", "a", b"four;", producer=("a", 0, 3))
        _dying_pwrite_all(monkeypatch, 3, False)
        with pytest.raises(errors.StorageFailure):
            await commit(engine, "s", "a", producer=("c", 0, 0))

    async def third(engine) -> None:
        assert await read_all(engine, "s") == b"base;other;"
        done = await commit(engine, "s", "a", producer=("c", 0, 0))
        assert not done.duplicate and done.messages == 4
        assert await read_all(engine, "s") == b"base;other;one;two;three;four;"
        assert (await commit(engine, "s", "a", producer=("c", 0, 0))).duplicate

    run(tmp_path, first)
    monkeypatch.undo()
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)
    run(tmp_path, second)
    monkeypatch.undo()
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)
    run(tmp_path, third)


def test_a_commit_right_after_a_truncated_group_copies_then_the_next_one_moves(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery can leave an empty last segment (a truncated group started it); its name is taken, so
    the next commit copies into it, and the one after moves again. The handle of the truncated group
    is still staged and is committed last."""

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
        assert len(segments(tmp_path)) == len(before) + 2  # moved, and the group's last record
        await commit(engine, "s", "a", producer=("c", 0, 2))
        assert await read_all(engine, "s") == b"base;bbbbbbbbbb;dddddddddd;aaaaaaaaaa;"

    run(tmp_path, first)
    monkeypatch.undo()
    monkeypatch.setattr(group, "MOVE_MIN_BYTES", 8)
    run(tmp_path, second)


# ---- a real server, SIGKILL -----------------------------------------------------------------------------

ROW = '{"id":%d,"payload":"' + "p" * 1000 + '"}'


def _body(first: int, count: int) -> bytes:
    return ("[" + ",".join(ROW % i for i in range(first, first + count)) + "]").encode()


def _stage(url: str, handle: str, body: bytes, seq: int = 0) -> None:
    response = requests.post(
        url,
        data=body,
        headers={
            "Content-Type": "application/json",
            "Durastream-Txn": handle,
            "Producer-Id": handle,
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
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


# Loaded by the server process (a sitecustomize module on its PYTHONPATH): SIGKILLs it at one point of
# the commit, from inside, so the crash lands exactly there.
KILL_HOOK = textwrap.dedent(
    """
    import os
    import signal

    _point = os.environ.get("DURASTREAM_TEST_KILL_AT")
    if _point:
        from durastream_server.storage import group

        def _die():
            os.kill(os.getpid(), signal.SIGKILL)

        if _point == "while_rewriting":  # h0's header and first record rewritten, not the rest
            _pwrite_all = group.pwrite_all
            _calls = [0]

            def _dying_pwrite_all(fd, buffers, offset):
                _calls[0] += 1
                if _calls[0] == 3:
                    _die()
                return _pwrite_all(fd, buffers, offset)

            group.pwrite_all = _dying_pwrite_all
        elif _point == "between_links":  # h0 linked into the log, h1 and h2 not
            _link = os.link
            _links = [0]

            def _dying_link(src, dst, **kwargs):
                _links[0] += 1
                if _links[0] == 2:
                    _die()
                return _link(src, dst, **kwargs)

            group.os.link = _dying_link
        elif _point == "before_the_last_record":  # all linked, the group's new segment created
            def _dying_records(*args, **kwargs):
                _die()

            group.group_records = _dying_records
        elif _point == "after_the_last_record":  # written (page cache), not yet fdatasynced
            def _dying_finish(self):
                self._flush()
                _die()

            group._SegmentAppender.finish = _dying_finish
    """
)
IN_THE_COMMIT = [
    "while_rewriting",
    "between_links",
    "before_the_last_record",
    "after_the_last_record",
]


@pytest.mark.parametrize(
    "kill", ["between_staging_and_commit", *IN_THE_COMMIT, "right_after_the_commit"]
)
def test_sigkill_around_a_commit_by_reference(
    server_factory, kill: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three ~300 KiB handles (above MOVE_MIN_BYTES: moved; h0 staged in three requests) and one
    5-row handle (copied). SIGKILL before the commit or anywhere inside it before its last record is
    written: the restarted server still has every handle staged and the retried commit succeeds, once.
    SIGKILL after the last record was written, or after the commit's 200: the data is there exactly
    once and the retry is a duplicate. Either way a second retry is a duplicate and the handles can
    never be committed again."""
    assert len(_body(0, 300)) > group.MOVE_MIN_BYTES
    if kill in IN_THE_COMMIT:
        (tmp_path / "sitecustomize.py").write_text(KILL_HOOK)
        path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", path)
        monkeypatch.setenv("DURASTREAM_TEST_KILL_AT", kill)
    server = server_factory()
    monkeypatch.delenv("DURASTREAM_TEST_KILL_AT", raising=False)  # restarts run without the hook
    url = server.stream_url("txn/by-reference")
    assert requests.put(url, headers={"Content-Type": "application/json"}).status_code == 201
    # One row first, so the group does not start at position 0 (a rewritten record's position then
    # differs from its staged one).
    first_row = requests.post(
        url, data=_body(1000, 1), headers={"Content-Type": "application/json"}
    )
    assert first_row.status_code in (200, 204)
    handles = ["h0", "h1", "h2", "h3"]
    for seq in range(3):
        _stage(url, "h0", _body(100 * seq, 100), seq)
    for i, handle in enumerate(handles[1:3], start=1):
        _stage(url, handle, _body(300 * i, 300))
    _stage(url, "h3", _body(900, 5))
    expected = [1000, *range(905)]
    if kill == "between_staging_and_commit":
        server.kill()
        server.restart()
        assert _ids(url) == [1000]
        assert _commit(url, handles).status_code == 200
    elif kill in IN_THE_COMMIT:
        with pytest.raises(requests.ConnectionError):
            _commit(url, handles)
        deadline = time.monotonic() + 30
        while server.running and time.monotonic() < deadline:  # it killed itself: being reaped
            time.sleep(0.01)
        assert not server.running
        server.kill()
        server.restart()
        if kill == "after_the_last_record":
            assert _ids(url) == expected
            assert _commit(url, handles).status_code == 204
        else:
            assert _ids(url) == [1000]
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
    assert _commit(url, handles).status_code == 204
    staging = list(server.data_dir.glob("streams/*/txn/*.stg"))
    assert not staging, staging


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


def test_a_move_reads_only_record_heads_and_damage_since_staging_still_fails_on_read(
    tmp_path: Path, move_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit derives each moved record's new checksum from the stored one instead of reading the
    payload back (crc.replace_prefix): it reads a few hundred bytes, not the megabyte staged. A payload
    byte damaged after the stage is therefore not caught by the commit, as for a plain append, but it is
    not laundered either: a read of the whole record fails its checksum (500 CORRUPT_STREAM), and the
    undamaged record before it, whose checksum was derived the same way, reads back intact."""
    good = b"g" * (512 * 1024) + b";"
    damaged = b"d" * (512 * 1024) + b";"
    read_in_commit = {"bytes": 0}
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        data = real_pread(fd, length, offset)
        read_in_commit["bytes"] += len(data)
        return data

    async def scenario(engine) -> None:
        await create(engine, "s", b"")
        await stage(engine, "s", "ok", good)
        await stage(engine, "s", "bad", damaged)
        (bad_file,) = [p for p in staging_files(tmp_path) if p.name == staging_file_name("bad")]
        with open(bad_file, "r+b") as f:  # one payload byte, near the end of the staged record
            f.seek(-100, os.SEEK_END)
            f.write(b"X")
        monkeypatch.setattr(os, "pread", counting_pread)
        done = await commit(engine, "s", "ok", "bad", producer=("c", 0, 0))
        monkeypatch.setattr(os, "pread", real_pread)
        assert done.messages == 2
        assert 0 < read_in_commit["bytes"] < 4096
        # A read's budget counts MESSAGE_OVERHEAD per message beyond its bytes.
        first = await read(engine, "s", "-1", len(good) + MESSAGE_OVERHEAD)
        assert b"".join(first.messages) == good
        with pytest.raises(errors.CorruptStream):  # a read that covers the damaged record whole
            await read_all(engine, "s", max_bytes=4 << 20)

    run(tmp_path, scenario)
