"""The change feed and registered selections as plain objects (``engine/changes.py``,
``engine/selections.py``), and the engine numbering what changes (creates, commits, closes, deletes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from durastream_server.engine.changes import ChangeFeed, Cursor
from durastream_server.engine.selections import Selections, prepare
from tests.server.engine.support import append, create, run


def changed_paths(feed: ChangeFeed, since: Cursor | None, **kw) -> tuple[list[str], Cursor, bool]:
    page = feed.page(since, kw.pop("match", None), limit=kw.pop("limit", 100), examine=1000)
    return page.paths, page.cursor, page.reset


def test_a_path_appears_once_at_its_latest_change() -> None:
    feed = ChangeFeed()
    feed.touch_all(["a", "b", "c"])
    paths, start, reset = changed_paths(feed, None)
    assert (paths, reset) == (["a", "b", "c"], True)
    for path in ("b", "a", "b", "b"):
        feed.touch(path)
    paths, after, reset = changed_paths(feed, start)
    assert (paths, reset) == (["a", "b"], False)  # by latest change: a, then b
    assert changed_paths(feed, after)[0] == []
    assert after.seq > start.seq and after.epoch == start.epoch


def test_pages_stop_at_the_limit_and_the_examine_budget() -> None:
    feed = ChangeFeed()
    feed.touch_all([f"s{i}" for i in range(10)])
    page = feed.page(None, None, limit=4, examine=100)
    assert page.paths == ["s0", "s1", "s2", "s3"] and page.more
    rest = feed.page(page.cursor, None, limit=100, examine=100)
    assert rest.paths == [f"s{i}" for i in range(4, 10)] and not rest.more and not rest.reset
    # Examining non-matching entries also ends a page: the cursor moves past them, nothing is lost.
    only_last = feed.page(None, lambda path: path == "s9", limit=100, examine=3)
    assert only_last.paths == [] and only_last.more
    seen: list[str] = []
    cursor: Cursor | None = None
    while True:
        page = feed.page(cursor, lambda path: path == "s9", limit=100, examine=3)
        seen += page.paths
        cursor = page.cursor
        if not page.more:
            break
    assert seen == ["s9"]


def test_pages_stay_exact_across_compactions_of_the_feed() -> None:
    """A path's earlier places are blanked and compacted away (engine/changes.py): many rounds of
    changes to the same paths keep every page equal to "each path once, by its latest change"."""
    feed = ChangeFeed()
    paths = [f"s{i}" for i in range(300)]
    feed.touch_all(paths)
    cursors: list[Cursor] = [feed.cursor]
    order = list(paths)
    for round_ in range(12):  # 3,600 changes: past the compaction floor (1,024 blanks) thrice
        moved = paths[round_ % 3 :: 3]
        for path in moved:
            feed.touch(path)
            order.remove(path)
            order.append(path)
        cursors.append(feed.cursor)
        assert len(feed._paths) - feed._blank == len(paths)  # one live place per path
        assert len(feed._paths) <= 2 * len(paths) + 1024
    assert changed_paths(feed, None, limit=1000)[0] == order
    last_moved = set(paths[11 % 3 :: 3])
    assert changed_paths(feed, cursors[-2], limit=1000)[0] == [p for p in order if p in last_moved]
    assert changed_paths(feed, cursors[-1])[0] == []
    # Tombstones dropped past the limit blank their places too.
    small = ChangeFeed(max_tombstones=4)
    small.touch_all(paths[:10])
    for path in paths[:8]:
        small.touch(path, live=False)
    assert changed_paths(small, None)[0] == paths[8:10]
    assert len(small._paths) - small._blank == len(small)


def test_deletions_are_tombstones_and_snapshots_skip_them() -> None:
    feed = ChangeFeed()
    feed.touch_all(["a", "b"])
    _, start, _ = changed_paths(feed, None)
    feed.touch("a", live=False)
    assert changed_paths(feed, start)[0] == ["a"]  # an incremental reader learns of the deletion
    assert changed_paths(feed, None)[0] == ["b"]  # a snapshot lists what exists
    feed.touch("a")  # re-created
    assert changed_paths(feed, None)[0] == ["b", "a"]


def test_a_cursor_from_another_epoch_or_below_the_horizon_gets_a_reset() -> None:
    feed = ChangeFeed(max_tombstones=4)
    feed.touch_all(["keep", *[f"gone{i}" for i in range(6)]])
    _, old, _ = changed_paths(feed, None)
    assert changed_paths(feed, Cursor("other", old.seq))[2]  # another epoch: a reset
    for i in range(5):  # the fifth tombstone passes the limit: the oldest are dropped
        feed.touch(f"gone{i}", live=False)
    assert feed.tombstones <= 4 and feed.horizon > old.seq
    paths, _, reset = changed_paths(feed, old)
    assert reset and paths == ["keep", "gone5"]
    _, recent, _ = changed_paths(feed, None)
    feed.touch("gone5", live=False)
    assert changed_paths(feed, recent) == (["gone5"], feed.cursor, False)


def test_a_waiter_wakes_only_for_its_selection_and_on_shutdown() -> None:
    async def scenario() -> None:
        feed = ChangeFeed()
        feed.touch_all(["mine/a", "other/b"])
        since = feed.cursor
        mine = asyncio.ensure_future(
            feed.wait(since, lambda p: p.startswith("mine/"), 30, examine=100)
        )
        await asyncio.sleep(0)
        feed.touch("other/b")
        await asyncio.sleep(0)
        assert not mine.done() and feed.waiting == 1
        feed.touch("mine/a")
        assert await mine is True and feed.waiting == 0
        assert await feed.wait(since, None, 0.01, examine=100)  # a change is already there
        parked = asyncio.ensure_future(feed.wait(feed.cursor, None, 30, examine=100))
        await asyncio.sleep(0)
        feed.shutdown()
        assert await parked is False

    asyncio.run(scenario())


def test_the_engine_numbers_creates_commits_closes_and_deletes(tmp_path: Path) -> None:
    async def scenario(engine) -> None:
        await create(engine, "s/a")
        await create(engine, "s/b")
        start = engine.changed(None, None, limit=100, examine=1000)
        assert [path for path, _ in start.changes] == ["s/a", "s/b"] and start.reset

        await append(engine, "s/a", b"xyz")
        page = engine.changed(start.cursor, None, limit=100, examine=1000)
        [(path, state)] = page.changes
        assert path == "s/a" and state.next_offset.endswith("3") and not state.closed

        await append(engine, "s/b", b"", close=True)
        page = engine.changed(page.cursor, None, limit=100, examine=1000)
        assert [(p, s.closed) for p, s in page.changes] == [("s/b", True)]

        await engine.delete("s/a")
        await create(engine, "s/c")
        page = engine.changed(page.cursor, None, limit=100, examine=1000)
        assert [(p, s is None) for p, s in page.changes] == [("s/a", True), ("s/c", False)]

    run(tmp_path, scenario)


def test_selections_share_ids_and_forget_the_least_recently_used() -> None:
    now = [0.0]
    selections = Selections(max_paths=5, idle_seconds=100, clock=lambda: now[0])
    first = selections.add(*prepare(["b", "a", "a"]))
    assert first.paths == {"a", "b"} and first.matches("a") and not first.matches("c")
    assert selections.add(*prepare(["a", "b"])).id == first.id and len(selections) == 1
    second = selections.add(*prepare(["x/1", "x/2", "x/3"]))
    assert second.prefix == "x/" and selections.paths == 5
    third = selections.add(*prepare(["y"]))  # 6 paths: the least recently used (first) goes
    assert selections.get(first.id) is None and selections.get(second.id) is second
    now[0] = 150.0
    assert selections.get(third.id) is None  # idle past the limit
