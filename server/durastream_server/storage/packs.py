"""Packed creates (decision 0010, step 1): a new empty stream is one WAL entry, not a directory.

A create with no initial data that is not a fork writes a *packed* entry (``wal.Kind.PACKED``: the
stream's header record) into the commit round's WAL file and nothing else: no directory, no segment file,
no fd, no catalog line. The stream is *promoted* to a directory of its own (today's layout) by its first
write (``promotion.py``): a CREATE entry and the write's records in one round. With packed appends, a
create with a small initial body (a ``PUT`` with data) is packed too: its entry's one record is the
header frame followed by the data's frame (``carries_data``, ``features.PACKED_CREATE_DATA``), read
back as a packed stream with records whose header piece holds its data.

Retention. At its checkpoint, a WAL file's packed creates that are still *live* are copied (entry by
entry, byte for byte, so each still carries the WAL file's generation) into ``packs/<generation>.pack``
(``write_pack``: a temporary file, synced, renamed, ``packs/`` synced), and only then is the WAL file
removed; the rest of the WAL file (other streams' records, up to 64 MiB) is never kept. A packed create
stops being live when its stream is deleted (a DROP entry) or promoted (a CREATE entry whose directory
the checkpoint of that entry's WAL file has synced). A pack whose void entries reach half of it is
rewritten the same way with its live ones only (``COMPACT_VOID_FRACTION``), and one with none left is
removed. So packs take at most twice the bytes of the live packed creates' entries (70 bytes + the header
record each), plus a sidecar line (33 bytes) per void one, reported by ``/healthz`` and ``inspect``.
A crash during a rewrite leaves the old pack or the new one (the rename is atomic; a temporary file is
removed at start-up); a crash between a checkpoint's new pack and its WAL file's removal leaves the same
entries in both, read as one stream each (same id, same generation).

The ordering trap: the WAL file that holds a DROP (or the promoting CREATE) may be retired long before the
pack that holds the original create, and the pack must not bring the stream back after a restart. So
each pack has a sidecar, ``packs/<generation>.dead``: the ids of its packed creates that are void. The
checkpoint that retires a WAL file appends to the sidecars the ids that file's DROP and promoting CREATE
entries made void, syncs them, and only then removes (or renames) the file. A sidecar line is written
only for a pack that is kept; a torn last line (power loss mid-append) belongs to a checkpoint that did
not finish, whose WAL file is still there to say the same.

Merging (step 2c, ``extents.merge_choice``): a checkpoint may carry a packed stream's last pack entries
again, with its new records, as one entry of the new pack; once that pack is durable the stream's id
is appended to the old packs' sidecars (its entries there are void), and only then is the WAL file
removed. A crash in between leaves both copies: ``survey`` reads each byte once (the merged entry is
the longer piece) and names the old entries void in their sidecars.

Start-up (``settle``, called by the WAL replay once segments are repaired): every pack and WAL file is
scanned, entry headers only; a packed create is live unless its sidecar names it, a DROP in any file
names it, or ``streams/`` has its directory (the promotion's CREATE entry was replayed). No directory is
made. What the WAL files' entries made void is written to the sidecars of the packs kept, the live
packed creates of each WAL file are written into a pack of its generation (a torn end is an
unacknowledged round, and is not read), half-void packs are rewritten, and packs with none are removed;
then the replay removes the WAL files. A damaged entry in the middle of a pack is skipped and logged with
its byte range; the entries after it are read (hazard 32). The pack's index (``packindex``, written
after each pack) names the stream of a damaged entry: that stream is quarantined, and the pack kept as
it is (``Survey.protected``); without a valid index the damaged entry's stream cannot be named.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, sub
from pathlib import Path

from durastream_server.storage import codec, packindex
from durastream_server.storage.extents import (
    FIELDS,
    IN_PACK,
    IN_WAL,
    Extents,
    Piece,
    coalesce,
    flat_iter,
    flat_lengths,
    flat_rows,
    may_merge,
    merge_choice,
    records_offsets,
)
from durastream_server.storage.files import fsync_dir, pread_exact, replace_file
from durastream_server.storage.records import StreamHeader
from durastream_server.storage.recovery import Quarantine, Recovered, recover_packed
from durastream_server.storage.wal import (
    FIXED_SIZE,
    HEAD_SIZE,
    WAL_DIR,
    Kind,
    Scan,
    WalEntry,
    WalFile,
    encode_entry,
    generations,
    scan,
    wal_name,
)

log = logging.getLogger(__name__)

PACKS_DIR = "packs"
TMP_SUFFIX = ".tmp"  # a pack being written (``write_pack``)
# A pack is rewritten with its live packed creates only once its void ones reach this fraction of it
# (``COMPACT_VOID_FRACTION``): packs then hold at most 1 / (1 - fraction) = 2x the live ones' entries.
COMPACT_VOID_FRACTION = 0.5
# Step 2c: the old bytes one checkpoint merges at most (``PackBook._plan_merges``): a merge holds them
# in memory while the pack is written (as the carry holds the WAL file's new records, up to 64 MiB),
# and streams created and appended together reach their bound in the same checkpoint: 10,000 streams
# of 100 KiB would be 1 GiB. Past this budget the others merge at their next carried checkpoints;
# that costs more (the packs they leave half void are compacted: with 4 MiB, 2,000 streams merging
# together, the checkpoint took 1.6x main's CPU instead of 1.16x, docs/benchmarks.md Run 16b).
MERGE_BYTES_PER_CHECKPOINT = 16 << 20
_PACK_RE = re.compile(r"\A(\d{20})\.pack\Z")
_ID_RE = re.compile(rb"\A[0-9a-f]{32}\Z")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_PACKED_KINDS = (Kind.PACKED, Kind.PACKED_RECORDS)


def pack_name(generation: int) -> str:
    return f"{generation:020d}.pack"


def dead_name(generation: int) -> str:
    return f"{generation:020d}.dead"


def decode_header_frame(data: bytes) -> StreamHeader:
    """The header a packed entry carries (raises ``codec.CorruptRecord`` if it is not one)."""
    frame = codec.parse_frame(data)
    body = memoryview(data)[codec.FRAME_SIZE : codec.FRAME_SIZE + frame.body_len]
    if (
        frame.kind != codec.Kind.HEADER
        or len(body) != frame.body_len
        or not codec.body_crc_ok(frame, body)
    ):
        raise codec.CorruptRecord("a packed entry that is not a whole stream header record")
    return codec.decode_header(body)


def carries_data(record: bytes) -> bool:
    """Whether a packed create's record holds more than its header frame: the initial data of a
    ``PUT`` with a body (``features.PACKED_CREATE_DATA``), read back as a packed stream with records
    whose header piece holds them (one CRC covers both: never the create without its data)."""
    if len(record) <= codec.FRAME_SIZE:
        return False
    try:
        return len(record) > codec.FRAME_SIZE + codec.parse_frame(record).body_len
    except codec.CorruptRecord:
        return False  # refused where its header is decoded (``decode_header_frame``)


def header_path(data: bytes) -> str:
    """The path a packed entry's header record names, without decoding the rest of it: start-up
    needs only the path of 100,000 packed streams (their pending hints), and the full decode cost
    ~55 us each (its field checks); the header is decoded and checked when the stream is recovered.
    Raises ``codec.CorruptRecord``."""
    try:
        # The header's body only: a packed create with data (``carries_data``) has a frame after it.
        body_len = codec.FRAME.unpack_from(data)[3]
        path = json.loads(data[codec.FRAME_SIZE : codec.FRAME_SIZE + body_len])["path"]
    except (ValueError, TypeError, KeyError, struct.error) as exc:
        raise codec.CorruptRecord(f"a packed entry without a readable path: {exc}") from exc
    if not isinstance(path, str):
        raise codec.CorruptRecord("a packed entry whose path is not a string")
    return path


def pack_generations(directory: Path) -> list[int]:
    found = []
    for name in os.listdir(directory):
        match = _PACK_RE.match(name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def read_dead(directory: Path, generation: int) -> set[str]:
    """The ids a pack's sidecar says are void (a torn or damaged line is skipped)."""
    try:
        raw = (directory / dead_name(generation)).read_bytes()
    except FileNotFoundError:
        return set()
    return {line.decode() for line in raw.split(b"\n") if _ID_RE.match(line)}


