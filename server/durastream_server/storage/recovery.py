"""Start-up recovery of one stream directory: header, snapshot, replay, torn-tail repair, quarantine.

Rules (hazards 18, 19, 32):
  - State is rebuilt by replaying records through ``apply_entry``, the same fold live appends use, so
    producer tuples, ``Stream-Seq`` and closure come back exactly as acknowledged.
  - A bad record (partial frame, bad magic or checksum) with no valid record anywhere after it is a torn
    tail from a crash mid-write: it is truncated away, and logged, before anything can be appended.
  - A bad record followed by valid data is mid-file corruption; so is a missing segment, a damaged header
    or an unreadable file. The stream is quarantined: never served, never reset to offset 0.
  - A record group (a staged-append commit, FLAG_GROUP_CONTINUES on all but its last record) is folded
    only once its last record is read. An incomplete group at the end of the log (a crash mid-commit)
    is truncated back to its first record, so none of it is ever visible; a damaged record inside it
    followed by valid data is mid-file corruption as above. Segments of such a group that are staging
    files linked into the log (a commit by reference) are unlinked, never truncated: their staging
    names keep the handles staged.
  - A snapshot only shortens the replay. Any doubt about it (checksum, bounds, a replay that does not
    line up) falls back to a full replay, which alone decides about truncation and quarantine.

Runs in a worker thread; reads sequentially in bounded chunks, never a whole segment at once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from durastream_server.storage import codec
from durastream_server.storage.codec import FRAME_SIZE, MAGIC, Kind
from durastream_server.storage.files import fsync_dir
from durastream_server.storage.index import LogIndex, SparseIndex
from durastream_server.storage.records import AppendEntry, GroupCommit, StreamHeader
from durastream_server.storage.segments import SEGMENT_RE, segment_name
from durastream_server.storage.snapshot import (
    SNAPSHOT_NAME,
    SNAPSHOT_TMP,
    Snapshot,
    load_snapshot,
)
from durastream_server.storage.state import StreamState, apply_entry
from durastream_server.storage.txnfile import TXN_DIR

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Quarantine(Exception):
    """The stream cannot be trusted. ``path`` is its path, or None if the header is lost."""

    def __init__(self, path: str | None, reason: str) -> None:
        super().__init__(reason)
        self.path = path
        self.reason = reason


@dataclass(slots=True)
class Recovered:
    log_id: str
    directory: str
    header: StreamHeader
    state: StreamState
    bases: list[int]
    index: LogIndex
    file_end: int
    last_record: int  # global offset of the last record (0: only the header)
    snapshot_entries: int  # state.entries covered by the snapshot on disk (0: none)
    snapshot_end: int  # file offset it covers (0: none)
    has_staging: bool = False  # a txn/ directory exists (staged appends to load; staging.py)


class _Bad(Exception):
    """A record that does not parse or check at (segment index, local offset)."""

    def __init__(self, seg: int, off: int, reason: str) -> None:
        super().__init__(reason)
        self.seg = seg
        self.off = off
        self.reason = reason


class _Inconsistent(Exception):
    """Valid records that do not line up (position gap, unexpected kind)."""


class _TornGroup(_Bad):
    """A record group without its last record at the end of the log: cut back to its first record.
    ``cut`` is the damaged record that ended it early, if any (valid data after *it* means mid-file
    corruption, not a torn tail)."""

    def __init__(self, seg: int, off: int, reason: str, cut: _Bad | None) -> None:
        super().__init__(seg, off, reason)
        self.cut = cut


class _GroupBuffer:
    """The records of a record group read so far: positions and offsets only, never payload (a group
    may be GiBs). The state and the index see the group only once its last record is read."""

    __slots__ = ("records", "start", "end")

    def __init__(self) -> None:
        self.records: list[tuple[int, int, int]] = []  # (position, global offset, messages)
        self.start = (0, 0)  # (segment index, local offset) of the group's first record
        self.end = 0  # position after the records read so far

    def __bool__(self) -> bool:
        return bool(self.records)

    def add(self, entry: AppendEntry, seg: int, off: int, offset: int, tail: int) -> None:
        expected = self.end if self.records else tail
        if entry.position != expected:
            raise _Inconsistent(
                f"group record at {offset} starts at {entry.position}, expected {expected}"
            )
        if not self.records:
            self.start = (seg, off)
        self.records.append((entry.position, offset, len(entry.messages)))
        self.end = entry.end

    def apply(self, last: AppendEntry, state: StreamState, index: LogIndex) -> None:
        """Fold the complete group (``last`` is its final record, already added) as one entry."""
        first = self.records[0][0]
        summary = GroupCommit(
            position=first,
            size=last.end - first,
            n_messages=sum(n for _, _, n in self.records),
            timestamp_ms=last.timestamp_ms,
            closes=last.closes,
            producer=last.producer,
            stream_seq=last.stream_seq,
            digest=last.digest,
            txn_handles=last.txn_handles,
        )
        try:
            apply_entry(state, summary)
        except ValueError as exc:
            raise _Inconsistent(f"record group at {self.records[0][1]}: {exc}") from None
        for position, offset, n_messages in self.records:
            index.note(position, offset, n_messages, last.timestamp_ms)
        self.records = []

    def torn(self, reason: str, cut: _Bad | None) -> _TornGroup:
        return _TornGroup(self.start[0], self.start[1], reason, cut)


class _Segments:
    """Read-only access to a log's segment files, with one chunk of read-ahead."""

    def __init__(self, directory: str, bases: list[int], sizes: list[int]) -> None:
        self.directory = directory
        self.bases = bases
        self.sizes = sizes
        self._fds: dict[int, int] = {}
        self._buf = b""
        self._buf_seg = -1
        self._buf_off = 0

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def path(self, i: int) -> str:
        return os.path.join(self.directory, segment_name(self.bases[i]))

    def fd(self, i: int) -> int:
        fd = self._fds.get(i)
        if fd is None:
            fd = os.open(self.path(i), os.O_RDONLY | _O_CLOEXEC)
            self._fds[i] = fd
        return fd

    def read(self, i: int, off: int, n: int) -> memoryview | bytes:
        """Up to ``n`` bytes at ``off`` of segment ``i`` (fewer only at the end of the file)."""
        n = max(0, min(n, self.sizes[i] - off))
        if (
            self._buf_seg == i
            and self._buf_off <= off
            and off + n <= self._buf_off + len(self._buf)
        ):
            start = off - self._buf_off
            return memoryview(self._buf)[start : start + n]
        if n > _CHUNK:
            return os.pread(self.fd(i), n, off)
        self._buf = os.pread(self.fd(i), min(_CHUNK, self.sizes[i] - off), off)
        self._buf_seg, self._buf_off = i, off
        return memoryview(self._buf)[:n]

    def record(self, i: int, off: int) -> tuple[codec.FrameInfo, memoryview | bytes]:
        """The checked record at (``i``, ``off``): its frame and body. Raises ``_Bad``."""
        try:
            frame = codec.parse_frame(self.read(i, off, FRAME_SIZE))
        except codec.CorruptRecord as exc:
            raise _Bad(i, off, str(exc)) from None
        if off + FRAME_SIZE + frame.body_len > self.sizes[i]:
            raise _Bad(i, off, "record runs past the end of the segment")
        body = self.read(i, off + FRAME_SIZE, frame.body_len)
        if not codec.body_crc_ok(frame, body):
            raise _Bad(i, off, "checksum mismatch")
        return frame, body

    def valid_record_after(self, i: int, off: int) -> tuple[int, int] | None:
        """The first checksum-valid record strictly after (``i``, ``off``), searching by magic bytes."""
        for j in range(i, len(self.bases)):
            pos = off + 1 if j == i else 0
            size = self.sizes[j]
            while pos < size:
                chunk = bytes(self.read(j, pos, _CHUNK))
                hit = chunk.find(MAGIC)
                while hit >= 0:
                    try:
                        self.record(j, pos + hit)
                        return j, pos + hit
                    except _Bad:
                        hit = chunk.find(MAGIC, hit + 1)
                if len(chunk) < len(MAGIC):
                    break
                pos += len(chunk) - (len(MAGIC) - 1)  # overlap: a magic split across chunks
        return None


