"""Commit rounds shared by every log of a data directory: group commit across streams.

Each log used to run its own writer: one executor trip, one ``pwritev`` and one ``fdatasync`` per batch of
that stream. With many streams each getting one append at a time (64 producers on 64 streams), every append
paid a thread hand-off and a journal commit of its own, and 64 producers on 64 streams were slower than on
one shared stream. Now a log with something staged asks the committer for a turn (``schedule``); the
committer's round takes the next batch of every log that asked, and one worker thread writes them all:

- each log's records into its segment file (``writer.lay_out``/``write_chunks``), as before, not synced;
- with ``--durability fsync``, the same bytes into the write-ahead log (``wal.py``), synced once for the
  whole round. Then every append of the round is durable and is acknowledged (``StreamLog.round_done``).

While a round is in flight, new stages queue up; the next round starts as soon as it ends, with everything
that arrived meanwhile, so rounds grow with the load (as a single log's batches always did).

Batches the round does not carry: a record group (a staged-append commit, ``group.py``) and a batch of more
than ``ROUND_BATCH_BYTES`` are written by the log itself, synced in its segment file, as before (large data
gains nothing from being written twice, and must not hold up the small appends of every other stream). A
log has at most one batch in flight either way, so its records reach its file in order.

Creates share the rounds too (``create``): a new stream's first segment (its header record and initial
data) goes into the round's WAL file as a *create* entry; after the round's sync, the worker makes its
directory in ``streams/`` and writes that segment through a handle pinned like the others, syncing nothing
(the round's catalog lines then go out in one write, ``on_made``).
So N creates in flight cost one sync, not three each (the segment, the staging directory, ``streams/``),
and a bulk ``ensure`` of many streams costs about one round. The checkpoint that retires the WAL file syncs
the new segments, then each new directory, then ``streams/`` once, and only then removes the file; until
then a restart's replay makes whatever did not reach the disk again (``wal.py``). A delete of a stream whose
create entry is still in a WAL file first writes a *drop* entry (``drop``), so the replay does not bring it
back. Creates wait while the pins of the current WAL file reach twice the checkpoint size and a checkpoint
is still syncing the previous one, so a burst of creates keeps the fds held bounded.

Checkpoints keep the WAL short: once the current WAL file holds ``CHECKPOINT_WAL_BYTES``, or
``CHECKPOINT_FILES`` segment files were written since it started, or the committer has been idle for
``CHECKPOINT_IDLE_SECONDS``, the next round starts a new WAL file and the old one is retired: every segment
file written during it is ``fdatasync``-ed through the fd it was written with (those fds stay open until
then: hazard 30), then the old file is removed. So what a restart replays is bounded, and so are the fds
held open.

Failures. A segment write that fails fails only its log (poisoned as before; out of space heals). A failed
WAL write or sync fails the whole round; out of space is undone (the WAL is cut back and synced) and the
logs heal as before; anything else, or an undo that fails, leaves the WAL's content unknown, and then no
log of the data directory may write again until a restart replays it (``failure``): a later write could
land where a restart would put back bytes of the failed round. The same holds if a checkpoint's sync
fails (the segment may have lost acknowledged bytes; the WAL file that has them is kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from durastream_server.storage.batch import Batch, Slot
from durastream_server.storage.extents import Extents, records_offsets
from durastream_server.storage.files import FdCache, Handle, fsync_dir, is_out_of_space
from durastream_server.storage.metrics import NO_METRICS, WriteMetrics
from durastream_server.storage.packs import PackBook, Retirement, read_virtual
from durastream_server.storage.packview import PackFiles
from durastream_server.storage.records import AppendEntry, SoftDelete
from durastream_server.storage.wal import Kind, WalEntry, WalFile
from durastream_server.storage.writer import (
    BatchResult,
    Chunk,
    WriteTarget,
    lay_out,
    payload,
    undo_chunks,
    write_chunks,
)

log = logging.getLogger(__name__)

# A log's batch goes into a shared round when its records take at most this many bytes; a larger one is
# written and synced by the log itself.
ROUND_BATCH_BYTES = 256 * 1024
# Decision 0010 step 2: a packed stream's records stay packed (WAL entries, no directory) while its
# virtual segment 0 stays within this many bytes; the write that would pass it promotes the stream.
# The default of ``--packed-threshold`` (``StorageConfig.packed_threshold``, ``Committer.packed_threshold``).
PACKED_APPEND_BYTES = 256 * 1024
# Checkpoint triggers (see the module docstring).
CHECKPOINT_WAL_BYTES = 64 * 1024 * 1024
CHECKPOINT_FILES = 256
CHECKPOINT_IDLE_SECONDS = 1.0
# Segment files synced per executor job in a checkpoint: concurrent syncs share journal commits.
_SYNCS_PER_JOB = 16


# A packed job's segment size (``StreamLog._packed_target``): its virtual segment 0 never rolls.
PACKED_SEGMENT_BYTES = 1 << 62


@dataclass(slots=True)  # not frozen: made per log per round (as ``writer.WriteTarget``)
class RoundJob:
    """One log's batch in a round: its records and where they go."""

    target: WriteTarget
    items: list[AppendEntry | SoftDelete]
    seg_base: int  # the log's last segment
    end: int  # the log's file end
    cost: int  # what the batch counts against the round's size (``log._batch_bytes``)
    promote: Promotion | None = None  # a packed stream's first write: make its directory too
    # Decision 0010 step 2: a packed stream's small batch, written only into the WAL as packed
    # records (``Kind.PACKED_RECORDS``) at ``end`` of its virtual segment 0; no segment write.
    packed: bool = False