def append_dead(directory: Path, generation: int, ids: list[str], *, sync: bool) -> None:
    """Append ``ids`` to a pack's sidecar, durable on return with ``sync``."""
    path = directory / dead_name(generation)
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC, 0o644)
    try:
        os.write(fd, "".join(f"{i}\n" for i in ids).encode())
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    if new and sync:
        fsync_dir(directory)


def records_sizes(entries: list[WalEntry]) -> list[int]:
    """Each entry's records bytes, for ``write_pack`` and ``_rows`` when the caller did not keep them."""
    return [sum(map(len, entry.records)) for entry in entries]


def write_pack(
    directory: Path,
    generation: int,
    entries: list[WalEntry],
    *,
    sync: bool,
    sizes: list[int] | None = None,
) -> int:
    """Make ``packs/<generation>.pack`` hold exactly ``entries`` (packed creates, encoded with
    ``generation`` as the WAL file that first held them wrote them: byte for byte the same entries, so
    the generation check of ``wal.scan`` passes), replacing any pack of that generation atomically:
    ``files.replace_file``: a temporary file (``TMP_SUFFIX``), ``fdatasync``, ``rename``, then ``fsync`` of
    ``packs/`` (with ``sync``). A crash
    leaves the old pack or the new one, never a part of either (a stray temporary file is removed at
    start-up). ``sizes``: each entry's records bytes if the caller knows them (``records_sizes``).
    Returns the new pack's size."""
    if sizes is None:
        sizes = records_sizes(entries)
    # The old pack's index goes (durably) before the new pack is renamed in; the new index is
    # written once the rename is durable (``packindex``): no index ever describes other bytes.
    packindex.remove(directory, generation, sync=sync)
    size = replace_file(
        directory / pack_name(generation), _encoded(generation, entries, sizes), sync=sync
    )
    packindex.write_encoded(
        directory,
        generation,
        packindex.encode_entries(generation, size, entries, sizes),
        sync=sync,
    )
    return size


# ``_encoded``: a pack's entries are joined into buffers of about this many bytes before they are
# written (``files.WRITE_CALL_BYTES`` is the most one write call takes).
_ENCODE_CHUNK = 256 << 10


def _encoded(generation: int, entries: list[WalEntry], sizes: list[int]) -> Iterator[bytes]:
    """``entries`` encoded (``wal.encode_entry``) as joined buffers of about ``_ENCODE_CHUNK``
    bytes, made one at a time as they are written (a copy of the whole pack is never held):
    ``files.pwrite_all`` looks at every buffer it is given in Python, and four or five a (stream,
    round) were ~25% of a checkpoint's carry of 10,000 streams x 10 rounds (issue 16); joining is
    one copy at C speed."""
    parts: list[bytes | bytearray | memoryview] = []
    held = 0
    fixed = HEAD_SIZE + FIXED_SIZE
    for entry, size in zip(entries, sizes, strict=True):
        parts += encode_entry(generation, entry)
        held += fixed + len(entry.log_id) + size
        if held >= _ENCODE_CHUNK:
            yield b"".join(parts)
            parts = []
            held = 0
    if parts:
        yield b"".join(parts)


def _live_entries(directory: Path, generation: int, void: set[str]) -> list[WalEntry]:
    """The packed creates (and packed records, step 2) of pack ``generation`` that ``void`` (and
    its sidecar) do not name."""
    void = void | read_dead(directory, generation)
    scanned = scan(directory / pack_name(generation), generation, resync=True)
    return [
        WalEntry(log_id, segment, offset, [records], Kind(kind))
        for log_id, segment, offset, records, kind in scanned.entries
        if kind in _PACKED_KINDS and log_id not in void
    ]


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ------------------------------------------------------------------------------------------ start-up


@dataclass(slots=True)
class Settled:
    """The packed streams a start-up found live: id -> (generation of the file holding its create,
    its header record), the packs kept (generation -> bytes) and the entries each holds."""

    live: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    kept: dict[int, int] = field(default_factory=dict)
    entries: dict[int, int] = field(default_factory=dict)
    damaged: int = 0  # damaged byte ranges skipped in packs
    # Step 2: the packed streams with records (``Kind.PACKED_RECORDS``), where their bytes are now
    # (after the rewrites), header record first; and those whose records stop short of a gap.
    extents: dict[str, Extents] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    # Live entries per pack, packed records included (``counts`` of ``survey`` counts creates only).
    live_entries: dict[int, int] = field(default_factory=dict)
    # Step 2: where each live packed create's header record is in its pack (generation ``live[id]
    # [0]``), after the rewrites: the header extent of its first packed records (``PackBook``).
    # Only with ``settle(headers=True)`` (packed appends on): an int per packed stream otherwise
    # costs every start-up (~4 us a stream measured with 50,000 packed creates).
    headers: dict[str, int] = field(default_factory=dict)
    # The pack index: packed streams whose create is a damaged entry its pack's index names (id ->
    # path, or None if the index had none): quarantined by ``DataDir``; and the packs kept as they
    # are because of a damaged entry attributed to a stream (never compacted while serving).
    lost: dict[str, str | None] = field(default_factory=dict)
    protected: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Survey:
    """What the packs and WAL files say, before anything is written (``settle``; ``check`` reads only
    this): the live packed creates, the packed creates each file holds that became void without its
    sidecar saying so yet, the packs scanned, and the damaged byte ranges skipped in them."""

    live: dict[str, tuple[int, bytes]]
    counts: dict[int, int]
    newly_void: dict[int, list[str]]
    pack_scans: list[tuple[int, Scan]]
    damaged: list[tuple[Path, int, int]]
    # Step 2: per live packed stream with records, its header's piece then its records' pieces, each
    # logical byte once (the same records in a pack and in the WAL file it was written from, after a
    # crash between the two, are read once), and the streams whose pieces leave a gap.
    pieces: dict[str, list[_Piece]] = field(default_factory=dict)
    # Where each live packed create's header record is in its pack, if a pack holds it.
    headers: dict[str, int] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    # The pack index: streams whose packed create is a damaged entry (id -> path, if the index
    # holds it), the packs kept as they are because a damaged entry of theirs is attributed, and the
    # clean packs without an index.
    lost: dict[str, str | None] = field(default_factory=dict)
    protected: set[int] = field(default_factory=set)
    unindexed: list[int] = field(default_factory=list)