def recover_stream(directory: str, log_id: str, index_interval: int, *, sync: bool) -> Recovered:
    """Recover one stream directory or raise ``Quarantine``."""
    path: str | None = None
    try:
        bases, sizes, has_staging = _list_segments(directory, log_id)
        segs = _Segments(directory, bases, sizes)
        try:
            header, header_end = _read_header(segs)
            path = header.path
            _check_contiguous(bases, sizes, path)
            recovered = _recover(segs, log_id, header, header_end, index_interval, sync, path)
        finally:
            segs.close()
    except NotADirectoryError:
        raise Quarantine(None, "not a stream directory") from None
    except OSError as exc:
        raise Quarantine(path, f"unreadable: {exc}") from exc
    recovered.has_staging = has_staging
    return recovered


class _InMemory(_Segments):
    """A packed stream's virtual segment 0 (decision 0010 step 2), read from its extents into memory
    (at most the packed threshold): the same fold as a directory's segments, no file."""

    def __init__(self, data: bytes) -> None:
        super().__init__("", [0], [len(data)])
        self._buf = data
        self._buf_seg = 0
        self._buf_off = 0

    def read(self, i: int, off: int, n: int) -> memoryview | bytes:
        n = max(0, min(n, self.sizes[i] - off))
        return memoryview(self._buf)[off : off + n]


