"""Durable storage: one append-only log per stream incarnation, in a locked data directory.

The storage layer never sees a request; it stores and returns records (``records.py``).

Modules, bottom up:
  ``codec``     record framing (magic, version, kind, length, crc32) and the binary record bodies
  ``files``     the reference-counted fd cache, pwritev/pread/fsync helpers
  ``segments``  segment naming, immutable segment views, the bounded read-ahead window
  ``index``     sparse position -> file offset index plus a small window of recent records
  ``reader``    ranged reads and boundary walks (worker threads)
  ``writer``    the blocking half of the group commit: encode, write, fdatasync the written fd
  ``txnfile``   staged appends: per-handle staging files and tombstones
  ``group``     staged-append commits: staged messages copied into the log as one record group
  ``snapshot``  atomic, checksummed snapshots of state + index
  ``recovery``  start-up: header, snapshot, replay, torn-tail truncation, quarantine
  ``log``       ``StreamLog``: staging, the per-log writer task, reads, listeners
  ``datadir``   ``DataDir``: lock, recovery of all streams, atomic create, delete, close
"""

from durastream_server.storage.datadir import AlreadyLocked, DataDir, Durability, StorageConfig
from durastream_server.storage.log import InvalidPosition, ReadChunk, StreamLog
from durastream_server.storage.records import (
    AppendEntry,
    MessageSlice,
    ProducerTuple,
    SoftDelete,
    StreamHeader,
)
from durastream_server.storage.state import ProducerState, StreamState, apply_entry

__all__ = [
    "AlreadyLocked",
    "AppendEntry",
    "DataDir",
    "Durability",
    "InvalidPosition",
    "MessageSlice",
    "ProducerState",
    "ProducerTuple",
    "ReadChunk",
    "SoftDelete",
    "StorageConfig",
    "StreamHeader",
    "StreamLog",
    "StreamState",
    "apply_entry",
]
