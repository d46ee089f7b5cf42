"""The blocking half of a staged-append commit: put staged messages into the log as one record group.

A commit (``records.GroupCommit``) is written by the log's writer task like any batch, but alone: the
log hands the group to ``write_group`` instead of ``writer.write_batch``, in the same worker-thread slot,
so it is serialized with every other write of the stream and acknowledged after one fdatasync per
touched file.

Commit by reference: a staging file is, from its first byte, a run of valid log records (its header is an
APPEND record without messages). So the group's leading staging files of at least ``MOVE_MIN_BYTES`` are
*moved* into the log: each record's position, timestamp, flags and checksum are rewritten in place (the
payload stays where it is), the file is fdatasynced and hard-linked as the next segment name. Smaller or
legacy staging files are copied after them, into a new segment (a moved file is never written to once it
is linked): their staged records are read sequentially (page-cache hot, checksums verified) and moved
whole into APPEND records of at least ``RECORD_TARGET`` payload bytes, written in ``WRITE_CHUNK`` pieces,
so memory stays bounded by one read block or one stage request.

Every record but the last carries FLAG_GROUP_CONTINUES; the last, written after everything else is in
place, carries the producer tuple, ``Stream-Seq``, closure, digest and the committed handle names, so
recovery can apply the group whole or truncate it (``recovery.py``, moved segments included), and readers
never see part of it: ``durable_tail`` moves only when ``write_group`` has returned.

A moved file keeps its staging name until the commit is durable (the engine unlinks it then, like a
copied one). So whenever the server dies, every handle is either in a durable commit record (its staging
file is removed at start-up) or still staged, its file whole: recovery truncates an incomplete group by
unlinking the moved segments' log names and never changes their content, and the staging reader reads
the rewritten positions back as staged ones (``txnfile.staged_position``). A commit retried after the
restart therefore succeeds, or is a duplicate if the first one had become durable.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from durastream_server.storage import codec, txnfile
from durastream_server.storage.crc import crc32, replace_prefix
from durastream_server.storage.files import Handle, fsync_dir, pwrite_all
from durastream_server.storage.records import GroupCommit, StagedSource
from durastream_server.storage.segments import segment_name
from durastream_server.storage.writer import BatchResult, WriteTarget, _undo

log = logging.getLogger(__name__)

RECORD_TARGET = 1024 * 1024  # payload bytes per group record (whole messages)
# Staging files at least this large are moved into the log as segments; smaller ones are copied, so
# that a stream is not cut into many tiny segments.
MOVE_MIN_BYTES = 256 * 1024
SYNC_THREADS = 8  # concurrent fdatasyncs of moved staging files
WRITE_CHUNK = 4 * 1024 * 1024  # bytes of frames gathered before one pwritev
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_APPEND_SEED = crc32(bytes([codec.Kind.APPEND]))


@dataclass(slots=True)  # not frozen, as ``BatchResult``
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

    The group's leading movable staging files of at least MOVE_MIN_BYTES are moved into the log as
    segments (``_move_sources``); the rest is copied after them, and the group's last record (the one
    with its producer tuple and handles) always comes last, so that recovery sees a complete group only
    once everything is in place.

    On any failure (I/O, or a staging file that fails its checksums) everything written is cut away and
    the moved files' log names are unlinked (best effort; recovery truncates an incomplete group anyway;
    their staging names were never removed) and the error propagates: the caller poisons the log, since
    the accepted state already includes the group.
    """
    (group,) = items
    # A moved file takes the next segment name; if the last segment is empty (a group truncated at
    # recovery can leave one), that name is taken: copy this time.
    count = _movable_prefix(group) if end > seg_base else 0
    moved: list[tuple[str, str, int]] = []  # (segment, staging file, base): unlinked on failure
    records: list[tuple[int, int, int]] = []
    new_segments: list[int] = []
    position = group.position
    out: _SegmentAppender | None = None
    try:
        if count:
            position, end = _move_sources(
                target, group, group.sources[:count], end, moved, records, new_segments
            )
            seg_base = new_segments[-1]
        out = _SegmentAppender(target, seg_base, end)
        if count:
            # The last moved file is still its handle's staging file: the rest goes to a new segment.
            out.roll()
        for parts, record_position, n_messages in group_records(group, count, position):
            out.add(parts, record_position, n_messages)
        out.finish()  # fsyncs the directory (the links and the new segment) before returning
    except BaseException:
        if out is not None:
            out.release()
            _undo(target, out.written)
        _move_back(target, moved)
        raise
    records.extend(out.records)
    new_segments.extend(out.new_segments)
    target.metrics.batch(len(records), group.n_messages, group.size)
    return GroupResult([records[-1][1]], new_segments, out.end, tuple(records))


