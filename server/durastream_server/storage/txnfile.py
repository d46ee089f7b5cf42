"""Staging files of staged (transactional) appends, and the per-stream tombstone list.

Everything here is blocking file I/O; the engine runs it in the data directory's I/O executor.

Layout, inside the stream incarnation's directory (so deleting the stream removes it, and a fork, which
is another incarnation, never sees it)::

  txn/<sha256(handle)[:32]>.stg   one file per open handle: a header record (an APPEND record without
                                  messages, continuing a group, whose digest field holds HEADER_TAG and
                                  the JSON of handle name, creation time and TTL; files of earlier
                                  versions have a TXN_HEADER record instead), then one APPEND record
                                  per accepted stage request
                                  (position = payload bytes staged before it; the stage's producer tuple
                                  and digest, so the handle's dedupe state is rebuilt by the same fold
                                  as a stream's). Durable (fdatasync) before a stage is acknowledged.
  txn/tombstones                  names of aborted, expired or corrupt handles, one checksummed JSON
                                  line each, so such a name is never committable; compacted at start-up.

A staging file is created whole (tmp file, fsync, rename), so it either exists with its header and first
record or not at all. A torn record at its end (a crash during a later stage) is truncated at start-up; a
bad record followed by valid data marks the handle corrupt (it is never committed).

A commit by reference rewrites a staging file's records in place for their log positions and then
hard-links it into the log as a segment; the staging name is unlinked only once the commit is durable
(``group.py``). So a staging file may have some or all of its records rewritten (``staged_position``
reads both forms), and, until that unlink, may be a segment of the log too (``st_nlink > 1``): such a
file is only ever read here, never truncated.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from durastream_server.storage import codec
from durastream_server.storage.codec import FRAME_SIZE, MAGIC, CorruptRecord, Kind
from durastream_server.storage.files import fsync_dir, pwrite_all, replace_file, write_file
from durastream_server.storage.records import StagedSource
from durastream_server.storage.state import StreamState, apply_entry

log = logging.getLogger(__name__)

TXN_DIR = "txn"
STAGING_SUFFIX = ".stg"
TMP_SUFFIX = ".tmp"
TOMBSTONES = "tombstones"
_READ_BLOCK = 1024 * 1024
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def staging_file_name(handle: str) -> str:
    """Hashed, so any valid handle name maps to a safe, fixed-length file name."""
    return hashlib.sha256(handle.encode()).hexdigest()[:32] + STAGING_SUFFIX


@dataclass(frozen=True, slots=True)
class HandleHeader:
    """The first record of a staging file: who the handle is and when it expires."""

    handle: str
    created_ms: int
    ttl_seconds: int

    @property
    def expires_at_ms(self) -> int:
        return self.created_ms + 1000 * self.ttl_seconds


# The handle header is an APPEND record without messages whose digest field holds this tag and the
# header's JSON, flagged as continuing a record group: so a whole staging file is a valid run of log
# records, which a commit can move into the stream's log as segments without copying its payload
# (docs/decisions/0003-staged-appends.md). Files of earlier versions start with a TXN_HEADER record
# instead; they are still read, and committed by copying.
HEADER_TAG = b"durastream-txn-header:"


def encode_handle_header(header: HandleHeader) -> bytearray:
    body = json.dumps(
        {"handle": header.handle, "created_ms": header.created_ms, "ttl": header.ttl_seconds},
        separators=(",", ":"),
    ).encode()
    return codec.encode_append(
        codec.AppendEntry(
            position=0,
            messages=(),
            timestamp_ms=header.created_ms,
            digest=HEADER_TAG + body,
            continues=True,
        )
    )


def decode_handle_header(body: bytes | memoryview) -> HandleHeader:
    """The header of a legacy TXN_HEADER record (its body is the JSON)."""
    try:
        data = json.loads(bytes(body))
        return HandleHeader(str(data["handle"]), int(data["created_ms"]), int(data["ttl"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRecord(f"bad staging file header: {exc}") from None


def decode_header_record(
    frame: codec.FrameInfo, body: memoryview
) -> tuple[HandleHeader, int, bool]:
    """The first record of a staging file: ``(header, base position, movable)``.

    ``base`` is the position the header record carries: 0, unless a commit that moved the file into
    the log had already rewritten its positions (``staged_position`` reads the records back).
    ``movable`` is False for a legacy TXN_HEADER file, which a commit copies.
    """
    if frame.kind == Kind.TXN_HEADER:
        return decode_handle_header(body), 0, False
    if frame.kind != Kind.APPEND:
        raise CorruptRecord(f"first record is kind {frame.kind}")
    meta = codec.decode_append_meta(body, 0, frame.body_len)
    if meta.lengths or not meta.digest.startswith(HEADER_TAG):
        raise CorruptRecord("first record is not a staging file header")
    return decode_handle_header(meta.digest[len(HEADER_TAG) :]), meta.position, True


def staged_position(position: int, flags: int, expected: int) -> int:
    """The staged position (payload bytes of the handle before it) of a staging file's record that
    stores ``position`` with ``flags``; ``expected`` is the staged position it should have.

    A staged record is written without FLAG_GROUP_CONTINUES. A commit by reference rewrites it in
    place with that flag and the log position ``P + staged position`` (``P``: where the group put the
    file), so a rewritten record is at its staged position whatever ``P`` was. A crash in the middle
    of a rewrite (the pages of which a power loss may keep in any order), commits at different
    positions that each failed part-way, or a stage after a failed commit leave a file with records of
    either form. A record without the flag must store exactly ``expected``.
    """
    if flags & codec.FLAG_GROUP_CONTINUES and position >= expected:
        return expected
    return position


def record_flags(body: bytes | memoryview) -> int:
    """The flags of an APPEND record's body."""
    return codec.APPEND_FIXED.unpack_from(body, 0)[4]