def survey(root: Path, wal_scans: list[tuple[int, Scan]], *, headers: bool = False) -> Survey:
    """Read every pack (with resync) and its sidecar; decide which packed creates are live. The same
    id in a pack and a WAL file of the same generation (a crash between a checkpoint's new pack and
    its WAL file's removal) is the same entry: one stream. With ``headers`` (packed appends on) it
    also says where each live packed create's header is in its pack (``Survey.headers``)."""
    packs = root / PACKS_DIR
    pack_scans: list[tuple[int, Scan]] = []
    void: dict[int, set[str]] = {}
    damaged = []
    blame: dict[str, tuple[int, str | None]] = {}  # stream id -> (pack, path) of a damaged entry
    unindexed: list[int] = []  # clean packs without a valid index (``settle`` writes one)
    in_wal_files = {generation for generation, _ in wal_scans}
    for generation in pack_generations(packs) if packs.is_dir() else []:
        scanned = scan(packs / pack_name(generation), generation, resync=True)
        damaged += [(packs / pack_name(generation), a, b) for a, b in scanned.damaged]
        pack_scans.append((generation, scanned))
        void[generation] = read_dead(packs, generation)
        if scanned.damaged:
            rows = packindex.read(packs, generation, _size(packs, generation))
            if rows is None:
                log.error(
                    "pack %s is damaged and has no valid index: the streams of its damaged "
                    "entries cannot be named",
                    pack_name(generation),
                )
            elif generation not in in_wal_files:  # else its WAL file still holds them whole
                for row in packindex.blamed(rows, scanned.damaged):
                    blame[row.log_id] = (generation, row.path)
        elif not packindex.describes(packs, generation, _size(packs, generation)):
            unindexed.append(generation)
    created: dict[str, tuple[int, bytes]] = {}
    header_at: dict[str, int] = {}
    dropped: set[str] = set()
    found: dict[str, list[_Piece]] = {}  # every piece of every packed stream (void ones too)
    in_pack = {id(scanned) for _, scanned in pack_scans}
    for generation, scanned in sorted(pack_scans + wal_scans, key=lambda found: found[0]):
        where = IN_PACK if id(scanned) in in_pack else IN_WAL
        for i, (log_id, _segment, offset, records, kind) in enumerate(scanned.entries):
            if kind == Kind.PACKED:
                created[log_id] = (generation, records)
                if headers and where == IN_PACK:
                    header_at[log_id] = scanned.records_at[i]
                if carries_data(records):  # a stream with records: its header piece holds them
                    found.setdefault(log_id, [])
            elif kind == Kind.PACKED_RECORDS and records:
                piece = _Piece(offset, where, generation, scanned.records_at[i], records, kind)
                found.setdefault(log_id, []).append(piece)
            elif kind == Kind.DROP:
                dropped.add(log_id)
    if found:  # the header pieces of the streams with records (none in a step 1 data directory)
        for generation, scanned in pack_scans + wal_scans:
            where = IN_PACK if id(scanned) in in_pack else IN_WAL
            for i, (log_id, _segment, _offset, records, kind) in enumerate(scanned.entries):
                if kind == Kind.PACKED and log_id in found:
                    at = scanned.records_at[i]
                    found[log_id].append(_Piece(0, where, generation, at, records, kind))
    present = set(os.listdir(root / "streams")) if created or blame else set()
    live: dict[str, tuple[int, bytes]] = {}
    counts: dict[int, int] = {}
    newly_void: dict[int, list[str]] = {}
    for log_id, (generation, records) in created.items():
        if log_id in void.get(generation, ()):
            continue
        if log_id in dropped or log_id in present:
            newly_void.setdefault(generation, []).append(log_id)
            continue
        live[log_id] = (generation, records)
        counts[generation] = counts.get(generation, 0) + 1
    chosen: dict[str, list[_Piece]] = {}
    gaps: list[str] = []
    for log_id in live:
        pieces = found.get(log_id, [])
        if any(p.kind == Kind.PACKED_RECORDS for p in pieces) or carries_data(live[log_id][1]):
            chosen[log_id], whole = _contiguous(pieces)
            if not whole:
                gaps.append(log_id)
            # Step 2c: a merge's old entries whose sidecar line a crash cut off (the merged entry
            # covers them): void in a pack holding none of the stream's bytes served, said now.
            served = {p.generation for p in chosen[log_id]} | {live[log_id][0]}
            stale = {p.generation for p in pieces if p.where == IN_PACK} - served
            for generation in stale if whole else ():
                if log_id not in void.get(generation, ()):
                    newly_void.setdefault(generation, []).append(log_id)
    headers = {i: header_at[i] for i in live if i in header_at} if header_at else {}
    # Damaged entries the packs' indexes name: a live stream is quarantined (whether the entry was its
    # first, middle or last); one whose create is the damaged entry (not void) is quarantined by the
    # path the index holds. Their packs are kept as they are (``protected``): the damage stays
    # visible to every later start-up and to ``check``.
    lost: dict[str, str | None] = {}
    protected: set[int] = set()
    for log_id, (generation, path) in blame.items():
        void_elsewhere = log_id in created or log_id in dropped or log_id in present
        if log_id in live:
            if log_id not in gaps:
                gaps.append(log_id)
        elif void_elsewhere or any(log_id in v for v in void.values()):
            continue  # void: nothing of it is served
        else:
            lost[log_id] = path
        protected.add(generation)
    return Survey(
        live,
        counts,
        newly_void,
        pack_scans,
        damaged,
        pieces=chosen,
        gaps=gaps,
        headers=headers,
        lost=lost,
        protected=protected,
        unindexed=unindexed,
    )


def _size(packs: Path, generation: int) -> int:
    return os.stat(packs / pack_name(generation)).st_size


@dataclass(frozen=True, slots=True)
class _Piece:
    """A packed stream's header or records as one file holds them (``survey``)."""

    position: int  # in the stream's virtual segment 0
    where: int  # IN_WAL or IN_PACK
    generation: int
    records_at: int  # where the records start in the file
    records: bytes
    kind: Kind


def _contiguous(pieces: list[_Piece]) -> tuple[list[_Piece], bool]:
    """``pieces`` cut to cover each logical byte once from 0, packs before WAL files (a crash
    between a checkpoint's pack and its WAL file's removal leaves the same records in both). False
    when they leave a gap (a damaged entry skipped, hazard 32): the pieces after it are kept all the
    same (carried and counted live like the others), so that the gap is found again by every later
    start-up instead of the stream's packs after it being removed, which would make the stream look
    whole and shorter. Its extents stop at the gap (``prefix``)."""
    out: list[_Piece] = []
    end = 0
    whole = True
    ordered = sorted(pieces, key=lambda p: (p.position, -len(p.records), -p.where))
    for piece in ordered:
        stop = piece.position + len(piece.records)
        if stop <= end:
            continue
        if piece.position > end:
            whole = False
            end = piece.position
        cut = end - piece.position
        out.append(
            _Piece(
                end,
                piece.where,
                piece.generation,
                piece.records_at + cut,
                piece.records[cut:],
                piece.kind if not cut else Kind.PACKED_RECORDS,
            )
        )
        end = stop
    return out, whole


