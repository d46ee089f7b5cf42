"""Shared helpers for the storage tests: a data dir on tmp_path and small entry builders."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from durastream_server.storage import (
    AppendEntry,
    DataDir,
    Durability,
    ProducerTuple,
    StorageConfig,
    StreamHeader,
    StreamLog,
)

T = TypeVar("T")


def config(root: Path, **overrides: Any) -> StorageConfig:
    values: dict[str, Any] = {"root": root, "durability": Durability.FSYNC}
    values.update(overrides)
    return StorageConfig(**values)


def run(factory: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(factory())  # type: ignore[arg-type]


def header(path: str = "/s", content_type: str = "application/json", **kw: Any) -> StreamHeader:
    return StreamHeader(path=path, content_type=content_type, created_at_ms=1_700_000_000_000, **kw)


def entry(
    log: StreamLog,
    *messages: bytes,
    closes: bool = False,
    producer: tuple[str, int, int] | None = None,
    stream_seq: str | None = None,
    ts: int = 1_700_000_000_001,
) -> AppendEntry:
    return AppendEntry(
        position=log.state.tail,
        messages=tuple(messages),
        timestamp_ms=ts,
        closes=closes,
        producer=ProducerTuple(*producer) if producer else None,
        stream_seq=stream_seq,
        digest=sample_digest(b"".join(messages)),
    )


def sample_digest(payload: bytes) -> bytes:
    """A recognisable digest of the size the server keeps (shorter ones are kept as unknown)."""
    return (b"digest:" + payload[:8]).ljust(24, b".")


async def append(log: StreamLog, *messages: bytes, **kw: Any) -> AppendEntry:
    e = entry(log, *messages, **kw)
    await log.stage(e)
    return e


async def read_all(
    log: StreamLog, *, whole_messages: bool = True, chunk: int = 1 << 20
) -> list[bytes]:
    """Every message from base to durable_tail, following next_position."""
    out: list[bytes] = []
    pos = log.base
    while pos < log.durable_tail:
        got = await log.read(pos, chunk, whole_messages=whole_messages)
        assert got.next_position > pos
        out.extend(s.data for s in got.slices)
        pos = got.next_position
    return out


def segment_files(root: Path, log_id: str) -> list[Path]:
    return sorted((root / "streams" / log_id).glob("*.seg"))


def drop_snapshot(root: Path, log_id: str) -> None:
    path = root / "streams" / log_id / "snapshot"
    if path.exists():
        os.unlink(path)


async def open_dd(root: Path, **overrides: Any) -> DataDir:
    return await DataDir.open(config(root, **overrides))


def crash_copy(root: Path, into: Path) -> Path:
    """The data directory as a crash would leave it on disk, with the WAL (nothing was checkpointed yet).
    Not trash/: a delete empties it in the background while the copy runs (and start-up empties it anyway)."""
    shutil.copytree(root, into, ignore=lambda d, names: names if Path(d).name == "trash" else ())
    assert list((into / "wal").glob("*.wal")), "the WAL was checkpointed before the copy"
    return into


async def checkpoint(dd: DataDir) -> None:
    """Rotate the WAL and wait for the checkpoint of the file it retired. First waits for the round
    and the checkpoint in flight (a size-triggered one), as the server does: it never rotates while a
    checkpoint runs (``Committer._checkpoint_due``, ``_idle_checkpoint``)."""
    committer_ = dd._committer
    while committer_._task is not None or committer_._checkpoint is not None:
        if committer_._task is not None:
            await asyncio.shield(committer_._task)
        if committer_._checkpoint is not None:
            await asyncio.shield(committer_._checkpoint)
    committer_._rotate = True
    committer_._start()
    while committer_._task is not None:
        await asyncio.shield(committer_._task)
    if committer_._checkpoint is not None:
        await asyncio.shield(committer_._checkpoint)