def _movable_prefix(group: GroupCommit) -> int:
    count = 0
    for source in group.sources:
        if not (source.movable and source.size >= MOVE_MIN_BYTES):
            break
        count += 1
    return count


def _move_sources(
    target: WriteTarget,
    group: GroupCommit,
    sources: tuple[StagedSource, ...],
    end: int,
    moved: list[tuple[str, str, int]],
    records: list[tuple[int, int, int]],
    new_segments: list[int],
) -> tuple[int, int]:
    """Make whole staging files segments of the log: commit by reference, no payload is copied.

    Each file is a run of APPEND records (its header record has no messages). In place, every record
    gets its log position, the group's timestamp and FLAG_GROUP_CONTINUES, and a new checksum derived
    from the stored one (the payload is not read; only the 37 bytes of frame and fixed fields are
    rewritten); the file is fdatasynced and renamed to the next segment name. The
    stage's producer tuple and digest stay in each record's meta, which readers and recovery ignore
    for a record that continues a group. Returns the position and global file offset after them.

    The file is *linked*, not renamed: its staging name stays until the commit is durable, so that a
    crash before then leaves the handle staged (recovery unlinks the log name of a segment of an
    incomplete group without touching its content).
    """
    position = group.position
    bases = []
    # Rewrite every file first; their fdatasyncs (each through the fd that wrote, hazard 30) run on
    # a few threads meanwhile, so the disk flushes of many small files overlap. Links come after all
    # of them: a moved file is always a durable run of valid log records.
    with ThreadPoolExecutor(max_workers=SYNC_THREADS, thread_name_prefix="group-sync") as pool:
        syncs = []
        for source in sources:
            fd = _rewrite_positions(source, position, group.timestamp_ms, end, records)
            syncs.append(pool.submit(_sync_and_close, fd, target.sync))
            bases.append(end)
            position += source.size
            end += source.end
        for sync in syncs:
            sync.result()
    for source, base in zip(sources, bases, strict=True):
        segment = os.path.join(target.directory, segment_name(base))
        if os.path.exists(segment):
            raise FileExistsError(errno.EEXIST, "segment already exists", segment)
        os.link(source.path, segment)
        moved.append((segment, source.path, base))
        new_segments.append(base)
    if target.sync:
        fsync_dir(target.directory)  # every link is durable before anything after them is written
    return position, end