def prefix(pieces: list[_Piece]) -> list[_Piece]:
    """The pieces of ``survey`` up to the first gap: what a stream can be served or folded from."""
    out: list[_Piece] = []
    for piece in pieces:
        if out and piece.position != out[-1].position + len(out[-1].records):
            break
        out.append(piece)
    return out


def wal_scans(root: Path) -> list[tuple[int, Scan]]:
    """The WAL files left behind, scanned (for ``check``, which replays nothing)."""
    directory = root / WAL_DIR
    if not directory.is_dir():
        return []
    return [(g, scan(directory / wal_name(g), g)) for g in generations(directory)]


def worth_rewriting(live: int, entries: int) -> bool:
    """A pack with ``live`` of its ``entries`` still live is rewritten with those only once its void
    entries reach ``COMPACT_VOID_FRACTION`` of it (never when nothing is live: it is removed)."""
    return live > 0 and entries - live >= entries * COMPACT_VOID_FRACTION


def settle(
    root: Path,
    wal_scans: list[tuple[int, Scan]],
    *,
    sync: bool,
    out: Settled,
    headers: bool = False,
) -> None:
    """See the module docstring. Fills ``out``. Every WAL file may be removed when it returns: the
    live packed creates of each are in a pack of its generation (durable with ``sync``)."""
    packs = root / PACKS_DIR
    packs.mkdir(exist_ok=True)
    for name in os.listdir(packs):
        if name.endswith(TMP_SUFFIX):  # a rewrite that did not finish: the old pack is whole
            _unlink(packs / name)
    found = survey(root, wal_scans, headers=headers)
    for path, start, end in found.damaged:
        out.damaged += 1
        log.error(
            "pack %s: bytes %d-%d are damaged and were skipped (the streams its index names for "
            "them are quarantined; the entries after them are read)",
            path,
            start,
            end,
        )
    out.live = found.live
    out.gaps = found.gaps
    out.lost = found.lost
    out.protected = found.protected
    for log_id, path in found.lost.items():
        log.error(
            "packed stream %s (%r): its packed create is a damaged pack entry (named by the pack's "
            "index); it is quarantined",
            log_id,
            path,
        )
    for log_id in found.gaps:
        log.error(
            "packed stream %s: its records stop at a gap (a damaged pack entry was skipped); it is "
            "quarantined, never served as if it ended there",
            log_id,
        )
    # Live entries per file: the packed creates, and (step 2) the records pieces of live streams.
    counts = dict(found.counts)
    in_wal = set()  # files whose pieces are read from a WAL file: written into a pack now
    for pieces in found.pieces.values():
        for piece in pieces:
            if piece.kind == Kind.PACKED_RECORDS:
                counts[piece.generation] = counts.get(piece.generation, 0) + 1
            if piece.where == IN_WAL:
                in_wal.add(piece.generation)
    held = {generation: len(scanned.entries) for generation, scanned in found.pack_scans}
    # Written again with their live entries only: the WAL files' (no pack of their generation yet)
    # and the packs that are half void (or that are whole WAL files, as step 1 first kept them).
    for generation in found.protected:  # kept as it is: its damage stays visible, so one more live
        # entry that nothing voids (the pack outlives the drops of its other streams)
        counts[generation] = counts.get(generation, 0) + 1
    rewrite = {
        g
        for g in counts
        if g not in held or g in in_wal or worth_rewriting(counts[g], held[g])
        if g not in found.protected
    }
    # The sidecars first: the WAL files whose DROPs (or replayed CREATEs) say so are removed next.
    for generation, ids in found.newly_void.items():
        if counts.get(generation) and generation not in rewrite:
            append_dead(packs, generation, ids, sync=sync)
    by_generation: dict[int, list[WalEntry]] = {g: [] for g in rewrite}
    for log_id, (generation, records) in found.live.items():
        if generation in rewrite and log_id not in found.pieces:
            by_generation[generation].append(WalEntry(log_id, 0, 0, [records], Kind.PACKED))
    for log_id, pieces in found.pieces.items():
        for generation in sorted({p.generation for p in pieces} & rewrite):
            by_generation[generation] += coalesce(
                [
                    WalEntry(log_id, 0, p.position, [p.records], p.kind)
                    for p in pieces
                    if p.generation == generation
                ]
            )
    # Where each rewritten entry's records are now: id -> generation -> [(position, file offset)].
    moved: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for generation, entries in sorted(by_generation.items()):
        write_pack(packs, generation, entries, sync=sync)
        held[generation] = len(entries)
        for entry, at in zip(entries, records_offsets(entries), strict=True):
            moved.setdefault(entry.log_id, {}).setdefault(generation, []).append((entry.offset, at))
    for generation in rewrite:  # the new pack is durable and names none of the void ids
        _unlink(packs / dead_name(generation))
    for generation, _ in found.pack_scans:
        if not counts.get(generation):
            _unlink(packs / pack_name(generation))
            _unlink(packs / dead_name(generation))
            _unlink(packs / packindex.index_name(generation))
    # The index of a clean pack kept as it is that has none, or a stale one (written before this
    # version, or a crash between a pack's rename and its index's).
    scans = dict(found.pack_scans)
    for generation in found.unindexed:
        if counts.get(generation) and generation not in rewrite:
            rows = packindex.rows_of_scan(scans[generation])
            packindex.write(packs, generation, _size(packs, generation), rows, sync=sync)
    for generation in counts:
        out.kept[generation] = os.stat(packs / pack_name(generation)).st_size
        out.entries[generation] = held[generation]
    out.live_entries = counts
    out.headers = {
        log_id: at
        for log_id, (generation, _) in (found.live.items() if found.headers else ())
        if generation not in rewrite and (at := found.headers.get(log_id)) is not None
    }
    for log_id, by_file in moved.items() if headers else ():
        generation = found.live[log_id][0]
        for position, at in by_file.get(generation, ()):
            if position == 0:
                out.headers[log_id] = at
    if sync and len(found.pack_scans) != len(out.kept):
        fsync_dir(packs)
    for log_id, pieces in found.pieces.items():
        out.extents[log_id] = _extents_after(pieces, rewrite, moved.get(log_id, {}))


def read_virtual(root: Path, extents: Extents) -> bytes:
    """A packed stream's virtual segment 0 (its header record and records, byte for byte what its
    segment 0 holds once promoted), read from the files its extents name: for its fold at start-up
    (``recovery.recover_packed``) and for the CREATE entry of its promotion. Blocking."""
    out = bytearray()
    for piece in extents.pieces(extents.start, extents.end):
        name = (
            pack_name(piece.generation)
            if piece.where == IN_PACK
            else os.path.join("..", WAL_DIR, wal_name(piece.generation))
        )
        fd = os.open(root / PACKS_DIR / name, os.O_RDONLY | _O_CLOEXEC)
        try:
            out += pread_exact(fd, piece.length, piece.offset)
        finally:
            os.close(fd)
    return bytes(out)


