"""Transactional mode: for servers with staged appends (durastream-server's ``staged-append`` extension).

Task side (``TransactionalPartitionWriter``): every task attempt stages its rows, per target stream, in
requests cut by the ``RequestBatcher``, each under a handle of its own (``identity.handle_name``: unique per
attempt *and* per run). Staged data is invisible to readers. Because no request shares a handle with
another, they are staged concurrently (up to ``maxInFlight``) in any order without ever being refused as
out of sequence; the order of the rows is kept by the order of the handles in the commit. Each stage
request carries producer headers of its handle, so the client may retry it safely. Everything is staged,
the final partial request included, because nothing staged can become visible without the driver.
``write()`` returns the handles in its commit message. (Past ``PARALLEL_HANDLES`` requests per stream, the
rest is staged sequentially into tail handles of up to 256 MiB, so that a commit stays far below the
server's 10,000 handles whatever a partition writes.)

Driver side (``commit_part``): one ``Durastream-Commit`` per (stream, partition), listing the successful
attempt's handles (in the request body: no size cliff up to the server's 10,000 handles per commit), under
producer ``(<producerId>-<writer key>-<partition>, epoch = batch id, seq 0)`` and the sink's commit key
(``batch_mode.COMMIT_KEY``). On servers with ``bulk-write`` (``commit_parts``) the commits of a whole
batch travel in a few bulk requests, each part still its own commit, and the remainders of a task's
streams are staged in bulk at its end (docs/decisions/0008-bulk-writes.md). The commit is atomic per
(stream, partition) and idempotent:

- a retried commit request is a 204 duplicate;
- a replayed batch (the driver crashed after committing, before Spark recorded the batch as done) commits
  *new* handles under the same tuple and key: the server answers 204, since the digest covers the key,
  not the handles. This batch's data for that partition is already visible from the earlier run, so the
  new handles are aborted and the part counts as delivered;
- a tuple that an earlier run of the batch used in *ordered* mode (409 ``DUPLICATE_PAYLOAD_MISMATCH``, or a
  204 reporting a seq above 0) fails the commit with ``BatchModeConflict``: the part can only be finished
  in ordered mode (``batch_mode.py``, decision 0006);
- a commit for an older batch than the producer's current epoch is 403: fenced.

Handles of failed, truncated, speculative-losing or zombie attempts are never committed: the driver only
commits what it received in commit messages. ``abort()`` and failing tasks abort what they know of;
anything else (e.g. the handle of a task whose input was truncated and whose message Spark discarded) is
reclaimed by the server when its TTL (``transactionTtl``) lapses. This works whatever the row order.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from durastream_spark.errors import (
    DuplicatePayloadMismatch,
    DurastreamError,
    StreamNotFound,
    TxnAlreadyCommitted,
)
from durastream_spark.protocol.body import RequestBody
from durastream_spark.protocol.bulk import (
    MAX_BULK_BYTES,
    MAX_BULK_PARTS,
    MAX_ENTRIES,
    MAX_ENTRY_PARTS,
    PARALLEL_REQUESTS,
    BulkWrites,
    CommitEntry,
    PartsEntry,
    StageEntry,
)
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.models import AppendResult, StageResult
from durastream_spark.sink.batch_mode import COMMIT_KEY, COMMIT_SEQ, ordered_run_conflict
from durastream_spark.sink.batcher import Request, RequestBatcher
from durastream_spark.sink.errors import BatchModeConflict, CommitError
from durastream_spark.sink.identity import handle_name, new_nonce
from durastream_spark.sink.messages import (
    COMMITTED,
    DUPLICATE,
    NOTHING,
    PartResult,
    SinkCommitMessage,
    StreamPart,
)
from durastream_spark.sink.mode_writer import ModeWriter
from durastream_spark.sink.options import TRANSACTIONAL, SinkOptions
from durastream_spark.sink.producer import IndependentRequests, PipelinedProducer
from durastream_spark.sink.targets import TargetStreams

log = logging.getLogger(__name__)

# Stage requests each get their own handle (no sequence among them: they are staged concurrently, never
# overtake each other, and the commit lists the handles in order). Past this many handles per stream and
# task attempt (the commit names them all, and the server takes at most 10,000 per commit), the rest is
# staged sequentially into tail handles.
PARALLEL_HANDLES = 4000
# A handle holds at most --max-staged-bytes on the server (1 GiB by default); tail handles roll over early.
MAX_TAIL_HANDLE_BYTES = 256 * 1024 * 1024
# Producer epoch of the stage requests: their sequence belongs to the handle, which is new each time.
STAGE_EPOCH = 0
# bulk-write servers: a (partition, stream) part that is a single request of at most this many bytes is
# committed inline (its data in the commit message) rather than staged, up to INLINE_TASK_BYTES a task.
INLINE_PART_BYTES = 64 * 1024
INLINE_TASK_BYTES = 16 * 1024 * 1024


@dataclass
class _StreamState:
    batcher: RequestBatcher
    # Made by the first request staged from the task (most routed streams have none: their whole part
    # is one remainder, inline or staged in bulk), so a task routing to 10,000 streams does not build
    # (and drain) 10,000 of them.
    parallel: IndependentRequests[StageResult] | None = None
    handles: list[str] = field(default_factory=list)
    tails: list[PipelinedProducer[StageResult]] = field(default_factory=list)
    tail_bytes: int = 0
    inline: bytes | None = None  # the whole part, committed inline by the driver (never staged)
    rows: int = 0
    bytes: int = 0
    requests: int = 0


class TransactionalPartitionWriter(ModeWriter[_StreamState]):
    """One task attempt's staged writes to its target streams."""

    mode = TRANSACTIONAL

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # ModeWriter's arguments
        super().__init__(*args, **kwargs)
        self._nonce = new_nonce()  # in every handle name: unique per attempt and per run
        self.targets: TargetStreams | None = None  # to ensure a target again after a 404
        self._handle_count = 0
        self._inline_bytes = 0

    def finish(self) -> tuple[StreamPart, ...]:
        """Stage the remainders, wait for every stage request, and return the parts with their handles.

        On ``bulk-write`` servers the remainders (a task routing to many streams has little more: 20
        rows per stream and partition are one remainder each) go in a few bulk requests instead of one
        request per stream; each is still the first stage of a handle of its own."""
        bulk = BulkWrites(self._client, self._options.content_type)
        batched = bulk.supported()
        entries: list[StageEntry] = []
        parts: list[StreamPart] = []
        waits: list[_StreamState] = []  # streams with stage requests of their own in flight
        for stream, state in self._streams.items():
            # One pass: nothing below changes a stream's figures or handles once its remainder is
            # handed on (draining only waits), so its part is made here, not in a second loop.
            batcher = state.batcher
            size = batcher.pending_body_bytes
            if batched and batcher.pending_rows and self._fits_inline(state, size):
                state.bytes += size
                state.inline = batcher.remainder_bytes()
                self._inline_bytes += size
            elif batcher.pending_rows:
                remainder = batcher.remainder()
                assert remainder is not None
                if batched and remainder.body and len(state.handles) < PARALLEL_HANDLES:
                    state.bytes += len(remainder.body)
                    state.requests += 1
                    handle = self._new_handle(state)
                    producer = (handle, STAGE_EPOCH, 0)
                    ttl = self._options.transaction_ttl_s
                    entries.append(StageEntry(stream, handle, remainder.body, producer, ttl))
                else:
                    self._submit(stream, state, remainder)
            if state.parallel is not None or state.tails:
                waits.append(state)
            parts.append(
                StreamPart(
                    stream,
                    state.rows,
                    state.bytes,
                    state.requests,
                    tuple(state.handles),
                    inline=state.inline,
                )
            )
        if entries:
            self._stage_in_bulk(bulk, entries)
        for state in waits:
            if state.parallel is not None:
                state.parallel.drain()
            for tail in state.tails:
                tail.drain()
        return tuple(parts)

    def discard(self) -> None:
        """After a failure: abort this attempt's handles (best effort; the TTL reclaims what remains), in
        bulk where the server takes it."""
        staged = [(stream, tuple(s.handles)) for stream, s in self._streams.items() if s.handles]
        bulk = BulkWrites(self._client, self._options.content_type)
        if len(staged) > 1 and bulk.supported():
            abort_in_bulk(bulk, staged)
            return
        for stream, handles in staged:
            abort_handles(self._client, stream, handles)

    # ---- internals ---------------------------------------------------------------------------------------

    def _stage_in_bulk(self, bulk: BulkWrites, entries: list[StageEntry]) -> None:
        """Stage ``entries``; those answered 404 (a target deleted after the query remembered it,
        ``targets.py``) are staged once more after their streams are ensured again: a stage to a missing
        stream stored nothing, so its handle is still unused."""
        results = bulk.stage(entries)
        missing = [
            e for e, r in zip(entries, results, strict=True) if isinstance(r, StreamNotFound)
        ]
        if missing and self.targets is not None:
            self.targets.refresh(entry.path for entry in missing)
            results = bulk.stage(missing)
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            raise failures[0]

    def _open(self, stream: str) -> _StreamState:
        return _StreamState(self._batcher())

    def _submit(self, stream: str, state: _StreamState, request: Request) -> None:
        if not request.body:  # only empty values of a byte stream: nothing to stage
            return
        size = len(request.body)
        state.bytes += size
        state.requests += 1
        if len(state.handles) < PARALLEL_HANDLES:
            handle = self._new_handle(state)
            body = request.body
            if state.parallel is None:
                state.parallel = IndependentRequests(self._pool)
            state.parallel.submit(lambda: self._send(stream, handle, 0, body))
            return
        if not state.tails or (
            state.tail_bytes and state.tail_bytes + size > MAX_TAIL_HANDLE_BYTES
        ):
            if state.tails:
                state.tails[-1].drain()  # the previous tail is complete before the next one starts
            handle = self._new_handle(state)
            state.tails.append(
                PipelinedProducer(
                    lambda seq, body, handle=handle: self._send(stream, handle, seq, body),
                    self._pool,
                    label=f"handle '{handle}' on stream '{stream}'",
                )
            )
            state.tail_bytes = 0
        state.tail_bytes += size
        state.tails[-1].submit(request.body)

    def _fits_inline(self, state: _StreamState, size: int) -> bool:
        """Whether the stream's whole part is its remainder of ``size`` bytes, small enough to travel
        inline in the commit message instead of being staged (no staging file, no record group: an
        inline commit is one record in the server's shared commit rounds). Bounded per part and per
        task, because commit messages go through the driver."""
        return (
            not state.handles
            and 0 < size <= INLINE_PART_BYTES
            and self._inline_bytes + size <= INLINE_TASK_BYTES
        )

    def _new_handle(self, state: _StreamState) -> str:
        handle = handle_name(
            self._options.producer_prefix, self._identity, self._nonce, self._handle_count
        )
        self._handle_count += 1
        state.handles.append(handle)
        return handle

    def _send(self, stream: str, handle: str, seq: int, body: RequestBody) -> StageResult:
        def stage() -> StageResult:
            return self._client.stage(
                stream,
                handle,
                body,
                self._options.content_type,
                producer=(handle, STAGE_EPOCH, seq),
                ttl_seconds=self._options.transaction_ttl_s if seq == 0 else None,
            )

        try:
            return stage()
        except StreamNotFound:
            # A target remembered as ensured was deleted: ensure it again and stage once more (the
            # first stage of a handle stored nothing when refused; later seqs are a sequence: no).
            if seq != 0 or self.targets is None:
                raise
            self.targets.refresh([stream])
            return stage()


