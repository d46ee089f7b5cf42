"""The data directory: lock, stream directories, atomic create and delete. CONTRACT STUB.

``<data-dir>/``
  ``LOCK``         held with ``fcntl.flock`` for the server's lifetime: a second server refuses to start.
  ``streams/``     one directory per stream incarnation, named by a fresh unique id (never derived from the
                   path, so any UTF-8 path is safe and ``a/b`` never meets ``a%2Fb``). The path lives in the
                   header record.
  ``staging/``     a new stream is built here (header + initial data, fsynced) and renamed into
                   ``streams/`` only when complete, so a failed or crashed create leaves no stream (hazard 20).
  ``trash/``       delete renames a stream directory here (atomic), then removes it in the background.
  ``meta/``        other components' durable files (e.g. subscriptions), via ``meta_path()``.

Recovery (``open``): truncate a torn tail to the last valid record before anything is appended (hazard 18);
a checksum failure *followed by valid data* is mid-file corruption: the stream is quarantined (reported by
``corrupt``), never served, never reset to offset 0 (hazard 32). Empty ``staging/`` and ``trash/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from durastream_server.storage.log import StreamLog
from durastream_server.storage.records import AppendEntry, StreamHeader


class Durability(str, Enum):
    """When an append is acknowledged."""

    FSYNC = "fsync"  # after fdatasync of the segment (default)
    NONE = "none"  # after write(2) only: survives a process crash, not a power loss


@dataclass(frozen=True, slots=True)
class StorageConfig:
    root: Path
    durability: Durability = Durability.FSYNC
    segment_bytes: int = 64 * 1024 * 1024
    index_interval_bytes: int = 64 * 1024  # one sparse-index entry per this many segment bytes
    snapshot_interval_entries: int = 4096


class AlreadyLocked(RuntimeError):
    """Another server holds the data directory."""


class DataDir:
    """Owns the data directory for the server's lifetime."""

    logs: dict[
        str, StreamLog
    ]  # storage id -> log, every recovered incarnation (incl. soft-deleted)
    corrupt: dict[str, str]  # path -> reason, for quarantined streams

    @classmethod
    async def open(cls, config: StorageConfig) -> DataDir:
        """Lock, recover every stream (snapshot + replay), return. Raises ``AlreadyLocked``."""
        raise NotImplementedError

    async def create_stream(self, header: StreamHeader, initial: AppendEntry | None) -> StreamLog:
        """Atomically create a new incarnation with its header and optional initial entry, durable."""
        raise NotImplementedError

    async def delete_stream(self, log: StreamLog) -> None:
        """Remove an incarnation: wait for its pending commits, rename to trash, fsync, rm in background."""
        raise NotImplementedError

    def meta_path(self, name: str) -> Path:
        """A path under ``meta/`` for another component's durable files."""
        raise NotImplementedError

    async def close(self) -> None:
        """Flush every log, write snapshots, release the lock."""
        raise NotImplementedError