def fold_packed(
    root: Path, items: list[tuple[str, Extents]], index_interval: int
) -> list[Recovered | Quarantine]:
    """``recovery.recover_packed`` of each (id, extents), in order: what a start-up adopts of the
    packed streams with records (``DataDir``). Each file is opened once per call, not once per stream
    (a few packs hold thousands of streams). A failure of one stream never stops the others."""
    fds: dict[tuple[int, int], int] = {}
    out: list[Recovered | Quarantine] = []
    try:
        for log_id, extents in items:
            try:
                data = bytearray()
                for piece in extents.pieces(extents.start, extents.end):
                    fd = fds.get((piece.where, piece.generation))
                    if fd is None:
                        fd = os.open(_file_path(root, piece), os.O_RDONLY | _O_CLOEXEC)
                        fds[(piece.where, piece.generation)] = fd
                    data += pread_exact(fd, piece.length, piece.offset)
                out.append(recover_packed(log_id, bytes(data), index_interval))
            except Quarantine as q:
                out.append(q)
            except Exception as exc:  # a bug or a lost file must not silently drop it (hazard 32)
                log.exception("packed stream %s: recovery failed", log_id)
                out.append(Quarantine(None, f"recovery failed: {exc!r}"))
    finally:
        for fd in fds.values():
            os.close(fd)
    return out


def _file_path(root: Path, piece: Piece) -> Path:
    if piece.where == IN_PACK:
        return root / PACKS_DIR / pack_name(piece.generation)
    return root / WAL_DIR / wal_name(piece.generation)


def _extents_after(
    pieces: list[_Piece], rewrite: set[int], moved: dict[int, list[tuple[int, int]]]
) -> Extents:
    """A stream's extents once ``settle`` wrote the packs: a piece of a rewritten file is inside the
    coalesced entry of its stream that starts at or before it (``moved``: generation -> (position,
    records offset) of the stream's entries there); any other is where it was, in a pack."""
    extents = Extents()
    for piece in prefix(pieces):
        offset = piece.records_at
        if piece.generation in rewrite:
            first, at = max(e for e in moved[piece.generation] if e[0] <= piece.position)
            offset = at + piece.position - first
        extents.add(IN_PACK, piece.generation, offset, len(piece.records), piece.position)
    return extents


# ------------------------------------------------------------------------------------------- serving


@dataclass(slots=True)
class Retirement:
    """What a checkpoint does to the packs once the segments of ``generation`` are synced
    (planned on the loop by ``PackBook.plan``, carried out on the I/O pool by ``PackBook.carry_out``)."""

    generation: int
    dead: dict[int, list[str]]  # pack generation -> ids void from now on
    keep: list[WalEntry]  # the retired WAL file's live packed creates: they become its pack
    remove: list[int]  # packs with no live packed create left
    compact: list[int]  # packs whose void entries reach half of them: rewritten with the live ones
    # Step 2: the live packed records the retired WAL file holds, read back from it by ``carry_out``
    # (never held in memory while serving): stream id -> their extents in the WAL file, flat
    # (``Extents.in_file_flat``: made on the loop without a tuple a row; ``rows`` makes those).
    records: dict[str, array] = field(default_factory=dict)
    # Step 2c: streams whose last pack extents (generation, offset, length, position) are merged with
    # their ``records`` into one entry of the new pack (``extents.merge_choice``); their entries in
    # those packs are void once the new pack is durable (a sidecar line each, by id).
    merges: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)

    def rows(self) -> dict[str, list[tuple[int, int, int]]]:
        """``records`` as stream id -> [(WAL file offset, length, position)]: what ``carry_out``
        iterates (``flat_iter``), as lists to look at."""
        return {log_id: flat_rows(flat) for log_id, flat in self.records.items()}

    def files_moved(self) -> list[tuple[int, int]]:
        """The files (where, generation) ``carry_out`` may rename over or remove: what packed reads
        planned before it must not read (``packview.PackFiles.moving``)."""
        packs = {*self.compact, *self.remove, self.generation}
        return [(IN_PACK, g) for g in sorted(packs)] + [(IN_WAL, self.generation)]


@dataclass(frozen=True, slots=True)
class Carried:
    """The packs ``carry_out`` wrote: generation -> (bytes, entries); and (step 2) where the packed
    entries of each file it replaced are now: (where, generation) of the old file -> stream id ->
    [(file offset of the records, length, position)] in pack ``generation`` (headers at position 0)."""

    written: dict[int, tuple[int, int]]
    moved: dict[tuple[int, int], dict[str, list[tuple[int, int, int]]]] = field(
        default_factory=dict
    )
    records: dict[int, int] = field(default_factory=dict)  # pack -> live records entries written


