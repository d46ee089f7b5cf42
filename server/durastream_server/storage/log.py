"""One stream incarnation's durable log.

Layout of a stream directory (``<data-dir>/streams/<id>/``):
  ``<first-file-offset:020d>.seg``  segment files of framed, checksummed records (codec.py), rolled at
                                   ``segment_bytes``; the first record of the first segment is the header.
  ``snapshot``                      latest StreamState + sparse index + the segment position they cover,
                                   written atomically (tmp + fsync + rename); start-up replays only
                                   the records after it.
  ``txn/``                          staging files of staged appends (txnfile.py); a commit reaches the
                                   log as one record group, written alone by the writer (group.py).

Concurrency model: everything runs on one asyncio event loop. The engine validates a request against
``log.state`` and calls ``stage()`` with no ``await`` in between, so validation and staging of one
stream are serialized without a lock (this also covers close vs append, hazard 17). ``stage()`` folds the
entry into ``state`` at once (so the next request validates against it) and queues it for the group
commit: one writer task per log writes every queued record with one write and one fsync, in a worker
thread, then advances ``durable_tail`` and resolves the futures. Readers never see past ``durable_tail``,
and listeners are called only after the fsync (waiters wake on durable data only).

If a write or fsync fails, the log is *poisoned*: every queued and future stage fails with
``StorageFailure`` (or ``InsufficientStorage`` for ENOSPC). The in-memory state may be ahead of the disk
then, so it must never be used again. An I/O error (EIO, a failed fsync) keeps the log poisoned until the
server restarts and recovers from disk. Running out of space does not: the failed batch was cut off the
file (``writer._undo``; recovery cuts any torn rest), everything before it was fsynced earlier, so the log
*heals itself*: shortly after the failure it re-reads its state from disk with the start-up recovery
(``recovery.recover_stream``: snapshot + replay, torn-tail truncation) and accepts appends again. If the
disk is still full, the next append fails and poisons it again; the retry delay backs off
(``HEAL_FIRST_DELAY`` doubling up to ``HEAL_MAX_DELAY``) until a commit succeeds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from durastream_server import errors
from durastream_server.storage import catalog, codec
from durastream_server.storage.batch import Completion, Slot
from durastream_server.storage.committer import (
    PACKED_SEGMENT_BYTES,
    ROUND_BATCH_BYTES,
    Committer,
    PackedResult,
    RoundJob,
)
from durastream_server.storage.extents import IN_WAL, Extents
from durastream_server.storage.files import FdCache, is_out_of_space
from durastream_server.storage.group import GroupResult, is_group_batch, split_batch, write_group
from durastream_server.storage.hot import HotSweep
from durastream_server.storage.index import LogIndex
from durastream_server.storage.metrics import NO_METRICS, WriteMetrics
from durastream_server.storage.ordinals import floor_boundary, message_start
from durastream_server.storage.packview import PackedView, PackFiles, Replan
from durastream_server.storage.promotion import Promotion
from durastream_server.storage.reader import (
    NotABoundary,
    read_entries,
    read_one_record,
    read_range,
)
from durastream_server.storage.records import (
    AppendEntry,
    GroupCommit,
    MessageRun,
    MessageSlice,
    SoftDelete,
    StreamHeader,
)
from durastream_server.storage.recovery import Quarantine, recover_packed, recover_stream
from durastream_server.storage.scans import ScanBatcher
from durastream_server.storage.segments import ReadView, SegmentTable, SegmentView
from durastream_server.storage.snapshot import (
    IndexImage,
    StateImage,
    capture,
    snapshot_pieces,
    write_snapshot,
)
from durastream_server.storage.state import StreamState, apply_entry
from durastream_server.storage.times import first_at_or_after
from durastream_server.storage.writer import BatchResult, WriteTarget, write_batch

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# The just-committed tail each log keeps in memory for the readers that commit wakes (``_keep_hot``):
# at most this many bytes (payload plus MESSAGE_OVERHEAD per message, so that tiny messages cannot make
# the on-loop read of it long) and entries per log, dropped once no commit came for HOT_SECONDS (to
# twice that: one timer for all logs, ``hot.py``).
HOT_MAX_BYTES = 32 * 1024
HOT_MAX_ENTRIES = 256
HOT_SECONDS = 0.1
# A packed read whose files a checkpoint moved meanwhile is planned again (``packview.Replan``), after
# a pause that doubles from REPLAN_FIRST_DELAY, at most REPLAN_TRIES times (a move lasts one
# checkpoint's pack writes).
REPLAN_FIRST_DELAY = 0.001
REPLAN_TRIES = 12
# Out-of-space self-healing (see the module docstring): first re-read from disk this long after the
# failure, doubling per consecutive failure up to the maximum.
HEAL_FIRST_DELAY = 0.05
HEAL_MAX_DELAY = 2.0


@dataclass(frozen=True, slots=True)
class ReadChunk:
    """Result of ``StreamLog.read``: whole messages (JSON) or byte slices, plus where the read stopped."""

    slices: tuple[MessageSlice | MessageRun, ...]  # runs only when the caller asked for them
    next_position: int  # position after the last returned byte; == start when nothing was returned
    messages: int = 0  # messages (or pieces of byte-stream messages) in ``slices``


class DiskRead(NamedTuple):
    """The disk part of a planned read (``StreamLog.plan_read``), for a worker thread: the segments
    and the record to scan from, as the log held them when it was planned. A tuple: a multi-range
    read plans one a range on the loop (``segments.SegmentView``)."""

    segments: SegmentView | PackedView
    cache: FdCache
    scan_from: int
    start: int
    cap: int

    def run(
        self, max_bytes: int, whole_messages: bool, runs: bool, overhead: int, *, evict: bool = True
    ) -> tuple[list[MessageSlice | MessageRun], int, int]:
        """``reader.read_range`` of this read (blocking). Raises ``NotABoundary``,
        ``codec.CorruptRecord`` or ``OSError``, which ``StreamLog.read`` turns into its errors.
        ``evict``: as in ``FdCache.acquire``."""
        where = (self.segments, self.cache, self.scan_from, self.start, self.cap, max_bytes)
        if whole_messages and runs:
            lean = read_one_record(*where, overhead, evict=evict)
            if lean is not None:
                return lean
        return read_range(*where, whole_messages, runs, overhead, evict=evict)


_new_tuple = tuple.__new__  # NamedTuples built on the read planning path (``_disk_read``)


class InvalidPosition(ValueError):
    """A logical position that is not in this log or not a boundary where one is required."""


@dataclass(frozen=True, slots=True)
class LogContext:
    """What every log of a data directory shares (owned by ``DataDir``)."""

    executor: Executor  # commits, snapshots: never queued behind reads
    read_executor: Executor
    cache: FdCache
    segment_bytes: int
    snapshot_interval_entries: int
    sync: bool  # Durability.FSYNC
    committer: Committer  # shared commit rounds and the write-ahead log (committer.py)
    scans: ScanBatcher  # header scans, those of one loop turn in one read-executor trip (scans.py)
    metrics: WriteMetrics = NO_METRICS  # what the group commit reports (storage/metrics.py)
    # Packed streams' files and the moves of them (``packview.py``); None: no packed records read.
    pack_files: PackFiles | None = None
    # The logs holding a hot tail, and the one timer that drops the idle ones (``hot.py``).
    hot: HotSweep = field(default_factory=lambda: HotSweep(HOT_SECONDS))


_Item = AppendEntry | SoftDelete | GroupCommit
_Queued = tuple[_Item, "asyncio.Future[None]"]


def _batch_bytes(batch: list[_Queued]) -> int:
    """About how many bytes a batch's records take (payload plus per-message overhead)."""
    cost = 0
    for item, _ in batch:  # a loop, not a generator: most batches hold one entry (issue 17)
        cost += item.cost if type(item) is AppendEntry else 64  # type: ignore[union-attr]
    return cost


