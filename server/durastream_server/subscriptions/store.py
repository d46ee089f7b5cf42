"""Durable subscription state: one JSON file per subscription, replaced atomically.

``<state_dir>/subscriptions/<sha256(id)>.json`` holds everything a restarted server needs: the
configuration, links and cursors, generation, the wake in flight (and its lease), and the webhook retry
schedule. Files are named by a hash so any client-chosen id is a safe, bounded file name.

Every write is tmp file + fsync + rename + fsync(dir), so a crash leaves either the old or the new state,
never a torn one. Writes for one subscription are *coalesced*: callers hand over a snapshot and await the
version they produced; the writer always writes the newest snapshot, so a burst of state changes costs
one fsync, and an older snapshot can never overwrite a newer one (including a delete).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_DELETE = object()


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` durably (blocking; run it in a thread from the loop)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


@dataclass
class _Slot:
    """Write coordination for one subscription file."""

    latest: Any = None  # newest snapshot (dict), or _DELETE
    version: int = 0  # version of ``latest``
    written: int = 0  # newest version durably on disk
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    writer: asyncio.Task[None] | None = None


def read_record(path: Path) -> dict[str, Any]:
    """One subscription's state file: a JSON object with an ``id``. Raises ``OSError`` or
    ``ValueError`` naming what is wrong (the offline ``check`` reports the same)."""
    record = json.loads(path.read_bytes())
    if not isinstance(record, dict) or "id" not in record:
        raise ValueError("not a subscription record (a JSON object with an id)")
    return record


class SubscriptionStore:
    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "subscriptions"
        self._slots: dict[str, _Slot] = {}

    def file_for(self, subscription_id: str) -> Path:
        digest = hashlib.sha256(subscription_id.encode("utf-8")).hexdigest()
        return self.directory / f"{digest}.json"

    def load_all(self) -> list[dict[str, Any]]:
        """Read every persisted subscription (blocking; called once at start)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        records = []
        for path in sorted(self.directory.iterdir()):
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # an interrupted write; the old file is intact
                continue
            if path.suffix != ".json":
                continue
            try:
                record = read_record(path)
            except (OSError, ValueError) as exc:
                log.error("skipping unreadable subscription state %s: %s", path, exc)
                continue
            records.append(record)
        return records

    async def save(self, subscription_id: str, record: dict[str, Any]) -> None:
        """Durably store ``record`` (a snapshot the caller will not mutate)."""
        await self._submit(subscription_id, record)

    async def delete(self, subscription_id: str) -> None:
        await self._submit(subscription_id, _DELETE)

    async def flush(self) -> None:
        """Wait for every submitted write (used at shutdown)."""
        writers = [slot.writer for slot in self._slots.values() if slot.writer is not None]
        if writers:
            await asyncio.gather(*writers, return_exceptions=True)

    async def _submit(self, subscription_id: str, snapshot: Any) -> None:
        slot = self._slots.setdefault(subscription_id, _Slot())
        slot.version += 1
        slot.latest = snapshot
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A caller cancelled mid-wait must not leave an unretrieved exception behind.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        slot.waiters.append((slot.version, future))
        if slot.writer is None or slot.writer.done():
            slot.writer = asyncio.create_task(self._drain(subscription_id, slot))
        await asyncio.shield(future)

    async def _drain(self, subscription_id: str, slot: _Slot) -> None:
        path = self.file_for(subscription_id)
        while slot.written < slot.version:
            version, snapshot = slot.version, slot.latest
            error: BaseException | None = None
            try:
                if snapshot is _DELETE:
                    await asyncio.to_thread(_remove, path)
                else:
                    data = json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode()
                    await asyncio.to_thread(atomic_write, path, data)
            except Exception as exc:  # reported to every waiter of this version, then go on
                log.error("writing subscription state %s failed: %s", path, exc)
                error = exc
            slot.written = version
            remaining = []
            for wanted, future in slot.waiters:
                if wanted <= version:
                    if not future.done():
                        if error is None:
                            future.set_result(None)
                        else:
                            future.set_exception(error)
                else:
                    remaining.append((wanted, future))
            slot.waiters = remaining
        if slot.version == slot.written and slot.latest is _DELETE and not slot.waiters:
            self._slots.pop(subscription_id, None)