class PackBook:
    """Which packed creates are live and in which file (WAL file or pack), for the committer.

    ``live``: stream id -> generation of the file holding its packed create. ``counts``: generation ->
    live packed entries in it (creates and, step 2, records). ``kept``: generation -> bytes of each
    file in ``packs/``; ``entries``: generation -> packed entries it holds (live or void). The header
    records of the packed creates of the WAL files not yet retired are held (``_unretired``: a few
    hundred bytes each, for one or two WAL files), so that a checkpoint writes their pack without
    reading the WAL file back.

    Step 2 (``appends``, ``StorageConfig.packed_appends``): ``header_at``: id -> where its packed
    create's header record is (file offset * 2 + IN_WAL/IN_PACK, in the file of generation
    ``live[id]``), for the header extent of its first packed records; ``extents``: id -> the
    ``Extents`` of each live packed stream with records (the very object its ``StreamLog.extents``
    holds: a checkpoint relocates it in place). Everything but ``carry_out`` runs on the loop."""

    def __init__(self, root: Path | None) -> None:
        self.directory = root / PACKS_DIR if root is not None else None
        self.root = root
        self.live: dict[str, int] = {}
        self.counts: dict[int, int] = {}
        self.kept: dict[int, int] = {}
        self.entries: dict[int, int] = {}
        self._unretired: dict[int, dict[str, bytes]] = {}
        # Packs holding bytes that packed streams found at start-up name (step 2): not compacted
        # while serving (conservative: ``carried_out`` relocates the extents of a rewritten pack, but
        # the reads of piece 2 were built against packs that stay put). The next start-up's
        # ``settle`` compacts them.
        self.read_through: set[int] = set()
        # WAL generation -> (id, generation of a pack entry of it) void once that WAL file's
        # checkpoint has synced the promotion's directory (or just for a DROP): its create, and
        # (step 2) each of its packed records entries in packs.
        self._dying: dict[int, list[tuple[str, int]]] = {}
        self.appends = False
        self.header_at: dict[str, int] = {}
        self.extents: dict[str, Extents] = {}
        self._records: dict[int, set[str]] = {}  # WAL generation -> ids with packed records in it
        # Step 2c: streams planned to be merged out of these packs, until ``carried_out`` (their
        # counts there are taken off by ``plan``: a drop meanwhile must not take them off again),
        # and the packs merges took entries from since the last plan (compaction candidates).
        self._merging: dict[str, set[int]] = {}
        self._shrunk: set[int] = set()

    def load(self, settled: Settled) -> None:
        for log_id, (generation, _) in settled.live.items():
            self.live[log_id] = generation
            self.counts[generation] = self.counts.get(generation, 0) + 1
        # Live entries per pack: creates and (step 2) records entries; a drop or promotion of a
        # stream adopted with its extents (``adopt``) makes its records entries void one by one.
        for generation, entries in settled.live_entries.items():
            self.counts[generation] = max(self.counts.get(generation, 0), entries)
        self.kept = dict(settled.kept)
        self.entries = dict(settled.entries)
        if self.appends:  # the header extent of packed creates made before this start-up
            self.header_at = {
                log_id: at * 2 + IN_PACK
                for log_id, at in settled.headers.items()
                if log_id not in settled.extents
            }
        self.read_through = {
            generation
            for extents in settled.extents.values()
            for where, generation in extents.files()
            if where == IN_PACK
        } | settled.protected

    @property
    def disk_bytes(self) -> int:
        return sum(self.kept.values())

    def is_packed(self, log_id: str) -> bool:
        return log_id in self.live

    def created(self, log_id: str, generation: int, header: bytes, at: int = -1) -> None:
        """A packed create is durable in WAL ``generation``, its header record at offset ``at``."""
        self.live[log_id] = generation
        self.counts[generation] = self.counts.get(generation, 0) + 1
        self._unretired.setdefault(generation, {})[log_id] = header
        if self.appends and at >= 0:
            self.header_at[log_id] = at * 2 + IN_WAL

    def header_piece(self, log_id: str, length: int) -> tuple[int, int, int] | None:
        """(where, generation, offset) of a live packed create's header record of ``length``
        bytes, if known (made with packed appends on, or found by ``settle``: ``Settled.headers``;
        otherwise its stream is promoted as in step 1 when it is first written)."""
        at = self.header_at.get(log_id)
        generation = self.live.get(log_id)
        if at is None or generation is None:
            return None
        return at & 1, generation, at >> 1

    def adopt(self, log_id: str, extents: Extents) -> None:
        """Start-up (piece 5, not in this module's caller yet): a packed stream with records found
        by ``settle`` (all its entries in packs) is tracked like one written since, so that a
        pack's rewrite relocates its extents and its drop or promotion voids its records entries.
        Its ``StreamLog.extents`` must be this same object."""
        self.extents[log_id] = extents

    def wrote(self, log_id: str, extents: Extents, generation: int) -> None:
        """Packed records of ``log_id`` are durable in WAL ``generation`` (``extents`` says where).
        Not tracked once its stream is dropped (a round in flight during its delete): void."""
        if log_id not in self.live:
            return
        self.extents[log_id] = extents
        self._records.setdefault(generation, set()).add(log_id)

    def superseded(self, log_id: str, generation: int) -> None:
        """A DROP or a promoting CREATE of ``log_id`` is durable in WAL ``generation``."""
        created = self.live.pop(log_id, None)
        self.header_at.pop(log_id, None)
        extents = self.extents.pop(log_id, None)
        if created is not None:
            dying = self._dying.setdefault(generation, [])
            dying.append((log_id, created))
            if extents is not None:  # its records entries in packs (one per row; headers at 0)
                merging = self._merging.get(log_id, ())
                dying += [
                    (log_id, p.generation)
                    for p in extents.pieces(extents.start, extents.end)
                    if p.where == IN_PACK and p.position > 0 and p.generation not in merging
                ]

    def void_now(self, log_id: str) -> None:
        """Without a WAL (``--durability none`` over a data directory written with fsync): write
        ``log_id`` into its pack's sidecar at once, unsynced. Blocking; the caller then ``forget``s.
        (Such packs are compacted by the next start-up's ``settle``, not while serving.)"""
        created = self.live.get(log_id)
        if created is not None and self.directory is not None and created in self.kept:
            append_dead(self.directory, created, [log_id], sync=False)

    def forget(self, log_id: str) -> None:
        """On the loop, after ``void_now``."""
        created = self.live.pop(log_id, None)
        self.header_at.pop(log_id, None)
        self.extents.pop(log_id, None)
        if created is not None:
            self.counts[created] -= 1

    def plan(self, generation: int) -> Retirement:
        dead: dict[int, list[str]] = {}
        for log_id, created in self._dying.pop(generation, []):
            dead.setdefault(created, []).append(log_id)
            self.counts[created] -= 1
        # Its packed creates not void by now (one promoted in a later WAL file is still live: its
        # directory is not synced yet), copied into its pack.
        void = set(dead.get(generation, ()))
        keep = [
            WalEntry(log_id, 0, 0, [header], Kind.PACKED)
            for log_id, header in self._unretired.pop(generation, {}).items()
            if log_id not in void
        ]
        # Step 2: the packed records of the streams still packed (a dropped or promoted one's
        # records are void; a promotion's CREATE entry holds them).
        # One pass over the streams the retired WAL file holds records of (not every packed
        # stream): their rows and, for those with enough extents to merge, their merge choice.
        records: dict[str, array] = {}
        due: list[tuple[str, list[tuple[int, int, int, int]]]] = []
        for log_id in sorted(self._records.pop(generation, ())):
            extents = self.extents.get(log_id)
            if extents is None:
                continue
            flat = extents.in_file_flat(IN_WAL, generation)
            if flat and flat[3] == 0:  # the header record (positions grow: only the first)
                del flat[:4]
            if flat:
                records[log_id] = flat
                chosen = self._merge_choice(log_id, extents, flat)
                if chosen:
                    due.append((log_id, chosen))
        for g in self._shrunk - dead.keys():  # packs that merges took entries from
            dead[g] = []
        self._shrunk = set()
        remove = [g for g in self.kept if not self.counts.get(g)]
        compact = [
            g
            for g in dead
            if g in self.kept
            and g not in self.read_through
            and worth_rewriting(self.counts.get(g, 0), self.entries.get(g, 0))
        ]
        for g in [g for g in dead if not dead[g] and g not in compact]:
            del dead[g]  # a merge source not worth rewriting: nothing to write
        merges = self._plan_merges(due, {*compact, *remove})
        for g in [g for g, n in self.counts.items() if not n and g <= generation]:
            del self.counts[g]
        return Retirement(generation, dead, keep, remove, compact, records, merges)

    def _merge_choice(
        self, log_id: str, extents: Extents, flat: array
    ) -> list[tuple[int, int, int, int]]:
        """Step 2c: the pack extents of a carried stream that ``extents.merge_choice`` would merge
        with its new records (``flat``: their extents in the WAL file); [] without computing it
        for a stream with too few extents to merge (``may_merge``: most streams of a checkpoint,
        the count checked first)."""
        created = self.live.get(log_id)
        end = first = flat[3]
        if created is None or log_id in self._merging or not may_merge(extents, first):
            return []
        for length, position in zip(flat[2::4], flat[3::4], strict=True):  # the run merged
            if position != end:
                break
            end += length
        return merge_choice(extents.rows(), created, first, end - first)

    def _plan_merges(
        self, due: list[tuple[str, list[tuple[int, int, int, int]]]], moving: set[int]
    ) -> dict[str, list[tuple[int, int, int, int]]]:
        """Step 2c: of the carried streams whose pack extents could merge with their new records
        (``due``, from ``_merge_choice``), those none of whose sources this plan rewrites or
        removes, the most extents first until ``MERGE_BYTES_PER_CHECKPOINT`` old bytes are taken
        (a stream left for later has more next time: none waits forever behind the others). Their
        entries there stop counting now (one an extent)."""
        due = [item for item in due if not any(piece[0] in moving for piece in item[1])]
        due.sort(key=lambda item: -len(item[1]))
        merges: dict[str, list[tuple[int, int, int, int]]] = {}
        budget = MERGE_BYTES_PER_CHECKPOINT
        for log_id, chosen in due:
            if budget <= 0:
                break
            budget -= sum(piece[2] for piece in chosen)
            merges[log_id] = chosen
            sources = {piece[0] for piece in chosen}
            self._merging[log_id] = sources
            self._shrunk |= sources
            for piece in chosen:
                self.counts[piece[0]] = self.counts.get(piece[0], 0) - 1
        return merges

    def carry_out(
        self, plan: Retirement, wal: WalFile | None, *, sync: bool, remove_wal: bool = True
    ) -> Carried:
        """Sidecars and half-void packs rewritten, then the retired WAL file's live packed creates
        (and, step 2, its live packed records, read back from it and coalesced per stream) written
        as its pack and the WAL file removed, then the packs left with nothing live removed.
        With ``remove_wal`` False those removals are left to ``finish`` (called once the loop has
        relocated the extents into the new pack: a reader never finds an extent's file gone).
        Blocking; raises OSError: out of space, the committer keeps the WAL file and carries the
        same plan out again at its next checkpoint (``Committer._carry_out_packs``); otherwise it fails."""
        assert self.directory is not None
        packs = self.directory
        packs.mkdir(exist_ok=True)
        gone = set(plan.remove)
        written: dict[int, tuple[int, int]] = {}
        moved: dict[tuple[int, int], dict[str, list[tuple[int, int, int]]]] = {}
        for created, ids in plan.dead.items():
            if created in gone or created == plan.generation:
                continue
            if created in plan.compact:
                # Rewritten without them (and without what its sidecar says): durable before the
                # WAL file that voids them goes, as a sidecar line would be.
                entries = _live_entries(packs, created, set(ids))
                written[created] = (write_pack(packs, created, entries, sync=sync), len(entries))
                if self.appends:
                    moved[(IN_PACK, created)] = _rows(entries)
            else:
                append_dead(packs, created, ids, sync=sync)
        for created in plan.compact:
            if created in written:  # the rewrite's rename is durable: its sidecar is obsolete
                _unlink(packs / dead_name(created))
        records = 0
        if wal is not None:
            if plan.keep or plan.records:
                entries = list(plan.keep)
                sizes = records_sizes(entries)  # the creates' header records: one each
                # Each stream's records taken straight off its flat extents (``_carry_records``:
                # one read and a join a stream when they are dense, no tuple a record).
                heads = _read_merged(packs, plan.merges)
                _carry_records(wal.fd, plan.records, heads, entries, sizes)
                records = len(entries) - len(plan.keep)
                size = write_pack(packs, plan.generation, entries, sync=sync, sizes=sizes)
                written[plan.generation] = (size, len(entries))
                # Only now (the new pack durable) are the merged entries void in their packs: a
                # crash before leaves both, read once (``survey``: the longer piece is taken).
                merged: dict[int, list[str]] = {}
                for log_id, chosen in plan.merges.items():
                    for g in sorted({piece[0] for piece in chosen}):
                        merged.setdefault(g, []).append(log_id)
                for g, ids in sorted(merged.items()):
                    append_dead(packs, g, ids, sync=sync)
                if self.appends:
                    moved[(IN_WAL, plan.generation)] = _rows(entries, sizes)
            if remove_wal:
                wal.remove()
        if remove_wal:
            self.finish(plan, None)
        return Carried(written, moved, {plan.generation: records} if records else {})

    def finish(self, plan: Retirement, wal: WalFile | None) -> None:
        """The end of ``carry_out(remove_wal=False)``: the WAL file and the packs left with nothing
        live removed. Blocking."""
        assert self.directory is not None
        if wal is not None:
            wal.remove()
        for generation in plan.remove:
            _unlink(self.directory / pack_name(generation))
            _unlink(self.directory / dead_name(generation))
            _unlink(self.directory / packindex.index_name(generation))
        if plan.remove:
            fsync_dir(self.directory)

    def carried_out(self, plan: Retirement, carried: Carried) -> None:
        """On the loop, after ``carry_out``: the books, and (step 2) each live packed stream's
        extents and header offset moved into the packs written."""
        for generation in plan.remove:
            self.kept.pop(generation, None)
            self.entries.pop(generation, None)
        for generation, (size, entries) in carried.written.items():
            self.kept[generation] = size
            self.entries[generation] = entries
        for generation, records in carried.records.items():
            # Live records entries only: a stream dropped or promoted since the plan (its void
            # entries were carried all the same) is not counted, so its entry reads as void.
            live = sum(
                1
                for log_id, rows in carried.moved.get((IN_WAL, generation), {}).items()
                if log_id in self.extents
                for row in rows
                if row[2] > 0
            )
            self.counts[generation] = self.counts.get(generation, 0) + min(records, live)
        for (where, generation), streams in carried.moved.items():
            for log_id, rows in streams.items():
                for offset, _, position in rows:
                    if position == 0 and log_id in self.header_at:
                        self.header_at[log_id] = offset * 2 + IN_PACK
                extents = self.extents.get(log_id)
                if extents is None:
                    continue
                chosen = plan.merges.get(log_id) if where == IN_WAL else None
                if chosen:
                    files = {(IN_PACK, piece[0]) for piece in chosen} | {(IN_WAL, generation)}
                    extents.merge(files, rows, (IN_PACK, generation))
                else:
                    extents.relocate(
                        where, generation, rows, (IN_PACK, generation), known_only=True
                    )
        for log_id in plan.merges:
            self._merging.pop(log_id, None)