def commit_part(
    client: StreamClient, options: SinkOptions, message: SinkCommitMessage, part: StreamPart
) -> PartResult:
    """Driver: make the part's handles visible under ``(producer, batch, 0)``, exactly once."""
    if part.inline is not None:  # written for a bulk-write server; commit_parts sends it
        raise CommitError(
            f"stream '{part.stream}', batch {message.epoch}, partition {message.partition}: the "
            "part is to be committed inline (bulk-write), but the commit went the per-stream way."
        )
    if not part.handles:  # rows whose payloads were all empty (byte streams): nothing was staged
        return PartResult(part.stream, message.partition, part.rows, part.bytes, NOTHING, None)
    entry = commit_entry(message, part)
    try:
        outcome: AppendResult | Exception = client.commit(
            part.stream, entry.handles, entry.producer, key=entry.key
        )
    except DuplicatePayloadMismatch as error:
        outcome = error
    result, unneeded = settle(options, message, part, outcome)
    abort_handles(client, part.stream, unneeded)
    if isinstance(result, Exception):
        raise result
    return result


def commit_parts(
    client: StreamClient,
    bulk: BulkWrites,
    options: SinkOptions,
    jobs: Sequence[tuple[SinkCommitMessage, StreamPart]],
) -> list[PartResult | Exception]:
    """Driver, ``bulk-write`` servers: ``commit_part`` for many (partition, stream) parts in a few
    requests (each part still its own keyed commit, one record group per stream); per part its result
    or its error, in order. Unneeded handles (duplicates) are aborted in bulk too."""
    out: list[PartResult | Exception] = [None] * len(jobs)  # type: ignore[list-item]  # all set below
    staged = []
    for index, (message, part) in enumerate(jobs):
        if part.handles or part.inline:
            staged.append(index)
        else:  # nothing to commit (only the staged and inline parts get an answer to settle)
            out[index] = PartResult(
                part.stream, message.partition, part.rows, part.bytes, NOTHING, None
            )
    # The parts of one stream side by side (every partition's; a stable sort keeps their order): they
    # then travel in the same bulk request, which the server stages in one pass, so a routed stream's
    # parts are one batch of its log in one commit round (and a new stream is promoted with all of
    # them) instead of a round each. The entries of a request are independent: order is not applied.
    staged.sort(key=lambda index: jobs[index][1].stream)
    slices = _stream_slices([jobs[index][1] for index in staged])
    shape = _GroupShape.of([jobs[index] for index in staged]) if bulk.supports_parts() else None
    unneeded: list[tuple[str, tuple[str, ...]]] = []

    def commit_slice(first: int, last: int) -> None:
        """A slice's commit, answers settled as soon as they come (the other slices' requests still
        on the server): see ``_stream_slices``."""
        indexes = staged[first:last]
        sliced = [jobs[index] for index in indexes]
        try:
            answers = _commit_staged(bulk, sliced, shape)
        except DurastreamError as error:
            # This slice's request failed as a whole: its parts (only) are to be replayed.
            answers = [error] * len(sliced)
        _recommit_missing(client, options, bulk, sliced, answers)
        for index, answer in zip(indexes, answers, strict=True):
            message, part = jobs[index]
            if isinstance(answer, Exception) and not isinstance(answer, DuplicatePayloadMismatch):
                out[index] = answer
                continue
            out[index], handles = settle(options, message, part, answer)
            if handles:
                unneeded.append((part.stream, tuple(handles)))  # list.append: atomic

    if len(slices) <= 1:
        for first, last in slices:
            commit_slice(first, last)
    else:
        with ThreadPoolExecutor(
            max_workers=min(PARALLEL_REQUESTS, len(slices)), thread_name_prefix="durastream-slice"
        ) as pool:
            for future in [pool.submit(commit_slice, first, last) for first, last in slices]:
                future.result()  # a request's failure is its parts' errors (above); a bug raises
    if unneeded:
        abort_in_bulk(bulk, unneeded)
    return out