def recover_packed(log_id: str, data: bytes, index_interval: int) -> Recovered:
    """Fold a packed stream's virtual segment 0 (header record, then its records: ``packs.
    read_virtual``), as ``recover_stream`` folds a directory's segments: the same state, producer
    dedup state and index. No snapshot and no repair: every record of it was whole and checksummed
    when its WAL entry was read, so a record that does not check out now is damage and the stream is
    quarantined (``Quarantine``), never cut (hazard 32)."""
    segs = _InMemory(data)
    header, header_end = _read_header(segs)
    state, index, progress = _fresh_fold(header, header_end, index_interval)
    try:
        end = _replay(segs, header_end, state, index, progress)
    except (_Bad, _Inconsistent) as exc:
        raise Quarantine(header.path, f"packed records do not fold: {exc}") from None
    return Recovered(log_id, "", header, state, [0], index, end, progress.last_record, 0, 0)


def _fresh_fold(
    header: StreamHeader, header_end: int, index_interval: int
) -> tuple[StreamState, LogIndex, _Progress]:
    """The state, index and progress a fold from the header on starts with (no snapshot)."""
    state = StreamState(tail=header.fork_position, last_timestamp_ms=header.append_time_floor_ms)
    index = LogIndex(SparseIndex(index_interval, last_time=header.append_time_floor_ms))
    index.sparse.note(header.fork_position, header_end, 0)
    return state, index, _Progress(0)


def recover_batch(
    streams: str, log_ids: list[str], index_interval: int, *, sync: bool
) -> list[Recovered | Quarantine]:
    """Recover several stream directories under ``streams`` in one call, in order.

    Start-up hands the I/O pool batches of a few hundred streams rather than one task per stream: with
    100,000 streams, a future per stream cost more event-loop time (and GIL hand-overs between the loop
    and the workers) than the recovery itself. A failure of one stream never stops the others.
    """
    results: list[Recovered | Quarantine] = []
    for log_id in log_ids:
        try:
            results.append(
                recover_stream(os.path.join(streams, log_id), log_id, index_interval, sync=sync)
            )
        except Quarantine as q:
            results.append(q)
        except Exception as exc:  # a bug must not silently drop a stream (hazard 32)
            log.exception("stream %s: recovery failed", log_id)
            results.append(Quarantine(None, f"recovery failed: {exc!r}"))
    return results


def read_headers(streams: str, log_ids: list[str]) -> list[StreamHeader | None]:
    """The header of each stream directory under ``streams`` (None where it cannot be read: its
    recovery will say why). For directories the catalog does not name (``catalog.py``)."""
    headers: list[StreamHeader | None] = []
    for log_id in log_ids:
        directory = os.path.join(streams, log_id)
        try:
            segs = _Segments(
                directory, [0], [os.stat(os.path.join(directory, segment_name(0))).st_size]
            )
            try:
                headers.append(_read_header(segs)[0])
            finally:
                segs.close()
        except (OSError, Quarantine):
            headers.append(None)
    return headers


def segment_listing(directory: str) -> tuple[list[int], list[str]]:
    """The segment bases in a stream directory (sorted), and the names of the other entries that are
    neither the snapshot nor ``txn/``. Reads only (``datacheck.py`` uses it too)."""
    bases = []
    others = []
    for name in os.listdir(directory):
        match = SEGMENT_RE.match(name)
        if match:
            bases.append(int(match.group(1)))
        elif name not in (SNAPSHOT_NAME, TXN_DIR):  # txn/: staging files (txnfile.py)
            others.append(name)
    bases.sort()
    return bases, others


def _list_segments(directory: str, log_id: str) -> tuple[list[int], list[int], bool]:
    """Segment bases and sizes, in order, and whether a ``txn/`` directory exists."""
    bases, others = segment_listing(directory)
    has_staging = os.path.isdir(os.path.join(directory, TXN_DIR))
    for name in others:
        if name == SNAPSHOT_TMP:
            os.unlink(os.path.join(directory, name))  # an interrupted snapshot write
        else:
            log.warning("stream %s: ignoring unexpected file %r", log_id, name)
    if not bases or bases[0] != 0:
        raise Quarantine(None, "first segment is missing")
    sizes = [os.stat(os.path.join(directory, segment_name(b))).st_size for b in bases]
    return bases, sizes, has_staging