# --------------------------------------------------------------------------------------- writing


def create_staging_file(path: str, frames: list[bytes | bytearray], *, sync: bool) -> int:
    """Create ``path`` holding ``frames`` (header + first record) atomically; returns its size."""
    tmp = path + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
    try:
        size = pwrite_all(fd, frames, 0)
        if sync:
            os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
        if sync:
            fsync_dir(os.path.dirname(path))
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return size


def append_staging_record(path: str, frame: bytes | bytearray, offset: int, *, sync: bool) -> int:
    """Write ``frame`` at ``offset`` (the file's durable end) and fdatasync; returns the new end.

    On failure the file is cut back to ``offset`` (best effort) and the error propagates.
    """
    fd = os.open(path, os.O_WRONLY | _O_CLOEXEC)
    try:
        check_not_linked(fd, path)
        try:
            pwrite_all(fd, [frame], offset)
            if sync:
                os.fdatasync(fd)
        except OSError:
            try:
                os.ftruncate(fd, offset)
            except OSError as exc:
                log.warning("could not cut staging file %s back to %d: %s", path, offset, exc)
            raise
    finally:
        os.close(fd)
    return offset + len(frame)


def check_not_linked(fd: int, path: str) -> None:
    """A staging file is never written while it is also a segment of the log: after a failed commit
    whose cleanup could not unlink the log's name (``group._move_back``), the restart's recovery
    does that first."""
    if os.fstat(fd).st_nlink > 1:
        raise OSError(
            errno.EBUSY,
            "staging file is still linked into the stream's log; restart to recover",
            path,
        )


def make_txn_dir(stream_dir: str, *, sync: bool) -> str:
    directory = os.path.join(stream_dir, TXN_DIR)
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        if sync:
            fsync_dir(stream_dir)
    return directory


def remove_files(paths: list[str]) -> None:
    """Unlink staging files (reclamation). Missing files are fine: the work was done before."""
    for path in paths:
        _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


# --------------------------------------------------------------------------------------- reading