@dataclass(slots=True)  # not frozen, as ``BatchResult``
class PackedResult(BatchResult):
    """``BatchResult`` of a packed job: where its records went in the round's WAL file (one
    entry, its records ``length`` bytes at ``records_at`` of WAL ``generation``)."""

    generation: int = -1
    records_at: int = -1
    length: int = 0


class Promotion(Protocol):
    """A packed stream given its directory by its first write, in that write's round
    (``promotion.py``)."""

    @property
    def log_id(self) -> str: ...

    @property
    def header_frame(self) -> bytes: ...  # segment 0 before the write: header (and packed records)

    @property
    def final(self) -> str: ...  # its directory in streams/

    @property
    def carries_records(self) -> bool: ...  # step 2: its packed records are read by ``load``

    def load(self) -> None:
        """In the worker, before the round's WAL write: read the stream's packed records back
        (``packs.read_virtual``) into ``header_frame``. Raises OSError."""
        ...

    @property
    def staged(self) -> str: ...  # where it is built without a WAL (staging/)

    def make(self) -> Handle:
        """After the WAL sync: make the directory in ``streams/`` with its first segment holding the
        header record (unsynced); returns the segment's handle, cached and referenced once."""
        ...

    def stage(self) -> Handle:
        """Without a WAL: ``make`` under ``staging/`` (``place`` renames it into ``streams/``)."""
        ...

    def place(self) -> None: ...

    def abandon(self) -> None:
        """Remove whatever ``make`` or ``stage`` made (best effort, never raises)."""
        ...

    def catalog_line(self) -> bytes: ...


class Creation(Protocol):
    """A new stream whose create rides a round (``DataDir``'s): its first segment, and how to make it."""

    @property
    def log_id(self) -> str: ...

    @property
    def data(self) -> bytes: ...  # the first segment's content: header record and initial data

    @property
    def packed(self) -> bool: ...  # a packed create (packs.py): the WAL entry alone, no directory

    def materialize(self) -> tuple[Handle, str]:
        """Make the directory and its first segment, unsynced (after the round's WAL sync). Returns
        the handle written through (referenced: the checkpoint syncs and releases it) and the
        directory. On an OSError it leaves nothing behind."""
        ...


class Member(Protocol):
    """What the committer needs of a log (``StreamLog``)."""

    def round_job(self) -> RoundJob | None: ...

    def round_done(self, result: BatchResult | BaseException) -> None: ...


@dataclass(slots=True)
class _Retired:
    """A WAL file that the next checkpoint syncs the segments of, then removes."""

    wal: WalFile | None  # None if no round of it got as far as creating the file
    pins: dict[int, Handle] = field(default_factory=dict)
    made: list[str] = field(default_factory=list)  # directories of the streams created during it


