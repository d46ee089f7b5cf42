"""Driver side: commit (or abort) one batch from the tasks' commit messages, and log what it did.

Spark calls ``commit`` once every task of the batch succeeded, with one message per partition: the
successful attempt's. (Should a partition ever come with two, from two attempts that both finished, the
lowest attempt is committed and the other's staged data is aborted: one copy, never two.) Each
(stream, partition) is committed by its mode (``transactional.commit_part``/``ordered.commit_part``),
concurrently, every one idempotent (transactional parts on ``bulk-write`` servers in a few bulk requests,
``transactional.commit_parts``); a failure of any fails the commit after all were tried, so a replay of
the batch only has to redo what failed (the rest is deduplicated).

``abort`` runs when a task of the batch failed for good. Transactional: the staged handles named in the
messages it gets are aborted (handles of failed attempts are not in them and expire with their TTL);
nothing of the batch was ever visible. Ordered: nothing can be taken back; the full requests that
succeeded tasks sent are visible, their remainders are not. When the query restarts from its checkpoint,
the batch is replayed under the same epoch and seqs, so those requests are deduplicated and the rest is
added: exactly once again, after the replay. (A failed ``df.write`` job is not replayed; its visible
requests stay, see docs/guarantees.md.)
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from durastream_spark.errors import DurastreamError, ProducerForgottenError, UnverifiedDuplicate
from durastream_spark.protocol.bulk import BulkWrites
from durastream_spark.protocol.client import StreamClient
from durastream_spark.sink import ordered, transactional
from durastream_spark.sink.errors import BatchModeConflict, CommitError
from durastream_spark.sink.messages import (
    COMMITTED,
    DUPLICATE,
    PartResult,
    SinkCommitMessage,
    StreamPart,
)
from durastream_spark.sink.options import EXACTLY_ONCE, ORDERED, TRANSACTIONAL, SinkOptions
from durastream_spark.worker_heap import collections_held

log = logging.getLogger(__name__)
# DEBUG stamps of the commit's phases (see partition.py).
phases = logging.getLogger("durastream_spark.phases")

MAX_COMMIT_THREADS = 16


@dataclass(frozen=True)
class StreamSummary:
    """Per-stream totals of one committed batch."""

    stream: str
    rows: int
    bytes: int
    partitions: int
    committed: int
    duplicates: int
    final_offset: str | None


@dataclass(frozen=True)
class BatchFigures:
    """One committed batch, as the driver's INFO line states it; ``as_dict`` for code that wants the
    figures (``writer.last_batch`` after a commit; ``totals`` is what ``batchFiguresPath`` records).
    Requests count answered ones; retries the extra attempts among them; ``task_*`` were sent by the
    batch's tasks, ``commit_*`` by the driver. ``writer_key``: the streaming query's id (the ``df.write``
    job's id), ``None`` for a batch without commit messages."""

    batch: str
    mode: str
    streams: int
    rows: int
    bytes: int
    partitions: int
    task_requests: int
    task_retries: int
    commit_requests: int
    commit_retries: int
    commit_ms: float
    per_stream: tuple[StreamSummary, ...]
    writer_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def totals(self) -> dict[str, Any]:
        """The INFO line's figures, without the per-stream list and the writer key: a fixed-size record
        whatever the number of streams (per-stream figures are the INFO lines of ``_log_summary``)."""
        return {
            item.name: getattr(self, item.name)
            for item in fields(self)
            if item.name not in ("per_stream", "writer_key")
        }

    def describe(self) -> str:
        return (
            f"batch {self.batch} committed ({self.mode}): {self.streams} stream(s), {self.rows} rows, "
            f"{self.bytes} bytes from {self.partitions} partition(s); tasks sent {self.task_requests} "
            f"requests ({self.task_retries} retries); commit took {self.commit_ms:.1f} ms, "
            f"{self.commit_requests} requests ({self.commit_retries} retries)"
        )


def commit_batch(
    client: StreamClient,
    options: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    *,
    batch_id: int | None,
) -> BatchFigures:
    """Commit the batch (see the module's docstring); its figures.

    With the collector held (``collections_held``): a routed batch's commit keeps ~20,000 parts, their
    answers and results alive to the end, so each young collection walked the survivors again and the
    older ones the whole heap: ~250 collections and about a third of the driver's commit CPU for
    10,000 streams x 2 partitions (docs/benchmarks.md, sink "Run 18b"). It makes no cycles worth
    collecting early; what it leaves is collected after."""
    with collections_held():
        return _commit_batch(client, options, messages, batch_id)


def _commit_batch(
    client: StreamClient,
    options: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int | None,
) -> BatchFigures:
    started = time.perf_counter()
    phases.debug("commit start")
    sent_before, retried_before = client.counts.snapshot()
    chosen, extra = _choose_attempts(messages, batch_id)
    for message in extra:
        log.warning(
            "batch %d, partition %d: discarding the output of attempt %d (attempt %d is committed)",
            message.epoch,
            message.partition,
            message.attempt,
            chosen[message.partition].attempt,
        )
        _discard(client, message)
    everything = [(message, part) for message in chosen.values() for part in message.parts]
    results: list[PartResult] = []
    failures: list[tuple[SinkCommitMessage, StreamPart, BaseException]] = []
    jobs = _commit_in_bulk(client, options, everything, results, failures)
    if jobs:
        with ThreadPoolExecutor(
            max_workers=min(MAX_COMMIT_THREADS, len(jobs)), thread_name_prefix="durastream-commit"
        ) as pool:
            futures = [
                (message, part, pool.submit(_commit_part, client, options, message, part))
                for message, part in jobs
            ]
            for message, part, future in futures:
                try:
                    results.append(future.result())
                except BaseException as error:  # collected; raised below once every part was tried
                    failures.append((message, part, error))
    phases.debug("commit requests done")
    if failures:
        listed = "; ".join(
            f"stream '{part.stream}' partition {message.partition}: {error}"
            for message, part, error in failures
        )
        raise CommitError(
            f"Committing batch {_batch_text(batch_id, chosen)} failed for {len(failures)} of "
            f"{len(everything)} (stream, partition) parts; the others are committed. "
            f"{_after_failure([error for _, _, error in failures])} {listed}",
            failures=tuple(error for _, _, error in failures),
        ) from failures[0][2]
    summaries = summarize(results)
    _log_summary(batch_id, chosen, summaries)
    sent, retried = client.counts.snapshot()
    figures = BatchFigures(
        batch=_batch_text(batch_id, chosen),
        mode=next(iter(chosen.values())).mode if chosen else options.exactly_once,
        streams=len(summaries),
        rows=sum(summary.rows for summary in summaries),
        bytes=sum(summary.bytes for summary in summaries),
        partitions=len(chosen),
        task_requests=sum(message.requests for message in chosen.values()),
        task_retries=sum(message.retries for message in chosen.values()),
        commit_requests=sent - sent_before,
        commit_retries=retried - retried_before,
        commit_ms=round((time.perf_counter() - started) * 1000, 3),
        per_stream=tuple(summaries),
        writer_key=next(iter(chosen.values())).writer_key if chosen else None,
    )
    log.info("%s", figures.describe())
    phases.debug("commit end")
    return figures


def abort_batch(
    client: StreamClient,
    messages: Sequence[WriterCommitMessage | None],
    *,
    batch_id: int | None,
) -> None:
    ours = [m for m in messages if isinstance(m, SinkCommitMessage)]
    for message in ours:
        _discard(client, message)
    if any(m.mode != TRANSACTIONAL for m in ours):
        log.warning(
            "batch %s aborted in ordered mode: full requests already sent by its successful tasks stay "
            "visible; replaying the batch from the checkpoint deduplicates them and adds the rest",
            batch_id if batch_id is not None else "(df.write job)",
        )
    else:
        log.info(
            "batch %s aborted: nothing of it became visible; staged data was discarded or expires",
            batch_id if batch_id is not None else "(df.write job)",
        )


def summarize(results: Sequence[PartResult]) -> list[StreamSummary]:
    by_stream: dict[str, list[PartResult]] = defaultdict(list)
    for result in results:
        by_stream[result.stream].append(result)
    summaries = []
    for stream in sorted(by_stream):
        # One pass over the stream's parts, not five: a routed batch summarizes 10,000 streams.
        rows = size = committed = duplicates = 0
        final: str | None = None
        for part in by_stream[stream]:
            rows += part.rows
            size += part.bytes
            if part.outcome == COMMITTED:
                committed += 1
            elif part.outcome == DUPLICATE:
                duplicates += 1
            if part.next_offset and (final is None or part.next_offset > final):
                final = part.next_offset
        summaries.append(
            StreamSummary(
                stream=stream,
                rows=rows,
                bytes=size,
                partitions=len(by_stream[stream]),
                committed=committed,
                duplicates=duplicates,
                final_offset=final,
            )
        )
    return summaries


# ---- internals -------------------------------------------------------------------------------------------


def _commit_in_bulk(
    client: StreamClient,
    options: SinkOptions,
    jobs: list[tuple[SinkCommitMessage, StreamPart]],
    results: list[PartResult],
    failures: list[tuple[SinkCommitMessage, StreamPart, BaseException]],
) -> list[tuple[SinkCommitMessage, StreamPart]]:
    """On ``bulk-write`` servers, commit every transactional part of the batch in a few requests (all
    partitions, all streams; each part its own keyed commit), adding to ``results``/``failures``; the
    jobs left for one request each."""
    bulk = BulkWrites(client, options.content_type)
    # Inline parts were written for a bulk-write server: they are committed in bulk even if this
    # client does not see the advertisement (a proxy); a server without it fails the commit loudly.
    if not jobs or not (bulk.supported() or any(part.inline for _, part in jobs)):
        return jobs
    staged = [job for job in jobs if job[0].mode == TRANSACTIONAL]
    rest = [job for job in jobs if job[0].mode != TRANSACTIONAL]
    if not staged:
        return rest
    answers: list[PartResult | Exception]
    try:
        answers = transactional.commit_parts(client, bulk, options, staged)
    except DurastreamError as error:  # the bulk request itself failed: every part is to be replayed
        answers = [error] * len(staged)
    for (message, part), answer in zip(staged, answers, strict=True):
        if isinstance(answer, Exception):
            failures.append((message, part, answer))
        else:
            results.append(answer)
    return rest


def _commit_part(
    client: StreamClient, options: SinkOptions, message: SinkCommitMessage, part: StreamPart
) -> PartResult:
    if message.mode == TRANSACTIONAL:
        return transactional.commit_part(client, options, message, part)
    return ordered.commit_part(client, options, message, part)


def _discard(client: StreamClient, message: SinkCommitMessage) -> None:
    if message.mode == TRANSACTIONAL:
        for part in message.parts:
            transactional.abort_handles(client, part.stream, part.handles)


def _choose_attempts(
    messages: Sequence[WriterCommitMessage | None], batch_id: int | None
) -> tuple[dict[int, SinkCommitMessage], list[SinkCommitMessage]]:
    chosen: dict[int, SinkCommitMessage] = {}
    extra: list[SinkCommitMessage] = []
    for message in messages:
        if message is None:
            log.warning(
                "commit got no message for a task; Spark commits only when all tasks succeeded"
            )
            continue
        if not isinstance(message, SinkCommitMessage):
            raise CommitError(
                f"The durastream sink got a commit message of type {type(message).__name__}, not its own."
            )
        if batch_id is not None and message.epoch != batch_id:
            raise CommitError(
                f"Commit of batch {batch_id} got a message of partition {message.partition} written for "
                f"batch {message.epoch}; refusing to commit data under the wrong epoch."
            )
        current = chosen.get(message.partition)
        if current is None:
            chosen[message.partition] = message
        elif message.attempt < current.attempt:
            extra.append(current)
            chosen[message.partition] = message
        else:
            extra.append(message)
    keys = {m.writer_key for m in chosen.values()}
    if len(keys) > 1:
        raise CommitError(
            f"Commit messages of one batch come from different writers {sorted(keys)}; refusing to commit."
        )
    return chosen, extra


def _after_failure(errors: Sequence[BaseException]) -> str:
    """What a replay of the failed batch would do."""
    if any(isinstance(e, BatchModeConflict) for e in errors):
        return (
            f"An earlier run of this batch wrote in ordered mode: restart the query from its "
            f"checkpoint with {EXACTLY_ONCE}={ORDERED} to finish it exactly once (details below)."
        )
    if any(isinstance(e, ProducerForgottenError | UnverifiedDuplicate) for e in errors):
        return (
            "The server can no longer tell whether an earlier run of this batch already wrote these "
            "parts (its producers were idle past the server's --producer-expiry-seconds), so it refused "
            "them rather than risk a duplicate, and a replay will be refused the same way. See "
            "docs/guarantees.md, 'When the server has forgotten a producer', for how to go on."
        )
    return "Replaying the batch (restart the query from its checkpoint) completes it without duplicates."


def _batch_text(batch_id: int | None, chosen: dict[int, SinkCommitMessage]) -> str:
    if batch_id is not None:
        return str(batch_id)
    keys = {m.writer_key for m in chosen.values()}
    return f"of df.write job {next(iter(keys))}" if keys else "(empty df.write job)"


def _log_summary(
    batch_id: int | None, chosen: dict[int, SinkCommitMessage], summaries: list[StreamSummary]
) -> None:
    if not summaries:
        log.info("batch %s committed: no rows", _batch_text(batch_id, chosen))
        return
    if not log.isEnabledFor(logging.INFO):  # a line per stream: 10,000 of a routed batch
        return
    batch = _batch_text(batch_id, chosen)
    for summary in summaries:
        log.info(
            "batch %s committed to stream '%s': %d rows, %d bytes from %d partition(s) (%d now visible, "
            "%d already visible from an earlier run); final offset %s",
            batch,
            summary.stream,
            summary.rows,
            summary.bytes,
            summary.partitions,
            summary.committed,
            summary.duplicates,
            summary.final_offset,
        )