def _sync_and_close(fd: int, sync: bool) -> None:
    try:
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _rewrite_positions(
    source: StagedSource,
    position: int,
    timestamp_ms: int,
    base: int,
    records: list[tuple[int, int, int]],
) -> int:
    """Rewrite the records of ``source`` in place for log position ``position`` (not synced); returns
    the open fd, for the caller to fdatasync and close. Appends ``(position, global offset, messages)``
    of each record to ``records``.

    Reads only each record's frame and meta, never its payload: the new checksum is the stored one
    with the fixed part swapped (``crc.replace_prefix``), so a payload damaged since it was staged still
    fails its checksum when read, as it would have before the move. (Reading the payload back here
    would mostly re-read the page cache the stage had just filled, at the end of every batch; staging
    files are verified whole when recovered from disk at start-up.)
    """
    fd = os.open(source.path, os.O_RDWR | _O_CLOEXEC)
    try:
        txnfile.check_not_linked(fd, source.path)
        frame, body = txnfile.read_record_head(fd, 0, source.end)
        # The header record has no payload: its head is all of it, so it is verified whole.
        if not codec.body_crc_ok(frame, body) or frame.record_len != source.start:
            raise codec.CorruptRecord(f"staging file {source.path} has no valid header record")
        txnfile.decode_header_record(frame, memoryview(body))
        patches: list[tuple[int, bytes]] = []
        offset = 0
        staged_at = 0
        messages = 0
        while offset < source.end:
            if offset:
                frame, body = txnfile.read_record_head(fd, offset, source.end)
            meta = codec.decode_append_meta(body, 0, frame.body_len)
            stored_flags = txnfile.record_flags(body)
            if offset:
                # Records may already be rewritten, some or all (a commit interrupted by a crash or
                # an error).
                staged = txnfile.staged_position(meta.position, stored_flags, staged_at)
                if staged != staged_at:
                    raise codec.CorruptRecord(
                        f"staging file {source.path}: record at staged position {staged}, "
                        f"expected {staged_at}"
                    )
            n = len(meta.lengths)
            flags = stored_flags | codec.FLAG_GROUP_CONTINUES
            meta_len = meta.payload_off - codec.APPEND_FIXED_SIZE
            record_position = position + staged_at
            fixed = codec.APPEND_FIXED.pack(record_position, timestamp_ms, n, meta_len, flags)
            crc = replace_prefix(
                frame.crc,
                crc32(body[: codec.APPEND_FIXED_SIZE], _APPEND_SEED),
                crc32(fixed, _APPEND_SEED),
                frame.body_len - codec.APPEND_FIXED_SIZE,
            )
            head = codec.FRAME.pack(
                codec.MAGIC, codec.FORMAT_VERSION, codec.Kind.APPEND, frame.body_len, crc
            )
            patches.append((offset, head + fixed))
            records.append((record_position, base + offset, n))
            staged_at += frame.body_len - meta.payload_off
            messages += n
            offset += frame.record_len
        if messages != source.n_messages or staged_at != source.size:
            raise codec.CorruptRecord(
                f"staging file {source.path} holds {messages} messages / {staged_at} bytes, "
                f"the commit expected {source.n_messages} / {source.size}"
            )
        for at, patch in patches:
            pwrite_all(fd, [patch], at)
        if os.fstat(fd).st_size != source.end:
            os.ftruncate(fd, source.end)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _move_back(target: WriteTarget, moved: list[tuple[str, str, int]]) -> None:
    """Best effort, after a failure: unlink the log names of the staging files linked into the log
    (their staging names were kept; their rewritten positions are read back as staged ones, so the
    handles stay committable). What is left is cut away by recovery, the same way."""
    for segment, _staging, base in reversed(moved):
        try:
            target.cache.discard(lambda key, b=base: key == (target.log_id, b))
            os.unlink(segment)
        except OSError as exc:
            log.warning("stream %s: could not unlink %s: %s", target.log_id, segment, exc)


Frame = list[bytes | bytearray | memoryview]