class Committer:
    """Runs the commit rounds of every log of one data directory (module docstring).

    ``wal_dir`` is None with ``--durability none``: rounds then only write (nothing is synced, nothing
    is pinned, there is no WAL). Everything but the worker half runs on the event loop.
    """

    def __init__(
        self,
        cache: FdCache,
        io_executor: Executor,
        wal_dir: Path | None,
        metrics: WriteMetrics = NO_METRICS,
        on_made: Callable[[list[Any]], None] | None = None,
        packs_root: Path | None = None,
    ) -> None:
        self._cache = cache
        # Live packed creates and the files holding them (packs.py).
        self.packs = PackBook(packs_root)
        # Readers of packed records (``packview.py``): told before a checkpoint moves pack files and
        # after it (``_carry_out_unpacked``). Set by the data directory.
        self.pack_files: PackFiles | None = None
        # Told the creations a round made, in one call (the data directory's catalog lines: one
        # write per round, not one per create). Runs in the worker thread; must not raise.
        self._on_made = on_made
        self._metrics = metrics  # one batch per round, one fsync per WAL sync (storage/metrics.py)
        # Pinned handles are in use until their checkpoint: check points often enough that they stay
        # within half of --max-open-files (the retired generation's pins and the new one's together).
        self._checkpoint_files = max(1, min(CHECKPOINT_FILES, cache.capacity // 4))
        self._io = io_executor
        self._wal_dir = wal_dir
        self.generation = 0  # of the next WAL file (set after the start-up replay)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="durastream-commit")
        self._ready: dict[Member, None] = {}  # logs waiting for a turn, in order (a set)
        self._creates: list[tuple[Creation, asyncio.Future[None]]] = []  # waiting for a round
        self._packed: list[tuple[Creation, asyncio.Future[None]]] = []  # packed creates, likewise
        self._drops: list[tuple[str, asyncio.Future[None]]] = []
        # Streams whose create entry is in a WAL file not yet removed: WAL generation -> log ids.
        self._fresh: dict[str, int] = {}
        # Retired WAL files whose packs could not be written yet (out of space), oldest first.
        self._unpacked: list[tuple[Retirement, WalFile]] = []
        self._packing = False  # ``_carry_out_packs`` is running: one at a time, oldest file first
        # Step 2: held while a carry moves packed entries between files (from the pack's rename to
        # the extents' relocation) and while a round reads a promoted stream's packed records back,
        # so that read never sees a file its extents do not describe yet.
        self._pack_lock = asyncio.Lock()
        self.packed_appends = False  # StorageConfig.packed_appends (decision 0010 step 2)
        self.packed_threshold = PACKED_APPEND_BYTES  # StorageConfig.packed_threshold
        self._task: asyncio.Task[None] | None = None
        self._rotate = False  # the next round starts a new WAL file
        self._idle_timer: asyncio.TimerHandle | None = None
        self._checkpoint: asyncio.Task[None] | None = None
        # Worker-thread state (touched only by the round in flight, one at a time):
        self._wal: WalFile | None = None
        self._pins: dict[int, Handle] = {}  # handles written through in the current WAL file
        self._made: list[str] = []  # directories created in the current WAL file
        # Set once the WAL's state is unknown: no log may write until a restart (module docstring).
        # Only ``_fail`` sets it. A plain attribute, not a property: every stage and every round job
        # reads it (issue 17).
        self.failure: BaseException | None = None
        self._closed = False
        self.rounds = 0  # rounds written (observability, tests)

    # ------------------------------------------------------------------------------------ the loop

    def schedule(self, member: Member) -> None:
        """``member`` has a batch to write: it gets a turn in the next round (or the one starting)."""
        self._ready[member] = None
        self._start()

    async def create(self, creation: Creation) -> None:
        """Make ``creation``'s stream durable in the next round, then materialize it (module
        docstring). Raises the OSError that failed it; then nothing of it is left, now or after a
        restart (unless even the drop entry that says so could not be written: then a restart may
        bring the whole stream back, never half of it)."""
        await self.create_soon(creation)

    def create_soon(self, creation: Creation) -> asyncio.Future[None]:
        """``create`` as the future of its round, without a coroutine (the engine's packed create,
        ``DataDir.create_packed_soon``): resolved once ``creation`` is durable, failed with the
        OSError that failed it."""
        assert self._wal_dir is not None, "creates ride rounds only with a WAL"
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._packed if creation.packed else self._creates).append((creation, done))
        self._start()
        return done

    async def create_many(self, creations: list[Creation]) -> list[BaseException | None]:
        """``create`` for a bulk request's new streams: each rides a round as ``create`` does (the
        same WAL entry, the same outcome), but the whole batch has one loop future, settled once
        every creation is settled: no future, callback or wake-up per stream (issue 16). Returns
        each creation's outcome (None: made durable) in order; never raises an OSError."""
        assert self._wal_dir is not None, "creates ride rounds only with a WAL"
        batch = Batch(len(creations))
        for index, creation in enumerate(creations):
            slot: Any = Slot(batch, index)  # where ``create`` puts a future (storage/batch.py)
            (self._packed if creation.packed else self._creates).append((creation, slot))
        if creations:
            self._start()
            await batch.all_done
        return batch.outcomes

    def is_fresh(self, log_id: str) -> bool:
        """True while ``log_id``'s create entry is in a WAL file (a delete must ``drop`` it first)."""
        return log_id in self._fresh

    async def drop(self, log_id: str) -> None:
        """Before the directory of a fresh stream goes: a durable drop entry, so that a restart does
        not make it again from its create entry (a no-op for a stream that is not fresh). For a
        packed stream the drop makes its packed create void (packs.py)."""
        if log_id not in self._fresh and not self.packs.is_packed(log_id):
            return
        if self._wal_dir is None:
            # --durability none over a data directory that has packs (written with fsync): no WAL
            # to say it, so the pack's sidecar does (unsynced, as everything is then).
            await asyncio.get_running_loop().run_in_executor(self._io, self.packs.void_now, log_id)
            self.packs.forget(log_id)
            return
        done = asyncio.get_running_loop().create_future()
        self._drops.append((log_id, done))
        self._start()
        await done
        self._fresh.pop(log_id, None)

    def _start(self) -> None:
        if self._task is None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._ready or self._rotate or self._creates or self._drops or self._packed:
                members = list(self._ready)
                self._ready.clear()
                jobs: list[tuple[Member, RoundJob]] = []
                budget = 0
                for member in members:
                    if budget > CHECKPOINT_WAL_BYTES // 8:  # a round's size is bounded too
                        self._ready[member] = None
                        continue
                    job = member.round_job()
                    if job is not None:
                        jobs.append((member, job))
                        budget += job.cost
                rotate = self._rotate or self._checkpoint_due()
                self._rotate = False
                # Pins stay bounded: creates wait while the WAL file's pins reach twice the
                # checkpoint size (then a checkpoint is in flight, or this round rotates).
                room = max(0, 2 * self._checkpoint_files - (0 if rotate else len(self._pins)))
                creates, self._creates = self._creates[:room], self._creates[room:]
                drops, self._drops = self._drops, []
                packed, self._packed = self._packed, []
                if not jobs and not rotate and not creates and not drops and not packed:
                    if self._creates and self._checkpoint is not None:
                        await asyncio.shield(self._checkpoint)
                    elif self._creates:
                        self._rotate = True  # no room and nothing syncing it: start a new file
                    continue
                call = functools.partial(
                    loop.run_in_executor,
                    self._thread,
                    self._write_round,
                    [job for _, job in jobs],
                    rotate,
                    [creation for creation, _ in creates],
                    [log_id for log_id, _ in drops],
                    [creation for creation, _ in packed],
                )
                try:
                    if any(j.promote is not None and j.promote.carries_records for _, j in jobs):
                        async with self._pack_lock:
                            outcome = await call()
                    else:
                        outcome = await call()
                    results, made, dropped, generation, retired, packed_at = outcome
                except BaseException as exc:  # a bug (or cancellation): never leave a log waiting
                    failure = exc if isinstance(exc, Exception) else RuntimeError("round cancelled")
                    for member, _ in jobs:
                        member.round_done(failure)
                    for _, done in creates + drops + packed:
                        if not done.done():
                            done.set_exception(failure)
                    raise
                self.rounds += 1
                if retired is not None:
                    self._checkpoint = loop.create_task(self._run_checkpoint(retired))
                for (member, job), result in zip(jobs, results, strict=True):
                    if job.promote is not None and not isinstance(result, BaseException):
                        if self._wal_dir is None:
                            self.packs.forget(job.promote.log_id)  # its sidecar says so already
                        else:
                            self._fresh[job.promote.log_id] = generation
                            self.packs.superseded(job.promote.log_id, generation)
                    member.round_done(result)
                for (creation, done), outcome in zip(creates, made, strict=True):
                    if outcome is None:
                        self._fresh[creation.log_id] = generation
                    _settle(done, outcome)
                for log_id, done in drops:
                    if dropped is None:
                        self.packs.superseded(log_id, generation)
                    _settle(done, dropped)
                for (creation, done), at in zip(
                    packed, packed_at or [-1] * len(packed), strict=True
                ):
                    if dropped is None:  # the round's WAL write (and so each packed create) held
                        self.packs.created(creation.log_id, generation, creation.data, at)
                    _settle(done, dropped)
        finally:
            self._task = None
            self._arm_idle_timer()

    def _checkpoint_due(self) -> bool:
        wal = self._wal
        if wal is None or self._checkpoint is not None:
            return False
        return wal.end >= CHECKPOINT_WAL_BYTES or len(self._pins) >= self._checkpoint_files

    def _arm_idle_timer(self) -> None:
        if self._closed or self._wal is None or self._idle_timer is not None:
            return
        self._idle_timer = asyncio.get_running_loop().call_later(
            CHECKPOINT_IDLE_SECONDS, self._idle_checkpoint
        )

    def _idle_checkpoint(self) -> None:
        self._idle_timer = None
        if self._task is not None or self._closed:
            return
        if self._checkpoint is not None:  # still syncing the previous one: look again later
            self._arm_idle_timer()
            return
        self._rotate = True
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run_checkpoint(self, retired: _Retired) -> None:
        """Sync every segment file written during ``retired`` through its own fd, then remove it."""
        loop = asyncio.get_running_loop()
        handles = list(retired.pins.values())
        try:
            groups = [
                handles[i : i + _SYNCS_PER_JOB] for i in range(0, len(handles), _SYNCS_PER_JOB)
            ]
            await asyncio.gather(*(loop.run_in_executor(self._io, _sync, g) for g in groups))
            made = retired.made
            if made:
                # The new segments' names, then the new directories' names (streams/ once).
                dirs = [made[i : i + _SYNCS_PER_JOB] for i in range(0, len(made), _SYNCS_PER_JOB)]
                await asyncio.gather(*(loop.run_in_executor(self._io, _sync_dirs, d) for d in dirs))
                await loop.run_in_executor(self._io, fsync_dir, os.path.dirname(made[0]))
            if retired.wal is not None:
                self._unpacked.append((self.packs.plan(retired.wal.generation), retired.wal))
            await self._carry_out_packs()
        except OSError as exc:
            self._fail(exc, "a checkpoint (syncing segment files before removing their WAL) failed")
            unpacked = [wal for _, wal in self._unpacked]
            self._unpacked.clear()
            for wal in {id(w): w for w in [*unpacked, retired.wal] if w is not None}.values():
                with contextlib.suppress(OSError):
                    wal.close()
        finally:
            for handle in handles:
                self._cache.release(handle)
            self._cache.trim()  # promotions are not held back by pins as creates are
            self._checkpoint = None
        if self._wal is None or not self._wal.end:
            return
        self._arm_idle_timer()

    async def _carry_out_packs(self) -> None:
        """Packs (packs.py) of the retired WAL files, oldest first: the sidecars of what each file
        made void (or those packs rewritten), then its live packed creates written as a pack, then the
        file is removed. Unlike the syncs before it, this writes new bytes, so it can run out of space;
        then the WAL files stay (their segments are synced already: a restart's replay only reads
        them again, and they still hold every create, drop and promotion the packs lack), writes go on,
        and the next checkpoint tries again from the oldest. Redoing a half-done plan is harmless: a
        sidecar line written twice names the same id, a pack is replaced whole. Any other error raises
        (the checkpoint fails the committer)."""
        if self._packing:  # the one carrying out takes this file too, in order
            return
        self._packing = True
        try:
            await self._carry_out_unpacked()
        finally:
            self._packing = False

    async def _carry_out_unpacked(self) -> None:
        loop = asyncio.get_running_loop()
        while self._unpacked:
            async with self._pack_lock:
                if not await self._carry_out_one(loop):
                    return

    async def _carry_out_one(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The oldest retired WAL file's packs (``_carry_out_packs``); False if out of space. The
        WAL file (and the packs left empty) are removed after the extents that pointed into them
        are relocated (step 2: a reader never finds an extent's file gone); readers of packed
        records are told before the move and after the relocation (``packview.PackFiles``)."""
        plan, wal = self._unpacked[0]
        files = self.pack_files
        if files is not None:  # packed reads of these files planned before re-plan (packview.py)
            files.moving(plan.files_moved())
        try:
            carried = await loop.run_in_executor(
                self._io,
                functools.partial(self.packs.carry_out, plan, wal, sync=True, remove_wal=False),
            )
        except OSError as exc:
            if files is not None:
                files.moved()
            if not is_out_of_space(exc):
                raise
            log.warning(
                "no space to write the packs of %d retired WAL file(s) (%r); they stay in "
                "wal/ and the next checkpoint tries again",
                len(self._unpacked),
                exc,
            )
            return False
        del self._unpacked[0]
        try:
            self.packs.carried_out(plan, carried)  # (step 2: relocates the logs' extents)
        finally:
            if files is not None:
                files.moved()
        await loop.run_in_executor(self._io, self.packs.finish, plan, wal)
        for log_id in [i for i, g in self._fresh.items() if g <= plan.generation]:
            del self._fresh[log_id]
        return True

    async def read_packed(self, extents: Extents) -> bytes:
        """A packed stream's virtual segment 0 (``packs.read_virtual``), read while no carry moves
        its entries."""
        root = self.packs.root
        assert root is not None
        async with self._pack_lock:
            return await asyncio.get_running_loop().run_in_executor(
                self._io, read_virtual, root, extents
            )

    def _fail(self, exc: BaseException, what: str) -> None:
        if self.failure is None:
            self.failure = exc
            log.error(
                "%s: %r; no stream of this data directory accepts writes until the server is "
                "restarted (the restart replays the write-ahead log)",
                what,
                exc,
            )

    async def close(self) -> None:
        """After every log has flushed: finish the round in flight, sync every segment written since
        the last checkpoint and remove the WAL (a clean shutdown leaves nothing to replay)."""
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        while self._task is not None:
            await asyncio.shield(self._task)
        if self._checkpoint is not None:
            await asyncio.shield(self._checkpoint)
        if (self._wal is not None or self._pins or self._made) and self.failure is None:
            *_, retired, _ = await asyncio.get_running_loop().run_in_executor(
                self._thread, self._write_round, [], True, [], [], []
            )
            if retired is not None:
                await self._run_checkpoint(retired)
        if self._wal is not None:
            self._wal.close()
        for _, wal in self._unpacked:  # still out of space: a restart reads them again
            wal.close()
        self._thread.shutdown(wait=True)

    # ------------------------------------------------------------------------- the worker thread

    def _write_round(
        self,
        jobs: list[RoundJob],
        rotate: bool,
        creates: list[Creation],
        drops: list[str],
        packed: list[Creation],
    ) -> tuple[
        list[BatchResult | BaseException],
        list[BaseException | None],
        BaseException | None,
        int,
        _Retired | None,
        list[int] | None,
    ]:
        """Write every job's records into its segment file, then (fsync durability) into the WAL with
        the creates, drops and packed creates, synced once; then make the created streams. A job that
        promotes a packed stream writes nothing before the sync: its directory, header and records
        are written after it, as a create's (without a WAL: staged, then placed). Returns one result
        per job
        (a ``BatchResult``, or the OSError that failed it), one per create (None: made), the drops'
        (None: durable), the WAL generation written, the WAL file this round retired, if it
        started a new one, and where each packed create's header record is in the WAL file.
        A packed job (step 2) writes its records into the WAL alone (``Kind.PACKED_RECORDS``)."""
        retired = None
        if rotate and (self._wal is not None or self._pins or self._made):
            retired = _Retired(self._wal, self._pins, self._made)
            self._wal = None
            self._pins = {}
            self._made = []
        if self.failure is not None:
            failure = self.failure
            return [failure] * len(jobs), [failure] * len(creates), failure, -1, retired, None
        wal = self._wal_dir is not None
        results: list[BatchResult | BaseException] = []
        entries: list[WalEntry] = []
        written = []
        keep = self._pin if wal else None
        records = round_messages = round_bytes = 0
        later: list[tuple[int, RoundJob, list[Chunk]]] = []  # promotions, written after the sync
        packed_jobs: dict[int, int] = {}  # job -> index of its entry in ``entries``
        for i, job in enumerate(jobs):
            try:
                if job.promote is not None and job.promote.carries_records:
                    job.promote.load()  # its segment 0: header and packed records
                if job.packed:
                    # The virtual segment 0 never rolls (``PACKED_SEGMENT_BYTES``): laid out as one
                    # chunk at ``end``; the WAL entry is all that is written (below).
                    assert job.target.segment_bytes == PACKED_SEGMENT_BYTES
                    chunks, result = lay_out(job.target, job.items, 0, job.end)
                else:
                    chunks, result = lay_out(job.target, job.items, job.seg_base, job.end)
                if job.packed:
                    pass
                elif job.promote is None:
                    write_chunks(job.target, chunks, sync=False, keep=keep)
                elif wal:
                    later.append((i, job, chunks))
                else:
                    self._stage(job.promote)
                    staged = dataclasses.replace(job.target, directory=job.promote.staged)
                    write_chunks(staged, chunks, sync=False)
            except OSError as exc:
                if job.promote is not None:
                    self._abandon(job.promote)
                results.append(exc)
                continue
            results.append(result)
            records += len(job.items)
            messages, size = payload(job.items)
            round_messages += messages
            round_bytes += size
            if wal and job.packed:
                packed_jobs[i] = len(entries)
                entries += [
                    WalEntry(job.target.log_id, 0, c.start, c.frames, Kind.PACKED_RECORDS)
                    for c in chunks
                ]
            elif wal:
                written.append((i, job, chunks))
                if job.promote is not None:  # replayed first: it makes the directory
                    entries.append(
                        WalEntry(job.promote.log_id, 0, 0, [job.promote.header_frame], Kind.CREATE)
                    )
                entries += [WalEntry(job.target.log_id, c.base, c.start, c.frames) for c in chunks]
        entries += [WalEntry(c.log_id, 0, 0, [c.data], Kind.CREATE) for c in creates]
        entries += [WalEntry(log_id, 0, 0, [], Kind.DROP) for log_id in drops]
        first_packed = len(entries)
        entries += [WalEntry(c.log_id, 0, 0, [c.data], Kind.PACKED) for c in packed]
        packed_at: list[int] | None = None
        if entries:
            try:
                base = self._wal_append(entries)
            except OSError as exc:
                for i, job, chunks in written:
                    if job.promote is None:
                        undo_chunks(job.target, chunks)
                    results[i] = exc
                for i in packed_jobs:
                    results[i] = exc
                return results, [exc] * len(creates), exc, -1, retired, None
            if packed or packed_jobs:
                at = records_offsets(entries, base)
                packed_at = at[first_packed:]
                generation = self._wal.generation  # type: ignore[union-attr]
                for i, k in packed_jobs.items():
                    done = results[i]
                    assert isinstance(done, BatchResult)
                    results[i] = PackedResult(
                        done.offsets,
                        [],
                        done.end,
                        generation,
                        at[k],
                        sum(map(len, entries[k].records)),
                    )
        promoted = []
        unpromoted = []
        for i, job in enumerate(jobs):
            if job.promote is None or isinstance(results[i], BaseException):
                continue
            try:
                if wal:
                    self._make_promoted(job.promote, job.target, later)
                    self._made.append(job.promote.final)
                else:
                    job.promote.place()
                    self.packs.void_now(job.promote.log_id)
                promoted.append(job.promote)
            except OSError as exc:
                # Not acknowledged: its CREATE and records are in the WAL, voided below.
                log.error("making promoted stream %s failed: %r", job.promote.log_id, exc)
                self._abandon(job.promote)
                results[i] = exc
                if wal:
                    unpromoted.append(job.promote.log_id)
                    if os.path.lexists(job.promote.final):
                        # Left behind: once the UNPROMOTE's WAL file is retired, a restart would
                        # take it for the stream. Until a restart (whose replay removes it), no
                        # log writes.
                        self._fail(exc, f"removing {job.promote.final} after a failed promotion")
        if unpromoted:
            self._unpromote(unpromoted)
        if records:
            self._metrics.batch(records, round_messages, round_bytes)
        made = [self._make(creation) for creation in creates]
        failed = [c.log_id for c, outcome in zip(creates, made, strict=True) if outcome is not None]
        if self._on_made is not None and (len(failed) < len(creates) or promoted):
            try:
                self._on_made(
                    [c for c, ok in zip(creates, made, strict=True) if ok is None] + promoted
                )
            except Exception as exc:  # the creates are made and durable: never fail them now
                log.error("after a round's creates: %r", exc)
        if failed:
            # Not acknowledged, and removed: a restart must not make them from their create entries.
            try:
                self._wal_append([WalEntry(log_id, 0, 0, [], Kind.DROP) for log_id in failed])
            except OSError as exc:
                log.error("could not record that %d failed creates are gone: %r", len(failed), exc)
        generation = self._wal.generation if self._wal is not None else -1
        return results, made, None, generation, retired, packed_at

    def _unpromote(self, log_ids: list[str]) -> None:
        """Before failed promotions are answered: a synced UNPROMOTE entry each, so that a restart
        does not make their directories from the CREATE and records entries the round's WAL write
        made durable (``wal.py``); the streams stay packed. If even that cannot be written, no log
        may write until a restart (``failure``): a later promotion of the same stream would be
        replayed over the failed one's entries, and the restart may bring the failed write back
        (whole, never half)."""
        try:
            self._wal_append([WalEntry(log_id, 0, 0, [], Kind.UNPROMOTE) for log_id in log_ids])
        except OSError as exc:
            self._fail(exc, f"recording that the promotions of {len(log_ids)} streams failed")

    def _make(self, creation: Creation) -> BaseException | None:
        try:
            handle, directory = creation.materialize()
        except OSError as exc:
            return exc
        self._pins[id(handle)] = handle  # a new handle: its one reference is the pin
        self._made.append(directory)
        return None

    def _make_promoted(
        self,
        promotion: Promotion,
        target: WriteTarget,
        later: list[tuple[int, RoundJob, list[Chunk]]],
    ) -> None:
        """After the WAL sync: the directory in ``streams/``, its header, the write's records."""
        handle = promotion.make()
        self._pins[id(handle)] = handle  # a new handle: its one reference is the pin
        chunks = next(chunks for _, job, chunks in later if job.promote is promotion)
        write_chunks(target, chunks, sync=False, keep=self._pin)

    def _stage(self, promotion: Promotion) -> None:
        handle = promotion.stage()
        self._cache.release(handle)  # nothing syncs it later (--durability none)

    def _abandon(self, promotion: Promotion) -> None:
        """Undo a promotion that failed: unpin and forget its handles, remove its staged directory."""
        log_id = promotion.log_id
        for key, handle in list(self._pins.items()):
            if handle.key[0] == log_id:  # type: ignore[index]
                del self._pins[key]
                self._cache.release(handle)
        self._cache.discard(lambda key: key[0] == log_id)  # type: ignore[index]
        promotion.abandon()

    def _wal_append(self, entries: list[WalEntry]) -> int:
        """Append and sync ``entries``; returns the WAL file's end before them."""
        assert self._wal_dir is not None
        if self._wal is None:
            self._wal = WalFile.create(self._wal_dir, self.generation)
            self.generation += 1
        wal = self._wal
        synced_at = time.perf_counter()
        base = wal.end
        try:
            wal.append(entries)
            self._metrics.fsync(time.perf_counter() - synced_at)
            return base
        except OSError as exc:
            # Cut the round off, so that a restart does not put it back (it was not acknowledged).
            # Out of space: that cut is synced, and the WAL goes on (the logs heal). Anything else
            # (or a cut that fails): the WAL's state is unknown, and nothing writes until a restart.
            try:
                wal.undo()
                if is_out_of_space(exc):
                    os.fdatasync(wal.fd)
            except OSError as undo_exc:
                self._fail(undo_exc, f"undoing a failed round in {wal.path}")
            else:
                if not is_out_of_space(exc):
                    self._fail(exc, f"write-ahead log {wal.path}")
            raise

    def _pin(self, handle: Handle) -> bool:
        """Keep the cache reference of a segment handle written through until the checkpoint that
        syncs it (one reference per handle)."""
        key = id(handle)
        if key in self._pins:
            return False
        self._pins[key] = handle
        return True


def _settle(done: asyncio.Future[None], outcome: BaseException | None) -> None:
    if done.done():  # the waiter was cancelled
        return
    if outcome is None:
        done.set_result(None)
    else:
        done.set_exception(outcome)


def _sync_dirs(directories: list[str]) -> None:
    for directory in directories:
        with contextlib.suppress(FileNotFoundError):  # deleted since (after its drop entry)
            fsync_dir(directory)


def _sync(handles: list[Handle]) -> None:
    for handle in handles:
        os.fdatasync(handle.fd)  # the fd the round wrote through (hazard 30)