def _stream_slices(parts: Sequence[StreamPart]) -> list[tuple[int, int]]:
    """``[first, last)`` ranges of ``parts`` (sorted by stream) cut between streams, each about one
    bulk request: at most ``MAX_ENTRIES`` streams, ``MAX_BULK_PARTS`` parts or ``MAX_BULK_BYTES``.

    Why: committed as one list, the driver built every entry of the batch (~0.1 s for 10,000 routed
    streams) before its first request left, and settled every part (~0.1 s) after the last answer,
    while the server, the bound of a routed commit, waited and then was done. A slice is built, sent
    and settled on its own, up to ``PARALLEL_REQUESTS`` at once, so that work overlaps the server's
    on the other slices. A stream's parts are never split across slices: it keeps its one entry (and
    its parts one commit round on the server), as in one list."""
    out: list[tuple[int, int]] = []
    first, streams, count, size = 0, 0, 0, 0
    previous: str | None = None
    for index, part in enumerate(parts):
        if part.stream != previous:
            if index > first and (
                streams >= MAX_ENTRIES or count >= MAX_BULK_PARTS or size >= MAX_BULK_BYTES
            ):
                out.append((first, index))
                first, streams, count, size = index, 0, 0, 0
            streams += 1
            previous = part.stream
        count += 1
        size += len(part.inline) if part.inline is not None else 0
    if first < len(parts):
        out.append((first, len(parts)))
    return out


