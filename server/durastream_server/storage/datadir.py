"""The data directory: lock, stream directories, atomic create and delete.

``<data-dir>/``
  ``FEATURES``     on-disk features beyond the base format (``features.py``); a server refuses to start
                   on a directory naming one it does not read.
  ``LOCK``         held with ``fcntl.flock`` for the server's lifetime: a second server refuses to start.
  ``streams/``     one directory per stream incarnation, named by a fresh unique id (never derived from the
                   path, so any UTF-8 path is safe and ``a/b`` never meets ``a%2Fb``). The path lives in the
                   header record.
  ``staging/``     with ``--durability none``, a new stream is built here (header + initial data) and
                   renamed into ``streams/`` only when complete, so a failed or crashed create leaves no
                   stream (hazard 20). With fsync durability a create rides a shared commit round
                   instead (``committer.py``): its first segment is synced in the WAL, then its directory
                   is made in ``streams/`` unsynced; a restart's WAL replay makes again whatever of it
                   did not reach the disk, so a stream is there whole or not at all (hazard 20).
  ``trash/``       delete renames a stream directory here (atomic), then removes it in the background.
  ``meta/``        other components' durable files (e.g. subscriptions), via ``meta_path()``.
  ``quarantine/``  streams set aside because they cannot be served (``quarantine.py``), never deleted.
  ``catalog``      path and fork source of each stream directory, a hint that spares start-up opening
                   every directory (``catalog.py``).
  ``wal/``         the write-ahead log of the shared commit rounds (``wal.py``, ``committer.py``); empty
                   after a clean shutdown, replayed into the segment files at start-up otherwise.
  ``packs/``       the live packed creates of retired WAL files, one pack per WAL file (``packs.py``): with fsync
                   durability a new stream without initial data that is not a fork has no directory
                   until its first write (decision 0010).

Recovery (``open``): truncate a torn tail to the last valid record before anything is appended (hazard 18);
a checksum failure *followed by valid data* is mid-file corruption: the stream is quarantined
(``quarantine()``: moved into ``quarantine/``, its path reserved in ``corrupt``), never served, never reset
to offset 0 (hazard 32). One stream that cannot be recovered never stops the others from being served.
Empty ``staging/`` and ``trash/``.

``open(lazy=True)`` (the server) only plans recovery: it lists ``streams/``, reads the catalog and leaves
every stream in ``pending`` (``pending.py``) for ``recover`` to recover unit by unit, in the background
or first for the path a request names (``engine/recovery.py``). ``open()`` recovers everything at once.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import logging
import os
import random
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from durastream_server import errors
from durastream_server.storage import catalog, codec, features
from durastream_server.storage.committer import PACKED_APPEND_BYTES, Committer
from durastream_server.storage.extents import Extents
from durastream_server.storage.files import (
    FdCache,
    Handle,
    fsync_dir,
    is_out_of_space,
    write_file,
)
from durastream_server.storage.index import LogIndex, SparseIndex
from durastream_server.storage.log import LogContext, StreamLog
from durastream_server.storage.metrics import NO_METRICS, WriteMetrics
from durastream_server.storage.packs import PACKS_DIR, decode_header_frame, fold_packed, header_path
from durastream_server.storage.packview import PackFiles
from durastream_server.storage.pending import Pending, plan
from durastream_server.storage.promotion import make_first_segment
from durastream_server.storage.quarantine import QuarantinedStream, free_name, set_aside
from durastream_server.storage.quarantine import load as load_quarantine
from durastream_server.storage.records import AppendEntry, StreamHeader
from durastream_server.storage.recovery import Quarantine, Recovered, read_headers, recover_batch
from durastream_server.storage.scans import ScanBatcher
from durastream_server.storage.segments import SegmentTable, segment_name
from durastream_server.storage.state import StreamState, apply_entry
from durastream_server.storage.wal import WAL_DIR
from durastream_server.storage.wal import replay as replay_wal

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# A clean shutdown snapshots a log only if start-up would otherwise replay at least this much.
_CLOSE_SNAPSHOT_BYTES = 256 * 1024
_CLOSE_SNAPSHOT_ENTRIES = 256
# Streams recovered per call on the I/O pool at start-up (recovery.recover_batch).
_RECOVERY_BATCH = 256
# The largest body a packed create carries (``DataDir.packed_data_bytes``).
_PACKED_DATA_BYTES = 64 << 10


class Durability(str, Enum):
    """When an append is acknowledged."""

    FSYNC = "fsync"  # after fdatasync of the segment (default)
    NONE = "none"  # after write(2) only: survives a process crash, not a power loss


# A stream's segment files roll at this size; also the largest ``--packed-threshold`` (a packed
# stream's virtual segment 0 is never rolled).
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StorageConfig:
    root: Path
    durability: Durability = Durability.FSYNC
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    index_interval_bytes: int = 64 * 1024  # one sparse-index entry per this many segment bytes
    snapshot_interval_entries: int = 4096
    io_threads: int = 16  # worker threads for write+fsync, creates, deletes and recovery
    read_threads: int = 16  # worker threads for reads (separate, so reads never delay commits)
    max_open_files: int = 512  # soft bound on cached segment fds (in-use fds are never closed)
    # Decision 0010 step 2 (``--packed-appends``, off by default): small appends of packed streams
    # become packed records (WAL kind 5), carried into packs at checkpoints; writes the format
    # marker (``features.py``) first. (Packed records found at start-up are read and adopted
    # whatever this says.)
    packed_appends: bool = False
    # ``--packed-threshold``: a packed stream whose virtual segment 0 would pass this many bytes is
    # promoted to its own directory (capped by ``segment_bytes``: segment 0 is never rolled).
    packed_threshold: int = PACKED_APPEND_BYTES
    # How long ``open`` waits for the directory's lock when another process holds it (0: refuse at
    # once, hazard 24). A worker of ``--workers N`` waits: after its parent is SIGKILLed, the last
    # generation's workers (SIGTERMed by the kernel) hold their shards' locks until their graceful
    # shutdown ends, and a parent started again at once would otherwise fail to start.
    lock_wait_seconds: float = 0.0


class AlreadyLocked(RuntimeError):
    """Another server holds the data directory."""


# The ids' random half: drawn from a generator seeded once per process by the OS (reading the OS's
# random source for each create cost ~30 us here). Ids need to be unique, not unguessable.
_ID_BITS = random.Random(secrets.randbits(128))


def new_storage_id() -> str:
    """Unique per incarnation and time-ordered (sorts by creation), never derived from the path."""
    return f"{time.time_ns():016x}{_ID_BITS.getrandbits(64):016x}"


class DataDir:
    """Owns the data directory for the server's lifetime.

    ``logs``: storage id -> log, every recovered or created incarnation (incl. soft-deleted).
    ``quarantined``: entry name under ``quarantine/`` -> what was set aside there and why.
    ``corrupt``: stream path -> reason, the paths of quarantined streams (reserved: never served,
    never re-created empty). A stream whose header is unreadable has no known path.
    ``with_staging``: ids of the logs recovered with a ``txn/`` directory (staged appends to load), so
    start-up looks at those only, not at every stream's directory.
    ``pending``: the stream directories not recovered yet (``open(lazy=True)``; ``recover``).
    """

    logs: dict[str, StreamLog]
    quarantined: dict[str, QuarantinedStream]
    corrupt: dict[str, str]
    with_staging: set[str]

    def __init__(
        self, config: StorageConfig, lock_fd: int, metrics: WriteMetrics = NO_METRICS
    ) -> None:
        self.config = config
        self.root = Path(config.root)
        self.logs = {}
        self.quarantined = {}
        self.corrupt = {}
        self.with_staging = set()
        self.pending = Pending()
        # Packed streams found at start-up, not recovered yet: id -> header record (``packs.py``).
        self._packed_boot: dict[str, bytes] = {}
        # Those of them with packed records (decision 0010 step 2): id -> where their bytes are; and
        # the ids whose records stop at a gap (a damaged pack entry): never served as if whole.
        self._packed_extents: dict[str, Extents] = {}
        self._packed_gaps: set[str] = set()
        self._pack_files = PackFiles(self.root)
        self._streams = sys.intern(str(self.root / "streams"))  # shared by every SegmentTable
        self._catalog: catalog.Catalog | None = None
        self._lock_fd = lock_fd
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, config.io_threads), thread_name_prefix="durastream-io"
        )
        self._read_executor = ThreadPoolExecutor(
            max_workers=max(1, config.read_threads), thread_name_prefix="durastream-read"
        )
        cache = FdCache(config.max_open_files)
        sync = config.durability == Durability.FSYNC
        self._committer = Committer(
            cache,
            self._executor,
            self._dir(WAL_DIR) if sync else None,
            metrics,
            self._catalog_made,
            self.root,
        )
        # Decision 0010 step 2: packed records (needs the WAL; the marker is written at start-up).
        self._committer.packed_appends = config.packed_appends and sync
        self._committer.packs.appends = config.packed_appends and sync
        self._committer.packed_threshold = config.packed_threshold
        self._ctx = LogContext(
            executor=self._executor,
            read_executor=self._read_executor,
            cache=cache,
            segment_bytes=max(1, config.segment_bytes),
            snapshot_interval_entries=max(1, config.snapshot_interval_entries),
            sync=sync,
            committer=self._committer,
            scans=ScanBatcher(self._read_executor),
            metrics=metrics,
            pack_files=self._pack_files,
        )
        self._committer.pack_files = self._pack_files
        self._background: set[asyncio.Future[None]] = set()
        self._closed = False

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The shared I/O thread pool (other components may use it for their own blocking file work)."""
        return self._executor

    @property
    def read_executor(self) -> ThreadPoolExecutor:
        """The readers' thread pool: reads, and the per-message work of rendering what they return."""
        return self._read_executor

    def _dir(self, name: str) -> Path:
        return self.root / name

    # ------------------------------------------------------------------------------------------- open

    @classmethod
    async def open(
        cls, config: StorageConfig, metrics: WriteMetrics = NO_METRICS, *, lazy: bool = False
    ) -> DataDir:
        """Lock, recover every stream (snapshot + replay), return. Raises ``AlreadyLocked``.
        ``metrics`` hears of every group commit and fsync (``storage/metrics.py``). ``lazy``: recover
        nothing yet, leave every stream in ``pending`` for ``recover``."""
        root = Path(config.root)
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = await _lock_waiting(root, config.lock_wait_seconds)
        try:
            self = cls(config, lock_fd, metrics)
        except BaseException:
            os.close(lock_fd)
            raise
        try:
            # Before anything is read: refuse a directory written with a feature we do not read, and
            # name packed records before any can be written (``features.py``).
            await self._run(features.require_known, root)
            if config.packed_appends:
                # Packed creates with data (``create_packed_soon``) are written only with packed
                # appends on: their header extent is the one packed records use.
                await self._run(
                    features.mark,
                    root,
                    features.PACKED_RECORDS,
                    features.PACKED_CREATE_DATA,
                    sync=self._ctx.sync,
                )
            await self._run(self._prepare_dirs)
            # Before any stream is read: put back what the write-ahead log holds (wal.py).
            report = await self._run(
                replay_wal, root, sync=self._ctx.sync, headers=self._committer.packed_appends
            )
            self._committer.generation = report.next_generation
            settled = report.packed
            self._committer.packs.load(settled)
            self._packed_boot = {i: frame for i, (_, frame) in settled.live.items()}
            self._packed_extents = settled.extents
            self._packed_gaps = set(settled.gaps)
            for log_id, path in settled.lost.items():
                # Its packed create is a damaged entry that its pack's index names: its path is
                # reserved, never made anew or served (decision 0010, "Step 2: the pack index").
                self._quarantine_packed(
                    log_id, path, "its packed create is a damaged pack entry (see `check`)"
                )
            if report.files:
                log.info(
                    "data dir %s: write-ahead log replayed (%d files, %d entries, %d written back; "
                    "%d creates, %d streams made again)",
                    root,
                    report.files,
                    report.entries,
                    report.repaired,
                    report.creates,
                    report.made,
                )
            await self._plan_recovery()
            if not lazy:
                await self._recover_everything()
        except BaseException:
            if self._catalog is not None:
                self._catalog.close()
            self._executor.shutdown(wait=True)
            self._read_executor.shutdown(wait=True)
            os.close(lock_fd)
            raise
        log.info(
            "data dir %s: %d streams recovered, %d to recover, %d quarantined (in %s)",
            root,
            len(self.logs),
            len(self.pending),
            len(self.quarantined),
            self._dir("quarantine"),
        )
        return self

    def _prepare_dirs(self) -> None:
        for name in ("streams", "staging", "trash", "meta", "quarantine"):
            self._dir(name).mkdir(exist_ok=True)
        for name in ("staging", "trash"):
            scratch = self._dir(name)
            for entry in os.listdir(scratch):
                _remove(scratch / entry)
        if self._ctx.sync:
            fsync_dir(self.root)

    async def _plan_recovery(self) -> None:
        """Quarantine records, the catalog, ``streams/``'s listing: the units to recover (``pending``).
        Opens only the directories the catalog does not name (for their header)."""
        for entry in await self._run(load_quarantine, self.root):
            self._note_quarantined(entry)
        if self.quarantined:
            log.warning(
                "data dir %s: %d streams remain quarantined from earlier start-ups (see /healthz)",
                self.root,
                len(self.quarantined),
            )
        streams = str(self._dir("streams"))
        listed, loaded = await asyncio.gather(
            self._run(_sorted_listing, streams), self._run(catalog.load, self.root)
        )
        ids, hints = listed, loaded.entries
        unnamed = [i for i in ids if i not in hints]
        packed = self._packed_boot
        if packed:
            # Packed streams (no directory, no catalog line): the path from the header they carry.
            for log_id, frame in list(packed.items()):
                try:
                    hints[log_id] = catalog.Entry(header_path(frame), None)
                except codec.CorruptRecord as exc:
                    log.error("packed stream %s cannot be served: %s", log_id, exc)
                    del packed[log_id]
            ids = sorted([*ids, *packed])
        if unnamed:
            log.info("data dir %s: reading the headers of %d streams", self.root, len(unnamed))
            batches = _batches(unnamed)
            for batch, headers in zip(
                batches,
                await asyncio.gather(*(self._run(read_headers, streams, b) for b in batches)),
                strict=True,
            ):
                for log_id, header in zip(batch, headers, strict=True):
                    if header is not None:
                        hints[log_id] = catalog.Entry(header.path, header.fork_source_id)
        self.pending = await self._run(plan, ids, hints)
        self._catalog = await self._run(catalog.Catalog, self.root)
        lines = {i: e for i, e in self.pending.hints.items() if i not in packed}
        if unnamed or loaded.lines != len(lines):
            # Lines of streams that are gone, damaged or missing ones: rewritten once serving.
            rewrite = asyncio.get_running_loop().run_in_executor(
                self._executor, self._catalog.rewrite, lines
            )
            self._background.add(rewrite)
            rewrite.add_done_callback(self._background.discard)

    async def _recover_everything(self) -> None:
        await asyncio.gather(*(self.recover(batch) for batch in _batches(self.pending.order)))
        self.pending.clear()

    async def recover(self, ids: list[str]) -> list[StreamLog]:
        """Recover the stream directories ``ids`` (pending ones) on the I/O pool: the logs recovered,
        now in ``logs``; those that cannot be are quarantined (their catalog path reserved when the
        header itself is lost). The caller marks their units recovered (``pending.recovered``)."""
        adopted: list[StreamLog] = []
        packed = [i for i in ids if i in self._packed_boot]
        if packed:
            ids = [i for i in ids if i not in self._packed_boot]
            with_records = [i for i in packed if i in self._packed_extents]
            if with_records:
                packed = [i for i in packed if i not in self._packed_extents]
                adopted += await self._adopt_packed_records(with_records)
            for log_id in packed:
                frame = self._packed_boot.pop(log_id)
                if log_id in self._packed_gaps:  # its only records entry is damaged (pack index)
                    hint = self.pending.hints.get(log_id)
                    self._quarantine_packed(
                        log_id,
                        hint.path if hint else None,
                        "a damaged pack entry holds its records (named by the pack's index; "
                        "see `check`)",
                    )
                    continue
                try:
                    header = decode_header_frame(frame)
                except codec.CorruptRecord as exc:  # its WAL entry checked out: a bug, not damage
                    hint = self.pending.hints.get(log_id)
                    self.quarantine(log_id, hint.path if hint else None, str(exc))
                    continue
                adopted.append(self._packed_log(log_id, header, len(frame)))
        streams = str(self._dir("streams"))
        interval = self.config.index_interval_bytes
        results = await self._run(recover_batch, streams, ids, interval, sync=self._ctx.sync)
        for log_id, result in zip(ids, results, strict=True):
            if isinstance(result, Quarantine):
                hint = self.pending.hints.get(log_id)
                path = result.path if result.path is not None or hint is None else hint.path
                self.quarantine(log_id, path, result.reason)
            else:
                adopted.append(self._adopt(result))
        return adopted

    async def _adopt_packed_records(self, ids: list[str]) -> list[StreamLog]:
        """Packed streams with records found at start-up (decision 0010 step 2): their virtual
        segment 0 read through their extents and folded (``recovery.recover_packed``) on the I/O
        pool, as a directory is recovered; no directory is made. A stream whose records stop at a gap
        or do not fold is quarantined where it is (``_quarantine_packed``), never served cut short."""
        items = []
        for log_id in ids:
            self._packed_boot.pop(log_id, None)
            items.append((log_id, self._packed_extents.pop(log_id)))
        interval = self.config.index_interval_bytes
        results = await self._run(fold_packed, self.root, items, interval)
        adopted = []
        for (log_id, extents), result in zip(items, results, strict=True):
            hint = self.pending.hints.get(log_id)
            if isinstance(result, Quarantine):
                path = result.path if result.path is not None or hint is None else hint.path
                self._quarantine_packed(log_id, path, result.reason)
                continue
            if log_id in self._packed_gaps:
                self._quarantine_packed(
                    log_id,
                    result.header.path,
                    f"its records stop at a gap or a damaged pack entry (its readable records end "
                    f"at byte {extents.end} of its virtual segment; see the start-up log and "
                    "`check`)",
                )
                continue
            stream = self._adopt(result, os.path.join(self._streams, log_id))
            stream.packed = True
            stream.extents = extents
            # The pack book tracks the same object: a checkpoint relocates it, a drop or promotion
            # voids its records entries (decision 0010 step 2, piece 3).
            self._committer.packs.adopt(log_id, extents)
            adopted.append(stream)
        return adopted

    def _quarantine_packed(self, log_id: str, path: str | None, reason: str) -> None:
        """Stop serving a packed stream that cannot be served whole (hazard 32): its path reserved,
        reported by ``/healthz``; its entries stay in ``packs/`` untouched (no DROP: an operator may
        still read them), so each start-up finds and quarantines it again."""
        self._packed_gaps.discard(log_id)
        entry = QuarantinedStream(
            name=free_name(set(self.quarantined), log_id),
            id=log_id,
            path=path,
            reason=f"packed stream left in {PACKS_DIR}/: {reason}",
            at_ms=int(time.time() * 1000),
        )
        self._note_quarantined(entry)
        log.error("packed stream %r (storage id %s) quarantined: %s", path, log_id, reason)

    def correct_catalog(self, log_id: str, path: str, source_id: str | None) -> None:
        """Record what a stream's header says, where the catalog said otherwise (one line)."""
        if self._catalog is not None:
            self._catalog.add(log_id, catalog.Entry(path, source_id))

    def _adopt(self, result: Recovered, directory: str | None = None) -> StreamLog:
        stream = StreamLog(
            self._ctx,
            result.log_id,
            result.header,
            result.state,
            SegmentTable(directory or result.directory, result.log_id, result.bases),
            result.index,
            result.file_end,
            result.last_record,
        )
        stream._snapshot_entries = result.snapshot_entries
        stream._snapshot_end = result.snapshot_end
        self.logs[result.log_id] = stream
        if result.has_staging:
            self.with_staging.add(result.log_id)
        return stream

    # ------------------------------------------------------------------------------------- quarantine

    def quarantine(self, storage_id: str, path: str | None, reason: str) -> asyncio.Future[None]:
        """Stop serving a stream and set its directory aside, whoever found it unusable (recovery, or
        the engine at start-up). Takes effect at once: the log is forgotten, its path reserved and
        the event logged (once, with the path and the reason). The directory moves to
        ``quarantine/`` on the I/O pool; the returned future is done when it has (``close`` waits
        for it too). It never raises: a move that fails is logged, and the next start-up finds the
        stream where it was and quarantines it again.
        """
        stream = self.logs.pop(storage_id, None)
        if stream is not None:
            stream._closed = True  # nothing was staged: it was never served
            stream._forget_files()
        entry = QuarantinedStream(
            name=free_name(set(self.quarantined), storage_id),
            id=storage_id,
            path=path,
            reason=reason,
            at_ms=int(time.time() * 1000),
        )
        self._note_quarantined(entry)
        log.error(
            "stream %r (storage id %s) quarantined: %s; moving it to %s",
            path,
            storage_id,
            reason,
            self.root / entry.location,
        )
        source = self._dir("streams") / storage_id
        move = asyncio.ensure_future(self._move_aside(source, entry))
        self._background.add(move)
        move.add_done_callback(self._background.discard)
        return move

    def _note_quarantined(self, entry: QuarantinedStream) -> None:
        self.quarantined[entry.name] = entry
        if entry.path is not None:
            self.corrupt[entry.path] = entry.reason

    async def _move_aside(self, source: Path, entry: QuarantinedStream) -> None:
        try:
            await self._committer.drop(entry.id)  # (a stream created by this process: never so far)
        except OSError as exc:
            log.error("could not record that %s is set aside: %s", source, exc)
            return
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._set_aside, source, entry
        )

    def _set_aside(self, source: Path, entry: QuarantinedStream) -> None:
        try:
            set_aside(self.root, source, entry, sync=self._ctx.sync)
        except OSError as exc:
            log.error("could not move quarantined %s to %s: %s", source, entry.location, exc)

    # ----------------------------------------------------------------------------------------- create

    async def create_stream(self, header: StreamHeader, initial: AppendEntry | None) -> StreamLog:
        """Atomically create a new incarnation with its header and optional initial entry, durable.

        Raises ``ValueError`` if ``initial`` does not start at ``header.fork_position``, and
        ``StorageFailure``/``InsufficientStorage`` on I/O errors (nothing is left behind then).
        """
        self._check_open()
        source = self.logs.get(header.fork_source_id or "")
        if source is not None and source.packed and (source.extents is not None or source._busy):
            # A fork reads its source's files: a source with packed records (decision 0010 step
            # 2) gets its directory first, in a round of its own.
            await source.ensure_directory()
        state = StreamState(
            tail=header.fork_position, last_timestamp_ms=header.append_time_floor_ms
        )
        if initial is not None:
            apply_entry(state, initial)
        log_id = new_storage_id()
        header_frame = codec.encode_header(header)
        initial_frame = codec.encode_append(initial) if initial is not None else None
        entry = catalog.Entry(header.path, header.fork_source_id)
        # Packed (decision 0010): no directory until its first write. Forks read their source's
        # files and creates with data write some: both keep today's path.
        packed = self._ctx.sync and initial is None and header.fork_source_id is None
        try:
            if self._ctx.sync:  # one shared WAL sync for every create in flight (committer.py)
                creation = _NewStream(self, log_id, entry, header_frame, initial_frame, packed)
                await self._committer.create(creation)
                directory = None  # streams/<log_id>: ``_new_log`` makes its table from the id
            else:
                directory = await self._run(
                    self._build_stream, log_id, entry, header_frame, initial_frame
                )
        except OSError as exc:
            raise _create_failed(header.path, exc) from exc
        stream = self._new_log(
            log_id,
            header,
            state,
            directory,
            len(header_frame),
            initial,
            len(initial_frame) if initial_frame is not None else 0,
        )
        stream.packed = packed
        return stream

    def can_create_packed(self) -> bool:
        """Whether a create with no data that is not a fork is a packed create (``create_stream``),
        which ``create_packed_soon`` can start without a coroutine: with a WAL (fsync durability)."""
        return self._ctx.sync and not self._closed

    @property
    def packed_data_bytes(self) -> int:
        """The largest initial data (a ``PUT``'s body) that ``create_packed_soon`` takes: 0 without
        packed appends (its stream's bytes are then read through the extent packed records use),
        else a packed stream's threshold (``--packed-threshold``), at most 64 KiB (a body the
        engine splits on the loop, as ``jsonmode.split_messages_offloaded`` does)."""
        committer = self._committer
        if not committer.packed_appends or not self._ctx.sync:
            return 0
        return min(_PACKED_DATA_BYTES, committer.packed_threshold, self._ctx.segment_bytes // 2)

    def create_packed_soon(
        self, header: StreamHeader, initial: AppendEntry | None = None
    ) -> tuple[asyncio.Future[None], Callable[[asyncio.Future[None]], StreamLog]]:
        """``create_stream(header, initial)`` of a packed create (``can_create_packed``; ``header``
        not a fork; ``initial`` only with ``packed_data_bytes``) without a coroutine: the round's
        future, and what makes the log once it resolved (raising what ``create_stream`` would have
        raised). The engine's single-request create (``Engine.create_nowait``) chains both in one
        callback of the round's future: no task, no coroutine frames per create (issue 17).

        ``initial`` (a ``PUT`` with a body): its frame follows the header's in the packed create's
        ONE record (``features.PACKED_CREATE_DATA``), so one CRC covers both: a crash keeps the
        create with its data or neither, never the create alone (whose retry would answer 200 with
        the data gone). Its stream is then a packed stream with records whose header extent holds
        the data too (``PackBook.header_piece``)."""
        self._check_open()
        assert header.fork_source_id is None and self._ctx.sync
        assert initial is None or self._committer.packed_appends
        log_id = new_storage_id()
        header_frame = codec.encode_header(header)
        initial_frame = codec.encode_append(initial) if initial is not None else None
        creation = _NewStream(
            self, log_id, catalog.Entry(header.path, None), header_frame, initial_frame, True
        )
        done = self._committer.create_soon(creation)
        return done, functools.partial(
            self._packed_made, header, creation, len(header_frame), initial
        )

    def _packed_made(
        self,
        header: StreamHeader,
        creation: _NewStream,
        header_end: int,
        initial: AppendEntry | None,
        done: asyncio.Future[None],
    ) -> StreamLog:
        """The end of ``create_packed_soon``: the log of a packed create whose round resolved."""
        failure = done.exception()
        if isinstance(failure, OSError):
            raise _create_failed(header.path, failure) from failure
        if failure is not None:
            raise failure
        state = StreamState(
            tail=header.fork_position, last_timestamp_ms=header.append_time_floor_ms
        )
        if initial is None:
            stream = self._new_log(creation.log_id, header, state, None, header_end, None, 0)
            stream.packed = True
            return stream
        apply_entry(state, initial)
        size = len(creation.data)
        packs = self._committer.packs
        piece = packs.header_piece(creation.log_id, size)
        if piece is None:  # dropped meanwhile: never (nothing knows its id before this returns)
            raise _create_failed(header.path, RuntimeError("packed create gone"))
        stream = self._new_log(
            creation.log_id, header, state, None, header_end, initial, size - header_end
        )
        stream.packed = True
        extents = Extents()
        extents.add(*piece, size, 0)
        stream.extents = extents
        # The pack book tracks the same object: a checkpoint relocates it (as ``_packed_done``'s).
        packs.adopt(creation.log_id, extents)
        return stream

    async def create_streams(self, headers: list[StreamHeader]) -> list[StreamLog | BaseException]:
        """``create_stream`` of many new streams without data, forks or closure (a bulk ``ensure``'s
        creates), in order: each the same create entry in a commit round as ``create_stream``
        writes, but awaited together (``Committer.create_many``: one future for the batch, not one
        per stream). A create that fails is returned as its ``StorageFailure``/
        ``InsufficientStorage`` (nothing of it is left behind); the others are made."""
        self._check_open()
        if not self._ctx.sync:  # --durability none: no rounds for creates; each as before
            return list(
                await asyncio.gather(
                    *(self.create_stream(header, None) for header in headers),
                    return_exceptions=True,
                )
            )
        creations = []
        for header in headers:
            assert header.fork_source_id is None, "create_streams makes plain streams only"
            entry = catalog.Entry(header.path, None)
            # Packed (decision 0010) whenever the server packs: no data, no fork.
            creations.append(
                _NewStream(self, new_storage_id(), entry, codec.encode_header(header), None, True)
            )
        outcomes = await self._committer.create_many(creations)
        made: list[StreamLog | BaseException] = []
        for header, creation, outcome in zip(headers, creations, outcomes, strict=True):
            if outcome is None:
                state = StreamState(
                    tail=header.fork_position, last_timestamp_ms=header.append_time_floor_ms
                )
                stream = self._new_log(
                    creation.log_id, header, state, None, len(creation.data), None, 0
                )
                stream.packed = True
                made.append(stream)
            else:
                made.append(_create_failed(header.path, outcome))
        return made

    def _packed_log(self, log_id: str, header: StreamHeader, header_end: int) -> StreamLog:
        """A packed stream found at start-up (``packs.py``): what ``create_stream`` made of it."""
        state = StreamState(
            tail=header.fork_position, last_timestamp_ms=header.append_time_floor_ms
        )
        stream = self._new_log(log_id, header, state, None, header_end, None, 0)
        stream.packed = True
        return stream

    def _new_log(
        self,
        log_id: str,
        header: StreamHeader,
        state: StreamState,
        directory: str | None,
        header_end: int,
        initial: AppendEntry | None,
        initial_len: int,
    ) -> StreamLog:
        """The log of a stream just created (or packed): its header and optional initial record.
        ``directory`` None: ``streams/<log_id>`` (a packed create), its table made without
        joining and splitting that path (issue 17: a create's objects)."""
        index = LogIndex(
            SparseIndex.starting_at(
                self.config.index_interval_bytes,
                header.fork_position,
                header_end,
                header.append_time_floor_ms,
            )
        )
        if initial is not None:
            index.note(initial.position, header_end, len(initial.messages), initial.timestamp_ms)
        stream = StreamLog(
            self._ctx,
            log_id,
            header,
            state,
            SegmentTable.first(self._streams, log_id)
            if directory is None
            else SegmentTable(directory, log_id, (0,)),
            index,
            header_end + initial_len,
            header_end if initial is not None else 0,
        )
        stream._snapshot_entries = 0
        stream._snapshot_end = 0
        self.logs[log_id] = stream
        return stream

    @property
    def packs_bytes(self) -> int:
        """Disk held by ``packs/`` (bounded by the live packed streams: ``packs.py``)."""
        return self._committer.packs.disk_bytes

    @property
    def packed_streams(self) -> int:
        """Streams that are packed creates (no directory yet)."""
        return len(self._committer.packs.live)

    def _catalog_made(self, creations: list[_NewStream]) -> None:
        """A commit round's creates, made: their catalog lines in one write (committer.py)."""
        if self._catalog is not None:
            self._catalog.add_lines([creation.catalog_line() for creation in creations])

    def _build_stream(
        self,
        log_id: str,
        entry: catalog.Entry,
        header_frame: bytes,
        initial_frame: bytes | None,
    ) -> str:
        """Build the stream under staging/, fsync it (if syncing), then rename it into streams/
        (hazard 20)."""
        staged = self._dir("staging") / log_id
        final = self._dir("streams") / log_id
        sync = self._ctx.sync
        renamed = False
        try:
            staged.mkdir()
            data = header_frame if initial_frame is None else header_frame + initial_frame
            write_file(
                staged / segment_name(0), os.O_WRONLY | os.O_CREAT | os.O_EXCL, data, sync=sync
            )
            if sync:
                fsync_dir(staged)
            os.rename(staged, final)
            renamed = True
            if sync:
                fsync_dir(final.parent)
        except BaseException:
            _remove(final if renamed else staged)  # a failed create leaves nothing (hazard 20)
            raise
        if self._catalog is not None:
            self._catalog.add(log_id, entry)
        return str(final)

    # ----------------------------------------------------------------------------------------- delete

    async def delete_stream(self, log: StreamLog) -> None:
        """Remove an incarnation: wait for its pending commits, rename to trash, fsync, rm in background.

        Readers of the log get ``errors.NotFound`` afterwards. Deleting a log twice is a no-op.
        """
        self._check_open()
        if self.logs.get(log.id) is not log:
            return
        del self.logs[log.id]
        await log._shutdown(snapshot=False)
        src = self._dir("streams") / log.id
        dst = self._dir("trash") / log.id
        log._deleted = True  # from here on, readers get NotFound rather than a missing-file error
        try:
            await self._committer.drop(log.id)  # a restart must not make it again (committer.py)
            if log.packed:  # no directory: the drop entry voids its packed create (packs.py)
                log._forget_files()
                return
            await self._run(self._move_to_trash, src, dst)
        except OSError as exc:
            log._closed = log._deleted = False  # still on disk and intact: keep serving it
            self.logs[log.id] = log
            logging.getLogger(__name__).error("delete of %r failed: %r", log.header.path, exc)
            raise errors.StorageFailure(f"could not delete {log.header.path!r}: {exc}") from exc
        log._forget_files()
        removal = asyncio.get_running_loop().run_in_executor(self._executor, _remove, dst)
        self._background.add(removal)
        removal.add_done_callback(self._background.discard)

    def _move_to_trash(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)
        if self._ctx.sync:
            fsync_dir(dst.parent)
            fsync_dir(src.parent)

    # ------------------------------------------------------------------------------------------- misc

    def disk_free(self) -> int:
        """Bytes available to the server on the data directory's file system (one ``statvfs``)."""
        stat = os.statvfs(self.root)
        return stat.f_bavail * stat.f_frsize

    def meta_path(self, name: str) -> Path:
        """A path under ``meta/`` for another component's durable files (``meta/`` exists)."""
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"bad meta file name {name!r}")
        meta = self._dir("meta")
        meta.mkdir(exist_ok=True)
        return meta / relative

    async def close(self) -> None:
        """Flush every log, write snapshots, release the lock."""
        if self._closed:
            return
        self._closed = True
        logs = list(self.logs.values())
        results = await asyncio.gather(
            *(self._close_log(stream) for stream in logs), return_exceptions=True
        )
        for stream, result in zip(logs, results, strict=True):
            if isinstance(result, BaseException):
                log.error("stream %s: close failed: %r", stream.id, result)
        try:
            await self._committer.close()  # syncs what the WAL still covers, removes it
        except Exception as exc:
            log.error("closing the write-ahead log failed (the next start-up replays it): %r", exc)
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self._ctx.hot.close()
        self._executor.shutdown(wait=True)
        self._read_executor.shutdown(wait=True)
        self._ctx.cache.close_all()
        if self._catalog is not None:
            self._catalog.close()
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self._lock_fd)

    async def _close_log(self, stream: StreamLog) -> None:
        # A packed stream has no directory to hold a snapshot (its records fold from its extents).
        worth = not stream.packed and (
            stream.state.entries - stream._snapshot_entries >= _CLOSE_SNAPSHOT_ENTRIES
            or stream._file_end - stream._snapshot_end >= _CLOSE_SNAPSHOT_BYTES
            or stream.snapshot_stale
        )
        await stream._shutdown(snapshot=worth)
        stream._forget_files()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.StorageFailure("data directory is closed")

    async def _run(self, func, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        loop = asyncio.get_running_loop()
        if kwargs:
            return await loop.run_in_executor(self._executor, lambda: func(*args, **kwargs))
        return await loop.run_in_executor(self._executor, func, *args)


class _NewStream:
    """A create riding a commit round (``committer.Creation``): made after the round's WAL sync."""

    __slots__ = ("_owner", "log_id", "data", "_entry", "packed")

    def __init__(
        self,
        owner: DataDir,
        log_id: str,
        entry: catalog.Entry,
        header_frame: bytes,
        initial_frame: bytes | None,
        packed: bool = False,
    ) -> None:
        self._owner = owner
        self.packed = packed  # the WAL entry alone (packs.py): never materialized
        self.log_id = log_id
        self.data = header_frame if initial_frame is None else header_frame + initial_frame
        self._entry = entry

    @property
    def directory(self) -> str:
        """Joined when asked for: a packed create (nearly every create) never makes its directory,
        and its log's ``SegmentTable`` is made from the data directory's ``streams/`` and the id
        (``DataDir._new_log``), so most creates never build this string (issue 17)."""
        return os.path.join(self._owner._streams, self.log_id)

    def catalog_line(self) -> bytes:
        return catalog.encode(self.log_id, self._entry)

    def materialize(self) -> tuple[Handle, str]:
        """Make the directory and the first segment, unsynced (the WAL holds them; the checkpoint
        syncs them). Leaves nothing behind on an OSError (hazard 20). Its catalog line is written
        with the round's others (``DataDir._catalog_made``)."""
        fd = make_first_segment(self.directory, self.data)
        handle = self._owner._ctx.cache.adopt((self.log_id, 0), fd)
        return handle, self.directory


def _create_failed(path: str, exc: BaseException) -> errors.ProtocolError:
    """What a create that failed with ``exc`` answers (logged here, once; ``exc`` is its cause, also
    for the callers that return it in a batch's outcomes instead of raising it)."""
    log.error("create of %r failed: %r", path, exc)
    failure: errors.ProtocolError
    if isinstance(exc, OSError) and is_out_of_space(exc):
        failure = errors.InsufficientStorage(f"no space to create {path!r}")
    else:
        failure = errors.StorageFailure(f"could not create {path!r}: {exc}")
    failure.__cause__ = exc
    return failure


def _sorted_listing(directory: str) -> list[str]:
    return sorted(os.listdir(directory))


def _batches(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + _RECOVERY_BATCH] for i in range(0, len(ids), _RECOVERY_BATCH)]


async def _lock_waiting(root: Path, seconds: float) -> int:
    """``_lock``, retried until ``seconds`` have passed while another process holds the lock (a
    lock has no notification to wait on; this runs once, before the server serves)."""
    deadline = time.monotonic() + seconds
    warned = False
    while True:
        try:
            return _lock(root)
        except AlreadyLocked:
            if time.monotonic() >= deadline:
                raise
            if not warned:
                warned = True
                log.warning(
                    "data directory %s is locked by another process; waiting up to %.0f s for it "
                    "(a previous server's worker finishing its shutdown)",
                    root,
                    seconds,
                )
            await asyncio.sleep(_LOCK_POLL_SECONDS)


_LOCK_POLL_SECONDS = 0.05


def _lock(root: Path) -> int:
    """Take the data directory lock (hazard 24); returns the fd that holds it."""
    fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise AlreadyLocked(f"data directory {root} is in use by another server") from None
        raise
    try:  # for operators: who holds it
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


def _remove(path: Path | str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
