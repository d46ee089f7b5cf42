"""The blocking half of the group commit: encode a batch, write it, fsync the fds that were written.

Runs in a worker thread, one batch per log at a time (the log's writer task awaits it before starting the
next one), so it can use the segment layout it was given without locks. It returns where each record
landed; the log applies that to its index on the loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from durastream_server.storage import codec
from durastream_server.storage.files import FdCache, Handle, fsync_dir, pwrite_all
from durastream_server.storage.metrics import NO_METRICS, WriteMetrics
from durastream_server.storage.records import AppendEntry, SoftDelete
from durastream_server.storage.segments import segment_name

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# Not frozen: made per log per commit round (``committer.py``), where a frozen dataclass's
# ``__init__`` (``object.__setattr__`` per field) was ~5x a plain one's (issue 17, h52). Never
# changed after it is made.
@dataclass(slots=True)
class WriteTarget:
    """Where and how a log's writer writes; constant for the log's lifetime."""

    directory: str
    log_id: str
    cache: FdCache
    segment_bytes: int
    sync: bool  # fdatasync after writing (Durability.FSYNC)
    metrics: WriteMetrics = NO_METRICS  # batch sizes and fsync latency (storage/metrics.py)


@dataclass(slots=True)  # not frozen: as ``WriteTarget``
class BatchResult:
    offsets: list[int]  # global file offset of each item's record, in order
    new_segments: list[int]  # bases of segments this batch created
    end: int  # global file end after the batch


def encode_item(item: AppendEntry | SoftDelete) -> bytearray:
    if type(item) is AppendEntry:
        return codec.encode_append(item)
    return codec.encode_soft_delete(item)  # type: ignore[arg-type]


@dataclass(slots=True)
class Chunk:
    """The frames of a batch bound for one segment file."""

    base: int  # the segment's base (global offset of its first byte)
    start: int  # where in the segment the frames start
    frames: list[bytearray]
    new: bool  # the batch creates this segment

    @property
    def size(self) -> int:
        return sum(map(len, self.frames))


def lay_out(
    target: WriteTarget, items: list[AppendEntry | SoftDelete], seg_base: int, end: int
) -> tuple[list[Chunk], BatchResult]:
    """Encode ``items`` and place them after global offset ``end`` (the last segment starts at
    ``seg_base``), rolling to a new segment when the current one would pass ``segment_bytes``."""
    frames = [encode_item(item) for item in items]
    base, size = seg_base, end - seg_base
    current = Chunk(base, size, [], False)
    chunks = [current]
    offsets: list[int] = []
    for frame in frames:
        if size and size + len(frame) > target.segment_bytes:
            base, size = base + size, 0
            current = Chunk(base, 0, [], True)
            chunks.append(current)
        offsets.append(base + size)
        current.frames.append(frame)
        size += len(frame)
    new_segments = [c.base for c in chunks if c.new]
    return [c for c in chunks if c.frames], BatchResult(offsets, new_segments, base + size)


def write_chunks(
    target: WriteTarget,
    chunks: list[Chunk],
    *,
    sync: bool,
    keep: Callable[[Handle], bool] | None = None,
) -> None:
    """Write ``chunks`` (one ``pwritev`` per segment), ``fdatasync`` each segment if ``sync``, and make
    new segments' names durable (with ``target.sync``). ``keep(handle)`` may keep the cache reference
    of a handle written through (True), for whoever syncs it later (the WAL's checkpoint). On an
    OSError everything written is truncated away (best effort) and the error propagates."""
    written: list[Chunk] = []
    try:
        for chunk in chunks:
            path = os.path.join(target.directory, segment_name(chunk.base))
            if chunk.new:
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644))
            written.append(chunk)
            handle = target.cache.acquire((target.log_id, chunk.base), path)
            try:
                pwrite_all(handle.fd, chunk.frames, chunk.start)
                if sync:
                    synced_at = time.perf_counter()
                    os.fdatasync(
                        handle.fd
                    )  # the fd we wrote through, never a re-lookup (hazard 30)
                    target.metrics.fsync(time.perf_counter() - synced_at)
            finally:
                if keep is None or not keep(handle):
                    target.cache.release(handle)
        if target.sync and any(chunk.new for chunk in chunks):
            fsync_dir(target.directory)
    except OSError:
        undo_chunks(target, written)
        raise


def write_batch(
    target: WriteTarget, items: list[AppendEntry | SoftDelete], seg_base: int, end: int
) -> BatchResult:
    """Append ``items`` after global offset ``end`` (last segment starts at ``seg_base``), durable on
    return with ``target.sync``: the batch path that syncs its own segment files (large batches and
    durability ``none``; small ones go through the shared WAL, ``committer.py``).

    One ``pwritev`` and one ``fdatasync`` per touched segment (normally exactly one of each). On an
    OSError everything this batch wrote is truncated away (best effort) and the error propagates: the
    caller poisons the log, and recovery would cut any torn remainder at restart.
    """
    chunks, result = lay_out(target, items, seg_base, end)
    write_chunks(target, chunks, sync=target.sync)
    target.metrics.batch(len(items), *payload(items))
    return result


def undo_chunks(target: WriteTarget, chunks: list[Chunk]) -> None:
    """Best effort: remove what a failed batch wrote (see ``_undo``)."""
    _undo(target, [(c.base, c.start, c.new) for c in chunks])


def payload(items: list[AppendEntry | SoftDelete]) -> tuple[int, int]:
    """Messages and payload bytes of a batch (sizes are summed once per entry already)."""
    messages = size = 0
    for item in items:
        if type(item) is AppendEntry:
            messages += len(item.messages)
            size += item.size
    return messages, size


def _undo(target: WriteTarget, written: list[tuple[int, int, bool]]) -> None:
    """Best effort: remove what a failed batch wrote, so a restart does not resurrect failed appends."""
    for c_base, c_start, is_new in reversed(written):
        path = os.path.join(target.directory, segment_name(c_base))
        try:
            if is_new:
                target.cache.discard(lambda key, b=c_base: key == (target.log_id, b))
                os.unlink(path)
            else:
                os.truncate(path, c_start)
        except OSError as exc:
            log.warning(
                "stream %s: could not undo failed write in %s: %s", target.log_id, path, exc
            )
