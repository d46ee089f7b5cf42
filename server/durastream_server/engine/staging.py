"""Staged (transactional) appends: stage under a handle, commit handles atomically, abort, expire.

Semantics are in docs/extensions.md section 5, the storage design in
docs/decisions/0003-staged-appends.md. In short:

- A stage writes one APPEND record to the handle's staging file (``storage/txnfile.py``) and fsyncs it
  before answering. It never touches the stream's log, so it never moves the tail or wakes a reader.
  The handle's own fold (a ``StreamState`` over its records) gives its totals and the producer state
  that deduplicates stage retries.
- A commit is an ordinary producer request of the stream: it is validated against the stream's state
  exactly like an append (a duplicate tuple is a 204 *before* the handles are looked at, so a commit
  retried after its handles were reclaimed still succeeds), and then handed to the log as ONE
  ``GroupCommit`` with no ``await`` in between (hazard 17). Once durable, the staging files are removed.
- Abort writes a tombstone (so the name can never be committed) and removes the files.
- Handles expire ``ttl`` seconds after their first stage; the engine's sweeper removes them.

Per handle name, stage, commit, abort and expiry are serialized by a keyed lock; commits and aborts of
several handles take their locks in sorted order.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from durastream_server.engine import contenttype, jsonmode, producers, txnspace
from durastream_server.engine.api import AppendRequest, AppendResult
from durastream_server.engine.bodies import request_messages
from durastream_server.engine.registry import Incarnation, Registry
from durastream_server.engine.txnapi import (
    AbortRequest,
    AbortResult,
    CommitRequest,
    CommitResult,
    StageRequest,
    StageResult,
    TxnLimits,
)
from durastream_server.engine.txnspace import (
    ABORTED,
    EXPIRED,
    FENCED,
    StagedHandle,
    StreamTxns,
    check_handle_names,
    commit_digest,
)
from durastream_server.errors import (
    BadRequest,
    InsufficientStorage,
    StorageFailure,
    StreamClosed,
    StreamSeqRegression,
    TxnAlreadyCommitted,
    TxnNotFound,
    TxnTooLarge,
)
from durastream_server.offsets import format_offset
from durastream_server.storage import codec, txnfile
from durastream_server.storage.datadir import DataDir, Durability
from durastream_server.storage.files import is_out_of_space
from durastream_server.storage.records import (
    MESSAGE_OVERHEAD,
    AppendEntry,
    CommittedHandle,
    GroupCommit,
    ProducerTuple,
    StagedSource,
)
from durastream_server.storage.state import StreamState, apply_entry
from durastream_server.storage.txnfile import HandleHeader, Tombstone

logger = logging.getLogger(__name__)

# A commit or abort of many handles (up to 10,000) lets the event loop run after this many names while
# it takes their locks and looks them up, so other requests are not held for its whole list.
YIELD_EVERY = 500


class EngineSide(Protocol):
    """What ``TxnManager`` uses of the engine that owns it, named here so that this module does not
    import ``engine.py`` (which imports this one): a commit is validated and answered like an append."""

    _data: DataDir
    _registry: Registry
    _clock: Callable[[], float]

    def _lookup(self, path: str) -> Incarnation: ...

    def _touch(self, inc: Incarnation) -> None: ...

    async def _append_to_closed(
        self,
        inc: Incarnation,
        request: AppendRequest,
        digest: bytes,
        barrier: asyncio.Future[None] | None = None,
    ) -> AppendResult: ...

    async def _duplicate(
        self,
        inc: Incarnation,
        decision: producers.Duplicate,
        barrier: asyncio.Future[None] | None = None,
    ) -> AppendResult: ...

    def _notify_appended(
        self, durable: asyncio.Future[None], path: str, next_offset: str
    ) -> None: ...


class TxnManager:
    """Staged appends for every stream of one engine. Uses the engine's lookup, clock, producer
    validation helpers and executor, so staged appends follow exactly the rules appends follow."""

    def __init__(self, engine: EngineSide, limits: TxnLimits | None = None) -> None:
        self._engine = engine
        self.limits = limits or TxnLimits()
        self._spaces: dict[str, StreamTxns] = {}
        # The spaces a sweep has work in: handles to expire, tombstones or fences to forget. A stream
        # whose handles were all committed leaves it, so the sweep (4 times a second) costs what can
        # expire, not every stream that ever staged (5,000 such streams kept an idle server at 6% of
        # a core; 100,000 would saturate it).
        self._sweepable: dict[str, StreamTxns] = {}
        self._background: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------------------------ plumbing

    @property
    def _sync(self) -> bool:
        return self._engine._data.config.durability == Durability.FSYNC

    def _now_ms(self) -> int:
        return int(self._engine._clock() * 1000)

    async def _io(self, func, *args):  # noqa: ANN001, ANN002, ANN202
        return await asyncio.get_running_loop().run_in_executor(
            self._engine._data.executor, func, *args
        )

    def _space(self, inc: Incarnation) -> StreamTxns:
        space = self._spaces.get(inc.id)
        if space is None:
            space = StreamTxns(inc.id, os.path.join(inc.log.directory, txnfile.TXN_DIR))
            self._spaces[inc.id] = space
        return space

    def spaces(self) -> list[StreamTxns]:
        """The staged-append state of every stream that has had any (a copy: for counting)."""
        return list(self._spaces.values())

    def _current(self, path: str, inc: Incarnation) -> Incarnation:
        """After an await: the stream must still be the same incarnation (else 404/410)."""
        now = self._engine._lookup(path)
        if now is not inc:
            raise TxnNotFound(f"stream {path!r} was re-created; its staged handles are gone")
        return now

    def _background_io(self, func, *args) -> None:  # noqa: ANN001, ANN002
        task = asyncio.ensure_future(self._io(func, *args))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _storage_error(self, what: str, exc: OSError) -> StorageFailure:
        logger.error("%s failed: %r", what, exc)
        if is_out_of_space(exc):
            return InsufficientStorage(f"{what}: no space left ({exc})")
        return StorageFailure(f"{what}: {exc}")

    def _hold(self, space: StreamTxns, names: tuple[str, ...]):  # noqa: ANN202
        """The locks of ``names``, letting the loop run every ``YIELD_EVERY`` names."""
        return space.locks.hold_all(names, yield_every=YIELD_EVERY)

    # ------------------------------------------------------------------------------ stage

    async def stage(self, request: StageRequest) -> StageResult:
        check_handle_names((request.handle,), "Durastream-Txn")
        engine = self._engine
        inc = engine._lookup(request.path)
        engine._touch(inc)
        body = request.body
        if not body:
            raise BadRequest("a stage (Durastream-Txn) needs a non-empty body")
        request_type = contenttype.parse(request.content_type)
        if request_type is None:
            raise BadRequest(
                "Content-Type is required with a body"
                if request.content_type is None
                else f"invalid Content-Type {request.content_type!r}"
            )
        ttl = request.ttl_seconds
        if ttl is not None and not 1 <= ttl <= self.limits.max_ttl_seconds:
            raise BadRequest(
                f"Durastream-Txn-TTL must be between 1 and {self.limits.max_ttl_seconds} seconds, "
                f"got {ttl}"
            )
        producer = request.producer
        digest = b""
        pending_digest: Awaitable[bytes] | None = None
        if producer is not None:
            producers.check_tuple_syntax(producer)
            # Hashed on another core (large bodies) while the loop validates the JSON below.
            pending_digest = producers.request_digest_soon(request_type.essence, body, False)
        parsed: tuple[bytes, ...] | BadRequest | None = None
        if inc.json:
            # Views, not copies: staged messages are only written to the staging file, never kept.
            parsed = await jsonmode.split_messages_offloaded(
                body, allow_empty_array=False, views=True, max_messages=engine.max_messages
            )
        if pending_digest is not None:
            digest = await pending_digest
        inc = self._current(request.path, inc)
        if inc.log.state.closed:
            raise self._closed_error(inc)
        messages = request_messages(inc, request_type, parsed, body, engine.max_messages)
        # Shielded: a client that hangs up must not leave a half-applied stage (file written, memory
        # not updated) or release the handle's lock while its write is still running.
        return await asyncio.shield(
            self._stage_locked(request, inc, messages, producer, digest, ttl)
        )

    def _closed_error(self, inc: Incarnation) -> StreamClosed:
        return StreamClosed(
            "the stream is closed",
            headers={
                "Stream-Closed": "true",
                "Stream-Next-Offset": format_offset(inc.log.state.tail),
            },
        )

    async def _stage_locked(
        self,
        request: StageRequest,
        inc: Incarnation,
        messages: tuple[bytes, ...],
        producer: ProducerTuple | None,
        digest: bytes,
        ttl: int | None,
    ) -> StageResult:
        space = self._space(inc)
        name = request.handle
        async with space.locks.hold(name):
            inc = self._current(request.path, inc)
            if inc.log.state.closed:
                raise self._closed_error(inc)
            now_ms = self._now_ms()
            handle = space.handles.get(name)
            if handle is None:
                dead = space.dead_error(inc.log.state, name)
                if not isinstance(dead, TxnNotFound):
                    raise dead
                state = StreamState(tail=0)
            else:
                handle.check_open(now_ms)
                state = handle.state
            if producer is not None:
                decision = producers.validate(state, producer, digest)
                if isinstance(decision, producers.Duplicate):
                    assert handle is not None  # an unknown producer is never a duplicate
                    return self._stage_result(inc, handle, producer, decision, duplicate=True)
            # Each message counts MESSAGE_OVERHEAD beyond its bytes, as in every byte budget, so a
            # handle of tiny messages is bounded like any other.
            held = state.tail + MESSAGE_OVERHEAD * (handle.n_messages if handle else 0)
            adding = sum(map(len, messages)) + MESSAGE_OVERHEAD * len(messages)
            limit = self.limits.max_handle_bytes
            if held + adding > limit:
                raise TxnTooLarge(
                    f"handle {name!r} would hold {held + adding} bytes (payload plus "
                    f"{MESSAGE_OVERHEAD} per message); the server allows {limit} bytes per handle "
                    "(--max-staged-bytes; commit it and stage the rest under another handle)"
                )
            entry = AppendEntry(
                position=state.tail,
                messages=messages,
                timestamp_ms=now_ms,
                producer=producer,
                digest=digest,
            )
            if handle is None:
                handle = await self._create(inc, space, name, entry, ttl, now_ms)
            else:
                await self._append(handle, entry)
            return self._stage_result(inc, handle, producer, None, duplicate=False)

    async def _create(
        self,
        inc: Incarnation,
        space: StreamTxns,
        name: str,
        entry: AppendEntry,
        ttl: int | None,
        now_ms: int,
    ) -> StagedHandle:
        header = HandleHeader(name, now_ms, ttl or self.limits.default_ttl_seconds)
        header_frame = txnfile.encode_handle_header(header)
        path = os.path.join(space.txn_dir, txnfile.staging_file_name(name))
        sync = self._sync

        def create() -> int:
            txnfile.make_txn_dir(inc.log.directory, sync=sync)
            return txnfile.create_staging_file(
                path, [header_frame, codec.encode_append(entry)], sync=sync
            )

        await inc.log.ensure_directory()  # a packed stream gets its directory (storage/packs.py)
        try:
            end = await self._io(create)
        except OSError as exc:
            raise self._storage_error(f"staging into handle {name!r}", exc) from exc
        handle = StagedHandle(name, path, header, len(header_frame), end, StreamState(tail=0))
        apply_entry(handle.state, entry)
        handle.n_messages = len(entry.messages)
        space.handles[name] = handle
        self._sweepable[space.log_id] = space
        return handle

    async def _append(self, handle: StagedHandle, entry: AppendEntry) -> None:
        frame = codec.encode_append(entry)
        try:
            end = await self._io(
                lambda: txnfile.append_staging_record(
                    handle.path, frame, handle.end, sync=self._sync
                )
            )
        except OSError as exc:
            handle.broken = f"a write to its staging file failed ({exc}); restart to recover"
            raise self._storage_error(f"staging into handle {handle.name!r}", exc) from exc
        apply_entry(handle.state, entry)
        handle.n_messages += len(entry.messages)
        handle.end = end

    def _stage_result(
        self,
        inc: Incarnation,
        handle: StagedHandle,
        producer: ProducerTuple | None,
        decision: producers.Duplicate | None,
        *,
        duplicate: bool,
    ) -> StageResult:
        epoch = seq = None
        if producer is not None:
            epoch = decision.epoch if decision else producer.epoch
            seq = decision.highest_seq if decision else producer.seq
        return StageResult(
            handle=handle.name,
            messages=handle.n_messages,
            bytes=handle.size,
            expires_at_ms=handle.expires_at_ms,
            next_offset=format_offset(inc.log.durable_tail),
            duplicate=duplicate,
            producer_epoch=epoch,
            producer_seq=seq,
        )

    # ------------------------------------------------------------------------------ commit

    async def commit(self, request: CommitRequest) -> CommitResult:
        check_handle_names(request.handles, "Durastream-Commit")
        if not request.handles:
            raise BadRequest("Durastream-Commit must name at least one handle")
        if len(request.handles) > self.limits.max_handles_per_commit:
            raise BadRequest(
                f"Durastream-Commit names {len(request.handles)} handles; at most "
                f"{self.limits.max_handles_per_commit} per request"
            )
        producers.check_tuple_syntax(request.producer)
        inc = self._engine._lookup(request.path)
        self._engine._touch(inc)
        return await asyncio.shield(self._commit_locked(request, inc))

    async def _commit_locked(self, request: CommitRequest, inc: Incarnation) -> CommitResult:
        engine = self._engine
        space = self._space(inc)
        digest = commit_digest(request.handles, request.close, request.key)
        producer = request.producer
        async with self._hold(space, request.handles):
            # The locks wait out stages in flight on these handles, and keep every other request off
            # them until the commit is done: what is looked up here cannot change before the group is
            # staged. The lookups yield to the loop (a commit may name 10,000 handles), so they come
            # before the validation; a missing handle is only reported after it (see below).
            found, missing = await self._lookup_handles(space, request.handles)
            # From here to stage_group(): no await, so the validation below is what the group is
            # appended under (hazard 17).
            inc = self._current(request.path, inc)
            log = inc.log
            state = log.state
            if state.closed:
                as_append = AppendRequest(
                    path=request.path,
                    content_type=None,
                    body=b"",
                    close=request.close,
                    stream_seq=request.stream_seq,
                    producer=producer,
                )
                return _as_commit(await engine._append_to_closed(inc, as_append, digest))
            decision = producers.validate(
                state, producer, digest, refuse_forgotten=request.refuse_forgotten
            )
            if isinstance(decision, producers.Duplicate):
                # Before the handles: a retried commit whose handles are already reclaimed is a 204.
                return _as_commit(await engine._duplicate(inc, decision))
            if (
                request.stream_seq is not None
                and state.last_stream_seq is not None
                and request.stream_seq <= state.last_stream_seq
            ):
                raise StreamSeqRegression(
                    f"Stream-Seq {request.stream_seq!r} is not greater than the last "
                    f"({state.last_stream_seq!r})"
                )
            if missing is not None:
                raise space.dead_error(state, missing)
            now_ms = self._now_ms()
            handles = found.handles
            for handle in handles:
                handle.check_open(now_ms)
            group = GroupCommit(
                position=state.tail,
                size=found.size,
                n_messages=found.n_messages,
                timestamp_ms=max(now_ms, state.last_timestamp_ms),
                sources=found.sources,
                closes=request.close,
                producer=producer,
                stream_seq=request.stream_seq,
                digest=digest,
                txn_handles=found.committed,
            )
            durable = log.stage_group(group)
            for handle in handles:
                handle.committing = True
            next_offset = format_offset(group.end)
            if group.size:
                path = inc.path
                durable.add_done_callback(
                    lambda fut: engine._notify_appended(fut, path, next_offset)
                )
            try:
                await durable
            except BaseException:
                for handle in handles:  # the log is poisoned; a restart recovers from disk
                    handle.committing = False
                raise
            for handle in handles:
                if space.handles.get(handle.name) is handle:
                    del space.handles[handle.name]
            logger.debug(
                "stream %r: committed %d handles, %d messages, %d bytes at %s",
                inc.path,
                len(handles),
                group.n_messages,
                group.size,
                next_offset,
            )
            # The commit record names the handles, so a crash before these unlinks is repaired at
            # start-up (a staging file of a committed handle is removed, never re-committed). A
            # moved file keeps its staging name until here (it is also a segment now: only the name
            # goes), so a crash before the commit was durable leaves every handle staged
            # (storage/group.py). Still under the handles' locks: a stage that creates a handle of
            # the same name (once the committed name is forgotten) cannot lose its file to this.
            await self._io(txnfile.remove_files, [h.path for h in handles])
        return CommitResult(
            next_offset=next_offset,
            closed=request.close,
            producer_epoch=producer.epoch,
            producer_seq=producer.seq,
            messages=group.n_messages,
            bytes=group.size,
        )

    async def _lookup_handles(
        self, space: StreamTxns, names: tuple[str, ...]
    ) -> tuple[_CommitSources, str | None]:
        """The handles of ``names`` (whose locks the caller holds), in order, and the first name
        without one. Nothing is raised here: the caller reports a missing or unusable handle only once
        it knows the commit is not a duplicate (a retried commit is a 204 whatever its handles)."""
        found = _CommitSources()
        for count, name in enumerate(names, 1):
            handle = space.handles.get(name)
            if handle is None:
                return found, name
            found.add(handle)
            if count % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        return found, None

    # ------------------------------------------------------------------------------ abort

    async def abort(self, request: AbortRequest) -> AbortResult:
        check_handle_names(request.handles, "Durastream-Abort")
        if not request.handles:
            raise BadRequest("Durastream-Abort must name at least one handle")
        if len(request.handles) > self.limits.max_handles_per_commit:
            raise BadRequest(
                f"Durastream-Abort names {len(request.handles)} handles; at most "
                f"{self.limits.max_handles_per_commit} per request"
            )
        inc = self._engine._lookup(request.path)
        self._engine._touch(inc)
        return await asyncio.shield(self._abort_locked(request, inc))

    async def _abort_locked(self, request: AbortRequest, inc: Incarnation) -> AbortResult:
        space = self._space(inc)
        async with self._hold(space, request.handles):
            inc = self._current(request.path, inc)
            state = inc.log.state
            victims: list[StagedHandle] = []
            for name in request.handles:
                handle = space.handles.get(name)
                if (handle is not None and handle.committing) or (
                    handle is None and name in state.txn_committed
                ):
                    raise TxnAlreadyCommitted(
                        f"handle {name!r} was already committed; it cannot be aborted"
                    )
                if handle is not None:
                    victims.append(handle)
            # Tombstones first (durable), then the data: a crash in between leaves a staging file
            # whose name is tombstoned, which start-up removes. Unknown names are fenced too, so a
            # stage racing its abort (a zombie writer's) can never create a committable handle; they
            # cost memory, so they are kept for less time and at most ``max_fenced_per_stream``.
            now_ms = self._now_ms()
            forget_at = now_ms + 1000 * self.limits.tombstone_seconds
            fence_at = now_ms + 1000 * self.limits.fence_seconds
            staged = {handle.name for handle in victims}
            new = []
            for name in request.handles:
                known = space.dead(name)
                if name in staged or (known is not None and known.status not in (ABORTED, FENCED)):
                    new.append((name, Tombstone(ABORTED, forget_at)))
                elif known is None and self.limits.max_fenced_per_stream:
                    new.append((name, Tombstone(FENCED, fence_at)))
            if new:
                await self._write_tombstones(inc, space, new)
            for handle in victims:
                space.handles.pop(handle.name, None)
        if victims:
            await self._io(txnfile.remove_files, [h.path for h in victims])
        return AbortResult(next_offset=format_offset(inc.log.durable_tail), aborted=len(victims))

    async def _write_tombstones(
        self, inc: Incarnation, space: StreamTxns, entries: list[tuple[str, Tombstone]]
    ) -> None:
        sync = self._sync

        def write() -> None:
            txnfile.make_txn_dir(inc.log.directory, sync=sync)
            txnfile.append_tombstones(space.txn_dir, entries, sync=sync)

        await inc.log.ensure_directory()
        try:
            await self._io(write)
        except OSError as exc:
            raise self._storage_error("writing handle tombstones", exc) from exc
        for name, tombstone in entries:
            if tombstone.status == FENCED:
                space.fence(name, tombstone, self.limits.max_fenced_per_stream)
            else:
                space.fenced.pop(name, None)
                space.tombstones[name] = tombstone
        space.tombstone_lines += len(entries)
        self._sweepable[space.log_id] = space

    # ------------------------------------------------------------------------------ expiry

    async def sweep(self) -> int:
        """Expire handles past their TTL (and every handle of a closed stream: it can never be
        committed); forget old tombstones. Returns how many handles were removed."""
        registry = self._engine._registry
        removed = 0
        for log_id, space in list(self._sweepable.items()):
            inc = registry.by_id.get(log_id)
            if inc is None or inc.removed or inc.soft_deleted:
                self.discard_id(log_id)
                continue
            now_ms = self._now_ms()
            closed = inc.log.state.closed
            due = [
                h.name
                for h in space.handles.values()
                if not h.committing and (closed or now_ms >= h.expires_at_ms)
            ]
            for name in due:
                removed += await self._expire(inc, space, name, closed=closed)
            space.forget_tombstones(now_ms)
            if space.tombstone_lines > max(1024, 2 * (len(space.tombstones) + len(space.fenced))):
                await self._compact(space)
            if not (space.handles or space.tombstones or space.fenced):
                self._sweepable.pop(log_id, None)  # back when it gets a handle or a tombstone
        return removed

    def sweepable(self) -> int:
        """How many streams the next sweep visits (for tests and figures)."""
        return len(self._sweepable)

    async def _expire(self, inc: Incarnation, space: StreamTxns, name: str, *, closed: bool) -> int:
        async with space.locks.hold(name):
            handle = space.handles.get(name)
            now_ms = self._now_ms()
            if handle is None or handle.committing:
                return 0
            if not closed and now_ms < handle.expires_at_ms:
                return 0
            if not closed:
                forget_at = now_ms + 1000 * self.limits.tombstone_seconds
                try:
                    await self._write_tombstones(
                        inc, space, [(name, Tombstone(EXPIRED, forget_at))]
                    )
                except StorageFailure:
                    return 0  # retried at the next sweep
            logger.info(
                "stream %r: handle %r %s; removing its %d staged bytes",
                inc.path,
                name,
                "abandoned (stream closed)" if closed else "expired",
                handle.size,
            )
            space.handles.pop(name, None)
        await self._io(txnfile.remove_files, [handle.path])
        return 1

    async def _compact(self, space: StreamTxns) -> None:
        live = space.live_tombstones
        try:
            await self._io(lambda: txnfile.rewrite_tombstones(space.txn_dir, live, sync=self._sync))
        except OSError as exc:
            logger.warning("compacting tombstones in %s failed: %s", space.txn_dir, exc)
            return
        space.tombstone_lines = len(live)

    # ------------------------------------------------------------------------------ lifecycle

    def discard(self, inc: Incarnation) -> None:
        """The stream is being deleted: its handles go with it (files are removed in the background;
        a hard delete moves them to the trash anyway)."""
        self.discard_id(inc.id)

    def discard_id(self, log_id: str) -> None:
        space = self._spaces.pop(log_id, None)
        self._sweepable.pop(log_id, None)
        if space is not None and space.handles:
            # A commit in flight still reads its handles' files; it removes them itself.
            paths = [h.path for h in space.handles.values() if not h.committing]
            space.handles.clear()
            if paths:
                self._background_io(txnfile.remove_files, paths)

    async def start(self, ids: Iterable[str] | None = None) -> list[tuple[Incarnation, str]]:
        """Rebuild every stream's handles from its staging files (or those of the streams ``ids``,
        registered by background recovery); finish interrupted cleanups.

        Returns the streams whose staged-append state could not be read, with the reason, for the
        engine to quarantine: one unreadable ``txn/`` must not stop the server.
        """
        # Only the streams recovery saw a txn/ directory in: start-up cost follows the streams with
        # staged appends, not every stream (a stat per stream on the loop cost seconds at 100,000).
        by_id = self._engine._registry.by_id
        with_staging = self._engine._data.with_staging
        chosen = with_staging if ids is None else with_staging.intersection(ids)
        incs = [by_id[i] for i in sorted(chosen) if i in by_id]
        results = await asyncio.gather(
            *(self._io(self._load, inc) for inc in incs), return_exceptions=True
        )
        unreadable: list[tuple[Incarnation, str]] = []
        for inc, loaded in zip(incs, results, strict=True):
            if isinstance(loaded, BaseException):
                if not isinstance(loaded, Exception):
                    raise loaded
                unreadable.append((inc, f"staged appends cannot be read: {loaded!r}"))
                continue
            space = self._space(inc)
            stale = space.adopt(loaded, inc.log.state, inc.path, self.limits.max_fenced_per_stream)
            self._sweepable[space.log_id] = space  # the first sweep sees what start-up found
            if stale:
                self._background_io(txnfile.remove_files, stale)
        return unreadable

    def _load(self, inc: Incarnation) -> txnspace.Loaded:
        """Blocking: read the tombstones and every staging file of ``inc``."""
        reclaim_only = inc.soft_deleted or inc.log.state.closed  # nothing could be committed
        return txnspace.load(
            os.path.join(inc.log.directory, txnfile.TXN_DIR),
            self._now_ms(),
            sync=self._sync,
            reclaim_only=reclaim_only,
        )

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


@dataclass(slots=True)
class _CommitSources:
    """What a commit gathers from its handles, built as they are looked up."""

    handles: list[StagedHandle] = field(default_factory=list)
    sources_list: list[StagedSource] = field(default_factory=list)
    committed_list: list[CommittedHandle] = field(default_factory=list)
    size: int = 0
    n_messages: int = 0

    def add(self, handle: StagedHandle) -> None:
        self.handles.append(handle)
        self.sources_list.append(handle.source())
        self.committed_list.append(CommittedHandle(handle.name, handle.expires_at_ms))
        self.size += handle.size
        self.n_messages += handle.n_messages

    @property
    def sources(self) -> tuple[StagedSource, ...]:
        return tuple(self.sources_list)

    @property
    def committed(self) -> tuple[CommittedHandle, ...]:
        return tuple(self.committed_list)


def _as_commit(result: AppendResult) -> CommitResult:
    return CommitResult(
        next_offset=result.next_offset,
        closed=result.closed,
        duplicate=result.duplicate,
        producer_epoch=result.producer_epoch,
        producer_seq=result.producer_seq,
        verified=result.verified,
    )
