"""Durable storage: one append-only log per stream incarnation, in a locked data directory.

The storage layer never sees a request; it stores and returns records (``records.py``).
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
