"""The shared write-ahead log: one ``fdatasync`` makes a commit round of many streams durable.

Without it every stream's writer synced its own segment file, so 64 producers on 64 streams paid 64
``fdatasync`` calls (each a journal commit on ext4) where 64 producers on one stream paid one. A commit
round (``committer.py``) writes each stream's records into its segment file as before, but without syncing
it, and appends a copy of the same bytes to the current WAL file, which is synced once for the round. An
append is acknowledged after that sync: its records (data and producer state in one record, as always)
are then durable in the WAL, and in the segment's page cache.

Segment files are synced later, by a checkpoint (``committer.py``): the WAL moves on to a new file (a new
*generation*), every segment file written during the old generation is ``fdatasync``-ed through the very
fd it was written with (hazard 30), and only then is the old WAL file removed. So at any moment every
acknowledged byte not yet synced in its segment is in a WAL file that still exists.

Start-up (``replay``), before any stream is recovered: every WAL file left behind is read in generation
order and each entry's bytes are put back at their place in their segment file, where they differ (after
a power loss the segment may have lost them; after a process crash they are all there and nothing is
written). The segments written are synced, then the WAL files are removed (after their live packed
creates are copied into ``packs/``: ``packs.py``). A WAL file ends at its first
entry that does not check out: a round's entries are written together and acknowledged only after the
sync, so a torn end is a round that was never acknowledged. Entries of streams no longer in ``streams/``
(deleted, or quarantined) are skipped.

Creates share the rounds too (``committer.py``): a *create* entry carries a new stream's first segment
(header record and initial data) and is synced before its directory is made, unsynced; so a directory in
``streams/`` whose content did not reach the disk always has its create entry in a WAL file, and the replay
writes the segment back, or makes the directory when even its name was lost. A *drop* entry (written by a
delete or a failed create of a stream whose create entry is still in a WAL file) says the directory must not
be made again: replay collects the drops of every WAL file first. A drop never removes anything: a
directory that is there (its delete was not acknowledged) is replayed as any other.

Entry (little-endian)::

    magic        2 bytes  b"\\xd5\\x77"
    version      u8       1
    kind         u8       0 records, 1 create, 2 drop, 3 packed, 4 unpromote, 5 packed records
    length       u32      body length
    crc          u32      crc32(body)
    body:
      generation u64      the WAL file's generation (a stale entry of a reused file cannot pass)
      segment    u64      base of the segment file (its global file offset)
      offset     u64      where in that segment file the records start
      id_len     u16
      log id     ascii    the stream incarnation's storage id (its directory name)
      records    whole log records (codec.py), exactly the bytes written to the segment

A *packed* entry (kind 3, decision 0010) is a create that makes no directory: its records are the new
stream's header record, and the entry alone is the stream (``packs.py``). The replay writes nothing for it;
``packs.settle`` copies the live ones of every WAL file into a pack before the file is removed. An
*unpromote* entry (kind 4) voids the CREATE and records entries of a packed stream written before it in
the WAL: its promotion failed after the round's sync, the write was answered as failed, and it stays
packed (``promotion.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from durastream_server.storage.crc import crc32
from durastream_server.storage.files import fsync_dir, pread_exact, pwrite_all
from durastream_server.storage.segments import segment_name

log = logging.getLogger(__name__)

MAGIC = b"\xd5\x77"
VERSION = 1
HEAD = struct.Struct("<2sBBII")
HEAD_SIZE = HEAD.size  # 12
FIXED = struct.Struct("<QQQH")
FIXED_SIZE = FIXED.size  # 26
WAL_DIR = "wal"
_WAL_RE = re.compile(r"\A(\d{20})\.wal\Z")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_WINDOW = 64 * 1024  # read-ahead of a segment file's content during a replay
_SYNC_THREADS = 8  # segment files synced at once at the end of a replay
# An entry larger than this cannot have been written (rounds carry small batches): a length beyond it
# is damage, and reading it would only allocate.
MAX_ENTRY_BYTES = 1 << 30


def wal_name(generation: int) -> str:
    return f"{generation:020d}.wal"


class Kind(IntEnum):
    """What an entry says (the byte after the version; 0 in every entry before creates had kinds)."""

    RECORDS = 0  # these records are at this place in this segment file
    CREATE = 1  # the same, and the stream directory is to be made if it is not there
    DROP = 2  # the stream's directory must not be made again (it was deleted, or its create failed)
    PACKED = 3  # a packed create: the stream exists with this header record, and has no directory
    # A promotion of this packed stream failed after its round's sync (its directory could not be
    # made or written): its CREATE and records entries before this one are void, and it stays packed.
    UNPROMOTE = 4
    # Records of a packed stream (decision 0010 step 2): ``offset`` is where they go in its virtual
    # segment 0 (header record at 0, then its records in order). They have no segment file: the replay
    # writes nothing for them, and ``packs.settle`` carries the live ones into a pack (``extents.py``).
    # A server without step 2 stops reading a WAL file at such an entry (a newer data directory).
    PACKED_RECORDS = 5


# Entries the replay writes into no segment file.
_NO_SEGMENT = frozenset((Kind.DROP, Kind.PACKED, Kind.UNPROMOTE, Kind.PACKED_RECORDS))


@dataclass(slots=True)  # not frozen: made per log per round (as ``writer.WriteTarget``)
class WalEntry:
    """Records bound for one segment file: where they go, and the bytes."""

    log_id: str
    segment: int
    offset: int
    records: Sequence[bytes | bytearray | memoryview]
    kind: Kind = Kind.RECORDS


def encode_entry(generation: int, entry: WalEntry) -> list[bytes | bytearray | memoryview]:
    """One WAL entry as buffers for ``pwritev`` (the records are checksummed, not copied)."""
    name = entry.log_id.encode("ascii")
    fixed = FIXED.pack(generation, entry.segment, entry.offset, len(name))
    crc = crc32(name, crc32(fixed))
    size = FIXED_SIZE + len(name)
    for record in entry.records:
        crc = crc32(record, crc)
        size += len(record)
    return [HEAD.pack(MAGIC, VERSION, entry.kind, size, crc), fixed, name, *entry.records]


class WalFile:
    """The WAL file of one generation, appended to by commit rounds (one at a time, in the committer's
    thread) and removed by the checkpoint that follows it."""

    def __init__(self, directory: Path, generation: int, fd: int) -> None:
        self.directory = directory
        self.generation = generation
        self.fd = fd
        self.end = 0  # bytes of whole, synced rounds

    @classmethod
    def create(cls, directory: Path, generation: int) -> WalFile:
        """A new, empty WAL file whose directory entry is durable before anything is written to it
        (an fdatasync of the file does not make its name durable)."""
        path = directory / wal_name(generation)
        # Read and write: a checkpoint reads packed records back from it (decision 0010 step 2).
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        try:
            fsync_dir(directory)
        except BaseException:
            os.close(fd)
            raise
        return cls(directory, generation, fd)

    @property
    def path(self) -> Path:
        return self.directory / wal_name(self.generation)

    def append(self, entries: list[WalEntry]) -> None:
        """Write ``entries`` after the last round and ``fdatasync``: when this returns, they are durable.
        On an OSError nothing of this round counts: ``undo`` cuts it off."""
        buffers: list[bytes | bytearray | memoryview] = []
        for entry in entries:
            buffers += encode_entry(self.generation, entry)
        written = pwrite_all(self.fd, buffers, self.end)
        os.fdatasync(self.fd)
        self.end += written

    def undo(self) -> None:
        """Cut off a failed round (raises OSError if even that fails)."""
        os.ftruncate(self.fd, self.end)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        """Close and delete (after a checkpoint: every byte in it is synced in its segment). Gone
        already is fine: a checkpoint redone after running out of space may have removed it."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        fsync_dir(self.directory)


