"""One stream incarnation's durable log. CONTRACT STUB: the storage module owner implements it.

Layout of a stream directory (``<data-dir>/streams/<id>/``):
  ``<first-file-offset:020d>.seg``  segment files of framed, checksummed records (codec.py), rolled at
                                   ``segment_bytes``; the first record of the first segment is the header.
  ``snapshot``                      latest StreamState + sparse index + the segment position they cover,
                                   written atomically (tmp + fsync + rename); start-up replays only
                                   the records after it.

Concurrency model: everything runs on one asyncio event loop. The engine validates a request against
``log.state`` and calls ``stage()`` with no ``await`` in between, so validation and staging of one
stream are serialized without a lock (this also covers close vs append, hazard 17). ``stage()`` folds the
entry into ``state`` at once (so the next request validates against it) and queues it for the group
commit: one writer task per log writes every queued record with one write and one fsync, in a worker
thread, then advances ``durable_tail`` and resolves the futures. Readers never see past ``durable_tail``,
and listeners are called only after the fsync (waiters wake on durable data only).

If a write or fsync fails, the log is *poisoned*: every queued and future stage fails with
``StorageFailure`` (or ``InsufficientStorage`` for ENOSPC) until the server restarts and recovers from
disk. The in-memory state may be ahead of the disk then, so it must never be used again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from durastream_server.storage.records import AppendEntry, MessageSlice, StreamHeader
from durastream_server.storage.state import StreamState


@dataclass(frozen=True, slots=True)
class ReadChunk:
    """Result of ``StreamLog.read``: whole messages (JSON) or byte slices, plus where the read stopped."""

    slices: tuple[MessageSlice, ...]
    next_position: int  # position after the last returned byte; == start when nothing was returned


class StreamLog:
    """Append-only log of one stream incarnation."""

    id: str  # storage id: the directory name, unique per incarnation (used in ETags and fork links)
    header: StreamHeader
    state: StreamState  # accepted state, including staged entries not yet durable
    durable_tail: int  # readers never read past this
    durable_closed: bool  # closure that is on disk (what readers may report)

    @property
    def base(self) -> int:
        """First logical position stored in this log (``header.fork_position``)."""
        raise NotImplementedError

    def stage(self, entry: AppendEntry) -> asyncio.Future[None]:
        """Apply ``entry`` to ``state`` now and queue it for the group commit.

        Returns a future that resolves once the entry is durable (after fsync, unless the server runs with
        ``--durability=none``), or fails with ``StorageFailure``.
        """
        raise NotImplementedError

    def stage_soft_delete(self) -> asyncio.Future[None]:
        """Durably mark the stream soft-deleted (it keeps serving fork reads)."""
        raise NotImplementedError

    async def read(
        self, start: int, max_bytes: int, end: int | None = None, *, whole_messages: bool
    ) -> ReadChunk:
        """Read from logical ``start`` up to ``min(end, durable_tail)``, about ``max_bytes`` of payload.

        - ``whole_messages=True`` (JSON streams): returns whole messages only, at least one if any
          exists (even if larger than ``max_bytes``); ``start`` must be a message boundary, else
          ``InvalidPosition``.
        - Byte streams: may start and stop inside a stored message.
        - ``start`` outside ``[base, durable_tail]`` raises ``InvalidPosition``.
        Uses the index to find the start and ``pread`` from disk in a worker thread; never loads a segment
        whole.
        """
        raise NotImplementedError

    def boundary_after(self, anchor: int, count: int, *, messages: bool) -> int:
        """Position ``count`` messages (or bytes) past ``anchor``, for fork sub-offsets.

        Raises ``InvalidPosition`` if ``anchor`` is not a boundary or the result would pass the end of the
        message that starts at ``anchor`` / the tail.
        """
        raise NotImplementedError

    def is_boundary(self, position: int) -> bool:
        """True if ``position`` is a message boundary (or the tail)."""
        raise NotImplementedError

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the loop) after each durable commit; returns an unsubscribe function."""
        raise NotImplementedError

    async def flush(self) -> None:
        """Wait until everything staged so far is durable (or raise the poisoning error)."""
        raise NotImplementedError


class InvalidPosition(ValueError):
    """A logical position that is not in this log or not a boundary where one is required."""