def _carry_records(
    fd: int,
    records: dict[str, array],
    heads: dict[str, tuple[int, list[bytes]]],
    entries: list[WalEntry],
    sizes: list[int],
) -> None:
    """Append to ``entries`` (and their records bytes to ``sizes``) the packed records of a retired
    WAL file (``fd``): ``records``, each stream's extents there (``Extents.in_file_flat``), one
    entry a run that follows on (``_carried_entries``), ``heads`` merged in front (step 2c).

    When the records are most of the bytes between the first and the last (a WAL file of small
    packed appends: their entry framing between them), that range is read in one ``pread`` and a
    stream whose records follow each other (every round's one after the last: the usual case)
    takes them as one join of slices made at C speed (``map``), with no Python step a record;
    a checkpoint of 10,000 streams x 10 rounds spent ~1 us a record on dicts, tuples and
    windows (issue 16). Otherwise (sparse records, a stream with a gap) ``_read_ranges`` and
    ``_carried_entries`` do it a record at a time. Raises OSError as ``pread_exact`` does."""
    span = _dense_span(records.values())
    if span is None:
        read = _read_ranges(fd, flat_lengths(records.values()))
        for log_id, flat in records.items():
            _carried_entries(log_id, flat_iter(flat), read, entries, sizes, heads.get(log_id))
        return
    base, end = span
    data = pread_exact(fd, end - base, base)
    take = data.__getitem__
    for log_id, flat in records.items():
        offsets = array("q", map(sub, flat[1::FIELDS], repeat(base)))
        lengths = flat[2::FIELDS]
        positions = flat[3::FIELDS]
        head = heads.get(log_id)
        ahead = [] if head is None else head[1]
        first = positions[0] - sum(map(len, ahead))
        # A stream's extents are in order and never overlap: they follow on if they span their sum.
        spanned = positions[-1] + lengths[-1] - positions[0]
        if spanned != sum(lengths) or (head is not None and head[0] != first):  # a gap
            read = {o + base: take(slice(o, o + n)) for o, n in zip(offsets, lengths, strict=True)}
            _carried_entries(log_id, flat_iter(flat), read, entries, sizes, head)
            continue
        parts = map(take, map(slice, offsets, map(add, offsets, lengths)))
        joined = b"".join([*ahead, *parts])
        entries.append(WalEntry(log_id, 0, first, [joined], Kind.PACKED_RECORDS))
        sizes.append(len(joined))