# ------------------------------------------------------------------------------------------- replay


@dataclass(frozen=True, slots=True)
class ReplayReport:
    files: int  # WAL files found
    entries: int  # records entries that checked out
    repaired: (
        int  # records entries whose bytes the segment did not hold, and that were written back
    )
    skipped: int  # entries of streams that are gone (deleted or quarantined)
    next_generation: int
    creates: int = (
        0  # create entries that checked out (written back when needed: not in ``repaired``)
    )
    made: int = 0  # stream directories made again from their create entries
    packed: Any = None  # packs.Settled: the live packed streams and the packs kept


def generations(directory: Path) -> list[int]:
    """Generations of the WAL files in ``directory``, oldest first."""
    found = []
    for name in os.listdir(directory):
        match = _WAL_RE.match(name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def read_entries(path: Path, generation: int) -> list[tuple[str, int, int, bytes]]:
    """The records entries (and creates) of one WAL file up to its first damaged one, as ``(log id,
    segment base, offset, records)``."""
    return [
        found[:4]
        for found in read_kinds(path, generation)
        if found[4] in (Kind.RECORDS, Kind.CREATE)
    ]


def read_kinds(path: Path, generation: int) -> list[tuple[str, int, int, bytes, int]]:
    """The entries of one WAL file up to its first damaged one, as ``(log id, segment base, offset,
    records, kind)``."""
    return scan(path, generation).entries


@dataclass(frozen=True, slots=True)
class Scan:
    """What a WAL file (or a pack) holds: its whole entries, where the last one ends, and the byte
    ranges of damage skipped (``resync``)."""

    entries: list[tuple[str, int, int, bytes, int]]
    end: int
    damaged: list[tuple[int, int]]
    # Where each entry's records start in the file (a packed stream's extents point there).
    records_at: list[int] = field(default_factory=list)


def scan(path: Path, generation: int, *, resync: bool = False) -> Scan:
    """Read the entries of one WAL file. Without ``resync`` it ends at its first damaged entry (the
    torn end of a round that was never acknowledged). With ``resync`` (a pack: every round in it was
    whole and synced before it became a pack) a damaged entry is mid-file corruption: it is skipped,
    reported in ``damaged``, and the scan goes on at the next entry that checks out (hazard 32: one
    damaged entry never hides the entries after it)."""
    with open(path, "rb", buffering=0) as fh:
        data = fh.read()
    found: list[tuple[str, int, int, bytes, int]] = []
    records_at: list[int] = []
    damaged: list[tuple[int, int]] = []
    at = end = 0
    while at + HEAD_SIZE <= len(data):
        entry = _entry_at(data, at, generation)
        if entry is None:
            if not resync:
                break
            following = _next_entry(data, at + 1, generation)
            damaged.append((at, following))
            at = following
            continue
        found.append(entry[0])
        records_at.append(entry[1] - len(entry[0][3]))
        at = end = entry[1]
    if not resync and end < len(data):
        log.warning(
            "WAL %s: %d bytes after its last whole entry (a round that was never acknowledged)",
            path,
            len(data) - end,
        )
    if resync and at < len(data):
        damaged.append((at, len(data)))
    return Scan(found, end, damaged, records_at)


def _entry_at(
    data: bytes, at: int, generation: int
) -> tuple[tuple[str, int, int, bytes, int], int] | None:
    """The entry at ``at`` and where it ends, or None if it does not check out."""
    if at + HEAD_SIZE > len(data):
        return None
    magic, version, kind, length, crc = HEAD.unpack_from(data, at)
    body_at = at + HEAD_SIZE
    if (
        magic != MAGIC
        or version != VERSION
        or kind > Kind.PACKED_RECORDS
        or length < FIXED_SIZE
        or length > MAX_ENTRY_BYTES
        or body_at + length > len(data)
    ):
        return None
    body = memoryview(data)[body_at : body_at + length]
    if crc32(body) != crc:
        return None
    gen, segment, offset, id_len = FIXED.unpack_from(body, 0)
    if gen != generation or FIXED_SIZE + id_len > length:
        return None
    log_id = bytes(body[FIXED_SIZE : FIXED_SIZE + id_len]).decode("ascii", "replace")
    return (log_id, segment, offset, bytes(body[FIXED_SIZE + id_len :]), kind), body_at + length


def _next_entry(data: bytes, at: int, generation: int) -> int:
    """Where the next entry that checks out starts at or after ``at`` (the file's end if none)."""
    while True:
        at = data.find(MAGIC, at)
        if at < 0:
            return len(data)
        if _entry_at(data, at, generation) is not None:
            return at
        at += 1


def replay(root: Path, *, sync: bool, headers: bool = False) -> ReplayReport:
    """Put every WAL entry's bytes back into its segment file, sync what was written, remove the WAL
    files (see the module docstring). Blocking; runs before any stream is recovered.

    A WAL that reached its checkpoint size holds a few hundred thousand small entries, and the server
    does not listen until this returns: so a stream directory is looked up once, a segment file is
    opened and measured once, and what it holds is read in windows (``_SegmentFile``), not once per
    entry."""
    directory = root / WAL_DIR
    directory.mkdir(exist_ok=True)
    streams = str(root / "streams")
    found = generations(directory)
    entries = repaired = skipped = 0
    stream_dirs: dict[str, str | None] = {}  # log id -> its directory, None if it is gone
    segments: dict[tuple[str, int], _SegmentFile] = {}
    created_dirs: set[str] = set()
    creates = made = 0
    scans = [(g, scan(directory / wal_name(g), g)) for g in found]
    files = [(g, scanned.entries) for g, scanned in scans]
    dropped = {e[0] for _, kinds in files for e in kinds if e[4] == Kind.DROP}
    unpromoted = _unpromoted(root, files)
    try:
        for file_index, (_generation, kinds) in enumerate(files):
            for entry_index, (log_id, segment, offset, records, kind) in enumerate(kinds):
                if kind in _NO_SEGMENT:
                    continue  # a packed create or packed records have no segment (packs.settle)
                if unpromoted.get(log_id, (-1, -1)) > (file_index, entry_index):
                    continue  # a failed promotion's entries: the stream stays packed
                if kind == Kind.CREATE:
                    creates += 1
                else:
                    entries += 1
                target = segments.get((log_id, segment))
                if target is None:
                    if log_id not in stream_dirs:
                        stream_dir = os.path.join(streams, log_id)
                        usable = log_id and "/" not in log_id and os.path.isdir(stream_dir)
                        if not usable and kind == Kind.CREATE and _makeable(log_id, dropped):
                            os.mkdir(stream_dir)  # acknowledged, or at least fully there
                            made += 1
                            usable = True
                        stream_dirs[log_id] = stream_dir if usable else None
                    stream_dir = stream_dirs[log_id]
                    if stream_dir is None:
                        skipped += kind == Kind.RECORDS
                        continue
                    target = _SegmentFile.open(os.path.join(stream_dir, segment_name(segment)))
                    segments[(log_id, segment)] = target
                    if target.created:
                        created_dirs.add(stream_dir)
                if not target.holds(offset, records):
                    target.write(offset, records)
                    repaired += kind == Kind.RECORDS
        if sync:
            # Concurrent syncs share journal commits (as the checkpoints' do, committer.py).
            with ThreadPoolExecutor(_SYNC_THREADS, thread_name_prefix="durastream-replay") as pool:
                list(pool.map(os.fdatasync, [target.fd for target in segments.values()]))
            for stream_dir in created_dirs:
                fsync_dir(stream_dir)
            if made:
                fsync_dir(streams)
    finally:
        for target in segments.values():
            os.close(target.fd)
    # Imported here: packs.py reads WAL files with this module's scan (one-way at module level).
    from durastream_server.storage.packs import Settled, settle

    packed = Settled()
    settle(root, scans, sync=sync, out=packed, headers=headers)
    for generation in found:
        os.unlink(directory / wal_name(generation))
    if found and sync:
        fsync_dir(directory)
    if repaired:
        log.warning(
            "WAL replay: %d of %d entries were missing from their segment files and were written back",
            repaired,
            entries,
        )
    return ReplayReport(
        files=len(found),
        entries=entries,
        repaired=repaired,
        skipped=skipped,
        next_generation=max(found[-1] + 1 if found else 0, max(packed.kept, default=-1) + 1),
        creates=creates,
        made=made,
        packed=packed,
    )


def _unpromoted(root: Path, files: list[tuple[int, list[Any]]]) -> dict[str, tuple[int, int]]:
    """Where (file, entry) the last ``UNPROMOTE`` entry of each stream is: the replay skips its
    entries before it. A directory such a failed promotion left behind (its removal failed too) and
    that no later ``CREATE`` makes again is removed: the stream is packed (``packs.settle``)."""
    found: dict[str, tuple[int, int]] = {}
    created: dict[str, tuple[int, int]] = {}
    for file_index, (_generation, kinds) in enumerate(files):
        for entry_index, entry in enumerate(kinds):
            if entry[4] == Kind.UNPROMOTE:
                found[entry[0]] = (file_index, entry_index)
            elif entry[4] == Kind.CREATE:
                created[entry[0]] = (file_index, entry_index)
    for log_id, at in found.items():
        stream_dir = os.path.join(root, "streams", log_id)
        if _makeable(log_id, set()) and created.get(log_id, at) <= at and os.path.isdir(stream_dir):
            log.warning("WAL replay: removing %s, left by a promotion that failed", stream_dir)
            shutil.rmtree(stream_dir)
    return found


def _makeable(log_id: str, dropped: set[str]) -> bool:
    """A create entry's directory may be made: a plain name, not dropped later."""
    return (
        bool(log_id) and "/" not in log_id and log_id not in (".", "..") and log_id not in dropped
    )


class _SegmentFile:
    """One segment file during a replay: its fd (synced through at the end), its size, and a window of
    its content, read ahead ``_WINDOW`` bytes at a time (a segment's entries come in ascending offsets;
    a WAL covers at most a few hundred segment files, so the windows held stay in the tens of MiB)."""

    __slots__ = ("fd", "size", "created", "_window", "_window_at")

    def __init__(self, fd: int, size: int, created: bool) -> None:
        self.fd = fd
        self.size = size
        self.created = created  # its name must be made durable too
        self._window = b""
        self._window_at = 0

    @classmethod
    def open(cls, path: str) -> _SegmentFile:
        created = not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
        try:
            return cls(fd, os.fstat(fd).st_size, created)
        except BaseException:
            os.close(fd)
            raise

    def holds(self, offset: int, records: bytes) -> bool:
        """True if the file already holds ``records`` at ``offset``."""
        end = offset + len(records)
        if self.size < end:
            return False
        if len(records) > _WINDOW:
            return pread_exact(self.fd, len(records), offset) == records
        at = self._window_at
        if offset < at or end > at + len(self._window):
            self._window = pread_exact(self.fd, min(_WINDOW, self.size - offset), offset)
            self._window_at = at = offset
        return self._window[offset - at : end - at] == records

    def write(self, offset: int, records: bytes) -> None:
        pwrite_all(self.fd, [records], offset)
        self.size = max(self.size, offset + len(records))
        self._window = b""  # it may hold what was just overwritten