def _check_contiguous(bases: list[int], sizes: list[int], path: str) -> None:
    for i in range(len(bases) - 1):
        if bases[i] + sizes[i] != bases[i + 1]:
            raise Quarantine(
                path,
                f"segment {segment_name(bases[i + 1])} does not follow {segment_name(bases[i])} "
                f"({sizes[i]} bytes): a segment is missing or was resized",
            )


def _read_header(segs: _Segments) -> tuple[StreamHeader, int]:
    try:
        frame, body = segs.record(0, 0)
    except _Bad as bad:
        raise Quarantine(None, f"stream header record is damaged: {bad.reason}") from None
    if frame.kind != Kind.HEADER:
        raise Quarantine(None, f"first record is kind {frame.kind}, not a stream header")
    try:
        header = codec.decode_header(body)
    except codec.CorruptRecord as exc:
        raise Quarantine(None, str(exc)) from None
    return header, frame.record_len


def _recover(
    segs: _Segments,
    log_id: str,
    header: StreamHeader,
    header_end: int,
    index_interval: int,
    sync: bool,
    path: str,
) -> Recovered:
    total_end = segs.bases[-1] + segs.sizes[-1]
    snap = load_snapshot(segs.directory, log_id)
    if snap is not None:
        if _snapshot_fits(snap, segs, header, header_end, total_end):
            snap_entries = snap.state.entries
            state, index = snap.state, LogIndex(snap.index)
            index.sparse.interval = max(1, index_interval)
            progress = _Progress(snap.last_record)
            try:
                end = _replay(segs, snap.covered_end, state, index, progress)
                return Recovered(
                    log_id,
                    segs.directory,
                    header,
                    state,
                    segs.bases,
                    index,
                    end,
                    progress.last_record,
                    snap_entries,
                    snap.covered_end,
                )
            except (_Bad, _Inconsistent) as exc:
                reason = f"replay after it failed ({exc})"
        else:
            reason = "it does not match the segment files"
        log.warning(
            "stream %s (%s): discarding snapshot: %s; replaying the whole log", log_id, path, reason
        )
        _drop_snapshot(segs.directory, sync)  # stale: must never be trusted again
    state, index, progress = _fresh_fold(header, header_end, index_interval)
    try:
        end = _replay(segs, header_end, state, index, progress)
    except _Inconsistent as exc:
        raise Quarantine(path, str(exc)) from None
    except _Bad as bad:
        # Everything before the bad record is already folded in (the fold stops before it).
        end = _repair_tail(segs, bad, log_id, path, sync)
    return Recovered(
        log_id, segs.directory, header, state, segs.bases, index, end, progress.last_record, 0, 0
    )


def _snapshot_fits(
    snap: Snapshot, segs: _Segments, header: StreamHeader, header_end: int, total_end: int
) -> bool:
    """Bounds, the index's first point, and the anchor: the record the snapshot says ends at its
    ``covered_end`` must be a valid record ending exactly there (so a snapshot left over from data
    that was since truncated and rewritten cannot line up by accident)."""
    index = snap.index
    if not (
        header_end <= snap.covered_end <= total_end
        and snap.state.tail >= header.fork_position
        and len(index) > 0
        and index.positions[0] == header.fork_position
        and index.offsets[0] == header_end
        and index.offsets[-1] <= snap.covered_end
        and 0 <= snap.last_record < snap.covered_end
    ):
        return False
    try:
        i, off = _locate(segs, snap.last_record)
        frame, _ = segs.record(i, off)
    except (_Bad, _Inconsistent):
        return False
    return snap.last_record + frame.record_len == snap.covered_end


def _drop_snapshot(directory: str, sync: bool) -> None:
    try:
        os.unlink(os.path.join(directory, SNAPSHOT_NAME))
    except FileNotFoundError:
        return
    if sync:
        fsync_dir(directory)


def _locate(segs: _Segments, offset: int) -> tuple[int, int]:
    for i in range(len(segs.bases) - 1, -1, -1):
        if segs.bases[i] <= offset:
            return i, offset - segs.bases[i]
    raise _Inconsistent(f"offset {offset} before the first segment")


