"""Durable subscription state: atomic replacement, coalesced writes, deletes that stay deleted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from durastream_server.subscriptions.store import SubscriptionStore


def test_save_load_and_delete(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SubscriptionStore(tmp_path)
        store.load_all()
        await store.save("a/b c", {"id": "a/b c", "n": 1})
        assert store.file_for("a/b c").parent == tmp_path / "subscriptions"
        assert SubscriptionStore(tmp_path).load_all() == [{"id": "a/b c", "n": 1}]
        await store.delete("a/b c")
        assert SubscriptionStore(tmp_path).load_all() == []

    asyncio.run(scenario())


def test_concurrent_saves_end_with_the_newest_and_delete_wins(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SubscriptionStore(tmp_path)
        store.load_all()
        await asyncio.gather(*(store.save("s", {"id": "s", "n": n}) for n in range(50)))
        assert json.loads(store.file_for("s").read_text())["n"] == 49
        # A save queued before a delete must not resurrect the file after it.
        await asyncio.gather(store.save("s", {"id": "s", "n": 50}), store.delete("s"))
        assert not store.file_for("s").exists()

    asyncio.run(scenario())


def test_leftover_temporary_files_are_discarded(tmp_path: Path) -> None:
    directory = tmp_path / "subscriptions"
    directory.mkdir()
    (directory / ".x.json.1.tmp").write_text("{torn")
    (directory / "bad.json").write_text("{torn")
    (directory / "good.json").write_text(json.dumps({"id": "g"}))
    assert SubscriptionStore(tmp_path).load_all() == [{"id": "g"}]
    assert not (directory / ".x.json.1.tmp").exists()
