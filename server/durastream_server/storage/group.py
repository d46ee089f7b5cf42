"""The blocking half of a staged-append commit: copy staged messages into the log as one record group.

A commit (``records.GroupCommit``) is written by the log's writer task like any batch, but alone: the
log hands the group to ``write_group`` instead of ``writer.write_batch``, in the same worker-thread slot,
so it is serialized with every other write of the stream and acknowledged after one fdatasync per
touched segment.

Why a copy, and in bounded memory: staged messages are read sequentially from the staging files (page-
cache hot: they were written moments ago) and re-framed into APPEND records of about ``RECORD_TARGET``
payload bytes (whole messages; a larger message gets a record of its own), which are written in
``WRITE_CHUNK`` pieces. A 1 GiB commit therefore never holds more than a few MiB (or one message) in
memory. Every record but the last carries FLAG_GROUP_CONTINUES; the last carries the producer tuple,
``Stream-Seq``, closure, digest and the committed handle names, so recovery can apply the group whole
or truncate it (``recovery.py``), and readers never see part of it: ``durable_tail`` moves only when
``write_group`` has returned.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from durastream_server.storage import codec, txnfile
from durastream_server.storage.files import Handle, fsync_dir, pwrite_all
from durastream_server.storage.records import AppendEntry, GroupCommit
from durastream_server.storage.segments import segment_name
from durastream_server.storage.writer import BatchResult, WriteTarget, _undo

log = logging.getLogger(__name__)

RECORD_TARGET = 1024 * 1024  # payload bytes per group record (whole messages)
WRITE_CHUNK = 4 * 1024 * 1024  # bytes of frames gathered before one pwritev
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class GroupResult(BatchResult):
    """``BatchResult`` for a one-group batch (``offsets`` holds the group's last record), plus every
    record of the group for the index: ``(position, global offset, message count)``."""

    records: tuple[tuple[int, int, int], ...] = ()


def split_batch(queue: list) -> tuple[list, list]:  # type: ignore[type-arg]
    """The next batch of a log's queue and the rest: a record group is always written alone, every
    other item batches with its neighbours as before."""
    for i, (item, _) in enumerate(queue):
        if type(item) is GroupCommit:
            cut = 1 if i == 0 else i
            return queue[:cut], queue[cut:]
    return queue, []


def is_group_batch(batch: list) -> bool:  # type: ignore[type-arg]
    return len(batch) == 1 and type(batch[0][0]) is GroupCommit


def write_group(
    target: WriteTarget, items: list[GroupCommit], seg_base: int, end: int
) -> GroupResult:
    """Append the group ``items[0]`` after global offset ``end`` (last segment starts at ``seg_base``).

    On any failure (I/O, or a staging file that fails its checksums) everything written is cut away
    (best effort; recovery truncates an incomplete group anyway) and the error propagates: the caller
    poisons the log, since the accepted state already includes the group.
    """
    (group,) = items
    out = _SegmentAppender(target, seg_base, end)
    try:
        for record in group_records(group):
            out.add(codec.encode_append(record), record.position, len(record.messages))
        out.finish()
    except BaseException:
        out.release()
        _undo(target, out.written)
        raise
    last = out.records[-1][1]
    return GroupResult([last], out.new_segments, out.end, tuple(out.records))


def group_records(group: GroupCommit) -> Iterator[AppendEntry]:
    """The records of ``group``: staged messages in source order, cut into ~RECORD_TARGET records.

    Checks that the staging files hold exactly what the commit was validated against (message and
    byte counts, contiguous staged positions); anything else is ``CorruptRecord``.
    """
    remaining = group.n_messages
    position = group.position
    chunk: list[memoryview] = []
    chunk_bytes = 0
    for source in group.sources:
        messages_seen = 0
        staged_at = 0
        for staged_position, messages in txnfile.read_staged_messages(source):
            if staged_position != staged_at:
                raise codec.CorruptRecord(
                    f"staging file {source.path}: record at staged position {staged_position}, "
                    f"expected {staged_at}"
                )
            for message in messages:
                chunk.append(message)
                chunk_bytes += len(message)
                staged_at += len(message)
                messages_seen += 1
                remaining -= 1
                if chunk_bytes >= RECORD_TARGET and remaining > 0:
                    yield AppendEntry(
                        position=position,
                        messages=tuple(chunk),  # type: ignore[arg-type]
                        timestamp_ms=group.timestamp_ms,
                        continues=True,
                    )
                    position += chunk_bytes
                    chunk, chunk_bytes = [], 0
        if messages_seen != source.n_messages or staged_at != source.size:
            raise codec.CorruptRecord(
                f"staging file {source.path} holds {messages_seen} messages / {staged_at} bytes, "
                f"the commit expected {source.n_messages} / {source.size}"
            )
    if remaining != 0 or position + chunk_bytes != group.end:
        raise codec.CorruptRecord("staged data does not add up to the commit")
    yield AppendEntry(
        position=position,
        messages=tuple(chunk),  # type: ignore[arg-type]
        timestamp_ms=group.timestamp_ms,
        closes=group.closes,
        producer=group.producer,
        stream_seq=group.stream_seq,
        digest=group.digest,
        txn_handles=group.txn_handles,
    )


class _SegmentAppender:
    """Appends frames to a log's segments in chunks, rolling segments like ``write_batch`` does, and
    fdatasyncs each touched segment through the fd it wrote (hazard 30) before leaving it."""

    def __init__(self, target: WriteTarget, seg_base: int, end: int) -> None:
        self._target = target
        self._base = seg_base
        self._size = end - seg_base  # bytes in the current segment, pending ones included
        self._flushed = self._size  # bytes of the current segment already written
        self._pending: list[bytes | bytearray] = []
        self._pending_bytes = 0
        self._handle: Handle | None = None
        self._touched = False
        self.new_segments: list[int] = []
        self.written: list[tuple[int, int, bool]] = []  # (base, local start, new) for undo
        self.records: list[tuple[int, int, int]] = []

    @property
    def end(self) -> int:
        return self._base + self._size

    def add(self, frame: bytes | bytearray, position: int, n_messages: int) -> None:
        if self._size and self._size + len(frame) > self._target.segment_bytes:
            self._flush()
            self._sync_and_release()
            self._roll()
        self.records.append((position, self._base + self._size, n_messages))
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        self._size += len(frame)
        if self._pending_bytes >= WRITE_CHUNK:
            self._flush()

    def finish(self) -> None:
        self._flush()
        self._sync_and_release()
        if self.new_segments and self._target.sync:
            fsync_dir(self._target.directory)

    def release(self) -> None:
        if self._handle is not None:
            self._target.cache.release(self._handle)
            self._handle = None

    def _path(self) -> str:
        return os.path.join(self._target.directory, segment_name(self._base))

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._handle is None:
            self._handle = self._target.cache.acquire(
                (self._target.log_id, self._base), self._path()
            )
        if not self._touched:
            self._touched = True
            if not (self.written and self.written[-1][0] == self._base):
                self.written.append((self._base, self._flushed, False))
        pwrite_all(self._handle.fd, self._pending, self._flushed)
        self._flushed += self._pending_bytes
        self._pending = []
        self._pending_bytes = 0

    def _sync_and_release(self) -> None:
        if self._handle is not None and self._touched and self._target.sync:
            os.fdatasync(self._handle.fd)
        self.release()
        self._touched = False

    def _roll(self) -> None:
        self._base += self._size
        self._size = self._flushed = 0
        os.close(os.open(self._path(), os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644))
        self.written.append((self._base, 0, True))  # undo removes it, even if never written
        self.new_segments.append(self._base)
