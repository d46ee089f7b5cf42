"""The protocol engine.

One ``Engine`` per server, on one asyncio loop. It owns the path -> current incarnation map, derived fork
reference counts (never stored, so they cannot drift: hazard 31), TTL and expiry, producer validation
(section 5.2.1), ``Stream-Seq``, closure, JSON mode (section 9.1) and waiters.

Validation of a request and ``StreamLog.stage()`` of its entry happen with no ``await`` in between, which
serializes append, close and delete per stream (hazard 17).

Append error precedence (section 5.2, hazard 35), decided against the conformance suite:

1. the stream must exist: 404, or 410 when soft-deleted (an expired stream answers like a deleted one);
2. malformed request: empty body without ``Stream-Closed`` -> 400; a body without (or with an
   unparseable) Content-Type -> 400; a close-only request's Content-Type is ignored;
3. a *closed* stream: a stale producer epoch -> 403 (``producer-state-survives-close`` accepts 403 or
   409; 403 tells a zombie it is fenced); the tuple that closed the stream -> 204 (even with a
   different body: ``close-with-different-body-dedup`` requires the retry to dedupe to the original);
   an already accepted earlier tuple of the current epoch -> 204 (hazard 35: the retry of a committed
   pre-close batch is a success, not a failure); a close-only request without producer headers -> 204
   (idempotent close); anything else -> 409 ``StreamClosed`` with ``Stream-Closed`` and the final
   ``Stream-Next-Offset``;
4. Content-Type mismatch -> 409;
5. JSON validation -> 400 (``[]`` on POST -> 400);
6. producer validation (403 stale, 400 epoch bump with seq != 0, 409 gap, 204 duplicate, 409
   ``DuplicateMismatch`` for a reused tuple whose remembered digest differs), before
7. ``Stream-Seq`` (byte-wise lexicographic, scoped per stream; ``<=`` last -> 409), as the suite's
   ``producer duplicate should return 204 even with Stream-Seq header`` requires.

Every 204 for a duplicate is sent only once the original is durable (``flush``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from durastream_server.engine import (
    bounds,
    census,
    contenttype,
    expiry,
    jsonmode,
    lookup,
    multiread,
    producer_sweep,
    producers,
    readmemo,
    rendering,
    time_lookup,
    txnspace,
)
from durastream_server.engine.api import (
    AppendRequest,
    AppendResult,
    ChangePage,
    CreateRequest,
    CreateResult,
    LimitRequest,
    LimitResult,
    MessagesResult,
    ReadRequest,
    ReadResult,
    StreamInfo,
    StreamListing,
    StreamPage,
    TimeRequest,
    TimeResult,
)
from durastream_server.engine.bodies import request_messages
from durastream_server.engine.changes import ChangeFeed, Cursor, InvalidCursor, Match
from durastream_server.engine.recovery import Recovery
from durastream_server.engine.registry import Incarnation, KeyedLocks, Registry, adopt, build
from durastream_server.engine.selections import Selection, Selections, prepare
from durastream_server.engine.staging import TxnManager
from durastream_server.engine.txnapi import (
    AbortRequest,
    AbortResult,
    CommitRequest,
    CommitResult,
    StageRequest,
    StageResult,
    TxnLimits,
)
from durastream_server.engine.view import StreamView
from durastream_server.errors import (
    BadRequest,
    ConfigMismatch,
    Conflict,
    ContentTypeMismatch,
    CorruptStream,
    Gone,
    InvalidParameter,
    InvalidReadOffset,
    NotFound,
    PlacedElsewhere,
    ProtocolError,
    SelectionNotFound,
    StreamClosed,
    StreamSeqRegression,
)
from durastream_server.offsets import (
    BEGINNING,
    CANONICAL_PREFIX,
    NOW,
    InvalidOffset,
    format_offset,
    offset_token,
    parse_position,
)
from durastream_server.storage import DataDir
from durastream_server.storage.batch import Batch, Slot
from durastream_server.storage.log import InvalidPosition, StreamLog
from durastream_server.storage.quarantine import QuarantinedStream
from durastream_server.storage.records import (
    MESSAGE_OVERHEAD,
    AppendEntry,
    MessageRun,
    MessageSlice,
    StreamHeader,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_SWEEP_INTERVAL = 0.25  # seconds between expiry sweeps
# Append bodies below this are hashed and validated on the loop without a coroutine (``append_nowait``);
# larger ones are hashed in a worker thread while they are validated.
INLINE_BODY_BYTES = 16 * 1024
# A create without TTL or expiry (a bulk ``ensure``'s): the lifetime its configuration is compared by.
_PLAIN_LIFETIME = expiry.Lifetime()
SELECTION_INLINE_PATHS = 1000  # larger selections are sorted and hashed in the read executor


class StreamObserver:
    """Hooks for the subscription layer. Called on the loop, after the change is durable."""

    def on_created(self, path: str, next_offset: str) -> None: ...

    def on_appended(self, path: str, next_offset: str) -> None: ...

    def on_deleted(self, path: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _ForkPlan:
    source: Incarnation
    content_type: str
    anchor: int
    position: int
    lifetime: expiry.Lifetime
    # The source's latest append time: the fork's own messages never get an earlier one, so append
    # times never go backwards along the chain (time lookups, docs/extensions.md section 7).
    append_time_floor_ms: int


class Engine:
    def __init__(
        self,
        data: DataDir,
        *,
        clock: Callable[[], float] | None = None,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
        txn_limits: TxnLimits | None = None,
        producer_policy: producer_sweep.ProducerPolicy | None = None,
        max_messages_per_request: int = jsonmode.DEFAULT_MAX_MESSAGES,
    ) -> None:
        self._data = data
        # Messages one JSON append, create or stage may carry (jsonmode: message-count bombs).
        self.max_messages = max_messages_per_request
        self._clock = clock or time.time
        self._sweep_interval = sweep_interval
        self.producer_policy = producer_policy or producer_sweep.ProducerPolicy()
        self._producer_sweeper: asyncio.Task[None] | None = None
        self._registry: Registry
        self._registry, unusable = build(data.logs, self._clock())
        # Streams whose header the engine cannot use are quarantined like damaged logs; start() waits
        # until their directories are set aside.
        self._setting_aside = [
            data.quarantine(log.id, log.header.path, reason) for log, reason in unusable
        ]
        # Every change of a path (created, committed, closed, deleted) is numbered here (changes.py).
        self.changes = ChangeFeed()
        by_path = self._registry.by_path
        for path in self._registry.paths:
            self.changes.touch(path, live=not by_path[path].soft_deleted)
        self._registry.on_path = self.changes.touch
        self.selections = Selections()  # explicit path sets change queries name by id
        self._create_locks = KeyedLocks()
        # Paths a bulk create is making (``create_batch_nowait``) -> the batch's done future.
        self._bulk_creating: dict[str, asyncio.Future[None]] = {}
        # Creates in flight: the loop keeps only weak references to tasks, and a direct create's task
        # has no awaiting caller to hold it (``create_nowait``).
        self._creating: set[asyncio.Task[CreateResult]] = set()
        # With ``--workers N``: the other shard a path homed here was placed in (a fork of a stream
        # there, ``shards/forks.py``), else None. Checked under the path's create lock, which the
        # fork's placement holds too (``creating``), so a path is never created both here and there.
        self.placed_elsewhere: Callable[[str], int | None] | None = None
        self._observers: list[StreamObserver] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        self._on_commit = self._committed  # one bound method, shared by every log
        self._read_memos = readmemo.ReadMemos()  # last small read results (readmemo.py)
        for inc in self._registry.by_id.values():
            self._subscribe(inc)
        self._txns = TxnManager(self, txn_limits)  # staged appends (staging.py)
        # Streams still pending in the data directory are recovered after start() (recovery.py);
        # what needs all of them runs once they are in.
        self._started_at = self._clock()
        self._after_recovery: list[Callable[[], Awaitable[None]]] = []
        self._recovery = Recovery(data, self._adopt, self._recovery_complete)
        if not len(data.pending):
            self._recovery.done.set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Set unusable streams aside, finish interrupted cascade deletions, load staged appends (a
        stream whose staged-append state cannot be read is quarantined), start the expiry sweeper."""
        await asyncio.gather(*self._setting_aside)
        self._setting_aside = []
        for orphan in self._registry.orphans():
            if not orphan.removed:
                logger.info(
                    "collecting unreferenced deleted stream %r (%s)", orphan.path, orphan.id
                )
                await self._collect(orphan)
        for inc, reason in await self._txns.start():
            await self._quarantine(inc, reason)
        if self._sweeper is None and self._sweep_interval > 0:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="durastream-expiry")
            self._producer_sweeper = asyncio.create_task(
                self._producer_sweep_loop(), name="durastream-producers"
            )
        if not self._recovery.done.is_set():
            self._recovery.start()

    # ------------------------------------------------------------------ recovery after start

    @property
    def recovering(self) -> bool:
        """Streams of the data directory are still being recovered (``recovery.py``)."""
        return self._recovery.active

    @property
    def streams_pending(self) -> int:
        """Stream directories not recovered yet (``/healthz``)."""
        return self._recovery.remaining

    @property
    def packs(self) -> tuple[int, int]:
        """Packed streams (no directory yet) and the bytes ``packs/`` holds for them (``/healthz``;
        ``storage/packs.py``)."""
        return self._data.packed_streams, self._data.packs_bytes

    async def prepare(self, path: str) -> None:
        """Recover ``path``'s streams now if they are still pending: a request naming a path calls
        this before anything else while ``recovering`` (the HTTP layer does)."""
        await self._recovery.prepare(path)

    async def recovered(self) -> None:
        """Return once every stream is recovered: for what looks at all of them (listing, changes,
        subscriptions, staged-append requests, the census)."""
        await self._recovery.done.wait()

    async def after_recovery(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` once every stream is recovered: now if they are, else before ``recovered``
        returns to anyone (the subscription service starts this way)."""
        if not self._recovery.done.is_set():
            self._after_recovery.append(hook)
        else:
            await hook()

    async def _adopt(self, logs: list[StreamLog]) -> None:
        """Register one batch of recovered units, as start-up registers what it recovered: the
        incarnations, their listeners, quarantine of unusable headers, staged appends, and the
        collection of deleted streams no fork reads any more (a cascade a crash interrupted)."""
        unusable = adopt(self._registry, logs, self._started_at)
        adopted = [inc for log in logs if (inc := self._registry.by_id.get(log.id)) is not None]
        for inc in adopted:
            self._subscribe(inc)
        for log, reason in unusable:
            await self._data.quarantine(log.id, log.header.path, reason)
        for inc, reason in await self._txns.start([inc.id for inc in adopted]):
            await self._quarantine(inc, reason)
        for inc in adopted:
            if not inc.removed and inc.soft_deleted and self._registry.refcount(inc) == 0:
                logger.info("collecting unreferenced deleted stream %r (%s)", inc.path, inc.id)
                await self._collect(inc)

    async def _recovery_complete(self) -> None:
        for hook in self._after_recovery:
            try:
                await hook()
            except Exception:
                logger.exception("start-up step after recovery failed: %r", hook)
        self._after_recovery = []

    async def close(self) -> None:
        """Release waiters (they answer as at a timeout) and flush storage."""
        self._closed = True
        await self._recovery.close()
        self.changes.shutdown()
        for task in (self._sweeper, self._producer_sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._sweeper = self._producer_sweeper = None
        for inc in list(self._registry.by_id.values()):
            if inc.waiters is not None:  # waitset() would make one for each of 100,000 idle streams
                inc.waiters.shutdown()
        results = await asyncio.gather(
            *(inc.log.flush() for inc in list(self._registry.by_id.values())),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                logger.error("flush at shutdown failed: %s", result)
        await self._txns.close()

    async def census(self) -> census.Census:
        """Streams, producers, staged handles and bytes, quarantine and free disk, for ``/metrics``
        (``census.py``: a walk over the streams in slices, yielding to the loop between them).
        Never waits for recovery (``recovery.py``): while streams are still pending, the counts are
        of the streams recovered so far, and ``pending`` says how many directories are left."""
        recovering = self.recovering
        pending = self.streams_pending
        current = list(self._registry.by_path.values())
        producers = await census.count_producers(inc.log.state for inc in current)
        handles, staged = await census.count_staged(self._txns.spaces())
        try:
            free: int | None = self._data.disk_free()
        except OSError:
            free = None
        return census.Census(
            streams=len(current),
            producers=producers,
            staged_handles=handles,
            staged_bytes=staged,
            quarantined=len(self._data.quarantined),
            disk_free_bytes=free,
            recovering=recovering,
            streams_pending=pending,
        )

    def add_observer(self, observer: StreamObserver) -> None:
        self._observers.append(observer)

    # ------------------------------------------------------------------ create

    async def create(self, request: CreateRequest) -> CreateResult:
        # Shielded: a client that disconnects must not cancel a create half-way (created on disk but
        # never registered).
        return await asyncio.shield(self.create_nowait(request))

    def create_nowait(self, request: CreateRequest) -> asyncio.Future[CreateResult]:
        """``create`` as a future the caller does not await (the HTTP layer's direct path answers in
        its done callback): the create runs in a task nobody cancels, so it is never left half-way.
        A request refused before anything was done comes back as a future already failed; errors are
        set on the future, never raised."""
        loop = asyncio.get_running_loop()
        try:
            lifetime = expiry.requested(request.ttl_seconds, request.expires_at)
            if request.forked_from is None and (
                request.fork_offset is not None or request.fork_sub_offset is not None
            ):
                raise BadRequest(
                    "Stream-Fork-Offset/Stream-Fork-Sub-Offset require Stream-Forked-From"
                )
            sub_offset = request.fork_sub_offset or 0
            if sub_offset < 0:
                raise BadRequest("Stream-Fork-Sub-Offset must be a non-negative integer")
        except Exception as exc:
            return _failed(loop, exc)
        if self._plain_new(request):
            return self._create_packed(loop, request, lifetime)
        task = loop.create_task(self._create_serialized(request, lifetime, sub_offset))
        # Referenced until it ends; the task forgets itself (a done callback would cost every create
        # one more turn of the loop).
        self._creating.add(task)
        return task

    def _plain_new(self, request: CreateRequest) -> bool:
        """A create that ``_create_packed`` can make without a task: the commonest one (a new path,
        no data, not a fork, a packed create), with nobody creating the same path meanwhile (a
        ``PUT`` or fork holding its lock, or a bulk batch: ``create_batch_nowait``; hazard 37)."""
        path = request.path
        return (
            request.forked_from is None
            # A body (issue 17): carried in the packed create's record (``create_packed_soon``).
            and (not request.body or len(request.body) <= self._data.packed_data_bytes)
            and not request.closed
            and path not in self._registry.by_path
            and path not in self._bulk_creating
            and path not in self._data.corrupt
            and (self.placed_elsewhere is None or self.placed_elsewhere(path) is None)
            and self._data.can_create_packed()
            and self._create_locks.claim(path)
        )

    def _create_packed(
        self, loop: asyncio.AbstractEventLoop, request: CreateRequest, lifetime: expiry.Lifetime
    ) -> asyncio.Future[CreateResult]:
        """``_create_serialized`` of a ``_plain_new`` create (its path's create lock claimed) as one
        callback of its commit round instead of a task and six coroutine frames: the same header,
        the same round, the same registration, then the lock released (issue 17: single-request
        creates, ~15-20 us of the loop's CPU each)."""
        path = request.path
        result: asyncio.Future[CreateResult] = loop.create_future()
        try:
            now = self._clock()
            header = self._new_header(request, None, lifetime, 0, now)
            done, made = self._data.create_packed_soon(header, self._initial(request, header, now))
        except BaseException as exc:
            self._create_locks.release(path)
            if isinstance(exc, ProtocolError):
                exc.__traceback__ = None  # as ``_failed``: no frames kept by the refusal
            result.set_exception(exc)
            return result

        def on_made(done: asyncio.Future[None]) -> None:
            try:
                log = made(done)
                inc = self._register(log, now)
                info = self._info(inc)
                self._emit("on_created", inc.path, info.next_offset)
            except BaseException as exc:
                if isinstance(exc, ProtocolError):
                    exc.__traceback__ = None  # its frames hold ``result``: a cycle otherwise
                if not result.done():
                    result.set_exception(exc)
            else:
                if not result.done():
                    result.set_result(CreateResult(created=True, info=info))
            finally:
                self._create_locks.release(path)

        done.add_done_callback(on_made)
        return result

    def _initial(
        self, request: CreateRequest, header: StreamHeader, now: float
    ) -> AppendEntry | None:
        """A packed create's initial data: ``_build``'s of a small body (``packed_data_bytes``),
        split on the loop (as ``split_messages_offloaded`` splits a body this small); None for no
        body or an empty JSON array. Raises the ``BadRequest`` ``_build`` would."""
        if not request.body:
            return None
        if contenttype.is_json(header.content_type):
            messages = jsonmode.split_messages(
                request.body, allow_empty_array=True, max_messages=self.max_messages
            )
        else:
            messages = (request.body,)
        if not messages:
            return None
        return AppendEntry(
            position=0,
            messages=messages,
            timestamp_ms=max(int(now * 1000), header.append_time_floor_ms),
        )

    def create_batch_nowait(
        self, paths: list[str], content_type: str
    ) -> asyncio.Future[list[CreateResult | BaseException]]:
        """Create many new plain streams (a bulk ``ensure``'s missing paths) as one batch: one task,
        one commit-round wait and one future for the whole batch, not a task, a lock and a future per
        stream (issue 16; docs/decisions/0008-bulk-writes.md, "Batched creates"). Each entry's result
        (or protocol error) is in the list, in order; one failing does not fail the others.

        A path another batch is making (two of a routed sink's tasks ensure the same new streams at
        once) waits for that batch, then is answered as the serialized create would answer it: the
        stream it made (200, its configuration compared), or, if that batch did not make it,
        ``create_nowait``. Any other path with a create already in flight (a ``PUT``, or the same
        path listed twice) or with an incarnation (expired, soft-deleted) takes ``create_nowait``'s
        serialized path, and a serialized create of a path in a batch waits for the batch first, so
        of concurrent creates of one path exactly one makes it, as before (hazard 37). Like
        ``create_nowait``, the batch runs in a task nobody cancels: a stream is never made durable
        without being registered."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        batched: list[int] = []
        others: list[tuple[int, asyncio.Future[CreateResult]]] = []
        # Paths another batch is making: waited for together, not a task and a lock each.
        waiting: list[tuple[int, asyncio.Future[None]]] = []
        headers: list[StreamHeader] = []
        kind = contenttype.for_create(content_type)
        now = self._clock()
        created_ms = int(now * 1000)
        by_path = self._registry.by_path
        in_flight = self._bulk_creating
        locked = self._create_locks
        corrupt = self._data.corrupt  # refused by the serialized path, with its reason
        # With ``--workers N``: a path placed in another shard (a fork's) meanwhile is refused by the
        # serialized path (``PlacedElsewhere``), never made here too.
        placed = self.placed_elsewhere or _nowhere
        for index, path in enumerate(paths):
            other = in_flight.get(path)
            if other is not None and other is not done:
                waiting.append((index, other))
                continue
            if (
                path in by_path
                or other is not None
                or locked.held(path)
                or path in corrupt
                or placed(path) is not None
            ):
                others.append(
                    (index, self.create_nowait(CreateRequest(path=path, content_type=content_type)))
                )
                continue
            in_flight[path] = done
            batched.append(index)
            headers.append(StreamHeader(path=path, content_type=kind, created_at_ms=created_ms))
        task = loop.create_task(
            self._create_batch(paths, content_type, batched, headers, others, waiting, done, now)
        )
        self._creating.add(task)  # type: ignore[arg-type]
        return task

    async def _create_batch(
        self,
        paths: list[str],
        content_type: str,
        batched: list[int],
        headers: list[StreamHeader],
        others: list[tuple[int, asyncio.Future[CreateResult]]],
        waiting: list[tuple[int, asyncio.Future[None]]],
        done: asyncio.Future[None],
        now: float,
    ) -> list[CreateResult | BaseException]:
        results: list[CreateResult | BaseException] = [None] * len(paths)  # type: ignore[list-item]
        try:
            made: list[StreamLog | BaseException] = []
            if headers:
                try:
                    made = await self._data.create_streams(headers)
                except Exception as exc:  # the data directory refused the batch (closed)
                    made = [exc] * len(headers)
            for index, outcome in zip(batched, made, strict=True):
                path = paths[index]
                if isinstance(outcome, BaseException):
                    results[index] = outcome
                else:
                    inc = self._register(outcome, now)
                    info = self._info(inc)
                    self._emit("on_created", path, info.next_offset)
                    results[index] = CreateResult(created=True, info=info)
        finally:
            for index in batched:
                self._bulk_creating.pop(paths[index], None)
            if not done.done():
                done.set_result(None)
            self._creating.discard(asyncio.current_task())  # type: ignore[arg-type]
        if waiting:
            for batch in {id(batch): batch for _, batch in waiting}.values():
                await asyncio.shield(batch)  # set in the other batch's ``finally``: never fails
            for index, _ in waiting:
                path = paths[index]
                try:
                    made = await self._made_by_other_batch(path, content_type)
                except Exception as exc:
                    results[index] = exc
                    continue
                if made is not None:
                    results[index] = made
                else:
                    others.append(
                        (index, self.create_nowait(CreateRequest(path, content_type=content_type)))
                    )
        for index, future in others:
            try:
                results[index] = await future
            except Exception as exc:
                results[index] = exc
        return results

    async def _made_by_other_batch(self, path: str, content_type: str) -> CreateResult | None:
        """After the batch that was making ``path`` is done: what ``_create_locked`` answers for a
        stream that exists (its configuration compared: a mismatch is the same 409 as ``PUT``'s),
        or ``None`` when the path is anything but a plain live stream (the batch failed to make
        it, or a create is again in flight): then the serialized ``create_nowait`` decides."""
        existing = self._registry.by_path.get(path)
        if (
            existing is None
            or existing.soft_deleted
            or existing.expired(self._clock())
            or path in self._bulk_creating
            or self._create_locks.held(path)
        ):
            return None
        self._check_same_config(
            existing, CreateRequest(path, content_type=content_type), _PLAIN_LIFETIME, 0
        )
        await existing.log.flush()
        return CreateResult(created=False, info=self._info(existing))

    async def _create_serialized(
        self, request: CreateRequest, lifetime: expiry.Lifetime, sub_offset: int
    ) -> CreateResult:
        # Creates of one path are serialized, so of N concurrent identical PUTs exactly one sees no
        # stream and creates it (201); the others find it and compare (hazard 37).
        try:
            # Not ``creating``: an ``asynccontextmanager`` costs every create ~3 us more (registry.py).
            async with self._create_locks.hold(request.path):
                # A batch creating this path (``create_batch_nowait``) goes first.
                while (batch := self._bulk_creating.get(request.path)) is not None:
                    await asyncio.shield(batch)
                return await self._create_locked(request, lifetime, sub_offset)
        finally:
            self._creating.discard(asyncio.current_task())  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def creating(self, path: str) -> AsyncIterator[None]:
        """Hold ``path``'s create lock, after any bulk batch making it (``create_batch_nowait``):
        every create of the path waits, and so does a fork's placement at its home with
        ``--workers N`` (``shards/forks.py``), which decides under it whether the path is created
        here or in its source's shard."""
        async with self._create_locks.hold(path):
            while (batch := self._bulk_creating.get(path)) is not None:
                await asyncio.shield(batch)
            yield

    def create_contended(self, path: str) -> bool:
        """Whether a create of ``path`` would wait (its lock held, a bulk batch making it) or be
        placed elsewhere: the direct path leaves such a ``PUT`` to the ordinary one (``http/app.py``),
        which forwards it if the path turns out placed in another shard."""
        return (
            self._create_locks.held(path)
            or path in self._bulk_creating
            or (self.placed_elsewhere is not None and self.placed_elsewhere(path) is not None)
        )

    async def _create_locked(
        self, request: CreateRequest, lifetime: expiry.Lifetime, sub_offset: int
    ) -> CreateResult:
        existing = self._registry.by_path.get(request.path)
        if existing is None and self.placed_elsewhere is not None:
            shard = self.placed_elsewhere(request.path)
            if shard is not None:  # a fork placed it there while this create waited for the lock
                raise PlacedElsewhere(request.path, shard, request.body)
        if existing is not None and not existing.soft_deleted and existing.expired(self._clock()):
            await self._expire(existing)
            existing = self._registry.by_path.get(request.path)
        if existing is not None:
            if existing.soft_deleted:
                raise Conflict(
                    "the stream at this path was deleted but is retained for its forks; "
                    "the path cannot be re-created until they are gone"
                )
            self._check_same_config(existing, request, lifetime, sub_offset)
            await existing.log.flush()
            return CreateResult(created=False, info=self._info(existing))
        if request.path in self._data.corrupt:
            raise CorruptStream(
                f"stream {request.path!r} is quarantined: {self._corrupt(request.path)}"
            )

        now = self._clock()
        plan = (
            await self._plan_fork(request, lifetime, sub_offset)
            if request.forked_from is not None
            else None
        )
        # From the plan on, the source is referenced (no await in between), so it cannot be
        # hard-deleted while the fork's body is parsed and its directory written.
        hold = self._registry.hold(plan.source) if plan else contextlib.nullcontext()
        try:
            with hold:
                log = await self._build(request, plan, lifetime, sub_offset, now)
        except BaseException:
            if plan is not None:
                # The source may have been deleted meanwhile and kept only for this fork.
                await self._collect(plan.source)
            raise
        inc = self._register(log, now)
        info = self._info(inc)
        self._emit("on_created", inc.path, info.next_offset)
        return CreateResult(created=True, info=info)

    async def _build(
        self,
        request: CreateRequest,
        plan: _ForkPlan | None,
        lifetime: expiry.Lifetime,
        sub_offset: int,
        now: float,
    ) -> StreamLog:
        """Write the new incarnation: header, initial data and closure in one atomic create."""
        content_type = plan.content_type if plan else contenttype.for_create(request.content_type)
        # Validate the whole body before anything touches disk: a bad JSON body leaves no stream
        # behind (hazard 20).
        if not request.body:
            messages: tuple[bytes, ...] = ()  # what either split makes of no body, unparsed
        elif contenttype.is_json(content_type):
            parsed = await jsonmode.split_messages_offloaded(
                request.body, allow_empty_array=True, max_messages=self.max_messages
            )
            if isinstance(parsed, BadRequest):
                raise parsed
            messages = parsed
        else:
            messages = (request.body,)
        position = plan.position if plan else 0
        header = self._new_header(request, plan, lifetime, sub_offset, now, content_type)
        initial = None
        if messages or request.closed:
            # A stream created closed is never visible open (hazard 20).
            initial = AppendEntry(
                position=position,
                messages=messages,
                timestamp_ms=max(int(now * 1000), header.append_time_floor_ms),
                closes=request.closed,
            )
        return await self._data.create_stream(header, initial)

    @staticmethod
    def _new_header(
        request: CreateRequest,
        plan: _ForkPlan | None,
        lifetime: expiry.Lifetime,
        sub_offset: int,
        now: float,
        content_type: str | None = None,
    ) -> StreamHeader:
        """The header record of a new incarnation (``content_type``: the one already decided)."""
        if content_type is None:
            content_type = (
                plan.content_type if plan else contenttype.for_create(request.content_type)
            )
        final_lifetime = plan.lifetime if plan else lifetime
        return StreamHeader(
            path=request.path,
            content_type=content_type,
            created_at_ms=int(now * 1000),
            ttl_seconds=final_lifetime.ttl_seconds,
            expires_at=final_lifetime.expires_at,
            fork_source_id=plan.source.id if plan else None,
            fork_source_path=plan.source.path if plan else None,
            fork_position=plan.position if plan else 0,
            fork_offset_requested=request.fork_offset if plan else None,
            fork_sub_offset=sub_offset if plan else 0,
            append_time_floor_ms=plan.append_time_floor_ms if plan else 0,
        )

    async def _plan_fork(
        self, request: CreateRequest, lifetime: expiry.Lifetime, sub_offset: int
    ) -> _ForkPlan:
        """Validate a fork request against its source (section 4.2). Nothing is referenced until
        ``_create_locked`` takes its hold, so a rejection cannot leak (hazard 21). Boundary checks
        may read record headers off the loop; the source is re-checked after them, so a plan never
        names a source that was deleted meanwhile."""
        assert request.forked_from is not None
        try:
            source = self._lookup(request.forked_from)
        except Gone:
            raise Conflict("the fork source was deleted") from None
        except NotFound:
            raise NotFound(f"fork source {request.forked_from!r} does not exist") from None
        source_type = source.header.content_type
        requested = contenttype.parse(request.content_type)
        if requested is not None and not contenttype.same_type(requested.essence, source_type):
            raise ContentTypeMismatch(
                f"fork content type {requested.text!r} does not match the source's {source_type!r}"
            )
        view = self._view(source)
        tail = view.tail
        if request.fork_offset is None:
            anchor = tail
        else:
            anchor = _parse_token(request.fork_offset, "Stream-Fork-Offset")
            if anchor > tail:
                raise BadRequest("Stream-Fork-Offset is beyond the source stream's tail")
        # Byte streams may fork anywhere up to the tail: chunked reads hand out offsets inside a
        # stored append. JSON offsets are always message boundaries (hazard 22).
        if source.json and not await view.is_boundary(anchor):
            raise BadRequest("Stream-Fork-Offset is not a message boundary of the source stream")
        position = await view.boundary_after(anchor, sub_offset)
        try:
            still = self._lookup(request.forked_from)
        except (Gone, NotFound):
            still = None
        if still is not source:
            raise Conflict("the fork source was deleted while the fork was being created")
        return _ForkPlan(
            source=source,
            content_type=source_type,
            anchor=anchor,
            position=position,
            lifetime=expiry.for_fork(source.lifetime, lifetime),
            append_time_floor_ms=source.log.state.last_timestamp_ms,
        )

    def _check_same_config(
        self,
        existing: Incarnation,
        request: CreateRequest,
        lifetime: expiry.Lifetime,
        sub_offset: int,
    ) -> None:
        """Idempotent PUT: 200 only if the request describes the stream that exists (section 5.1)."""
        header = existing.header
        differences: list[str] = []
        requested_type = contenttype.parse(request.content_type)
        if request.forked_from is not None and requested_type is None:
            pass  # a fork without (valid) Content-Type inherits, whatever the source's type was
        elif not contenttype.same_type(
            contenttype.for_create(request.content_type), header.content_type
        ):
            differences.append("content type")
        if request.closed != existing.log.state.closed:
            differences.append("closed status")
        expected_lifetime = lifetime
        if request.forked_from is not None and not lifetime.expires:
            source = self._registry.by_id.get(header.fork_source_id or "")
            if source is not None:
                expected_lifetime = expiry.for_fork(source.lifetime, lifetime)
            else:
                expected_lifetime = existing.lifetime  # inherited from a source that is gone
        if expected_lifetime != existing.lifetime:
            differences.append("TTL/expiry")
        if request.forked_from is not None:
            if header.fork_source_path != request.forked_from:
                differences.append("fork source")
            elif request.fork_offset is not None:
                requested_anchor = _parse_token(request.fork_offset, "Stream-Fork-Offset")
                anchor = (
                    parse_position(header.fork_offset_requested)
                    if header.fork_offset_requested is not None
                    else header.fork_position
                )
                if requested_anchor != anchor:
                    differences.append("fork offset")
            if sub_offset != header.fork_sub_offset:
                differences.append("fork sub-offset")
        if differences:
            raise ConfigMismatch(
                "stream already exists with a different configuration: " + ", ".join(differences)
            )

    # ------------------------------------------------------------------ append

    async def append(self, request: AppendRequest) -> AppendResult:
        """Append and/or close. See the module docstring for the error precedence."""
        return await self.append_nowait(request)

    def append_nowait(self, request: AppendRequest) -> asyncio.Future[AppendResult]:
        """``append`` as a future, without a coroutine on the common path.

        A body below ``INLINE_BODY_BYTES`` (the one-event, one-token appends of many small streams) is
        hashed and split on the loop and staged at once; the future resolves when the entry is durable
        (a thing the caller cannot cancel by going away: the entry is committed either way). A larger
        body (hashed and parsed off the loop meanwhile), a closed stream and a duplicate take the
        coroutine path in a task. Errors are set on the future, never raised.
        """
        loop = asyncio.get_running_loop()
        try:
            staged = self._next_of_producer(request, loop)
            if staged is not None:
                return staged
            inc, request_type = self._append_target(request)
            body = request.body
            if len(body) >= INLINE_BODY_BYTES:
                return loop.create_task(self._append_offloaded(request, inc, request_type))
            digest = _small_digest(request, request_type)
            return self._append_staged(inc, request, request_type, None, digest)
        except Exception as exc:
            return _failed(loop, exc)

    def _next_of_producer(
        self, request: AppendRequest, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[AppendResult] | None:
        """The common small append, checked, folded and staged in one frame (issue 17, h73): a
        producer's next seq of its current epoch, a small body of the stream's content type, on
        an open, healthy stream without a TTL, no Stream-Seq, no close, no commit key. None, with
        nothing done but the sliding access time, when the request is anything else: the general
        path (``_append_target``, ``_small_digest``, ``_append_staged``) then judges it from the
        start, so every refusal, duplicate and precedence is its.

        Each step is the general path's own for this case, without its intermediate calls: the
        lookup (no TTL: never expired), ``_touch``, the content type (``contenttype.parse``'s cache,
        compared by essence as ``request_messages`` does), ``check_tuple_syntax`` (an id the
        stream knows is not empty; the epoch is the producer's; seq is last + 1), the digest,
        ``producers.validate``'s Accept (the same three comparisons), the JSON split, the entry and
        its answer, as ``_checked_append`` makes them, staged as ``_append_staged`` stages them. The
        digest is ``request_digest``'s, hashed in one piece (``producers.append_digest``)."""
        producer = request.producer
        body = request.body
        if (
            producer is None
            or request.key is not None
            or request.stream_seq is not None
            or request.close
            or not body
            or len(body) >= INLINE_BODY_BYTES
        ):
            return None
        inc = self._registry.by_path.get(request.path)
        if (
            inc is None
            or inc.soft_deleted
            or inc.hard_deadline is not None
            or inc.lifetime.ttl_seconds is not None
        ):
            return None
        now = self._clock()
        if now > inc.last_access:
            inc.last_access = now
        raw_type = request.content_type
        request_type = None if raw_type is None else contenttype.parse(raw_type)
        if request_type is None or request_type.essence != inc.essence:
            return None
        log = inc.log
        if log.poisoned:
            return None
        state = log.state
        if state.closed:
            return None
        current = state.producers.get(producer.producer_id)
        seq = producer.seq
        if (
            current is None
            or producer.epoch != current.epoch
            or seq != current.last_seq + 1
            or seq > producers.MAX_SAFE_INTEGER
        ):
            return None
        digest = producers.append_digest(request_type.essence, body)
        messages = (
            jsonmode.split_messages(body, allow_empty_array=False, max_messages=self.max_messages)
            if inc.json
            else (body,)
        )
        entry = AppendEntry(
            position=state.tail,
            messages=messages,
            timestamp_ms=max(int(self._clock() * 1000), state.last_timestamp_ms),
            closes=False,
            producer=producer,
            stream_seq=None,
            digest=digest,
        )
        answer = AppendResult(
            next_offset=format_offset(state.tail + entry.size),
            closed=False,
            duplicate=False,
            producer_epoch=producer.epoch,
            producer_seq=seq,
        )
        result: asyncio.Future[AppendResult] = loop.create_future()
        settles = _Settles(result, answer, inc.path if entry.size else None, self._emit)
        log.stage_to(entry, settles)
        settles.staged = True
        return result

    def append_batch(self, requests: list[AppendRequest]) -> Batch:
        """``append_nowait`` of many appends (a bulk ``commits`` request's inline commits), settled
        together: each entry is checked and staged exactly as ``append_nowait`` stages it, but its
        completion is a ``Slot`` of one ``Batch`` (storage/batch.py), recorded when the round
        settles its log, not a future and a done callback per entry (issue 16). The batch's
        outcomes are each entry's ``AppendResult`` or the error that failed it alone; entries that
        take a path of their own (a large body, a closed stream, a duplicate) are followed there."""
        loop = asyncio.get_running_loop()
        batch = Batch(len(requests))
        # A stream's parts of one multi-part commit entry (bulk-write 2) come in a row, with the
        # same path, content type and commit key: the stream's lookup, the type and the keyed
        # digest are judged once for the row, not once per part (nothing is awaited in this loop,
        # so the stream found for the first part is the one every part of the row finds). Each part
        # is still checked (closed, producer, Stream-Seq), staged and answered as its own append.
        last_path: str | None = None
        last_type: str | None = None
        inc: Incarnation | None = None
        request_type: contenttype.ContentType | None = None
        keyed: dict[tuple[bool, str], bytes] = {}
        for index, request in enumerate(requests):
            try:
                if (
                    inc is None
                    or request.path != last_path
                    or request.content_type != last_type
                    or not request.body
                ):
                    last_path = None
                    inc, request_type = self._append_target(request)
                    if request.body:
                        last_path, last_type = request.path, request.content_type
                if len(request.body) >= INLINE_BODY_BYTES:
                    task = loop.create_task(self._append_offloaded(request, inc, request_type))
                    batch.follow(index, task)
                    continue
                key = request.key
                if key is None:
                    digest = _small_digest(request, request_type)
                else:
                    producers.check_tuple_syntax(request.producer)
                    digest = keyed.get((request.close, key), b"")
                    if not digest:
                        digest = keyed[request.close, key] = txnspace.commit_digest(
                            (), request.close, key
                        )
                checked = self._checked_append(inc, request, request_type, None, digest)
                if not isinstance(checked, tuple):
                    batch.follow(index, checked)
                    continue
                entry, answer = checked
                path = inc.path if entry.size else None
                inc.log.stage_to(entry, _AppendSlot(batch, index, answer, path, self._emit))
            except Exception as exc:
                batch.settle(index, exc)
        return batch

    def _append_target(
        self, request: AppendRequest
    ) -> tuple[Incarnation, contenttype.ContentType | None]:
        """Precedence steps 1 and 2: the stream, and a well-formed request."""
        inc = self._lookup(request.path)
        self._touch(inc)
        body = request.body
        if not body and not request.close:
            raise BadRequest("an empty POST body requires Stream-Closed: true")
        request_type: contenttype.ContentType | None = None
        if body:
            request_type = contenttype.parse(request.content_type)
            if request_type is None:
                raise BadRequest(
                    "Content-Type is required with a body"
                    if request.content_type is None
                    else f"invalid Content-Type {request.content_type!r}"
                )
        return inc, request_type

    async def _append_offloaded(
        self,
        request: AppendRequest,
        inc: Incarnation,
        request_type: contenttype.ContentType | None,
    ) -> AppendResult:
        """A large body: its digest is computed in a worker thread while the loop (or another worker,
        for a very large one) validates the JSON, before the validation section."""
        body = request.body
        producer = request.producer
        digest = b""
        pending_digest: Awaitable[bytes] | None = None
        if request.key is not None:
            producers.check_tuple_syntax(producer)
            digest = txnspace.commit_digest((), request.close, request.key)
        elif producer is not None:
            producers.check_tuple_syntax(producer)
            pending_digest = producers.request_digest_soon(
                request_type.essence if request_type else None, body, request.close
            )
        parsed: tuple[bytes, ...] | BadRequest | None = None
        if inc.json and body:
            # A parse error is reported at its place in the precedence (request_messages).
            parsed = await jsonmode.split_messages_offloaded(
                body, allow_empty_array=False, max_messages=self.max_messages
            )
        if pending_digest is not None:
            digest = await pending_digest
        current = self._lookup(request.path)  # the stream may have changed during the awaits
        if current is not inc:
            inc, parsed = current, None
        return await self._append_staged(inc, request, request_type, parsed, digest)

    def _append_staged(
        self,
        inc: Incarnation,
        request: AppendRequest,
        request_type: contenttype.ContentType | None,
        parsed: tuple[bytes, ...] | BadRequest | None,
        digest: bytes,
    ) -> asyncio.Future[AppendResult]:
        """Precedence steps 3 to 7, then ``log.stage()``, with no await in between (hazard 17).
        Returns the future of the result: resolved when the entry is durable, or the task answering a
        closed stream or a duplicate once what it answers is durable."""
        loop = asyncio.get_running_loop()
        checked = self._checked_append(inc, request, request_type, parsed, digest)
        if not isinstance(checked, tuple):
            return checked
        entry, answer = checked
        result: asyncio.Future[AppendResult] = loop.create_future()
        # The round settles the result itself (``_Settles``): no future of the log's per append, no
        # done callback and no loop turn between the commit and the answer's own callbacks.
        settles = _Settles(result, answer, inc.path if entry.size else None, self._emit)
        inc.log.stage_to(entry, settles)
        settles.staged = True
        return result

    def _checked_append(
        self,
        inc: Incarnation,
        request: AppendRequest,
        request_type: contenttype.ContentType | None,
        parsed: tuple[bytes, ...] | BadRequest | None,
        digest: bytes,
    ) -> tuple[AppendEntry, AppendResult] | asyncio.Future[AppendResult]:
        """Precedence steps 3 to 7 (raising their errors): the entry to stage and its answer, or the
        task answering a closed stream or a duplicate. Nothing awaited, nothing staged."""
        if inc.log.poisoned:
            # Its state may be ahead of the disk (the failed batch is still folded in): nothing is
            # decided on it. A Stream-Seq or producer check would refuse the retry of the failed
            # append for good (409); it gets the storage error, and is decided again once healed.
            raise inc.log.failure_error()
        state = inc.log.state
        if state.closed:
            # The barrier now, as for a duplicate: a poisoned log's state may hold a close that
            # failed, and a heal before the task runs would reopen the stream under it.
            barrier = inc.log.durable_barrier()
            return asyncio.get_running_loop().create_task(
                self._append_to_closed(inc, request, digest, barrier)
            )
        messages = request_messages(inc, request_type, parsed, request.body, self.max_messages)
        producer = request.producer
        if producer is not None:
            decision = producers.validate(
                state, producer, digest, refuse_forgotten=request.refuse_forgotten
            )
            if isinstance(decision, producers.Duplicate):
                # The barrier now, with the decision: the task runs a loop turn later, when a heal
                # may have replaced the state the decision was made on (``durable_barrier``).
                barrier = inc.log.durable_barrier()
                return asyncio.get_running_loop().create_task(
                    self._duplicate(inc, decision, barrier)
                )
        if (
            request.stream_seq is not None
            and state.last_stream_seq is not None
            and request.stream_seq <= state.last_stream_seq
        ):
            # str order is code point order, which is UTF-8 byte order.
            raise StreamSeqRegression(
                f"Stream-Seq {request.stream_seq!r} is not greater than the last "
                f"({state.last_stream_seq!r})"
            )
        entry = AppendEntry(
            position=state.tail,
            messages=messages,
            timestamp_ms=max(int(self._clock() * 1000), state.last_timestamp_ms),
            closes=request.close,
            producer=producer,
            stream_seq=request.stream_seq,
            digest=digest,
        )
        answer = AppendResult(
            next_offset=format_offset(entry.end),
            closed=request.close,
            duplicate=False,
            producer_epoch=producer.epoch if producer else None,
            producer_seq=producer.seq if producer else None,
        )
        return entry, answer

    async def _append_to_closed(
        self,
        inc: Incarnation,
        request: AppendRequest,
        digest: bytes,
        barrier: asyncio.Future[None] | None = None,
    ) -> AppendResult:
        """An append to a stream found closed: a duplicate of the closing request or of an earlier
        one (204), else 409. ``barrier``: the log's ``durable_barrier`` taken when the stream was
        found closed; it fails (507) if that closed state was a poisoned log's, ahead of the disk."""
        if barrier is not None:
            await barrier
        log = inc.log
        state = log.state
        producer = request.producer
        if producer is not None:
            if state.closed_by == producer:
                # The closing tuple: its retry dedupes to the original whatever its body (section
                # 5.2.1), even once the producer itself is forgotten (closed_by stays).
                decision: producers.Decision | None = producers.Duplicate(
                    epoch=producer.epoch, highest_seq=producer.seq
                )
            else:
                decision = producers.stale_or_duplicate_after_close(state, producer)
                if decision is not None:
                    verified = producers.check_duplicate_digest(state, producer, digest)
                    decision = dataclasses.replace(decision, verified=verified)
            if isinstance(decision, producers.Duplicate):
                return await self._duplicate(inc, decision)
        elif not request.body:
            await log.flush()  # the close being repeated may still be in flight
            return AppendResult(
                next_offset=format_offset(log.durable_tail), closed=True, duplicate=True
            )
        await log.flush()
        final = format_offset(log.state.tail)
        raise StreamClosed(
            "the stream is closed",
            headers={"Stream-Closed": "true", "Stream-Next-Offset": final},
        )

    async def _duplicate(
        self,
        inc: Incarnation,
        decision: producers.Duplicate,
        barrier: asyncio.Future[None] | None = None,
    ) -> AppendResult:
        """Answer a producer retry, but only once what it duplicates is durable: ``barrier``, the
        log's ``durable_barrier`` taken with the decision (without it, the decision was made in the
        caller's current step, and the barrier is taken now, before any ``await``)."""
        await (inc.log.durable_barrier() if barrier is None else barrier)
        return AppendResult(
            next_offset=format_offset(inc.log.durable_tail),
            closed=inc.log.state.closed,
            duplicate=True,
            producer_epoch=decision.epoch,
            producer_seq=decision.highest_seq,
            verified=decision.verified,
        )

    # ------------------------------------------------------------------ head / read / wait

    def head(self, path: str) -> StreamInfo:
        """Stream metadata. Does not refresh a sliding TTL (section 5.1)."""
        return self._info(self._lookup(path))

    def holds(self, path: str) -> bool:
        """Whether a stream (live, or deleted but kept for its forks) is at ``path`` here: with
        ``--workers N``, a fork held in this shard is served here (``shards/forks.py``)."""
        return path in self._registry.by_path

    def head_if_any(self, path: str) -> StreamInfo | None:
        """``head``, or None where it would answer 404 because no stream was ever at ``path`` (the
        bulk ensure's common case, a new stream: no error built and raised per entry). Every other
        answer, and every error, is ``head``'s."""
        if path not in self._registry.by_path and path not in self._data.corrupt:
            return None
        return self.head(path)

    async def read(self, request: ReadRequest) -> ReadResult:
        inc = self._lookup(request.path)
        self._touch(inc)
        log = inc.log
        memo = self._read_memos.get(inc)
        if (
            memo is not None
            and memo[1] == log.durable_tail
            and memo[2] == log.durable_closed
            and memo[0] == request
        ):
            # Same range, same durable state: the same answer. This is the fan-out case: a commit
            # wakes every reader parked at the tail, and each reads the same range (then parks again
            # at the same new tail). See docs/decisions/0004-performance.md.
            return memo[3]  # type: ignore[return-value]
        view = self._view(inc)
        tail = view.tail
        if request.offset == NOW:
            if request.end_offset is not None:  # bounded read: only ``end == tail`` is valid here
                await bounds.resolve_end(view, tail, request.end_offset, whole_messages=inc.json)
            return ReadResult(
                info=self._info(inc),
                start_offset=format_offset(tail),
                items=(),
                count=0,
                body=b"[]" if inc.json else b"",
                next_offset=format_offset(tail),
                up_to_date=True,
                closed=log.durable_closed,
                json=inc.json,
            )
        start = 0 if request.offset == BEGINNING else _parse_token(request.offset, "offset")
        if start > tail:
            raise BadRequest("offset is beyond the tail of the stream")
        end = tail
        if request.end_offset is not None:
            # Bounded read (extension): exactly [start, end), or a typed 400 (bounds.py). A JSON read
            # must start on a message boundary: storage checks that while it reads (in its worker
            # thread) and the view turns a violation into 400.
            end = await bounds.resolve_end(view, start, request.end_offset, whole_messages=inc.json)
        closed_before = log.durable_closed
        # Runs, not a slice per message, and each message counts MESSAGE_OVERHEAD against the
        # chunk: a chunk of 1-byte messages holds ~170k of them, not millions (rendering.py).
        slices, next_position, count = await view.read(
            start, request.max_bytes, end, runs=True, overhead=MESSAGE_OVERHEAD
        )
        # Judge EOF against the state *after* the read: a close (with or without data) that landed
        # meanwhile moved the durable tail, so a reader at the old tail is not told "closed" while
        # final data remains unread (hazards 16, 23).
        durable_tail = log.durable_tail
        durable_closed = log.durable_closed
        body = await self.offload(
            count, functools.partial(rendering.payload, json=inc.json), slices
        )
        result = ReadResult(
            info=self._info(inc),
            start_offset=format_offset(start),
            items=slices,
            count=count,
            body=body,
            next_offset=format_offset(next_position),
            up_to_date=next_position >= durable_tail,
            closed=durable_closed and next_position == durable_tail,
            json=inc.json,
        )
        if (
            request.end_offset is None
            and durable_tail == tail
            and log.durable_closed == closed_before
            and next_position - start <= readmemo.MAX_BYTES
        ):
            self._read_memos.put(inc, (request, tail, closed_before, result))
        return result

    # ------------------------------------------------------------------ read extensions

    async def read_messages(self, request: ReadRequest, *, overhead: int = 0) -> MessagesResult:
        """Whole messages with their own positions and append times (message frames extension).

        Like ``read``, but every slice is one whole message for every content type, so ``offset``
        (and ``end_offset``) must be message boundaries (400 ``INVALID_OFFSET``/``INVALID_END``).
        Each message costs its length plus ``overhead`` against ``max_bytes``; at least one is
        returned.
        """
        inc = self._lookup(request.path)
        self._touch(inc)
        view = self._view(inc)
        start = self._start_position(request.offset, view.tail)
        end = view.tail
        if request.end_offset is not None:
            end = await bounds.resolve_end(view, start, request.end_offset, whole_messages=True)
        slices, next_position, count = await view.read(
            start, request.max_bytes, end, whole_messages=True, runs=True, overhead=overhead
        )
        return self.messages_result(inc, start, slices, next_position, count)

    def messages_result(
        self,
        inc: Incarnation,
        start: int,
        slices: list[MessageSlice | MessageRun],
        next_position: int,
        count: int,
        next_offset: str | None = None,
    ) -> MessagesResult:
        """What ``read_messages`` answers for what it read, judged against the log's state after the
        read, as in ``read`` (hazards 16, 23). ``next_offset``: ``next_position``'s token if the
        caller minted it already (a multi-range read mints 10,000 of them; each costs ~1 us)."""
        log = inc.log
        durable_tail = log.durable_tail
        if next_offset is None:
            next_offset = format_offset(next_position)
        return MessagesResult(
            # A read of an idle stream usually stops at its tail: the token is the same.
            info=self._info(inc, next_offset if next_position == durable_tail else None),
            start_offset=format_offset(start),
            slices=slices,
            count=count,
            next_offset=next_offset,
            up_to_date=next_position >= durable_tail,
            closed=log.durable_closed and next_position == durable_tail,
            json=inc.json,
        )

    async def read_ranges(
        self, ranges: Iterable[multiread.Range | ProtocolError], max_bytes: int, *, overhead: int
    ) -> list[MessagesResult | ProtocolError]:
        """``read_messages`` of ``(path, offset, end)`` ranges in order under one shared budget, for
        a prefix of them, in few worker-thread trips (multi-range reads; ``multiread.py``)."""
        return await multiread.read_ranges(self, ranges, max_bytes, overhead)

    async def read_range_answers(
        self, ranges: Iterable[multiread.Range | ProtocolError], max_bytes: int, *, overhead: int
    ) -> list[multiread.Answer | ProtocolError]:
        """``read_ranges``, each read answered by what a multi-range answer says of it (its
        messages and next offset) without the rest of a ``MessagesResult``."""
        return await multiread.read_answers(self, ranges, max_bytes, overhead)

    async def read_range_frames(
        self, ranges: Iterable[multiread.Range | ProtocolError], max_bytes: int, *, overhead: int
    ) -> multiread.FramesRead:
        """``read_range_answers`` gathered for one ``format=frames`` body: each range's count
        and next offset (or error), the messages as columns (``multiread.read_frames``)."""
        return await multiread.read_frames(self, ranges, max_bytes, overhead)

    def plan_messages(
        self, path: str, offset: str, end_offset: str, now: float | None = None
    ) -> multiread.Planned | None:
        """``read_messages`` of ``[offset, end_offset)`` up to its read, decided on the loop, with
        the same errors; None when the loop cannot decide it alone (a fork chain, an end whose
        boundary check scans headers, the hot tail): ``read_messages`` then reads it.

        ``now``: the clock, read once by the caller for a group of ranges planned in one loop turn
        (two clock reads a range were ~3% of the server's CPU for 10,000 ranges); the expiry check
        and the access time then use that instant, as one read at that instant would."""
        if now is None:
            now = self._clock()
        inc = self._lookup(path, now)
        if now > inc.last_access:
            inc.last_access = now
        log = inc.log
        # A stream that is no fork reads its own log alone: no StreamView to build (~3 us a range).
        if log.header.fork_source_id is not None:
            view = self._view(inc)
            if len(view.levels) > 1:
                return None
            log = view.own
        start = self._start_position(offset, log.durable_tail)
        end, settled = bounds.settle_end_at(
            log.durable_tail, start, end_offset, whole_messages=True
        )
        if not settled:
            known = log.known_boundary(end)
            if known is None:
                return None
            if not known:
                raise bounds.inside_message(end_offset)
        try:
            read = log.plan_read(start, end)
        except InvalidPosition:
            return None
        return None if read is None else multiread.Planned(inc, start, end_offset, read)

    def plan_group(
        self, items: Iterator[multiread.Range | ProtocolError], limit: int
    ) -> tuple[list[multiread.Entry], multiread.Range | None, bool]:
        """``plan_messages`` of the next ranges of ``items``, at most ``limit``, in one pass (one
        loop turn, one clock read): the planned entries (a ProtocolError for a range that fails),
        the range after them that ``read_messages`` must read alone (or None), and whether
        ``items`` may hold more.

        The common range of a multi-range read (an unforked, idle stream read from a canonical
        token, or its start, to its durable tail) is planned inline: the same decisions as
        ``plan_messages`` with the registry, the clock and the token parse bound once for the
        group rather than a call chain a range. Anything else (a missing, deleted or expiring
        stream, a fork, ``now``, a non-canonical token, an end before the tail, an error) goes
        through ``plan_messages`` itself, which answers it and raises its errors."""
        now = self._clock()
        by_path = self._registry.by_path
        plan = self.plan_messages
        group: list[multiread.Entry] = []
        append = group.append
        zero = CANONICAL_PREFIX
        for item in items:
            if isinstance(item, ProtocolError):  # the caller found it
                append((("", "", ""), item))
            else:
                path, offset, end_offset = item
                inc = by_path.get(path)
                planned: multiread.Planned | ProtocolError | None = None
                fast = False
                if (
                    inc is not None
                    and not inc.soft_deleted
                    and inc.hard_deadline is None
                    and inc.lifetime.ttl_seconds is None
                    and len(end_offset) == 33
                    and end_offset.startswith(zero)
                    and end_offset[17:].isdecimal()
                ):
                    log = inc.log
                    end = int(end_offset[17:])
                    if offset == BEGINNING:
                        start = 0
                    elif len(offset) == 33 and offset.startswith(zero) and offset[17:].isdecimal():
                        start = int(offset[17:])
                    else:
                        start = -1
                    fast = (
                        log.header.fork_source_id is None
                        and 0 <= start <= end
                        and end == log.durable_tail
                    )
                if fast:
                    if now > inc.last_access:  # type: ignore[union-attr]
                        inc.last_access = now  # type: ignore[union-attr]
                    try:
                        read = log.plan_read(start, end)
                    except Exception:  # noqa: BLE001 - plan_messages raises it as it should
                        fast = False
                    else:
                        if read is None:
                            return group, item, True
                        # An ASCII token of this shape is the one ``format_offset(end)`` mints.
                        planned = multiread.new_planned(
                            inc, start, end_offset, read, end if end_offset.isascii() else -1
                        )
                if not fast:
                    try:
                        planned = plan(path, offset, end_offset, now)
                    except ProtocolError as exc:
                        planned = exc
                    if planned is None:
                        return group, item, True
                append((item, planned))  # type: ignore[arg-type]
            if len(group) >= limit:
                return group, None, True
        return group, None, False

    def clock(self) -> float:
        """The engine's clock (expiry and access times), for callers that plan many reads at once."""
        return self._clock()

    @property
    def read_executor(self) -> Executor:
        """The readers' worker threads (``DataDir.read_executor``)."""
        return self._data.read_executor

    async def offload(self, count: int, func: Callable[..., _T], *args: Any) -> _T:
        """``func(*args)``: on the loop for work on at most ``rendering.INLINE_MESSAGES`` messages,
        else in the read executor, so per-message work never holds the loop for long."""
        if count <= rendering.INLINE_MESSAGES:
            return func(*args)
        return await asyncio.get_running_loop().run_in_executor(
            self._data.read_executor, func, *args
        )

    async def lookup_limit(self, request: LimitRequest) -> LimitResult:
        """The furthest message boundary within a message/byte budget, without reading data (limit
        lookups extension; ``lookup.py``)."""
        inc, view, start, end = await self._lookup_range(
            request.path, request.offset, request.end_offset, "limit lookup"
        )
        found = await lookup.advance(view, start, end, request.max_messages, request.max_bytes)
        log = inc.log
        return LimitResult(
            start_offset=format_offset(start),
            end_offset=format_offset(found.end),
            messages=found.messages,
            bytes=found.end - start,
            tail_offset=format_offset(log.durable_tail),
            closed=log.durable_closed,
        )

    async def lookup_time(self, request: TimeRequest) -> TimeResult:
        """The first message at or after ``offset`` whose append time is at or after an instant,
        without reading data (time lookups extension; ``time_lookup.py``)."""
        inc, view, start, end = await self._lookup_range(
            request.path, request.offset, request.end_offset, "time lookup"
        )
        found = await time_lookup.first_at(view, start, end, request.at_ms)
        log = inc.log
        return TimeResult(
            start_offset=format_offset(start),
            end_offset=format_offset(end),
            offset=format_offset(end if found is None else found),
            found=found is not None,
            tail_offset=format_offset(log.durable_tail),
            closed=log.durable_closed,
        )

    async def _lookup_range(
        self, path: str, offset: str, end_offset: str | None, what: str
    ) -> tuple[Incarnation, StreamView, int, int]:
        """The stream and the ``[start, end)`` a lookup searches: both message boundaries (400
        ``INVALID_OFFSET``/``INVALID_END`` otherwise), ``end`` defaulting to the durable tail."""
        inc = self._lookup(path)
        self._touch(inc)
        view = self._view(inc)
        start = self._start_position(offset, view.tail)
        end = view.tail
        if end_offset is not None:
            end = await bounds.resolve_end(view, start, end_offset, whole_messages=True)
        if start != end and not await view.is_boundary(start):
            raise InvalidReadOffset(
                f"offset {format_offset(start)!r} is inside a message; a {what} starts at a "
                "message boundary"
            )
        return inc, view, start, end

    @staticmethod
    def _start_position(offset: str, tail: int) -> int:
        if offset == NOW:
            return tail
        start = 0 if offset == BEGINNING else _parse_token(offset, "offset")
        if start > tail:
            raise BadRequest("offset is beyond the tail of the stream")
        return start

    async def wait(
        self,
        path: str,
        offset: str,
        timeout: float,
        release: Iterable[asyncio.Future[Any]] = (),
    ) -> bool:
        """Wait until data past ``offset`` is durable or the stream is closed; False on timeout, or once
        any future in ``release`` completes (the HTTP layer's hang-up and drain signals).

        Raises NotFound/Gone if the stream is deleted while waiting (hazard 33). Counts as access for a
        sliding TTL for its whole duration (hazard 26). Only the stream's own durable commits wake it,
        so a fork's waiters ignore appends to its source (section 5.7).
        """
        inc = self._lookup(path)
        self._touch(inc)
        log = inc.log
        if offset == NOW:
            target = log.durable_tail
        else:
            target = 0 if offset == BEGINNING else _parse_token(offset, "offset")
            if target > log.durable_tail:
                raise BadRequest("offset is beyond the tail of the stream")
        if self._closed:  # shut down: as at a timeout (``close`` released only existing wait sets)
            return log.durable_tail > target or log.durable_closed
        inc.active_waits += 1
        try:
            return await inc.waitset().wait_until(
                lambda: log.durable_tail > target or log.durable_closed, timeout, release
            )
        finally:
            inc.active_waits -= 1
            self._touch(inc)

    def waiting(self, path: str) -> int:
        """How many waits are parked on the stream at ``path`` (observability; 0 if none)."""
        inc = self._registry.by_path.get(path)
        return inc.active_waits if inc is not None else 0

    # ------------------------------------------------------------------ staged appends

    async def stage(self, request: StageRequest) -> StageResult:
        """Stage data under a handle, invisible until committed (extensions.md section 5)."""
        return await self._txns.stage(request)

    async def commit(self, request: CommitRequest) -> CommitResult:
        """Append the listed handles' data as one atomic, idempotent producer request."""
        return await self._txns.commit(request)

    async def abort(self, request: AbortRequest) -> AbortResult:
        return await self._txns.abort(request)

    # ------------------------------------------------------------------ delete / expiry

    async def delete(self, path: str) -> None:
        """Hard delete, or soft delete while forks still read the stream (section 5.4)."""
        inc = self._lookup(path)
        # Shielded: a half-done delete (unregistered, directory still present) must not be left
        # behind by a client disconnect.
        await asyncio.shield(self._remove(inc))

    async def sweep_expired(self) -> int:
        """Delete every expired stream now; returns how many. The background sweeper calls this."""
        now = self._clock()
        expired = [
            inc
            for inc in list(self._registry.expiring)
            if not inc.soft_deleted and inc.expired(now)
        ]
        for inc in expired:
            try:
                await asyncio.shield(self._expire(inc))
            except Exception:
                logger.exception("expiring stream %r failed", inc.path)
        try:
            await self._txns.sweep()  # staged-append handles past their TTL
        except Exception:
            logger.exception("expiring staged-append handles failed")
        return len(expired)

    async def sweep_producers(self) -> producer_sweep.SweepCounts:
        """Compact quiet producers, forget idle ones and old forgotten groups, now (in slices on the
        loop); the background sweeper calls this every ``producer_policy.tick_seconds``."""
        logs = (inc.log for inc in list(self._registry.by_id.values()))
        return await producer_sweep.sweep(logs, int(self._clock() * 1000), self.producer_policy)

    async def _producer_sweep_loop(self) -> None:
        policy = self.producer_policy
        while not self._closed:
            try:
                counts = await self.sweep_producers()
            except Exception:
                logger.exception("producer sweep failed")
            else:
                if counts:
                    logger.info("producer state: %s", counts.describe(policy))
            await asyncio.sleep(policy.tick_seconds)

    async def _sweep_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._sweep_interval)
            try:
                await self.sweep_expired()
            except Exception:
                logger.exception("expiry sweep failed")

    async def _expire(self, inc: Incarnation) -> None:
        if inc.removed or inc.soft_deleted:
            return
        logger.info("stream %r expired", inc.path)
        await self._remove(inc)

    async def _remove(self, inc: Incarnation) -> None:
        path = inc.path
        self._txns.discard(inc)  # staged handles belong to this incarnation and die with it
        if self._registry.refcount(inc) > 0:
            await self._soft_delete(inc)
        else:
            await self._hard_delete(inc)
            await self._collect_source_of(inc)
        self._emit("on_deleted", path)

    async def _soft_delete(self, inc: Incarnation) -> None:
        # Flag first (synchronously): from here on every direct request answers 410.
        inc.soft_deleted = True
        self.changes.touch(inc.path, live=False)
        inc.waitset().fail(lambda: Gone("the stream was deleted"))
        await inc.log.stage_soft_delete()
        # The last fork may have gone while the record was being written.
        await self._collect(inc)

    async def _hard_delete(self, inc: Incarnation) -> None:
        if inc.removed:
            return
        self._registry.remove(inc)
        self._unsubscribe(inc)
        inc.waitset().fail(lambda: NotFound("the stream was deleted"))
        try:
            await self._data.delete_stream(inc.log)
        except ProtocolError:
            # Storage keeps serving a log it could not move to the trash; so do we, unless the path
            # was re-created meanwhile (then it stays reachable only for its forks).
            inc.removed = False
            inc.waiters = None
            self._registry.add(inc, current=inc.path not in self._registry.by_path)
            self._subscribe(inc)
            raise

    async def _quarantine(self, inc: Incarnation, reason: str) -> None:
        """Stop serving ``inc`` and set it aside (start-up only: nothing was served from it yet)."""
        self._registry.remove(inc)
        self._unsubscribe(inc)
        await self._data.quarantine(inc.id, inc.path, reason)

    async def _collect(self, inc: Incarnation) -> None:
        """Garbage-collect ``inc`` if it is deleted and unreferenced, then cascade up the chain."""
        current: Incarnation | None = inc
        while (
            current is not None
            and not current.removed
            and current.soft_deleted
            and self._registry.refcount(current) == 0
        ):
            source = self._registry.source_of(current)
            logger.info("collecting deleted stream %r (%s)", current.path, current.id)
            await self._hard_delete(current)
            current = source

    async def _collect_source_of(self, inc: Incarnation) -> None:
        source_id = inc.source_id
        source = self._registry.by_id.get(source_id) if source_id else None
        if source is not None:
            try:
                await self._collect(source)
            except Exception:
                # The fork itself is deleted; a failed cascade is retried at the next start-up.
                logger.exception("cascade deletion of %r failed", source.path)

    # ------------------------------------------------------------------ listing

    def list_streams(self, prefix: str = "") -> list[StreamListing]:
        """Every live stream whose path starts with ``prefix``, sorted by path (O(log n + streams
        under the prefix): for the subscription layer, which needs all of them)."""
        now = self._clock()
        by_path = self._registry.by_path
        found = []
        for path in self._registry.paths.islice(self._first_path(prefix, None)):
            if not path.startswith(prefix):
                break
            inc = by_path[path]
            if not inc.soft_deleted and not inc.expired(now):
                found.append(self._listing(path, inc))
        return found

    def list_page(
        self,
        prefix: str,
        *,
        match: Callable[[str], bool] | None,
        after: str | None,
        limit: int,
        examine: int,
    ) -> StreamPage:
        """One page of the listing extension: live streams whose path starts with ``prefix`` and
        satisfies ``match``, strictly after ``after``, at most ``limit`` of them, by path.

        The cost is bounded by the caller, whatever matches: a bisect into the sorted paths, then at
        most ``examine`` paths. A page that stops there answers with what it found (possibly nothing)
        and a ``next`` after the last path it examined, so a pattern that matches nothing costs one
        bounded page per ``examine`` paths, never a walk of every stream per request. The engine
        does not depend on how paths are matched: the HTTP layer brings the glob rules.
        """
        now = self._clock()
        by_path = self._registry.by_path
        listing = self._listing
        found: list[StreamListing] = []
        add = found.append
        last: str | None = None
        # At most ``examine`` paths of the range, and one more to know whether the page is cut.
        window = self._registry.paths.islice(self._first_path(prefix, after))
        for examined, path in enumerate(window):
            if not path.startswith(prefix):
                break
            if examined >= examine or len(found) >= limit:
                return StreamPage(found, last)  # more paths follow in the range
            last = path
            if match is not None and not match(path):
                continue
            inc = by_path[path]
            if not inc.soft_deleted and not inc.expired(now):
                add(listing(path, inc))
        return StreamPage(found, None)

    def changed(
        self, since: str | None, match: Match | None, *, limit: int, examine: int
    ) -> ChangePage:
        """One page of the change feed (extension ``changes``): the paths ``match`` holds that changed
        after the cursor ``since`` (``None``: a full snapshot), each with its current state. Costs a
        bisect plus at most ``examine`` entries, whatever the number of streams."""
        page = self.changes.page(self._cursor(since), match, limit=limit, examine=examine)
        now = self._clock()
        by_path = self._registry.by_path
        entries: list[tuple[str, StreamListing | None]] = []
        for path in page.paths:
            inc = by_path.get(path)
            live = inc is not None and not inc.soft_deleted and not inc.expired(now)
            entries.append((path, self._listing(path, inc) if live else None))  # type: ignore[arg-type]
        return ChangePage(entries, str(page.cursor), page.more, page.reset)

    async def wait_changed(
        self,
        since: str,
        match: Match | None,
        timeout: float,
        release: Iterable[asyncio.Future[Any]] = (),
        *,
        examine: int,
    ) -> bool:
        """Wait until a path ``match`` holds changes after ``since`` (True), or ``timeout`` passes or a
        ``release`` future completes (False). An unusable cursor has "changes" at once (a reset)."""
        cursor = self._cursor(since)
        if not self.changes.usable(cursor):
            return True
        assert cursor is not None
        return await self.changes.wait(cursor, match, timeout, release, examine=examine)

    async def register_selection(
        self, paths: list[str], keep: Callable[[str], bool] | None = None
    ) -> Selection:
        """Remember an explicit set of paths for change queries; the same set gets the same id
        (``keep``: only those paths are held, under the id of all of them; selections.prepare)."""
        if len(paths) > SELECTION_INLINE_PATHS:  # sorting and hashing 100k paths: off the loop
            prepared = await asyncio.get_running_loop().run_in_executor(
                self._data.read_executor, prepare, paths, keep
            )
        else:
            prepared = prepare(paths, keep)
        return self.selections.add(*prepared)

    def selection(self, id: str) -> Selection:
        found = self.selections.get(id)
        if found is None:
            raise SelectionNotFound(
                f"selection {id!r} is not registered here (forgotten after an hour unused, or the "
                "server restarted): register its paths again"
            )
        return found

    @staticmethod
    def _cursor(since: str | None) -> Cursor | None:
        if since is None:
            return None
        try:
            return Cursor.parse(since)
        except InvalidCursor as exc:
            raise InvalidParameter(f"since: {exc}") from None

    def _first_path(self, prefix: str, after: str | None) -> int:
        """Index in the sorted paths of the first one >= ``prefix`` and > ``after``."""
        paths = self._registry.paths
        if after is not None and after >= prefix:
            return paths.bisect_right(after)
        return paths.bisect_left(prefix)

    @staticmethod
    def _listing(path: str, inc: Incarnation) -> StreamListing:
        log = inc.log
        return StreamListing(
            path, log.header.content_type, offset_token(log.durable_tail), log.durable_closed
        )

    def quarantined(self, limit: int) -> tuple[int, list[QuarantinedStream]]:
        """How many streams are set aside because they cannot be served (``storage/quarantine.py``),
        and the first ``limit`` of them in the order they were found."""
        entries = self._data.quarantined
        return len(entries), list(itertools.islice(entries.values(), limit))

    # ------------------------------------------------------------------ helpers

    def _lookup(self, path: str, now: float | None = None) -> Incarnation:
        """The live incarnation at ``path``: 404 if none (or expired at ``now``, default the clock),
        410 if soft-deleted."""
        inc = self._registry.by_path.get(path)
        if inc is None:
            if path in self._data.corrupt:
                raise CorruptStream(f"stream {path!r} is quarantined: {self._corrupt(path)}")
            raise NotFound(f"stream {path!r} does not exist")
        if inc.soft_deleted:
            raise Gone(f"stream {path!r} was deleted")
        if inc.expired(self._clock() if now is None else now):
            # Answer as the sweeper will leave it: soft-deleted if forks still read it.
            if self._registry.refcount(inc) > 0:
                raise Gone(f"stream {path!r} expired")
            raise NotFound(f"stream {path!r} does not exist")
        return inc

    def _corrupt(self, path: str) -> str:
        return self._data.corrupt.get(path, "corrupt")

    def _touch(self, inc: Incarnation) -> None:
        inc.last_access = max(inc.last_access, self._clock())

    def _view(self, inc: Incarnation) -> StreamView:
        def source_log(storage_id: str) -> StreamLog | None:
            source = self._registry.by_id.get(storage_id)
            return source.log if source is not None else None

        return StreamView.of(inc.log, source_log, json=inc.json)

    def _register(self, log: StreamLog, now: float) -> Incarnation:
        inc = Incarnation.of(log, now)
        self._registry.add(inc, current=True)
        self._subscribe(inc)
        return inc

    def _subscribe(self, inc: Incarnation) -> None:
        # The same bound method for every log (made once in __init__): no closure per stream.
        inc.log.on_commit = self._on_commit

    @staticmethod
    def _unsubscribe(inc: Incarnation) -> None:
        inc.log.on_commit = None

    def _committed(self, log: StreamLog) -> bool:
        """A durable commit of ``log``: wake its incarnation's readers, and number the change if the
        path still names it (a soft-deleted source that serves its forks changes nothing visible).
        True if readers of it were parked (the log then keeps its hot tail for them)."""
        inc = self._registry.by_id.get(log.id)
        if inc is None or inc.log is not log:
            return False
        waiters = inc.waiters
        woke = waiters is not None and len(waiters) > 0
        if waiters is not None:
            waiters.notify()
        if not inc.soft_deleted:
            path = inc.path
            if self._registry.by_path.get(path) is inc:
                self.changes.touch(path)
        return woke

    def _info(self, inc: Incarnation, tail_offset: str | None = None) -> StreamInfo:
        """``tail_offset``: the durable tail's token, if the caller has it."""
        return StreamInfo(
            path=inc.path,
            storage_id=inc.id,
            content_type=inc.header.content_type,
            next_offset=format_offset(inc.log.durable_tail) if tail_offset is None else tail_offset,
            closed=inc.log.durable_closed,
            ttl_seconds=inc.lifetime.ttl_seconds,
            expires_at=inc.lifetime.expires_at,
        )

    def _notify_appended(self, durable: asyncio.Future[None], path: str, next_offset: str) -> None:
        if not durable.cancelled() and durable.exception() is None:
            self._emit("on_appended", path, next_offset)

    def _emit(self, hook: str, *args: str) -> None:
        for observer in self._observers:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                logger.exception("stream observer %r failed in %s", observer, hook)


def _small_digest(request: AppendRequest, request_type: contenttype.ContentType | None) -> bytes:
    """The payload digest of a small append (computed on the loop; a large body's is offloaded)."""
    producer = request.producer
    if request.key is not None:
        producers.check_tuple_syntax(producer)
        return txnspace.commit_digest((), request.close, request.key)
    if producer is not None:
        producers.check_tuple_syntax(producer)
        return producers.request_digest(
            request_type.essence if request_type else None, request.body, request.close
        )
    return b""


class _Settles:
    """An ``_append_staged`` entry's completion, where the round expects its future (``done``,
    ``set_result``, ``set_exception``, as ``storage/batch.Slot``): once the entry is durable,
    observers hear of the append and ``result`` gets its answer, in the round's own callback. Before,
    the log's future per entry woke a done callback a loop turn later, which then settled ``result``:
    a future, a closure and a loop turn per append (issue 17, h49)."""

    __slots__ = ("_answer", "_emit", "_path", "_result", "_settled", "staged")

    def __init__(
        self,
        result: asyncio.Future[AppendResult],
        answer: AppendResult,
        path: str | None,
        emit: Callable[..., None],
    ) -> None:
        self._result = result
        self._answer = answer
        self._path = path  # None: nothing appended (a close alone), nothing to tell
        self._emit = emit
        # False while ``stage_to`` runs: a refusal there (the log's storage error) settles the
        # result a loop turn later, as the log's failed future did, so the caller never sees an
        # append that was handed to the log as refused before it started.
        self.staged = False
        self._settled = False

    def done(self) -> bool:
        # Its own flag, not the result's: a result the caller cancelled (gone away) is done, and
        # observers must still hear of the append once durable.
        return self._settled

    def set_result(self, _: None) -> None:
        if self._settled:
            return
        self._settled = True
        # Observers hear of the append once it is durable, even if the request went away
        # meanwhile (its result cancelled): the data is committed either way.
        if self._path is not None:
            self._emit("on_appended", self._path, self._answer.next_offset)
        if not self._result.done():
            self._result.set_result(self._answer)

    def set_exception(self, exc: BaseException) -> None:
        if self._settled:
            return
        self._settled = True
        if not self.staged:
            asyncio.get_running_loop().call_soon(self._fail, exc)
        else:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if not self._result.done():
            self._result.set_exception(exc)


class _AppendSlot(Slot):
    """An ``append_batch`` entry's completion: when its round settles it, observers hear of the
    append (as ``_append_staged``'s done callback tells them) and the batch records its answer."""

    __slots__ = ("_answer", "_emit", "_path")

    def __init__(
        self,
        batch: Batch,
        index: int,
        answer: AppendResult,
        path: str | None,
        emit: Callable[..., None],
    ) -> None:
        # ``Slot.__init__``'s fields set here: one call less for each of a bulk request's appends.
        self._batch = batch
        self._index = index
        self._done = False
        self._answer = answer
        self._path = path  # None: nothing appended (a close alone), nothing to tell
        self._emit = emit

    def set_result(self, result: None) -> None:
        if not self._done and self._path is not None:
            self._emit("on_appended", self._path, self._answer.next_offset)
        super().set_result(self._answer)


def _failed(loop: asyncio.AbstractEventLoop, exc: BaseException) -> asyncio.Future[_T]:
    """A future already failed with ``exc``: how the ``_nowait`` calls report a refusal."""
    failed: asyncio.Future[_T] = loop.create_future()
    if isinstance(exc, ProtocolError):
        # A refusal needs no traceback, and one would hold the frames it came through and, by their
        # callers, the frame holding this future: a reference cycle per refused request.
        exc.__traceback__ = None
    failed.set_exception(exc)
    return failed


def _parse_token(text: str, what: str) -> int:
    try:
        return parse_position(text)
    except InvalidOffset:
        raise BadRequest(f"malformed {what} {text!r}") from None


def _nowhere(path: str) -> None:
    """``Engine.placed_elsewhere`` of one process: no path is placed in another shard."""
    return None


__all__ = ["Engine", "ProtocolError", "StreamObserver"]