class _SequentialReader:
    """Reads a file front to back in blocks; returned views stay valid (blocks are never reused)."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self.size = size
        self._buf = b""
        self._buf_off = 0

    def get(self, offset: int, length: int) -> memoryview:
        """Exactly ``length`` bytes at ``offset``, or CorruptRecord if the file ends first."""
        if offset + length > self.size:
            raise CorruptRecord(f"record at {offset} runs past the end of the file")
        rel = offset - self._buf_off
        if rel < 0 or rel + length > len(self._buf):
            want = min(max(length, _READ_BLOCK), self.size - offset)
            data = os.pread(self._fd, want, offset)
            if len(data) < length:
                raise CorruptRecord(f"short read at {offset}")
            self._buf, self._buf_off, rel = data, offset, 0
        return memoryview(self._buf)[rel : rel + length]

    def record(self, offset: int) -> tuple[codec.FrameInfo, memoryview]:
        """The checksum-verified record at ``offset``: its frame and body."""
        rel = offset - self._buf_off
        if rel >= 0 and rel + FRAME_SIZE <= len(self._buf):
            frame = codec.parse_frame(self._buf, rel)
        else:
            # Read just the header, then the whole record in one go (a large record is never read
            # twice: once as the tail of a block, then again whole).
            if offset + FRAME_SIZE > self.size:
                raise CorruptRecord(f"partial frame header at {offset}")
            frame = codec.parse_frame(os.pread(self._fd, FRAME_SIZE, offset))
            self._buf_off = self.size  # forces the next get() to read from ``offset``
            self._buf = b""
            self.get(offset, min(frame.record_len, self.size - offset))
        body = self.get(offset + FRAME_SIZE, frame.body_len)
        if not codec.body_crc_ok(frame, body):
            raise CorruptRecord(f"checksum mismatch in record at {offset}")
        return frame, body

    def valid_record_after(self, offset: int) -> int | None:
        """Offset of the first checksum-valid record strictly after ``offset`` (magic search)."""
        pos = offset + 1
        while pos < self.size:
            chunk = os.pread(self._fd, min(_READ_BLOCK, self.size - pos), pos)
            hit = chunk.find(MAGIC)
            while hit >= 0:
                try:
                    self.record(pos + hit)
                    return pos + hit
                except CorruptRecord:
                    hit = chunk.find(MAGIC, hit + 1)
            if len(chunk) < len(MAGIC):
                return None
            pos += len(chunk) - (len(MAGIC) - 1)
        return None


def read_record_head(fd: int, offset: int, end: int) -> tuple[codec.FrameInfo, bytes]:
    """The frame of the APPEND record at ``offset`` and its body up to the payload (fixed part and
    meta, lengths included), checked for shape but not checksummed: the payload is not read.

    For the commit by reference, which rewrites only the fixed part and derives the new checksum from
    the stored one (``crc.replace_prefix``), so a damaged payload still fails its checksum when read.
    """
    head = os.pread(fd, FRAME_SIZE + codec.APPEND_FIXED_SIZE, offset)
    if len(head) < FRAME_SIZE + codec.APPEND_FIXED_SIZE:
        raise CorruptRecord(f"record at {offset} is cut short")
    frame = codec.parse_frame(head)
    if frame.kind != Kind.APPEND:
        raise CorruptRecord(f"unexpected record kind {frame.kind} at {offset}")
    if offset + frame.record_len > end or frame.body_len < codec.APPEND_FIXED_SIZE:
        raise CorruptRecord(f"record at {offset} runs past the end of the file")
    meta_len = codec.APPEND_FIXED.unpack_from(head, FRAME_SIZE)[3]
    if codec.APPEND_FIXED_SIZE + meta_len > frame.body_len:
        raise CorruptRecord(f"append meta past end of record at {offset}")
    meta = os.pread(fd, meta_len, offset + len(head)) if meta_len else b""
    if len(meta) != meta_len:
        raise CorruptRecord(f"record at {offset} is cut short")
    return frame, head[FRAME_SIZE:] + meta


class StagedRecord(NamedTuple):
    """One staged APPEND record, as the commit moves it: its messages stay laid out as stored."""

    position: int  # staged position of its first message (bytes staged before it in the handle)
    n_messages: int
    lengths: memoryview  # the packed n_messages x u32 lengths section
    payload: memoryview  # the concatenated messages
    size: int  # payload bytes


def read_staged_records(source: StagedSource) -> Iterator[StagedRecord]:
    """Each staged record of ``source`` in order, checksums verified, without splitting its messages.

    Used by the commit copy: memory is one read block (or one record, if larger) at a time, plus
    whatever views the caller keeps.
    """
    fd = os.open(source.path, os.O_RDONLY | _O_CLOEXEC)
    try:
        reader = _SequentialReader(fd, source.end)
        offset = source.start
        staged_at = 0
        while offset < source.end:
            frame, body = reader.record(offset)
            if frame.kind != Kind.APPEND:
                raise CorruptRecord(f"unexpected record kind {frame.kind} in {source.path}")
            meta = codec.decode_append_meta(body, 0, frame.body_len)
            n = len(meta.lengths)
            p = meta.payload_off
            # positions may have been rewritten by an interrupted move (group.py)
            position = staged_position(meta.position, record_flags(body), staged_at)
            size = frame.body_len - p
            yield StagedRecord(position, n, body[p - 4 * n : p], body[p:], size)
            staged_at = position + size
            offset += frame.record_len
    finally:
        os.close(fd)


@dataclass(slots=True)
class RecoveredHandle:
    """A staging file as found at start-up."""

    path: str
    header: HandleHeader
    data_start: int  # end of the header record: where staged records begin
    end: int  # end of the last valid record (the file is truncated there)
    state: StreamState  # the handle's fold: tail = staged bytes, producers = stage dedupe state
    n_messages: int = 0
    corrupt: str | None = None  # why the handle cannot be trusted (it is never committed)
    movable: bool = True  # a commit may move the file into the log (False: legacy layout, copied)
    torn_at: int | None = None  # read-only check (``repair=False``): a torn tail left in place here


def recover_staging_file(path: str, *, sync: bool, repair: bool = True) -> RecoveredHandle | None:
    """Rebuild a handle from its file. None if the file has no valid header (the caller deletes it:
    such a file was never acknowledged, since creation is atomic). ``repair=False`` (the offline
    ``check``): open it read-only and report a torn tail in ``torn_at`` instead of truncating it."""
    fd = os.open(path, (os.O_RDWR if repair else os.O_RDONLY) | _O_CLOEXEC)
    try:
        stat = os.fstat(fd)
        size = stat.st_size
        # Also a segment of the log: a commit by reference that became durable before the staging
        # name was unlinked (the caller removes the file). Read it, never change it.
        shared = stat.st_nlink > 1
        reader = _SequentialReader(fd, size)
        try:
            frame, body = reader.record(0)
            header, _, movable = decode_header_record(frame, body)
        except CorruptRecord as exc:
            log.warning("staging file %s has no valid header (%s)", path, exc)
            return None
        data_start = frame.record_len
        handle = RecoveredHandle(
            path, header, data_start, data_start, StreamState(tail=0), movable=movable
        )
        offset = data_start
        while offset < size:
            try:
                frame, body = reader.record(offset)
                if frame.kind != Kind.APPEND:
                    raise CorruptRecord(f"unexpected record kind {frame.kind}")
                entry = codec.decode_append(body, 0, frame.body_len, copy=False)
                # Positions rewritten by an interrupted commit: make them staged again.
                position = staged_position(entry.position, record_flags(body), handle.state.tail)
                if position != entry.position:
                    entry = dataclasses.replace(entry, position=position)
                apply_entry(handle.state, entry)
            except (CorruptRecord, ValueError) as exc:
                if shared or reader.valid_record_after(offset) is not None:
                    what = "in a file shared with the log" if shared else "followed by valid data"
                    handle.corrupt = f"bad record at {offset} {what} ({exc})"
                    log.error(
                        "staging file %s (handle %r): %s", path, header.handle, handle.corrupt
                    )
                    return handle
                if not repair:
                    handle.torn_at = offset
                    break
                log.warning(
                    "staging file %s: torn tail at %d (%s); truncating %d bytes",
                    path,
                    offset,
                    exc,
                    size - offset,
                )
                os.ftruncate(fd, offset)
                if sync:
                    os.fsync(fd)
                break
            handle.n_messages += len(entry.messages)
            offset += frame.record_len
            handle.end = offset
        return handle
    finally:
        os.close(fd)


def list_staging_files(txn_dir: str) -> list[str]:
    """Staging file paths in ``txn_dir``; removes interrupted creations (``*.tmp``)."""
    try:
        names = os.listdir(txn_dir)
    except FileNotFoundError:
        return []
    paths = []
    for name in sorted(names):
        path = os.path.join(txn_dir, name)
        if name.endswith(TMP_SUFFIX):
            _unlink_quietly(path)
        elif name.endswith(STAGING_SUFFIX):
            paths.append(path)
    return paths


# ------------------------------------------------------------------------------------ tombstones


class Tombstone(NamedTuple):
    """Why a handle name is dead, and when the name may be forgotten."""

    status: str  # "aborted", "expired" or "corrupt"
    forget_at_ms: int


def _tombstone_line(name: str, tombstone: Tombstone) -> bytes:
    text = json.dumps(
        {"h": name, "s": tombstone.status, "f": tombstone.forget_at_ms}, separators=(",", ":")
    ).encode()
    return b"%08x %s\n" % (zlib.crc32(text), text)


def load_tombstones(txn_dir: str, now_ms: int) -> tuple[dict[str, Tombstone], int]:
    """Live tombstones, and how many lines were dropped (forgotten, torn or damaged)."""
    path = os.path.join(txn_dir, TOMBSTONES)
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return {}, 0
    live: dict[str, Tombstone] = {}
    dropped = 0
    for line in lines:
        if not line:
            continue
        crc_hex, _, text = line.partition(b" ")
        try:
            if int(crc_hex, 16) != zlib.crc32(text):
                raise ValueError("checksum mismatch")
            data = json.loads(text)
            tombstone = Tombstone(str(data["s"]), int(data["f"]))
            name = str(data["h"])
        except (ValueError, KeyError, TypeError):
            dropped += 1  # a torn last line (crash mid-append); nothing acknowledged depends on it
            continue
        if tombstone.forget_at_ms <= now_ms:
            dropped += 1
            live.pop(name, None)
            continue
        live[name] = tombstone
    return live, dropped


def append_tombstones(txn_dir: str, entries: list[tuple[str, Tombstone]], *, sync: bool) -> None:
    path = os.path.join(txn_dir, TOMBSTONES)
    data = b"".join(_tombstone_line(name, tombstone) for name, tombstone in entries)
    write_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, data, sync=sync)


def rewrite_tombstones(txn_dir: str, live: dict[str, Tombstone], *, sync: bool) -> None:
    """Replace the tombstone file with exactly ``live`` (tmp, fsync, rename): compaction."""
    data = b"".join(_tombstone_line(name, tombstone) for name, tombstone in live.items())
    replace_file(Path(txn_dir, TOMBSTONES), [data], sync=sync)