class _Progress:
    """How far a replay got: the last good record (survives the exception that stops it)."""

    __slots__ = ("last_record",)

    def __init__(self, last_record: int) -> None:
        self.last_record = last_record


def _replay(
    segs: _Segments, start: int, state: StreamState, index: LogIndex, progress: _Progress
) -> int:
    """Fold every record from global ``start`` into ``state`` and ``index``; returns the end offset."""
    first, off = _locate(segs, start)
    group = _GroupBuffer()
    for i in range(first, len(segs.bases)):
        base, size = segs.bases[i], segs.sizes[i]
        if i != first:
            off = 0
        while off < size:
            try:
                frame, body = segs.record(i, off)
            except _Bad as bad:
                if group:
                    raise group.torn(f"record group cut short by {bad.reason}", bad) from None
                raise
            kind = frame.kind
            if kind == Kind.APPEND:
                try:
                    entry = codec.decode_append(body, 0, frame.body_len, copy=False)
                except codec.CorruptRecord as exc:
                    raise _Inconsistent(f"append record at {base + off}: {exc}") from None
                if entry.continues or group:
                    group.add(entry, i, off, base + off, state.tail)
                    if entry.continues:
                        off += frame.record_len
                        continue  # folded (and counted as progress) with the group's last record
                    group.apply(entry, state, index)
                else:
                    try:
                        apply_entry(state, entry)
                    except ValueError as exc:
                        raise _Inconsistent(f"append record at {base + off}: {exc}") from None
                    index.note(entry.position, base + off, len(entry.messages), entry.timestamp_ms)
            elif group:
                raise _Inconsistent(f"record kind {kind} inside a record group at {base + off}")
            elif kind == Kind.SOFT_DELETE:
                try:
                    codec.decode_soft_delete(body)
                except codec.CorruptRecord as exc:
                    raise _Inconsistent(f"record at {base + off}: {exc}") from None
                state.soft_deleted = True
            else:
                raise _Inconsistent(f"unexpected record kind {kind} at file offset {base + off}")
            progress.last_record = base + off
            off += frame.record_len
    if group:
        raise group.torn("incomplete record group (crash during a commit)", None)
    return segs.bases[-1] + segs.sizes[-1]


def _valid_data_after(segs: _Segments, bad: _Bad) -> tuple[int, int] | None:
    """The first valid record after ``bad`` (mid-file corruption), or None (a torn tail)."""
    if isinstance(bad, _TornGroup):
        cut = bad.cut
        return segs.valid_record_after(cut.seg, cut.off) if cut is not None else None
    return segs.valid_record_after(bad.seg, bad.off)


def _repair_tail(segs: _Segments, bad: _Bad, log_id: str, stream_path: str, sync: bool) -> int:
    """Truncate a torn tail at ``bad``, or quarantine if valid data follows it."""
    after = _valid_data_after(segs, bad)
    where = f"{segment_name(segs.bases[bad.seg])} offset {bad.off}"
    if after is not None:
        j, off = after
        raise Quarantine(
            stream_path,
            f"mid-file corruption: {bad.reason} at {where}, followed by valid data at "
            f"{segment_name(segs.bases[j])} offset {off}",
        )
    dropped = segs.sizes[bad.seg] - bad.off + sum(segs.sizes[bad.seg + 1 :])
    log.warning(
        "stream %s (%s): torn tail (%s) at %s; truncating %d bytes",
        log_id,
        stream_path,
        bad.reason,
        where,
        dropped,
    )
    segs.close()
    # Later segments first, so that a crash in the middle leaves a prefix of the log, with the torn
    # part still at its end, for the next start-up to repair the same way.
    later = range(len(segs.bases) - 1, bad.seg, -1)
    for j in later:
        os.unlink(segs.path(j))
    if sync and later:
        fsync_dir(segs.directory)
    path = segs.path(bad.seg)
    if bad.off == 0 and os.stat(path).st_nlink > 1:
        # A staging file that a commit by reference linked into the log (group.py), whose group is
        # incomplete: its staging name keeps the data, staged again. Unlink the log's name and start
        # an empty segment in its place; the file's content is never changed.
        os.unlink(path)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644))
    else:
        fd = os.open(path, os.O_RDWR | _O_CLOEXEC)
        try:
            os.ftruncate(fd, bad.off)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    del segs.bases[bad.seg + 1 :]
    del segs.sizes[bad.seg + 1 :]
    segs.sizes[bad.seg] = bad.off
    segs._buf, segs._buf_seg = b"", -1
    if sync:
        fsync_dir(segs.directory)
    return segs.bases[-1] + segs.sizes[-1]