def _commit_staged(
    bulk: BulkWrites,
    jobs: Sequence[tuple[SinkCommitMessage, StreamPart]],
    shape: _GroupShape | None,
) -> list[AppendResult | Exception]:
    """Per job (sorted by stream) its commit's answer. On bulk-write 2 servers a stream's inline parts
    of several partitions go as one entry (``PartsEntry``: each still its own keyed commit under its
    own producer tuple, answered per part), so a batch costs one entry per stream, not per (stream,
    partition); everything else goes as one entry per part, as on bulk-write 1."""
    groups = _stream_groups(jobs, shape) if shape is not None else []
    grouped = {index for group in groups for index in group.indexes}
    single = [index for index in range(len(jobs)) if index not in grouped]
    answers: list[AppendResult | Exception | None] = [None] * len(jobs)
    if single:
        for index, answer in zip(
            single, bulk.commit([commit_entry(*jobs[index]) for index in single]), strict=True
        ):
            answers[index] = answer
    if groups:
        for group, answer in zip(
            groups, bulk.commit_parts([group.entry for group in groups]), strict=True
        ):
            for position, index in enumerate(group.indexes):
                answers[index] = answer if isinstance(answer, Exception) else answer[position]
    assert all(answer is not None for answer in answers)  # every job is in one of the two lists
    return answers  # type: ignore[return-value]