# ``_dense_span``: the records are read in one ``pread`` of the range from the first to the end of
# the last if that range is at most this many times their bytes (or at most ``_READ_WINDOW``).
_DENSE_FACTOR = 4


def _dense_span(flats: Iterable[array]) -> tuple[int, int] | None:
    """(start, end) of the file range holding every extent of ``flats`` if it is dense enough to
    read whole (``_DENSE_FACTOR``), else None (or None if there are none). C-level sums and
    searches over one array of every extent."""
    every = array("q")
    for flat in flats:
        every.extend(flat)
    offsets = every[1::FIELDS]
    if not offsets:
        return None
    lengths = every[2::FIELDS]
    start, last = min(offsets), max(offsets)
    end = last + lengths[offsets.index(last)]  # extents of a file do not overlap
    if end - start > max(_READ_WINDOW, _DENSE_FACTOR * sum(lengths)):
        return None
    return start, end


def _carried_entries(
    log_id: str,
    rows: Iterable[tuple[int, int, int]],
    read: dict[int, bytes],
    entries: list[WalEntry],
    sizes: list[int],
    head: tuple[int, list[bytes]] | None = None,
) -> None:
    """Append to ``entries`` (and their records bytes to ``sizes``) one stream's packed records of
    a retired WAL file, ``rows`` (offset, length, position) in order, merged where they follow each
    other: what ``coalesce`` makes of one entry per row, without making those entries (a
    ``WalEntry`` per (stream, round) was ~10% of the carry for 10 rounds a stream, issue 16).
    Each entry's records are joined into one bytes: the same bytes in the pack (an entry's records
    are written one after the other under one CRC), one buffer to checksum and write instead of
    one a round (``write_pack``).
    ``head``: (position, records) of the stream's pack extents merged in front of them (step 2c),
    which end where ``rows`` start."""
    records: list[bytes] = []
    first = end = -1
    if head is not None:
        first, records = head[0], list(head[1])
        end = first + sum(map(len, records))
    for offset, length, position in rows:
        if position != end and records:
            entries.append(WalEntry(log_id, 0, first, [b"".join(records)], Kind.PACKED_RECORDS))
            sizes.append(end - first)
            records = []
        if not records:
            first = end = position
        records.append(read[offset])
        end += length
    if records:
        entries.append(WalEntry(log_id, 0, first, [b"".join(records)], Kind.PACKED_RECORDS))
        sizes.append(end - first)


def _read_merged(
    packs: Path, merges: dict[str, list[tuple[int, int, int, int]]]
) -> dict[str, tuple[int, list[bytes]]]:
    """The bytes of the pack extents ``merges`` names (step 2c): stream id -> (position of the
    first, their records in order). Each pack is opened once and read as ``_read_ranges`` reads a
    WAL file. Raises OSError."""
    by_pack: dict[int, dict[int, int]] = {}
    for chosen in merges.values():
        for generation, offset, length, _ in chosen:
            by_pack.setdefault(generation, {})[offset] = length
    read: dict[tuple[int, int], bytes] = {}
    for generation, lengths in by_pack.items():
        fd = os.open(packs / pack_name(generation), os.O_RDONLY | _O_CLOEXEC)
        try:
            for offset, data in _read_ranges(fd, lengths).items():
                read[(generation, offset)] = data
        finally:
            os.close(fd)
    return {
        log_id: (chosen[0][3], [read[(piece[0], piece[1])] for piece in chosen])
        for log_id, chosen in merges.items()
    }


# ``_read_ranges``: ranges of a WAL file closer than this are read in one ``pread``, up to a window
# of ``_READ_WINDOW`` bytes (the other streams' records between them are read and dropped).
_READ_GAP = 16 << 10
_READ_WINDOW = 1 << 20


def _read_ranges(fd: int, lengths: dict[int, int]) -> dict[int, bytes]:
    """The bytes of every range (file offset -> length) of ``lengths`` in file ``fd``, by offset.

    A checkpoint carries every live packed record of its WAL file; one ``pread`` each was a syscall
    per (stream, round) (issue 16: 100,000 for a routed save). The ranges are read in file order,
    nearby ones in one read of at most ``_READ_WINDOW`` bytes, each a copy of its part of the window
    (bytes, as a ``pread`` gives: a memoryview slice is an object the garbage collector tracks, and
    10,000 of them a checkpoint made a collection every other one). Offsets are sorted as ints, not
    (offset, length) tuples: no object per range the collector tracks.
    Raises OSError as ``pread_exact`` does (a short read: the file shrank)."""
    offsets = sorted(lengths)
    out: dict[int, bytes] = {}
    n = len(offsets)
    i = 0
    while i < n:
        start = offsets[i]
        end = start + lengths[start]
        limit = start + _READ_WINDOW
        j = i + 1
        while j < n:
            offset = offsets[j]
            stop = offset + lengths[offset]
            if offset - end > _READ_GAP or stop > limit:
                break
            if stop > end:
                end = stop
            j += 1
        window = pread_exact(fd, end - start, start)
        for offset in offsets[i:j]:
            at = offset - start
            out[offset] = window[at : at + lengths[offset]]
        i = j
    return out


def _rows(
    entries: list[WalEntry], sizes: list[int] | None = None
) -> dict[str, list[tuple[int, int, int]]]:
    """Where each stream's entries of a pack written from ``entries`` have their records: id ->
    [(file offset, length, position)]. ``sizes``: each entry's records bytes, if known."""
    if sizes is None:
        sizes = records_sizes(entries)
    out: dict[str, list[tuple[int, int, int]]] = {}
    for entry, at, length in zip(
        entries, records_offsets(entries, sizes=sizes), sizes, strict=True
    ):
        out.setdefault(entry.log_id, []).append((at, length, entry.offset))
    return out
