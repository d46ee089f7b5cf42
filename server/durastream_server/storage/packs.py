"""Packed creates (decision 0010, step 1): a new empty stream is one WAL entry, not a directory.

A create with no initial data that is not a fork writes a *packed* entry (``wal.Kind.PACKED``: the
stream's header record) into the commit round's WAL file and nothing else: no directory, no segment file,
no fd, no catalog line. The stream is *promoted* to a directory of its own (today's layout) by its first
write (``promotion.py``): a CREATE entry and the write's records in one round.

Retention. A WAL file that still holds a *live* packed create is not removed at its checkpoint: it is
renamed into ``packs/<generation>.pack`` (its content is already synced). A packed create stops being live
when its stream is deleted (a DROP entry) or promoted (a CREATE entry whose directory the checkpoint of
that entry's WAL file has synced). When the last one of a pack stops being live, the pack is removed: the
disk used by packs is bounded by the live packed streams (reported by ``/healthz`` and ``inspect``).

The ordering trap: the WAL file that holds a DROP (or the promoting CREATE) may be retired long before the
pack that holds the original create, and the pack must not bring the stream back after a restart. So
each pack has a sidecar, ``packs/<generation>.dead``: the ids of its packed creates that are void. The
checkpoint that retires a WAL file appends to the sidecars the ids that file's DROP and promoting CREATE
entries made void, syncs them, and only then removes (or renames) the file. A sidecar line is written
only for a pack that is kept; a torn last line (power loss mid-append) belongs to a checkpoint that did
not finish, whose WAL file is still there to say the same.

Start-up (``settle``, called by the WAL replay once segments are repaired): every pack and WAL file is
scanned, entry headers only; a packed create is live unless its sidecar names it, a DROP in any file
names it, or ``streams/`` has its directory (the promotion's CREATE entry was replayed). No directory is
made. What the WAL files' entries made void is written to the sidecars of the packs kept, WAL files with
live packed creates move into ``packs/`` (cut at their last whole entry: a torn end is an unacknowledged
round), and packs with none are removed. A damaged entry in the middle of a pack is skipped and logged
with its byte range; the entries after it are read (hazard 32).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from durastream_server.storage import codec
from durastream_server.storage.files import fsync_dir
from durastream_server.storage.records import StreamHeader
from durastream_server.storage.wal import (
    WAL_DIR,
    Kind,
    Scan,
    WalFile,
    generations,
    scan,
    wal_name,
)

log = logging.getLogger(__name__)

PACKS_DIR = "packs"
_PACK_RE = re.compile(r"\A(\d{20})\.pack\Z")
_ID_RE = re.compile(rb"\A[0-9a-f]{32}\Z")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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


def header_path(data: bytes) -> str:
    """The path a packed entry's header record names, without decoding the rest of it: start-up
    needs only the path of 100,000 packed streams (their pending hints), and the full decode cost
    ~55 us each (its field checks); the header is decoded and checked when the stream is recovered.
    Raises ``codec.CorruptRecord``."""
    try:
        path = json.loads(data[codec.FRAME_SIZE :])["path"]
    except (ValueError, TypeError, KeyError) as exc:
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


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ------------------------------------------------------------------------------------------ start-up


@dataclass(slots=True)
class Settled:
    """The packed streams a start-up found live: id -> (generation of the file holding its create,
    its header record), and the packs kept (generation -> bytes)."""

    live: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    kept: dict[int, int] = field(default_factory=dict)
    damaged: int = 0  # damaged byte ranges skipped in packs


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


def survey(root: Path, wal_scans: list[tuple[int, Scan]]) -> Survey:
    """Read every pack (with resync) and its sidecar; decide which packed creates are live."""
    packs = root / PACKS_DIR
    pack_scans: list[tuple[int, Scan]] = []
    void: dict[int, set[str]] = {}
    damaged = []
    for generation in pack_generations(packs) if packs.is_dir() else []:
        scanned = scan(packs / pack_name(generation), generation, resync=True)
        damaged += [(packs / pack_name(generation), a, b) for a, b in scanned.damaged]
        pack_scans.append((generation, scanned))
        void[generation] = read_dead(packs, generation)
    created: dict[str, tuple[int, bytes]] = {}
    dropped: set[str] = set()
    for generation, scanned in sorted(pack_scans + wal_scans, key=lambda found: found[0]):
        for log_id, _segment, _offset, records, kind in scanned.entries:
            if kind == Kind.PACKED:
                created[log_id] = (generation, records)
            elif kind == Kind.DROP:
                dropped.add(log_id)
    present = set(os.listdir(root / "streams")) if created else set()
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
    return Survey(live, counts, newly_void, pack_scans, damaged)


def wal_scans(root: Path) -> list[tuple[int, Scan]]:
    """The WAL files left behind, scanned (for ``check``, which replays nothing)."""
    directory = root / WAL_DIR
    if not directory.is_dir():
        return []
    return [(g, scan(directory / wal_name(g), g)) for g in generations(directory)]


def settle(root: Path, wal_scans: list[tuple[int, Scan]], *, sync: bool, out: Settled) -> set[int]:
    """See the module docstring. Fills ``out``; returns the WAL generations moved into ``packs/``
    (the replay removes the others)."""
    packs = root / PACKS_DIR
    packs.mkdir(exist_ok=True)
    found = survey(root, wal_scans)
    for path, start, end in found.damaged:
        out.damaged += 1
        log.error(
            "pack %s: bytes %d-%d are damaged and were skipped (a packed stream created there is "
            "lost; the entries after them are read)",
            path,
            start,
            end,
        )
    out.live = found.live
    counts = found.counts
    # The sidecars first: the WAL files whose DROPs (or replayed CREATEs) say so are removed next.
    for generation, ids in found.newly_void.items():
        if counts.get(generation):
            append_dead(packs, generation, ids, sync=sync)
    moved = set()
    wal_dir = root / WAL_DIR
    for generation, scanned in wal_scans:
        if counts.get(generation):
            source = wal_dir / wal_name(generation)
            os.truncate(source, scanned.end)  # a torn end: an unacknowledged round
            if sync:
                fd = os.open(source, os.O_RDONLY | _O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.rename(source, packs / pack_name(generation))
            moved.add(generation)
    for generation, _ in found.pack_scans:
        if not counts.get(generation):
            _unlink(packs / pack_name(generation))
            _unlink(packs / dead_name(generation))
    for generation in counts:
        out.kept[generation] = os.stat(packs / pack_name(generation)).st_size
    if sync and (moved or len(found.pack_scans) != len(out.kept)):
        fsync_dir(packs)
    return moved


# ------------------------------------------------------------------------------------------- serving


@dataclass(slots=True)
class Retirement:
    """What a checkpoint does to the packs once the segments of ``generation`` are synced
    (planned on the loop by ``PackBook.plan``, carried out on the I/O pool by ``PackBook.carry_out``)."""

    generation: int
    dead: dict[int, list[str]]  # pack generation -> ids void from now on
    keep: bool  # the retired WAL file holds live packed creates: it becomes a pack
    remove: list[int]  # packs with no live packed create left


class PackBook:
    """Which packed creates are live and in which file (WAL file or pack), for the committer.

    ``live``: stream id -> generation of the file holding its packed create. ``counts``: generation ->
    live packed creates in it. ``kept``: generation -> bytes of each file in ``packs/``. Everything but
    ``carry_out`` runs on the loop."""

    def __init__(self, root: Path | None) -> None:
        self.directory = root / PACKS_DIR if root is not None else None
        self.live: dict[str, int] = {}
        self.counts: dict[int, int] = {}
        self.kept: dict[int, int] = {}
        # WAL generation -> (id, generation of its packed create) void once that WAL file's
        # checkpoint has synced the promotion's directory (or just for a DROP).
        self._dying: dict[int, list[tuple[str, int]]] = {}

    def load(self, settled: Settled) -> None:
        for log_id, (generation, _) in settled.live.items():
            self.live[log_id] = generation
            self.counts[generation] = self.counts.get(generation, 0) + 1
        self.kept = dict(settled.kept)

    @property
    def disk_bytes(self) -> int:
        return sum(self.kept.values())

    def is_packed(self, log_id: str) -> bool:
        return log_id in self.live

    def created(self, log_id: str, generation: int) -> None:
        self.live[log_id] = generation
        self.counts[generation] = self.counts.get(generation, 0) + 1

    def superseded(self, log_id: str, generation: int) -> None:
        """A DROP or a promoting CREATE of ``log_id`` is durable in WAL ``generation``."""
        created = self.live.pop(log_id, None)
        if created is not None:
            self._dying.setdefault(generation, []).append((log_id, created))

    def void_now(self, log_id: str) -> None:
        """Without a WAL (``--durability none`` over a data directory written with fsync): write
        ``log_id`` into its pack's sidecar at once, unsynced. Blocking; the caller then ``forget``s."""
        created = self.live.get(log_id)
        if created is not None and self.directory is not None and created in self.kept:
            append_dead(self.directory, created, [log_id], sync=False)

    def forget(self, log_id: str) -> None:
        """On the loop, after ``void_now``."""
        created = self.live.pop(log_id, None)
        if created is not None:
            self.counts[created] -= 1

    def plan(self, generation: int) -> Retirement:
        dead: dict[int, list[str]] = {}
        for log_id, created in self._dying.pop(generation, []):
            dead.setdefault(created, []).append(log_id)
            self.counts[created] -= 1
        keep = self.counts.get(generation, 0) > 0
        remove = [g for g in self.kept if not self.counts.get(g)]
        for g in [g for g, n in self.counts.items() if not n and g <= generation]:
            del self.counts[g]
        return Retirement(generation, dead, keep, remove)

    def carry_out(self, plan: Retirement, wal: WalFile | None, *, sync: bool) -> int | None:
        """Sidecars, then the retired WAL file kept as a pack (its size returned) or removed, then
        the packs left with nothing live. Blocking; raises OSError (the committer then fails)."""
        assert self.directory is not None
        packs = self.directory
        packs.mkdir(exist_ok=True)
        gone = set(plan.remove)
        for created, ids in plan.dead.items():
            if created in gone or (created == plan.generation and not plan.keep):
                continue
            append_dead(packs, created, ids, sync=sync)
        size = None
        if wal is not None:
            if plan.keep:
                wal.close()
                target = packs / pack_name(plan.generation)
                os.rename(wal.path, target)
                size = os.stat(target).st_size
                if sync:
                    fsync_dir(packs)
                    fsync_dir(wal.directory)
            else:
                wal.remove()
        for generation in plan.remove:
            _unlink(packs / pack_name(generation))
            _unlink(packs / dead_name(generation))
        if plan.remove and sync:
            fsync_dir(packs)
        return size

    def carried_out(self, plan: Retirement, size: int | None) -> None:
        """On the loop, after ``carry_out``."""
        for generation in plan.remove:
            self.kept.pop(generation, None)
        if size is not None:
            self.kept[plan.generation] = size