class _Rare:
    """The part of a ``StreamLog`` that only a log being written, waited on, healed or closed needs, with the
    defaults an idle log has: an idle log holds ``None`` in its place, not sixteen slots (128 bytes of
    each of 100,000 idle streams; issue 17). ``StreamLog`` reads and writes these through properties
    of the same names (``_rare_field``)."""

    __slots__ = (
        "_writer",
        "_failure",
        "_closed",
        "_deleted",
        "_idle_waiters",
        "_round_snapshot",
        "_flush_waiters",
        "_listeners",
        "_next_listener",
        "_pruned",
        "_snapshot_pruned",
        "_hot_bytes",
        "_healing",
        "_heal_failures",
        "_promote_waiters",
    )

    def __init__(self) -> None:
        self._writer: asyncio.Task[None] | None = None  # a batch written alone, or a snapshot
        self._failure: BaseException | None = None  # what poisoned the log
        self._closed = False  # closed by DataDir (delete or shutdown): no more stages or reads
        self._deleted = False
        self._idle_waiters: list[asyncio.Future[None]] | tuple[()] = ()
        self._round_snapshot: StateImage | None = None  # to write after the batch in the round
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] | tuple[()] = ()
        self._listeners: dict[int, Callable[[], None]] | None = None  # add_listener (tests, tools)
        self._next_listener = 0
        self._pruned = 0  # changes to the state that are not in the log (``note_pruned``)
        self._snapshot_pruned = 0  # ... of them, covered by the last snapshot
        self._hot_bytes = 0  # see _keep_hot
        self._healing: asyncio.Task[None] | None = None  # see _heal
        self._heal_failures = 0  # out-of-space poisonings since the last successful commit
        self._promote_waiters: list[asyncio.Future[None]] | tuple[()] = ()  # ensure_directory

    def at_defaults(self) -> bool:
        return (
            self._writer is None
            and self._failure is None
            and not self._closed
            and not self._idle_waiters
            and self._round_snapshot is None
            and not self._flush_waiters
            and not self._listeners
            and self._pruned == self._snapshot_pruned == 0
            and self._hot_bytes == 0
            and self._healing is None
            and self._heal_failures == 0
            and not self._promote_waiters
        )


_IDLE = _Rare()  # the defaults, read while a log has no _Rare (never written)


def _rare_field(name: str) -> property:
    """A ``StreamLog`` property for the ``_Rare`` slot ``name``: the default while the log has none;
    the first write of another value makes its ``_Rare``."""
    default = getattr(_IDLE, name)
    get_slot = getattr(_Rare, name).__get__
    set_slot = getattr(_Rare, name).__set__

    def get(self: StreamLog) -> Any:
        rare = self._rare
        return default if rare is None else get_slot(rare)

    def put(self: StreamLog, value: Any) -> None:
        rare = self._rare
        if rare is None:
            if value is default or value == default:
                return
            rare = self._rare = _Rare()
        set_slot(rare, value)

    return property(get, put)