def group_records(
    group: GroupCommit, first: int = 0, position: int | None = None
) -> Iterator[tuple[Frame, int, int]]:
    """The records of ``group`` from its source ``first`` on (starting at log ``position``) as ``(frame
    buffers, position, message count)``: the staged records in source order, whole, gathered into
    records of at least ~RECORD_TARGET payload bytes (a staged record is never split, so a group record
    holds whole stage requests and is as large as the largest one). The last one carries the group's
    producer tuple, handles and so on; it has no messages when every source was moved.

    Messages are never split apart or copied here: a group record reuses the staged records' packed
    lengths and payload bytes, and only its header and checksum are new (``codec.encode_append_parts``).
    Checks that the staging files hold exactly what the commit was validated against (message and byte
    counts, contiguous staged positions); anything else is ``CorruptRecord``.
    """
    sources = group.sources[first:]
    remaining = sum(source.n_messages for source in sources)
    position = group.position if position is None else position
    lengths: list[memoryview] = []
    payload: list[memoryview] = []
    count = 0
    size = 0
    for source in sources:
        messages_seen = 0
        staged_at = 0
        for record in txnfile.read_staged_records(source):
            if record.position != staged_at:
                raise codec.CorruptRecord(
                    f"staging file {source.path}: record at staged position {record.position}, "
                    f"expected {staged_at}"
                )
            if not record.n_messages:
                continue
            lengths.append(record.lengths)
            payload.append(record.payload)
            count += record.n_messages
            size += record.size
            staged_at += record.size
            messages_seen += record.n_messages
            remaining -= record.n_messages
            if size >= RECORD_TARGET and remaining > 0:
                parts = codec.encode_append_parts(
                    position,
                    group.timestamp_ms,
                    count,
                    _joined(lengths),
                    payload,
                    continues=True,
                )
                yield parts, position, count
                position += size
                lengths, payload, count, size = [], [], 0, 0
        if messages_seen != source.n_messages or staged_at != source.size:
            raise codec.CorruptRecord(
                f"staging file {source.path} holds {messages_seen} messages / {staged_at} bytes, "
                f"the commit expected {source.n_messages} / {source.size}"
            )
    if remaining != 0 or position + size != group.end:
        raise codec.CorruptRecord("staged data does not add up to the commit")
    parts = codec.encode_append_parts(
        position,
        group.timestamp_ms,
        count,
        _joined(lengths),
        payload,
        closes=group.closes,
        producer=group.producer,
        stream_seq=group.stream_seq,
        digest=group.digest,
        txn_handles=group.txn_handles,
    )
    yield parts, position, count


def _joined(pieces: list[memoryview]) -> bytes | memoryview:
    """Packed u32 lengths sections concatenate into one (only a few KiB: a copy is fine)."""
    if not pieces:
        return b""
    if len(pieces) == 1:
        return pieces[0]
    return b"".join(pieces)


class _SegmentAppender:
    """Appends frames to a log's segments in chunks, rolling segments like ``write_batch`` does, and
    fdatasyncs each touched segment through the fd it wrote (hazard 30) before leaving it."""

    def __init__(self, target: WriteTarget, seg_base: int, end: int) -> None:
        self._target = target
        self._base = seg_base
        self._size = end - seg_base  # bytes in the current segment, pending ones included
        self._flushed = self._size  # bytes of the current segment already written
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_bytes = 0
        self._handle: Handle | None = None
        self._touched = False
        self.new_segments: list[int] = []
        self.written: list[tuple[int, int, bool]] = []  # (base, local start, new) for undo
        self.records: list[tuple[int, int, int]] = []

    @property
    def end(self) -> int:
        return self._base + self._size

    def add(self, frame: Frame, position: int, n_messages: int) -> None:
        """Queue one record, given as its buffers (written with one ``pwritev`` per chunk)."""
        length = sum(len(part) for part in frame)
        if self._size and self._size + length > self._target.segment_bytes:
            self._flush()
            self._sync_and_release()
            self._roll()
        self.records.append((position, self._base + self._size, n_messages))
        self._pending.extend(frame)
        self._pending_bytes += length
        self._size += length
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
            synced_at = time.perf_counter()
            os.fdatasync(self._handle.fd)
            self._target.metrics.fsync(time.perf_counter() - synced_at)
        self.release()
        self._touched = False

    def roll(self) -> None:
        """Start a new segment at the current end (nothing may be pending)."""
        assert not self._pending and self._handle is None
        self._roll()

    def _roll(self) -> None:
        self._base += self._size
        self._size = self._flushed = 0
        os.close(os.open(self._path(), os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644))
        self.written.append((self._base, 0, True))  # undo removes it, even if never written
        self.new_segments.append(self._base)