@dataclass(frozen=True)
class _StreamGroup:
    """The inline parts of one stream (``indexes`` into the jobs), as one multi-part entry."""

    indexes: tuple[int, ...]
    entry: PartsEntry


@dataclass(frozen=True)
class _GroupShape:
    """What the inline parts of a batch's streams share as ``PartsEntry``s: the producer ids' common
    prefix (``<producerId>-<writer key>-``), each producer id's suffix (the partition) and the epoch.
    Worked out once per batch (a few messages), not per slice or part."""

    prefix: str
    epoch: int
    suffixes: dict[str, str]

    @staticmethod
    def of(jobs: Sequence[tuple[SinkCommitMessage, StreamPart]]) -> _GroupShape | None:
        """None when the parts are not the sink's own shape (one entry per part, as before)."""
        messages: dict[int, SinkCommitMessage] = {}  # by id(): the jobs' messages, once each
        for message, part in jobs:
            if part.inline is not None:
                messages[id(message)] = message
        producer_ids = {message.producer_id for message in messages.values()}  # one per partition
        prefix = os.path.commonprefix(sorted(producer_ids))
        epochs = {message.epoch for message in messages.values()}
        suffixes = {producer_id: producer_id[len(prefix) :] for producer_id in producer_ids}
        if len(epochs) != 1 or not all(_SUFFIX.fullmatch(suffix) for suffix in suffixes.values()):
            return None
        (epoch,) = epochs
        return _GroupShape(prefix, epoch, suffixes)


def _stream_groups(
    jobs: Sequence[tuple[SinkCommitMessage, StreamPart]], shape: _GroupShape | None = None
) -> list[_StreamGroup]:
    """Streams with two or more inline parts, each as one ``PartsEntry``. The parts' producer ids
    share the batch's prefix (``<producerId>-<writer key>-``), the rest (the partition) is each part's
    suffix; epoch (the batch), seq and key are the same for all, as ``commit_entry`` makes them.
    ``shape``: the batch's (``_GroupShape.of`` of all its jobs, when ``jobs`` is a slice of them).

    Why the shape: a routed batch has one (stream, partition) job per part, ~20,000 of them, but only
    a few messages; what depends on the message (its suffix) is worked out once per message."""
    by_stream: dict[str, list[int]] = {}
    for index, (_, part) in enumerate(jobs):
        if part.inline is not None:
            by_stream.setdefault(part.stream, []).append(index)
    if sum(len(listed) for listed in by_stream.values()) < 2:
        return []
    shape = shape or _GroupShape.of(jobs)
    if shape is None:
        return []  # not the sink's own shape: one entry per part, as before
    prefix, epoch, suffixes = shape.prefix, shape.epoch, shape.suffixes
    groups = []
    for stream, listed in by_stream.items():
        if len(listed) < 2:  # one part: a plain entry is cheaper
            continue
        for first in range(0, len(listed), MAX_ENTRY_PARTS):  # the server's cap per entry
            indexes = listed[first : first + MAX_ENTRY_PARTS]
            producers = [jobs[index][0].producer_id for index in indexes]
            if len(indexes) < 2 or len(set(producers)) != len(producers):
                continue  # one part, or two attempts' parts (never sent so): one entry each
            entry = PartsEntry(
                stream,
                prefix,
                epoch,
                COMMIT_SEQ,
                COMMIT_KEY,
                tuple([suffixes[producer] for producer in producers]),
                tuple([jobs[index][1].inline or b"" for index in indexes]),
            )
            groups.append(_StreamGroup(tuple(indexes), entry))
    return groups


_SUFFIX = re.compile(r"[A-Za-z0-9._~-]{0,64}")