class StreamLog:
    """Append-only log of one stream incarnation.

    Public attributes: ``id`` (storage id: the directory name, unique per incarnation; used in ETags and
    fork links), ``header``, ``state`` (accepted state, including staged entries not yet durable),
    ``durable_tail`` (readers never read past it) and ``durable_closed`` (closure that is on disk).
    Instances come from ``DataDir``; do not construct them directly.
    """

    # Slots, not a __dict__: with 100,000 streams the per-instance dict was 1.5 KiB of each idle
    # stream's memory (issue 17).
    __slots__ = (
        "id",
        "header",
        "state",
        "durable_tail",
        "durable_closed",
        "_ctx",
        "_segments",
        "_index",
        "_file_end",
        "_last_record",
        "_queue",
        "_inflight",
        "_busy",
        "_staged_count",
        "_durable_count",
        "on_commit",
        "_snapshot_entries",
        "_snapshot_end",
        "_hot",
        "_rare",
        "packed",
        "extents",
    )

    def __init__(
        self,
        ctx: LogContext,
        log_id: str,
        header: StreamHeader,
        state: StreamState,
        segments: SegmentTable,
        index: LogIndex,
        file_end: int,
        last_record: int,
    ) -> None:
        self.id = log_id
        self.header = header
        self.state = state
        self.durable_tail = state.tail
        self.durable_closed = state.closed
        self._ctx = ctx
        self._segments = segments
        index.forget_recent()  # a log starts idle (recovery noted every record into it)
        self._index = index
        self._file_end = file_end
        self._last_record = last_record  # global offset of the last record on disk
        # Empty tuples, not lists, while nothing is queued or waits (shared: no memory per idle log,
        # issue 17); a list is made when the first item comes.
        self._queue: list[_Queued] | tuple[()] = ()
        self._inflight: list[_Queued] | tuple[()] = ()
        self._busy = False  # something is queued or in flight (see round_job)
        self._staged_count = 0
        self._durable_count = 0
        # The owner's commit callback (the engine's): one function shared by every log and called
        # with the log, so that it costs no closure per stream (issue 17).
        # It returns True if readers were parked on the log (see ``_commit``: the hot tail).
        self.on_commit: Callable[[StreamLog], bool] | None = None
        self._snapshot_entries = state.entries  # state.entries covered by the last snapshot
        self._snapshot_end = file_end
        # See _keep_hot. An idle log holds no deque (an empty one is 600 bytes; issue 17).
        self._hot: collections.deque[AppendEntry] | tuple[()] = ()
        # What only a written, waited-on or healing log needs (``_Rare``): made on the first change
        # from its defaults, dropped once the log is idle again (issue 17).
        self._rare: _Rare | None = None
        # No directory yet: the stream is its packed create (``packs.py``); the first write promotes
        # it (``promotion.py``).
        self.packed = False
        # Decision 0010 step 2 (behind ``StorageConfig.packed_appends``): where a packed stream's
        # bytes are, its virtual segment 0 in WAL files and packs (``extents.py``). None for a stream
        # with a directory, and for a packed create whose header is all it holds.
        self.extents: Extents | None = None

    _writer = _rare_field("_writer")
    _failure = _rare_field("_failure")
    _closed = _rare_field("_closed")
    _deleted = _rare_field("_deleted")
    _idle_waiters = _rare_field("_idle_waiters")
    _round_snapshot = _rare_field("_round_snapshot")
    _flush_waiters = _rare_field("_flush_waiters")
    _listeners = _rare_field("_listeners")
    _next_listener = _rare_field("_next_listener")
    _pruned = _rare_field("_pruned")
    _snapshot_pruned = _rare_field("_snapshot_pruned")
    _hot_bytes = _rare_field("_hot_bytes")
    _healing = _rare_field("_healing")
    _heal_failures = _rare_field("_heal_failures")
    _promote_waiters = _rare_field("_promote_waiters")

    # ----------------------------------------------------------------------------------------- writes

    @property
    def directory(self) -> str:
        """The stream directory (``<data-dir>/streams/<id>``)."""
        return self._segments.directory

    @property
    def base(self) -> int:
        """First logical position stored in this log (``header.fork_position``)."""
        return self.header.fork_position

    @property
    def idle(self) -> bool:
        """Nothing queued or in flight, and no hot tail kept: the log holds only its idle state."""
        return not self._busy and not self._hot

    @property
    def poisoned(self) -> bool:
        return self._failure is not None

    def failure_error(self) -> errors.StorageFailure:
        """What a poisoned log answers (507 ``InsufficientStorage`` for a full disk, else 503)."""
        return self._error()

    def _write_target(self) -> WriteTarget:
        """Made per batch, not kept: a log that is not written to holds none (issue 17)."""
        ctx = self._ctx
        return WriteTarget(
            self.directory, self.id, ctx.cache, ctx.segment_bytes, ctx.sync, ctx.metrics
        )

    def _packed_target(self) -> WriteTarget:
        """A packed job's target: no directory (its records go into the WAL alone) and a virtual
        segment 0 that never rolls (``Committer._write_round`` lays it out as one chunk)."""
        ctx = self._ctx
        return WriteTarget("", self.id, ctx.cache, PACKED_SEGMENT_BYTES, ctx.sync, ctx.metrics)

    def _promotion(self) -> Promotion:
        root = self._ctx.committer.packs.root
        return Promotion(
            self.id,
            codec.encode_header(self.header),
            self.directory,
            self._ctx.cache,
            catalog.Entry(self.header.path, self.header.fork_source_id),
            (root, self.extents) if self.extents is not None and root is not None else None,
        )

    def _packs_batch(self, batch: list[_Queued], cost: int) -> bool:
        """Decision 0010 step 2: a packed log's batch stays packed records (a round's WAL entry,
        no directory) when packed appends are on, it is not a record group, the virtual segment
        0 stays within ``Committer.packed_threshold`` (``--packed-threshold``, and a segment), and the header's place is known
        (for the header extent)."""
        ctx = self._ctx
        committer = ctx.committer
        if not committer.packed_appends or not ctx.sync or is_group_batch(batch):
            return False
        if self._file_end + cost > min(committer.packed_threshold, ctx.segment_bytes):
            return False
        return self.extents is not None or self.id in committer.packs.header_at

    async def ensure_directory(self) -> None:
        """Give a packed stream its directory now, in a round of its own (a staged-append space
        writes files into it); a no-op for any other. Raises the write error that failed it."""
        if not self.packed:
            return
        if not self._writable():
            raise self._error()
        waiter = asyncio.get_running_loop().create_future()
        if self._promote_waiters:
            self._promote_waiters.append(waiter)  # type: ignore[union-attr]
        else:
            self._promote_waiters = [waiter]
        if not self._busy:
            self._busy = True
            self._ctx.committer.schedule(self)
        await waiter

    def _writable(self) -> bool:
        """Not poisoned, not closed, and the data directory's WAL has not failed (``committer.py``)."""
        if self._ctx.committer.failure is not None and self._failure is None:
            self._poison(self._ctx.committer.failure)
        rare = self._rare  # read once: every append asks (``_rare_field`` is a call per read)
        return rare is None or (rare._failure is None and not rare._closed)

    def stage(self, entry: AppendEntry) -> asyncio.Future[None]:
        """Apply ``entry`` to ``state`` now and queue it for the group commit.

        Returns a future that resolves once the entry is durable (after fsync, unless the server runs with
        ``--durability=none``), or fails with ``StorageFailure``. Raises ``ValueError`` at once if the
        entry does not start at ``state.tail`` (an engine bug; nothing is staged then).
        """
        fut = asyncio.get_running_loop().create_future()
        if not self._writable():
            fut.set_exception(self._error())
            return fut
        apply_entry(self.state, entry)
        self._enqueue(entry, fut)
        return fut

    def stage_to(self, entry: AppendEntry, slot: Completion) -> None:
        """``stage()`` whose completion is ``slot`` (one entry of a bulk request's ``Batch``,
        storage/batch.py, or a small append's answer, the engine's ``_Settles``) instead of a new
        future: settled by the same round, with the same outcome (``set_result(None)`` once
        durable, ``set_exception`` with the storage failure)."""
        if not self._writable():
            slot.set_exception(self._error())
            return
        apply_entry(self.state, entry)
        self._enqueue(entry, slot)  # type: ignore[arg-type]

    def stage_group(self, group: GroupCommit) -> asyncio.Future[None]:
        """``stage()`` for a staged-append commit: the group is folded into ``state`` now (as one
        entry) and written alone, as one record group, by the writer task (``group.py``)."""
        fut = asyncio.get_running_loop().create_future()
        if not self._writable():
            fut.set_exception(self._error())
            return fut
        apply_entry(self.state, group)
        self._enqueue(group, fut)
        return fut

    def stage_soft_delete(self) -> asyncio.Future[None]:
        """Durably mark the stream soft-deleted (it keeps serving fork reads)."""
        fut = asyncio.get_running_loop().create_future()
        if not self._writable():
            fut.set_exception(self._error())
            return fut
        self.state.soft_deleted = True
        self._enqueue(SoftDelete(int(time.time() * 1000)), fut)
        return fut

    async def flush(self) -> None:
        """Wait until everything staged so far is durable (or raise the poisoning error)."""
        await self.durable_barrier()

    def durable_barrier(self) -> asyncio.Future[None]:
        """A future done once everything staged *now* is durable, or failed with the poisoning
        error: ``flush`` taken at once, without an ``await`` before it.

        A decision made against ``state`` that answers without staging (a producer's duplicate)
        must take its barrier in the same step as the decision: ``state`` may be ahead of the disk
        (a poisoned log keeps the failed batch in it), and a heal in between would rebuild ``state``
        and the counts from the disk, so a ``flush`` called later could find nothing pending and
        acknowledge a duplicate of an append that was never written (seen in the chaos soak: a 204
        for a seq that the healed log did not hold, then 409 gaps)."""
        waiter = asyncio.get_running_loop().create_future()
        if self._failure is not None:
            waiter.set_exception(self._error())
        elif self._durable_count >= self._staged_count:
            waiter.set_result(None)
        elif self._flush_waiters:
            self._flush_waiters.append((self._staged_count, waiter))  # type: ignore[union-attr]
        else:
            self._flush_waiters = [(self._staged_count, waiter)]
        return waiter

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the loop) after each durable commit; returns an unsubscribe function."""
        key = self._next_listener
        self._next_listener += 1
        if self._listeners is None:
            self._listeners = {}
        self._listeners[key] = callback

        def unsubscribe() -> None:
            if self._listeners is not None:
                self._listeners.pop(key, None)

        return unsubscribe

    def _enqueue(self, item: _Item, fut: asyncio.Future[None]) -> None:
        if self._queue:
            self._queue.append((item, fut))  # type: ignore[union-attr]
        else:
            self._queue = [(item, fut)]
        self._staged_count += 1
        if not self._busy:
            self._busy = True
            self._ctx.committer.schedule(self)

    # The write path: a log with something queued is *busy* until its queue is empty again. It has at
    # most one batch in flight, either in the committer's shared round (``round_job``/``round_done``)
    # or written by itself (``_write_alone``: record groups and large batches), so its records reach
    # its files in order.

    def round_job(self) -> RoundJob | None:
        """Called by the committer when this log's turn comes: the next batch, if it goes into the shared
        round; None if there is nothing to write or the log writes it itself."""
        failure = self._ctx.committer.failure
        if failure is not None and self._failure is None:
            self._poison(failure)
        rare = self._rare
        queue = self._queue
        if self.packed and len(queue) == 1 and (rare is None or rare._failure is None):
            job = self._one_packed_append(queue)  # type: ignore[arg-type]
            if job is not None:
                return job
        promote = None
        packed = False
        if self.packed and (rare is None or rare._failure is None):
            if not self._queue and rare is not None and rare._promote_waiters:
                self._inflight = []
                promote = self._promotion()
                target = self._write_target()
                return RoundJob(target, [], 0, self._file_end, 0, promote)
            packed = bool(self._queue)
        if (rare is not None and rare._failure is not None) or not self._queue:
            self._set_idle()
            return None
        # A record group (staged-append commit) is written alone; a snapshot is taken only when the
        # batch leaves nothing queued (the state then matches the disk).
        batch, rest = split_batch(self._queue)
        self._queue = rest or ()
        self._inflight = batch
        # (Not for a batch of packed records: no directory holds a snapshot.)
        if packed and self._ctx.committer.packed_appends:
            due = False
        else:
            due = not rest and self._snapshot_due()
        snapshot_state = capture(self.state) if due else None
        cost = _batch_bytes(batch)
        if packed and self._packs_batch(batch, cost):
            # Packed records (decision 0010 step 2): no directory, no segment write, no snapshot
            # (a packed stream is folded from its virtual segment).
            return RoundJob(
                self._packed_target(),
                [item for item, _ in batch],
                0,
                self._file_end,
                cost,
                None,
                packed=True,
            )
        if packed:
            promote = self._promotion()
        if promote is not None:
            if is_group_batch(batch) or cost > ROUND_BATCH_BYTES:
                # Written alone once the directory is there: this round makes only the directory.
                self._queue = [*batch, *rest]
                self._inflight = []
                return RoundJob(self._write_target(), [], 0, self._file_end, 0, promote)
        elif is_group_batch(batch) or cost > ROUND_BATCH_BYTES:
            self._writer = asyncio.get_running_loop().create_task(
                self._write_alone(batch, snapshot_state)
            )
            return None
        if rare is not None:
            rare._round_snapshot = snapshot_state
        elif snapshot_state is not None:
            self._round_snapshot = snapshot_state
        return RoundJob(
            self._write_target(),
            [item for item, _ in batch],
            self._segments.last,
            self._file_end,
            cost,
            promote,
        )

    def _one_packed_append(self, queue: list[_Queued]) -> RoundJob | None:
        """``round_job`` of the common case of many small streams (issue 17, h73): a packed, healthy
        log that has one append queued, which stays packed records. The general steps for it
        (``split_batch``, ``is_group_batch``, ``_batch_bytes``, ``_packs_batch``) in one frame: the
        same job, the same state after it. None, with nothing changed, for anything else (the
        general steps then decide)."""
        item = queue[0][0]
        if type(item) is not AppendEntry:
            return None
        ctx = self._ctx
        committer = ctx.committer
        cost = item.cost
        if (
            not committer.packed_appends
            or not ctx.sync
            or self._file_end + cost > min(committer.packed_threshold, ctx.segment_bytes)
            or (self.extents is None and self.id not in committer.packs.header_at)
        ):
            return None
        self._queue = ()
        self._inflight = queue
        return RoundJob(
            WriteTarget("", self.id, ctx.cache, PACKED_SEGMENT_BYTES, ctx.sync, ctx.metrics),
            [item],
            0,
            self._file_end,
            cost,
            None,
            packed=True,
        )

    def round_done(self, result: BatchResult | BaseException) -> None:
        """The committer wrote (or failed to write) the batch ``round_job`` gave it."""
        rare = self._rare
        snapshot_state = None
        if rare is not None:
            snapshot_state, rare._round_snapshot = rare._round_snapshot, None
        if type(result) is PackedResult:
            if not self._packed_done(result):
                result = errors.StorageFailure(f"stream {self.header.path!r}: packed create gone")
        elif self.packed and not isinstance(result, BaseException):
            self.packed = False  # promoted by this round (``promotion.py``)
            self.extents = None  # its directory holds its packed records now
            self._settle_promote_waiters(None)
        if self._finish_batch(result) and snapshot_state is not None:
            self._writer = asyncio.get_running_loop().create_task(
                self._snapshot_then_continue(snapshot_state, result.end)  # type: ignore[union-attr]
            )
            return
        self._continue()

    def _packed_done(self, result: PackedResult) -> bool:
        """Packed records are durable (decision 0010 step 2): their extent, after the header's
        the first time, becomes readable (on the loop, after the sync: nothing unacknowledged is
        ever readable). The pack book holds the same ``Extents`` (a checkpoint relocates it)."""
        packs = self._ctx.committer.packs
        extents = self.extents
        if extents is None:
            header = packs.header_piece(self.id, self._file_end)
            if header is None:  # dropped or promoted meanwhile: never (a log has one batch)
                log.error("stream %s: packed records without a packed create", self.id)
                return False
            extents = Extents()
            extents.add(*header, self._file_end, 0)
            self.extents = extents
        extents.add(IN_WAL, result.generation, result.records_at, result.length, self._file_end)
        packs.wrote(self.id, extents, result.generation)
        return True

    async def _write_alone(self, batch: list[_Queued], snapshot_state: StateImage | None) -> None:
        """Write a batch the shared round does not carry: synced in the log's own segment file."""
        try:
            result: BatchResult | BaseException = await asyncio.get_running_loop().run_in_executor(
                self._ctx.executor,
                write_group if is_group_batch(batch) else write_batch,
                self._write_target(),
                [item for item, _ in batch],
                self._segments.last,
                self._file_end,
            )
        except asyncio.CancelledError:
            self._finish_batch(errors.StorageFailure("log writer was cancelled mid-commit"))
            self._writer = None
            self._continue()
            raise
        except Exception as exc:  # OSError, or a bug: either way nothing may be acked
            result = exc
        self._writer = None
        if self._finish_batch(result) and snapshot_state is not None:
            await self._snapshot_then_continue(snapshot_state, result.end)  # type: ignore[union-attr]
            return
        self._continue()

    def _finish_batch(self, result: BatchResult | BaseException) -> bool:
        """Commit the batch in flight, or poison the log with the error that failed it. True if
        committed."""
        batch = self._inflight
        if isinstance(result, BaseException):
            self._poison(result)
            return False
        self._inflight = ()
        try:
            self._commit(batch, result)
        except Exception as exc:  # a bug; never leave stagers waiting forever
            self._inflight = batch
            self._poison(exc)
            return False
        return True

    async def _snapshot_then_continue(self, snapshot_state: StateImage, covered_end: int) -> None:
        try:
            await self._write_snapshot(snapshot_state, covered_end, self._last_record)
        finally:
            self._writer = None
            self._continue()

    def _continue(self) -> None:
        """After a batch: the next turn if more is queued, else idle."""
        # A packed log whose batch was packed records may have a promotion waiting (``ensure_
        # directory`` came while that batch was in flight): its turn too.
        rare = self._rare  # read once: a ``_rare_field`` read is a call (this runs every round)
        if rare is not None and rare._failure is not None:
            self._set_idle()
        elif self._queue or (self.packed and rare is not None and rare._promote_waiters):
            self._ctx.committer.schedule(self)
        else:
            self._set_idle()

    def _set_idle(self) -> None:
        self._busy = False
        rare = self._rare
        if rare is None or not rare._idle_waiters:
            return
        waiters, rare._idle_waiters = rare._idle_waiters, ()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_idle(self) -> None:
        """Until no batch of this log is queued or in flight (nor the snapshot after one)."""
        while self._busy:
            waiter = asyncio.get_running_loop().create_future()
            if self._idle_waiters:
                self._idle_waiters.append(waiter)  # type: ignore[union-attr]
            else:
                self._idle_waiters = [waiter]
            await waiter

    def _commit(self, batch: list[_Queued], result: BatchResult) -> None:
        # A batch of a bulk request's entries only (each completion a ``Slot``) keeps neither the
        # index's recent window nor the hot tail unless a reader is parked on the log (below).
        bulk = True
        for _, fut in batch:  # a loop, not ``all`` over a generator: most batches hold one entry
            if not isinstance(fut, Slot):
                bulk = False
                break
        index = self._index
        note = index.sparse.note if bulk else index.note
        tail = None
        closed = False
        for (item, _), offset in zip(batch, result.offsets, strict=True):
            if type(item) is AppendEntry:
                note(item.position, offset, len(item.messages), item.timestamp_ms)
                tail = item.position + item.size
                closed = closed or item.closes
            elif type(item) is GroupCommit:
                assert isinstance(result, GroupResult)
                for position, record_offset, n_messages in result.records:
                    index.note(position, record_offset, n_messages, item.timestamp_ms)
                tail = item.end
                closed = closed or item.closes
        if result.new_segments:
            self._segments.extend(result.new_segments)
        self._file_end = result.end
        if result.offsets:
            self._last_record = result.offsets[-1]
        if tail is not None:
            self.durable_tail = tail
        if closed:
            self.durable_closed = True
        self._durable_count += len(batch)
        rare = self._rare
        if rare is not None:
            rare._heal_failures = 0
        for _, fut in batch:
            if not fut.done():  # the stager may have been cancelled; the entry is durable anyway
                fut.set_result(None)
        if rare is not None and rare._flush_waiters:
            durable = self._durable_count
            still = []
            for target, waiter in self._flush_waiters:
                if target <= durable:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    still.append((target, waiter))
            self._flush_waiters = still or ()
        woke = self._notify_committed()
        # The hot tail is for the readers this commit wakes. A bulk batch (the sink routing rows to
        # many streams) keeps none unless a reader of this stream is parked: per stream it was a
        # deque, a ``_Rare``, a timer and the index's recent window, a tenth of a new stream's
        # commit (issue 16, session h37). Readers that come later read the same durable bytes from
        # disk (or the WAL, for packed records), starting at the sparse index's point.
        if woke or not bulk:
            self._keep_hot(batch)

    def _notify_committed(self) -> bool:
        """Tell the owner (``on_commit``) and the listeners that more of the log is durable. True
        if a reader was waiting for it (the owner says so for its parked readers)."""
        woke = False
        on_commit = self.on_commit
        if on_commit is not None:
            try:
                woke = bool(on_commit(self))
            except Exception:
                log.exception("stream %s: commit callback failed", self.id)
        rare = self._rare
        if rare is not None and rare._listeners:
            woke = True
            for callback in list(rare._listeners.values()):
                try:
                    callback()
                except Exception:
                    log.exception("stream %s: commit listener failed", self.id)
        return woke

    def _keep_hot(self, batch: list[_Queued]) -> None:
        """Keep the data this commit made durable in memory for a moment (bounded, see HOT_*).

        The readers a commit wakes (long-polls, SSE, tailing catch-ups) read exactly that data next.
        Serving it from memory spares each of them a trip to the read executor and a ``pread``, which
        is what bounded the wake latency of 100 parked readers (docs/decisions/0004-performance.md).
        The entries are the ones just written, so nothing is served that is not on disk.
        """
        hot = self._hot
        if not isinstance(hot, collections.deque):
            hot = self._hot = collections.deque()
        rare = self._rare  # read once: a ``_rare_field`` read or write is a call
        hot_bytes = 0 if rare is None else rare._hot_bytes
        for item, _ in batch:
            kind = type(item)
            if kind is AppendEntry:
                if hot and hot[-1].end != item.position:
                    hot.clear()
                    hot_bytes = 0
                hot.append(item)  # type: ignore[arg-type]
                hot_bytes += item.cost  # type: ignore[union-attr]
            elif kind is not SoftDelete:
                # A record group: its messages are not in the item, so the window would have a gap.
                hot.clear()
                hot_bytes = 0
        while hot and (hot_bytes > HOT_MAX_BYTES or len(hot) > HOT_MAX_ENTRIES):
            hot_bytes -= hot.popleft().cost
        if not hot:
            self._hot = ()
            if rare is not None:
                rare._hot_bytes = 0
        else:
            if rare is None:
                rare = self._rare = _Rare()
            rare._hot_bytes = hot_bytes
            self._ctx.hot.touch(self)

    def expire_hot(self) -> None:
        """No commit has added to the hot tail for HOT_SECONDS (``hot.HotSweep``): drop it."""
        self._drop_hot()

    def _drop_hot(self) -> None:
        """The log is idle: drop what only its readers right after a commit need (the hot tail, the
        index's recent window)."""
        self._hot = ()
        self._hot_bytes = 0
        self._index.forget_recent()
        self._ctx.hot.forget(self)
        rare = self._rare
        if rare is not None and not self._busy and rare.at_defaults():
            self._rare = None

    def _settle_promote_waiters(self, exc: BaseException | None) -> None:
        rare = self._rare
        if rare is None or not rare._promote_waiters:
            return
        waiters, rare._promote_waiters = rare._promote_waiters, ()
        for waiter in waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    def _poison(self, exc: BaseException) -> None:
        self._failure = exc
        log.error(
            "stream %s (%s): storage write failed, log poisoned %s: %r",
            self.id,
            self.header.path,
            "(it heals once space returns)" if is_out_of_space(exc) else "until restart",
            exc,
            exc_info=not isinstance(exc, OSError | errors.StorageFailure),
        )
        pending = [*self._inflight, *self._queue]
        self._inflight = ()
        self._queue = ()
        self._round_snapshot = None
        for _, fut in pending:
            if not fut.done():
                fut.set_exception(self._error())
        waiters, self._flush_waiters = self._flush_waiters, ()
        for _, waiter in waiters:
            if not waiter.done():
                waiter.set_exception(self._error())
        self._settle_promote_waiters(self._error())
        if is_out_of_space(exc) and not self._closed and self._healing is None:
            self._heal_failures += 1
            delay = min(HEAL_MAX_DELAY, HEAL_FIRST_DELAY * 2 ** (self._heal_failures - 1))
            self._healing = asyncio.get_running_loop().create_task(self._heal(delay))

    async def _heal(self, delay: float) -> None:
        """After running out of space: re-read the log from disk and accept appends again.

        Only the accepted state can be ahead of the disk (the failed batch was truncated away, or its
        torn rest is truncated by the recovery below), so the state is rebuilt exactly as a restart
        would rebuild it: producers, ``Stream-Seq`` and closure as acknowledged, and an append that
        failed is not remembered (its retry is written, never answered as a duplicate). Anything odd
        (recovery quarantines the stream, or finds less than was acknowledged) leaves the log poisoned
        until a restart.
        """
        try:
            await asyncio.sleep(delay)
            await self._wait_idle()  # the batch that poisoned the log has ended
            if self._closed or self._deleted or self._failure is None:
                return
            if self._ctx.committer.failure is not None:
                return  # the WAL itself failed: nothing writes until a restart
            if self.packed and self.extents is not None:  # step 2: fold its packed records
                await self._heal_packed(self.extents)
                return
            if self.packed:  # its failed promotion left nothing: back to the packed create's state
                self._drop_hot()
                self.state = StreamState(
                    tail=self.header.fork_position,
                    last_timestamp_ms=self.header.append_time_floor_ms,
                )
                self._staged_count = self._durable_count
                self._failure = None
                log.warning(
                    "stream %s (%s): healed after running out of space (still packed)",
                    self.id,
                    self.header.path,
                )
                return
            interval = self._index.sparse.interval
            try:
                recovered = await asyncio.get_running_loop().run_in_executor(
                    self._ctx.executor,
                    lambda: recover_stream(self.directory, self.id, interval, sync=self._ctx.sync),
                )
            except Quarantine as q:
                log.error(
                    "stream %s (%s): cannot heal after running out of space: %s; poisoned until "
                    "restart",
                    self.id,
                    self.header.path,
                    q.reason,
                )
                return
            if self._closed or self._deleted or self._failure is None:
                return
            if recovered.state.tail < self.durable_tail:
                log.error(
                    "stream %s (%s): the log on disk ends at %d, before the acknowledged tail %d; "
                    "poisoned until restart",
                    self.id,
                    self.header.path,
                    recovered.state.tail,
                    self.durable_tail,
                )
                return
            self._drop_hot()
            self._ctx.cache.discard(lambda key: key[0] == self.id)
            self.state = recovered.state
            self._segments = SegmentTable(recovered.directory, self.id, recovered.bases)
            self._index = recovered.index
            self._file_end = recovered.file_end
            self._last_record = recovered.last_record
            self._snapshot_entries = recovered.snapshot_entries
            self._snapshot_end = recovered.snapshot_end
            self._staged_count = self._durable_count  # every pending stage was failed
            grew = recovered.state.tail != self.durable_tail
            self.durable_tail = recovered.state.tail
            self.durable_closed = recovered.state.closed
            self._failure = None
            log.warning(
                "stream %s (%s): healed after running out of space; accepting appends again at %d",
                self.id,
                self.header.path,
                self.durable_tail,
            )
            if grew:  # a failed batch whose undo failed was complete on disk: it is data now
                self._notify_committed()
        except asyncio.CancelledError:
            pass
        finally:
            self._healing = None

    async def _heal_packed(self, extents: Extents) -> None:
        """``_heal`` of a packed stream with records: its state folded again from its virtual
        segment 0 (what a restart would fold: ``recovery.recover_packed``)."""
        data = await self._ctx.committer.read_packed(extents)
        interval = self._index.sparse.interval
        try:
            recovered = recover_packed(self.id, data, interval)
        except Quarantine as q:
            log.error("stream %s: cannot heal: %s; poisoned until restart", self.id, q.reason)
            return
        if self._closed or self._deleted or self._failure is None:
            return
        self._drop_hot()
        self.state = recovered.state
        self._index = recovered.index
        self._file_end = recovered.file_end
        self._last_record = recovered.last_record
        self._staged_count = self._durable_count
        self._failure = None
        log.warning("stream %s: healed after running out of space (still packed)", self.id)

    def _error(self) -> errors.StorageFailure:
        exc = self._failure
        if exc is None:
            return errors.StorageFailure(f"stream {self.header.path!r}: log is closed")
        if is_out_of_space(exc):
            return errors.InsufficientStorage(
                f"stream {self.header.path!r}: no space left for the log ({exc})"
            )
        return errors.StorageFailure(f"stream {self.header.path!r}: storage failure ({exc})")

    # -------------------------------------------------------------------------------------- snapshots

    def note_pruned(self) -> None:
        """The state dropped something the log still holds (idle producers, engine/producer_sweep.py):
        the shutdown snapshot is written even without new entries, so a restart does not fold it back
        first (harmless if it does: it is true, and the next sweep drops it again)."""
        self._pruned += 1

    @property
    def snapshot_stale(self) -> bool:
        return self._pruned != self._snapshot_pruned

    def _snapshot_due(self) -> bool:
        """Every ``snapshot_interval_entries``, and only once the bytes written since are worth more
        than re-writing the index (so a huge index is not rewritten every few KiB)."""
        if self.state.entries - self._snapshot_entries < self._ctx.snapshot_interval_entries:
            return False
        return self._file_end - self._snapshot_end >= 16 * len(self._index.sparse)

    async def _write_snapshot(self, state: StateImage, covered_end: int, last_record: int) -> None:
        """Encode and write in a worker thread: the loop only took ``capture`` and the index's length
        (storage/snapshot.py), whatever the number of producers or index points. None for a
        packed stream (no directory: it is folded from its virtual segment 0, at most 256 KiB)."""
        if self.packed:
            return
        index = IndexImage.of(self._index.sparse)
        pruned = self._pruned

        def encode_and_write() -> None:
            pieces = snapshot_pieces(self.id, covered_end, last_record, state, index)
            write_snapshot(self.directory, pieces, sync=self._ctx.sync)

        try:
            await asyncio.get_running_loop().run_in_executor(self._ctx.executor, encode_and_write)
        except OSError as exc:
            log.warning(
                "stream %s: snapshot not written (%s); start-up will replay more", self.id, exc
            )
            return
        self._snapshot_entries = state.entries
        self._snapshot_end = covered_end
        self._snapshot_pruned = pruned

    # ------------------------------------------------------------------------------------------ reads

    async def read(
        self,
        start: int,
        max_bytes: int,
        end: int | None = None,
        *,
        whole_messages: bool,
        runs: bool = False,
        overhead: int = 0,
    ) -> ReadChunk:
        """Read from logical ``start`` up to ``min(end, durable_tail)``, about ``max_bytes`` of payload.

        - ``whole_messages=True`` (JSON streams): returns whole messages only, at least one if any
          exists (even if larger than ``max_bytes``); ``start`` must be a message boundary, else
          ``InvalidPosition``.
        - Byte streams: may start and stop inside a stored message.
        - ``start`` outside ``[base, durable_tail]`` raises ``InvalidPosition``.
        - A read of a deleted log raises ``errors.NotFound``; checksum failure ``errors.CorruptStream``;
          an I/O error ``errors.StorageFailure``.
        - ``runs`` (whole-message reads): the messages returned from one record read from disk come
          back as one ``MessageRun`` (reads served from memory return slices).
        - ``overhead``: what each message costs against ``max_bytes`` beyond its bytes.
        Uses the index to find the start and ``pread`` from disk in a worker thread; never loads a segment
        whole.
        """
        cap = self._read_cap(start, end)
        if cap <= start:
            return ReadChunk((), start)
        if self._hot_covers(start):
            # Just committed (usually the readers this commit woke): served from memory. Readers
            # start near the end, so look for the first entry from there.
            hot = self._hot
            first = len(hot) - 1
            while hot[first].position > start:
                first -= 1
            entries = hot if first == 0 else itertools.islice(hot, first, None)
            try:
                slices, next_position, count = read_entries(
                    entries, start, cap, max_bytes, whole_messages, overhead
                )
            except NotABoundary as exc:
                raise InvalidPosition(str(exc)) from None
            return ReadChunk(tuple(slices), next_position, count)
        disk = self._disk_read(start, cap)
        try:
            for attempt in itertools.count():
                try:
                    slices, next_position, count = await asyncio.get_running_loop().run_in_executor(
                        self._ctx.read_executor, disk.run, max_bytes, whole_messages, runs, overhead
                    )
                    break
                except Replan as exc:
                    await self._before_replan(attempt, exc)
                    cap = self._read_cap(start, end)
                    disk = self._disk_read(start, cap)
        except NotABoundary as exc:
            raise InvalidPosition(str(exc)) from None
        except (codec.CorruptRecord, OSError) as exc:
            raise self._read_error(exc) from exc
        return ReadChunk(tuple(slices), next_position, count)

    def plan_read(self, start: int, end: int) -> DiskRead | ReadChunk | None:
        """What ``read(start, ..., end)`` will do, decided now on the loop, so that many small reads
        can share one worker-thread trip (multi-range reads, ``engine/multiread.py``): an empty chunk
        when there is nothing to read, the ``DiskRead`` to run in a worker thread, or None when
        ``read`` answers from memory (the hot tail: call ``read`` itself). Raises what ``read`` raises
        before it reads. A ``DiskRead`` reads what the log held when it was planned.

        ``_read_cap``, ``_hot_covers`` and ``_disk_read`` with ``_view`` written out in one body: a
        multi-range read plans one a range on the loop (10,000 for a packed Spark task), and those
        calls were ~1 us of its ~5 us of planning."""
        rare = self._rare  # ``_deleted`` and ``base`` read without their properties' calls
        if rare is not None and rare._deleted:
            self._check_open()
        tail = self.durable_tail
        base = self.header.fork_position
        if not base <= start <= tail:
            raise InvalidPosition(f"position {start} is outside [{base}, {tail}]")
        cap = end if end < tail else tail
        if cap <= start:
            return ReadChunk((), start)
        hot = self._hot
        if hot and hot[0].position <= start and hot[-1].end == tail:
            return None
        _, scan_from = self._index.floor(start)
        extents = self.extents
        if extents is None:
            view: SegmentView | PackedView = self._segments.view(self._file_end)
        else:
            files = self._ctx.pack_files
            assert files is not None, "a packed log with extents in a data directory without packs"
            # ``PackedView.of`` written out (a call less a range).
            view = _new_tuple(
                PackedView, (self.id, extents.rows(), self._file_end, files, files.done)
            )
        # ``tuple.__new__``: a NamedTuple's own ``__new__`` is Python (~0.3 us more).
        return _new_tuple(DiskRead, (view, self._ctx.cache, scan_from, start, cap))

    def _read_cap(self, start: int, end: int | None) -> int:
        self._check_open()
        tail = self.durable_tail
        if not self.base <= start <= tail:
            raise InvalidPosition(f"position {start} is outside [{self.base}, {tail}]")
        return tail if end is None else min(end, tail)

    def _hot_covers(self, start: int) -> bool:
        hot = self._hot
        return bool(hot) and hot[0].position <= start and hot[-1].end == self.durable_tail

    def _disk_read(self, start: int, cap: int) -> DiskRead:
        _, scan_from = self._index.floor(start)
        # ``tuple.__new__``: a NamedTuple's own ``__new__`` is Python (~0.3 us more), and a
        # multi-range read plans one a range on the loop.
        return _new_tuple(DiskRead, (self._view(), self._ctx.cache, scan_from, start, cap))

    def _view(self) -> SegmentView | PackedView:
        """The durable bytes as the read algorithms see them: the segments of a directory stream,
        or a packed stream's pieces in WAL files and packs (``packview.py``)."""
        extents = self.extents
        if extents is None:
            return self._segments.view(self._file_end)
        files = self._ctx.pack_files
        assert files is not None, "a packed log with extents in a data directory without packs"
        return PackedView.of(self.id, extents, self._file_end, files)

    async def _before_replan(self, attempt: int, exc: Replan) -> None:
        """A packed read's files moved under it: wait a little, then the caller plans it again."""
        if attempt + 1 >= REPLAN_TRIES:
            raise OSError(f"packed records kept moving during a read: {exc}")
        await asyncio.sleep(REPLAN_FIRST_DELAY * 2**attempt)
        self._check_open()

    async def is_boundary(self, position: int) -> bool:
        """True if ``position`` is a message boundary (or the tail), staged entries included."""
        known = self.known_boundary(position)
        if known is not None:
            return known
        floor, _ = (await self.message_floors([position]))[0]
        return floor == position

    def known_boundary(self, position: int) -> bool | None:
        """``is_boundary(position)`` when memory answers it (the base, the tails, staged entries,
        recent record starts); None when it takes a header scan in the read executor."""
        state = self.state
        if position < self.base or position > state.tail:
            return False
        if position == self.base or position == self.durable_tail or position == state.tail:
            return True
        if position > self.durable_tail:
            return self._staged_ordinal(position, self._staged()) is not None
        return None if self._index.exact(position) is None else True

    async def boundary_after(self, anchor: int, count: int, *, messages: bool) -> int:
        """Position ``count`` messages (or bytes) past ``anchor``, for fork sub-offsets.

        Raises ``InvalidPosition`` if ``anchor`` is not a boundary, ``count`` is negative, or the result
        would pass the tail (``messages=True``) or the end of the message that starts at ``anchor``
        (``messages=False``). Staged entries count. Costs two bounded header scans in the read
        executor (message ordinals, ``ordinals.py``), whatever ``count`` is.
        """
        if count < 0:
            raise InvalidPosition(f"negative count {count}")
        # Everything below is judged against one consistent picture: the durable part as of now
        # (its message count and tail) plus the entries staged after it.
        staged = self._staged()
        durable_tail = self.durable_tail
        durable_count = self._index.messages
        if anchor < self.base or anchor > self.state.tail:
            raise InvalidPosition(f"position {anchor} is outside [{self.base}, {self.state.tail}]")
        if anchor < durable_tail:
            floor, ordinal = (await self.message_floors([anchor]))[0]
            if floor != anchor:
                raise InvalidPosition(f"position {anchor} is not a message boundary")
        else:
            staged_ordinal = self._staged_ordinal(anchor, staged)
            if staged_ordinal is None:
                raise InvalidPosition(f"position {anchor} is not a message boundary")
            ordinal = durable_count + staged_ordinal
        if count == 0:
            return anchor
        step = count if messages else 1
        target = ordinal + step
        if target <= durable_count:
            end = (
                durable_tail
                if target == durable_count
                else (await self.message_starts([target]))[0]
            )
        else:
            end = self._staged_start(target - durable_count, staged, durable_tail)
            if end is None:
                if messages:
                    raise InvalidPosition(f"{count} messages past {anchor} is past the tail")
                raise InvalidPosition(f"no message at {anchor}")
        if messages:
            return end
        if anchor + count > end:
            raise InvalidPosition(
                f"{count} bytes past {anchor} passes the end of its message ({end - anchor} bytes)"
            )
        return anchor + count

    @property
    def durable_messages(self) -> int:
        """How many messages the durable part of this log holds."""
        return self._index.messages

    async def message_floors(self, positions: list[int]) -> list[tuple[int, int]]:
        """For each durable position, ``(floor, ordinal)``: the last message boundary at or before it
        and the ordinal of the message starting there (messages of this log before it).

        Positions must lie in ``[base, durable_tail]``. Answers from memory for the base, the tail and
        recent record starts (a read or lookup from the beginning of an idle stream takes no scan); everything else costs one bounded header scan each, all in one trip to
        the read executor.
        """
        self._check_open()
        tail = self.durable_tail
        count = self._index.messages
        answers: list[tuple[int, int] | None] = []
        pending: list[tuple[int, tuple[int, int, int], int]] = []
        for i, position in enumerate(positions):
            if not self.base <= position <= tail:
                raise InvalidPosition(f"position {position} is outside [{self.base}, {tail}]")
            if position == tail:
                answers.append((tail, count))
                continue
            if position == self.base:  # no message of this log before its base
                answers.append((position, 0))
                continue
            exact = self._index.exact(position)
            if exact is not None:
                answers.append((position, exact))
                continue
            answers.append(None)
            pending.append((i, self._index.floor_entry(position), position))
        if pending:
            cache = self._ctx.cache

            def scan(view: ReadView) -> list[tuple[int, int]]:
                return [floor_boundary(view, cache, point, pos) for _, point, pos in pending]

            for (i, _, _), answer in zip(pending, await self._scan(scan), strict=True):
                answers[i] = answer
        return answers  # type: ignore[return-value]

    async def message_starts(self, ordinals: list[int]) -> list[int]:
        """For each ordinal in ``[0, durable_messages]``, where that message starts (the durable tail
        for ``durable_messages``). One bounded header scan each, in one executor trip."""
        self._check_open()
        tail = self.durable_tail
        count = self._index.messages
        answers: list[int | None] = []
        pending: list[tuple[int, tuple[int, int, int], int]] = []
        for i, ordinal in enumerate(ordinals):
            if not 0 <= ordinal <= count:
                raise InvalidPosition(f"message ordinal {ordinal} is outside [0, {count}]")
            if ordinal == count:
                answers.append(tail)
                continue
            answers.append(None)
            pending.append((i, self._index.floor_ordinal(ordinal), ordinal))
        if pending:
            cache = self._ctx.cache

            def scan(view: ReadView) -> list[int]:
                return [message_start(view, cache, point, target) for _, point, target in pending]

            for (i, _, _), answer in zip(pending, await self._scan(scan), strict=True):
                answers[i] = answer
        return answers  # type: ignore[return-value]

    async def first_at_time(self, at_ms: int) -> tuple[int, int] | None:
        """``(position, append time)`` of the first durable message of this log whose append time is
        ``>= at_ms`` (effective times, ``index.py``), or None if there is none yet.

        A bisect over the sparse index, then one header scan of about one index interval in the read
        executor (``times.py``); answered from memory when no message is that late.
        """
        self._check_open()
        sparse = self._index.sparse
        if not self._index.messages or sparse.last_time < at_ms:
            return None
        point = sparse.floor_time(at_ms)
        if point is None:  # even the first point is that late: the first message is the answer
            offset, running = sparse.offsets[0], -(2**63)
        else:
            _, offset, running = point
        cache = self._ctx.cache

        def scan(view: ReadView) -> list[tuple[int, int] | None]:
            return [first_at_or_after(view, cache, offset, running, at_ms)]

        return (await self._scan(scan))[0]

    async def _scan(self, work: Callable[[ReadView], list[_T]]) -> list[_T]:
        """``work`` over the log's current view in the read executor (planned again if a packed
        stream's files moved under it)."""
        try:
            for attempt in itertools.count():
                view = self._view()
                try:
                    return await self._ctx.scans.run(functools.partial(work, view))  # type: ignore[no-any-return]
                except Replan as exc:
                    await self._before_replan(attempt, exc)
        except (codec.CorruptRecord, OSError) as exc:
            raise self._read_error(exc) from exc
        raise AssertionError("unreachable")

    def _staged(self) -> list[AppendEntry]:
        """Entries accepted but not yet durable, in log order."""
        return [item for item, _ in [*self._inflight, *self._queue] if type(item) is AppendEntry]

    def _staged_ordinal(self, position: int, staged: list[AppendEntry]) -> int | None:
        """Ordinal (counted from the first staged message) of the staged message starting at
        ``position``, or of the end of staged data; None if ``position`` is inside a message."""
        ordinal = 0
        if position == self.durable_tail:
            return 0
        for entry in staged:
            m_pos = entry.position
            for message in entry.messages:
                if m_pos == position:
                    return ordinal
                if m_pos > position:
                    return None
                m_pos += len(message)
                ordinal += 1
            if m_pos == position:
                return ordinal
        return None

    @staticmethod
    def _staged_start(target: int, staged: list[AppendEntry], durable_tail: int) -> int | None:
        """Where staged message number ``target`` starts (the end of staged data for the count of
        staged messages); None past that."""
        ordinal = 0
        at = durable_tail
        for entry in staged:
            n = len(entry.messages)
            if ordinal + n < target:
                ordinal += n
                at = entry.end
                continue
            at = entry.position
            for message in entry.messages[: target - ordinal]:
                at += len(message)
            return at
        return at if ordinal == target else None

    def _check_open(self) -> None:
        if self._deleted:
            raise errors.NotFound(f"stream {self.header.path!r} was deleted")

    def _read_error(self, exc: BaseException) -> errors.ProtocolError:
        if self._deleted:
            return errors.NotFound(f"stream {self.header.path!r} was deleted")
        if isinstance(exc, codec.CorruptRecord):
            log.error("stream %s (%s): corrupt record on read: %s", self.id, self.header.path, exc)
            return errors.CorruptStream(f"stream {self.header.path!r} failed its checksums")
        log.error("stream %s (%s): read failed: %r", self.id, self.header.path, exc)
        return errors.StorageFailure(f"stream {self.header.path!r}: read failed ({exc})")

    # ---------------------------------------------------------------------- lifecycle (for DataDir)

    async def _shutdown(self, *, snapshot: bool) -> None:
        """Stop accepting stages, drain the queue, optionally snapshot. Never raises for the log's own
        failure (it was logged when it happened)."""
        self._closed = True
        self._drop_hot()
        if self._healing is not None:
            self._healing.cancel()
        with contextlib.suppress(errors.StorageFailure):
            await self.flush()
        await asyncio.shield(self._wait_idle())
        if (
            snapshot
            and self._failure is None
            and not self._deleted
            and (
                self.state.entries != self._snapshot_entries
                or self._file_end != self._snapshot_end
                or self.snapshot_stale
            )
        ):
            await self._write_snapshot(capture(self.state), self._file_end, self._last_record)

    def _forget_files(self) -> None:
        self._drop_hot()
        segments = self._segments
        self._ctx.cache.discard_keys([segments.key(base) for base in segments.bases])