def _recommit_missing(
    client: StreamClient,
    options: SinkOptions,
    bulk: BulkWrites,
    jobs: Sequence[tuple[SinkCommitMessage, StreamPart]],
    answers: list[AppendResult | Exception],
) -> None:
    """Inline commits answered 404 (the stream was deleted after the query's tasks remembered it as
    ensured, ``targets.py``): ensure those streams again and commit those parts once more, in place in
    ``answers``. Safe: a commit refused 404 wrote nothing, and the part's data is in its message. (A
    staged part's handles went with its stream: its 404 stands, and the batch's replay stages anew.)"""
    missing = [
        index
        for index, answer in enumerate(answers)
        if isinstance(answer, StreamNotFound) and jobs[index][1].inline is not None
    ]
    if not missing:
        return
    try:
        TargetStreams(client, options).refresh(jobs[index][1].stream for index in missing)
    except DurastreamError as error:  # e.g. TargetMissing without createStreams: the parts fail
        for index in missing:
            answers[index] = error
        return
    again = bulk.commit([commit_entry(*jobs[index]) for index in missing])
    for index, answer in zip(missing, again, strict=True):
        answers[index] = answer


def commit_entry(message: SinkCommitMessage, part: StreamPart) -> CommitEntry:
    """The part's commit: its handles under ``(producer, batch, 0)`` and the sink's commit key."""
    producer = (message.producer_id, message.epoch, COMMIT_SEQ)
    return CommitEntry(part.stream, part.handles, producer, key=COMMIT_KEY, inline=part.inline)


def settle(
    options: SinkOptions,
    message: SinkCommitMessage,
    part: StreamPart,
    outcome: AppendResult | DuplicatePayloadMismatch,
) -> tuple[PartResult | BatchModeConflict, tuple[str, ...]]:
    """What a commit's answer means for the part, and the handles that are no longer needed (to abort,
    best effort). One place for the single and the bulk commit."""
    if isinstance(outcome, DuplicatePayloadMismatch):  # the tuple holds an ordered request
        conflict = _ordered_conflict(
            options, message, part, outcome.headers.get("Producer-Seq"), outcome.request_id
        )
        conflict.__cause__ = outcome
        return conflict, part.handles
    if outcome.duplicate:
        if outcome.producer_seq:  # seqs above 0 exist in this epoch: only ordered mode sends them
            return _ordered_conflict(
                options, message, part, str(outcome.producer_seq)
            ), part.handles
        # This very commit was applied by an earlier try, or an earlier run of the batch committed the
        # part (same key, other handles). Aborting is a no-op in the first case (409
        # TXN_ALREADY_COMMITTED, ignored) and discards this run's unneeded copy in the second.
        log.info(
            "stream '%s', batch %d, partition %d: already committed (by an earlier try or run of "
            "this batch); discarding this run's staged copy",
            part.stream,
            message.epoch,
            message.partition,
        )
        result = PartResult(
            part.stream, message.partition, part.rows, part.bytes, DUPLICATE, outcome.next_offset
        )
        return result, part.handles
    result = PartResult(
        part.stream, message.partition, part.rows, part.bytes, COMMITTED, outcome.next_offset
    )
    return result, ()


def _ordered_conflict(
    options: SinkOptions,
    message: SinkCommitMessage,
    part: StreamPart,
    highest: str | None,
    request_id: str | None = None,
) -> BatchModeConflict:
    return ordered_run_conflict(
        options,
        stream=part.stream,
        batch=message.epoch,
        partition=message.partition,
        producer_id=message.producer_id,
        highest_seq=int(highest) if highest and highest.isdigit() else None,
        request_id=request_id,
    )


def abort_handles(client: StreamClient, stream: str, handles: list[str] | tuple[str, ...]) -> None:
    """Discard staged handles, best effort: a failure is logged, the server's TTL reclaims them anyway."""
    if not handles:
        return
    try:
        client.abort(stream, list(handles))
    except DurastreamError as error:
        _abort_failed(stream, handles, error)


def abort_in_bulk(bulk: BulkWrites, staged: list[tuple[str, tuple[str, ...]]]) -> None:
    """``abort_handles`` for many streams in a few requests, best effort like it."""
    try:
        answers: list[None | Exception] = bulk.abort(staged)
    except DurastreamError as error:
        answers = [error] * len(staged)
    for (stream, handles), error in zip(staged, answers, strict=True):
        _abort_failed(stream, handles, error)


def _abort_failed(
    stream: str, handles: list[str] | tuple[str, ...], error: BaseException | None
) -> None:
    if error is None or isinstance(error, TxnAlreadyCommitted):
        return
    log.warning(
        "could not abort staged handles %s on stream '%s' (the server reclaims them when their TTL "
        "lapses): %s",
        list(handles),
        stream,
        error,
    )
