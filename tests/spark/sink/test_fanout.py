"""Issue 16, the sink: routing rows to many streams costs requests per task and per batch, not per stream.

The task-side and driver-side code run by hand (``WriterHarness``, ``commit_batch``) against a real server,
so each test counts the requests the sink sent: with ``bulk-write`` a task routing to ``STREAMS`` streams
sends a few requests (one ``ensure``, one bulk stage), and the driver commits the whole batch in one
(main sent a ``HEAD``, a ``PUT``, a stage and a commit per stream and partition). The same writes with the
extension hidden (what a server without it gets) still land exactly once, one request per stream.
Exactly-once across a replay (new attempts, new handles, the same keyed commits) is checked per stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from durastream_spark.protocol import extensions as ext
from durastream_spark.protocol.bulk import BulkWrites
from durastream_spark.protocol.client import StreamClient
from durastream_spark.sink import partition
from durastream_spark.sink.commit import BatchFigures, commit_batch
from durastream_spark.sink.errors import CommitError, UnsupportedWrite
from durastream_spark.sink.identity import TaskIdentity
from durastream_spark.sink.messages import SinkCommitMessage
from durastream_spark.sink.partition import PartitionWrite
from durastream_spark.sink.plan import BATCH, plan_write
from tests.spark.sink.support import (
    WriterHarness,
    client_for,
    read_stream,
    record_batches,
    unique,
)
from tests.support.http import poll_until

STREAMS = 150
ROWS_PER_STREAM = 4
SCHEMA = StructType([StructField("n", LongType()), StructField("stream", StringType())])
ARROW = pa.schema([("n", pa.int64()), ("stream", pa.string())])


@contextmanager
def _advertised(change: Callable[[ext.Extensions], ext.Extensions]) -> Iterator[None]:
    """Every client in this process sees the server's extensions through ``change``."""
    original = StreamClient.extensions

    def changed(self: StreamClient) -> ext.Extensions:
        return change(original(self))

    StreamClient.extensions = changed  # type: ignore[method-assign]
    try:
        yield
    finally:
        StreamClient.extensions = original  # type: ignore[method-assign]


def without_bulk_write() -> AbstractContextManager[None]:
    """A server without ``bulk-write``, as the connector sees it (the Node reference server and rakaia
    are tested against the real thing in test_reference_server.py)."""
    return _advertised(
        lambda found: ext.Extensions(
            tuple((n, v) for n, v in found.versions if n != ext.BULK_WRITE)
        )
    )


def _rows(base: str, partition: int) -> list[dict]:
    """Each partition writes ``ROWS_PER_STREAM`` rows to every stream, interleaved across streams."""
    return [
        {"n": partition * 10_000 + r * STREAMS + s, "stream": f"{base}/s{s:03d}"}
        for r in range(ROWS_PER_STREAM)
        for s in range(STREAMS)
    ]


def _write_messages(
    harness: WriterHarness, base: str, epoch: int, attempt: int = 0
) -> list[SinkCommitMessage]:
    """Both partitions' tasks of a batch (``_rows``), their commit messages."""
    return [
        harness.write(
            record_batches(ARROW, _rows(base, partition), 250),
            epoch=epoch,
            partition=partition,
            attempt=attempt,
        )
        for partition in (0, 1)
    ]


def _write_batch(
    harness: WriterHarness, base: str, epoch: int, attempt: int = 0
) -> tuple[list[SinkCommitMessage], BatchFigures]:
    messages = _write_messages(harness, base, epoch, attempt)
    figures = commit_batch(harness.plan.client, harness.plan.options, messages, batch_id=epoch)
    return messages, figures


def _assert_every_stream_once(root: str, base: str) -> None:
    for s in range(STREAMS):
        got = sorted(m["n"] for m in read_stream(root, f"{base}/s{s:03d}"))
        expected = sorted(
            partition * 10_000 + r * STREAMS + s
            for partition in (0, 1)
            for r in range(ROWS_PER_STREAM)
        )
        assert got == expected, f"stream s{s:03d}"


@pytest.fixture
def harness(durastream_server) -> tuple[WriterHarness, str, str]:
    root = durastream_server.base_url + "/v1/stream"
    options = {"url": root, "exactlyOnce": "transactional"}
    return WriterHarness(options, SCHEMA, unique("fanout-query")), root, unique("fanout")


def test_a_task_routing_to_many_streams_sends_a_few_requests(harness) -> None:
    writer, root, base = harness
    messages, figures = _write_batch(writer, base, epoch=0)
    for message in messages:
        assert len(message.parts) == STREAMS
        # Each small part travels inline: nothing staged, one ensure per task (main: HEAD + PUT +
        # stage per stream: 450 requests).
        assert all(part.inline and not part.handles for part in message.parts)
        assert message.requests <= 2, message.requests
    assert figures.commit_requests <= 2, figures.commit_requests  # main: 300 commits
    assert figures.streams == STREAMS and figures.rows == 2 * STREAMS * ROWS_PER_STREAM
    assert {s.committed for s in figures.per_stream} == {2}
    _assert_every_stream_once(root, base)


def test_a_replayed_batch_commits_nothing_twice(harness) -> None:
    """The driver died after the commit: the batch runs again (new attempts stage new handles) and its
    bulk commit finds every keyed commit already made: duplicates, the new handles aborted."""
    writer, root, base = harness
    _write_batch(writer, base, epoch=3)
    _, figures = _write_batch(writer, base, epoch=3, attempt=1)
    assert {(s.committed, s.duplicates) for s in figures.per_stream} == {(0, 2)}
    _assert_every_stream_once(root, base)


def test_a_commit_retried_whole_is_exactly_once(harness) -> None:
    """The bulk commit's answer was lost: the same messages are committed again."""
    writer, root, base = harness
    messages, first = _write_batch(writer, base, epoch=1)
    again = commit_batch(writer.plan.client, writer.plan.options, messages, batch_id=1)
    assert {s.committed for s in first.per_stream} == {2}
    assert {s.duplicates for s in again.per_stream} == {2}
    _assert_every_stream_once(root, base)


def test_without_bulk_write_the_sink_falls_back_to_one_request_per_stream(harness) -> None:
    writer, root, base = harness
    with without_bulk_write():
        messages, figures = _write_batch(writer, base, epoch=0)
    assert all(message.requests >= 2 * STREAMS for message in messages)  # HEAD (+PUT) and a stage
    assert figures.commit_requests >= 2 * STREAMS
    _assert_every_stream_once(root, base)


def test_a_bulk_ensure_reports_a_target_of_another_content_type(harness) -> None:
    writer, root, base = harness
    client = StreamClient.__new__(StreamClient)
    client.__setstate__({"connection": writer.plan.client.connection, "extensions": None})
    client.create(f"{base}/s007", "text/plain")
    with pytest.raises(Exception, match="s007") as failure:
        writer.write(record_batches(ARROW, _rows(base, 0), 1000), epoch=0, partition=0, attempt=0)
    assert "text/plain" in str(failure.value)


def test_parts_with_full_requests_are_staged_and_committed_with_the_inline_ones(
    durastream_server,
) -> None:
    """``maxMessagesPerRequest=3``: each stream's 4 rows of a partition are a full request (staged as
    it fills) and a remainder, staged in bulk at the end of the task; the even streams get 2 rows,
    one small request, committed inline. One bulk commit holds both kinds."""
    root = durastream_server.base_url + "/v1/stream"
    options = {"url": root, "exactlyOnce": "transactional", "maxMessagesPerRequest": "3"}
    writer = WriterHarness(options, SCHEMA, unique("fanout-mixed"))
    base = unique("fanout-mixed")
    rows = [r for r in _rows(base, 0) if not (r["n"] // STREAMS >= 2 and r["n"] % 2 == 0)]
    message = writer.write(record_batches(ARROW, rows, 250), epoch=0, partition=0, attempt=0)
    kinds = {part.stream: (bool(part.inline), len(part.handles)) for part in message.parts}
    assert kinds[f"{base}/s000"] == (True, 0) and kinds[f"{base}/s001"] == (False, 2)
    commit_batch(writer.plan.client, writer.plan.options, [message], batch_id=0)
    again = commit_batch(writer.plan.client, writer.plan.options, [message], batch_id=0)
    assert {s.duplicates for s in again.per_stream} == {1}
    for s in range(STREAMS):
        got = [m["n"] for m in read_stream(root, f"{base}/s{s:03d}")]
        assert got == [r * STREAMS + s for r in range(2 if s % 2 == 0 else ROWS_PER_STREAM)]


# ---- a query's later batches (targets remembered per query) -----------------------------------------------


@pytest.fixture
def logged(server_factory) -> tuple[WriterHarness, str, str, object]:
    """A harness against a server that logs every request (the ensure requests are counted there)."""
    server = server_factory(extra_args=["--access-log"])
    root = server.base_url + "/v1/stream"
    options = {"url": root, "exactlyOnce": "transactional"}
    return WriterHarness(options, SCHEMA, unique("fanout-query")), root, unique("fanout"), server


def _ensure_requests(server, client: StreamClient, *also: str) -> int:
    """The ``ensure`` requests (and ``PUT`` of the streams ``also``: one target is ensured alone) the
    server answered so far: a marker request is sent and awaited in the access log first, so every
    earlier request's line is there."""
    marker = unique("marker")
    client.create(marker, "application/json")

    def lines() -> list[str]:
        return server.log_path.read_text(errors="replace").splitlines()

    poll_until(lambda: any(f"PUT /v1/stream/{marker} " in line for line in lines()), marker)
    wanted = [" /v1/stream/__ds/x-durastream/ensure "] + [f"PUT /v1/stream/{p} " for p in also]
    return sum(any(w in line for w in wanted) for line in lines())


def test_a_later_batch_of_the_query_sends_no_ensure_for_streams_it_ensured(logged) -> None:
    """Batch 0 ensures its 150 targets (one ensure per task); batch 1 of the same query writes to the
    same streams and sends none (main: one ensure of all 150 per task and batch)."""
    writer, root, base, server = logged
    client = writer.plan.client
    _write_batch(writer, base, epoch=0)
    after_first = _ensure_requests(server, client)
    assert after_first >= 1
    messages, _ = _write_batch(writer, base, epoch=1)
    assert _ensure_requests(server, client) == after_first
    assert all(message.requests <= 1 for message in messages)  # the extensions lookup at most
    got = {s: sorted(m["n"] for m in read_stream(root, f"{base}/s{s:03d}")) for s in (0, 77)}
    for s, values in got.items():  # every row of both batches once
        assert values == sorted(
            2 * [p * 10_000 + r * STREAMS + s for p in (0, 1) for r in range(4)]
        )


def test_a_stream_deleted_between_batches_is_created_again_by_the_commit(logged) -> None:
    """The query remembers s005 as ensured, but it was deleted before batch 1: the inline commit's 404
    makes the driver ensure it again (one ensure) and commit the parts once more; it then holds exactly
    batch 1's rows, the other streams both batches'."""
    writer, root, base, server = logged
    client = writer.plan.client
    _write_batch(writer, base, epoch=0)
    client.delete(f"{base}/s005")
    before = _ensure_requests(server, client, f"{base}/s005")
    _, figures = _write_batch(writer, base, epoch=1)
    assert _ensure_requests(server, client, f"{base}/s005") == before + 1
    assert {s.committed for s in figures.per_stream} == {2}
    got = sorted(m["n"] for m in read_stream(root, f"{base}/s005"))
    assert got == sorted(p * 10_000 + r * STREAMS + 5 for p in (0, 1) for r in range(4))
    assert len(read_stream(root, f"{base}/s006")) == 2 * 2 * ROWS_PER_STREAM


def _save(root: str, base: str, **extra: str) -> BatchFigures:
    """One routed ``df.write`` job as Spark runs it: a batch plan (a new job id), two tasks, the
    commit (``batch_id=None``)."""
    plan = plan_write(
        {"url": root, "exactlyOnce": "transactional", **extra}, SCHEMA, False, kind=BATCH
    )
    assert plan.job_id is not None
    messages = [
        PartitionWrite(plan, TaskIdentity(plan.job_id, 0, partition, 0)).write_arrow(
            record_batches(ARROW, _rows(base, partition), 250)
        )
        for partition in (0, 1)
    ]
    return commit_batch(plan.client, plan.options, messages, batch_id=None)


def test_a_later_df_write_job_sends_no_ensure_and_repairs_a_deleted_stream(logged) -> None:
    """df.write jobs of one worker process share what they ensured: the second job to the same 150
    streams sends no ensure. s005, deleted before the third job, is answered 404 by its inline
    commit and created again (one PUT), holding exactly the third job's rows; s006 all three's."""
    _, root, base, server = logged
    client = client_for(root)
    _save(root, base)
    after_first = _ensure_requests(server, client)
    assert after_first >= 1
    _save(root, base)
    assert _ensure_requests(server, client) == after_first
    client.delete(f"{base}/s005")
    before = _ensure_requests(server, client, f"{base}/s005")
    figures = _save(root, base)
    assert _ensure_requests(server, client, f"{base}/s005") == before + 1  # its PUT
    assert {s.committed for s in figures.per_stream} == {2}
    got = sorted(m["n"] for m in read_stream(root, f"{base}/s005"))
    assert got == sorted(p * 10_000 + r * STREAMS + 5 for p in (0, 1) for r in range(4))
    assert len(read_stream(root, f"{base}/s006")) == 3 * 2 * ROWS_PER_STREAM


def test_a_later_df_write_job_staging_to_a_deleted_stream_ensures_it_again(logged) -> None:
    """The same with staged requests (``maxMessagesPerRequest=3``): the task's first stage to the
    deleted, remembered stream is answered 404, the stream is ensured again and staged once more."""
    _, root, base, _ = logged
    _save(root, base, maxMessagesPerRequest="3")
    client_for(root).delete(f"{base}/s005")
    figures = _save(root, base, maxMessagesPerRequest="3")
    assert {s.committed for s in figures.per_stream} == {2}
    got = sorted(m["n"] for m in read_stream(root, f"{base}/s005"))
    assert got == sorted(p * 10_000 + r * STREAMS + 5 for p in (0, 1) for r in range(4))
    assert len(read_stream(root, f"{base}/s006")) == 2 * 2 * ROWS_PER_STREAM


def test_a_staged_write_to_a_deleted_stream_ensures_it_again(logged) -> None:
    """Full requests are staged as they fill (``maxMessagesPerRequest=3``): the first stage to the
    deleted (but remembered) stream is answered 404, the task ensures it again and stages once more;
    the batch is written once."""
    _, root, base, server = logged
    options = {"url": root, "exactlyOnce": "transactional", "maxMessagesPerRequest": "3"}
    writer = WriterHarness(options, SCHEMA, unique("fanout-staged"))
    _write_batch(writer, base, epoch=0)
    writer.plan.client.delete(f"{base}/s005")
    _, figures = _write_batch(writer, base, epoch=1)
    assert {s.committed for s in figures.per_stream} == {2}
    got = sorted(m["n"] for m in read_stream(root, f"{base}/s005"))
    assert got == sorted(p * 10_000 + r * STREAMS + 5 for p in (0, 1) for r in range(4))
    assert len(read_stream(root, f"{base}/s006")) == 2 * 2 * ROWS_PER_STREAM


def bulk_write_version(version: int) -> AbstractContextManager[None]:
    """``bulk-write`` advertised at ``version`` (1: a server before multi-part entries)."""
    return _advertised(
        lambda found: ext.Extensions(
            tuple((n, min(v, version) if n == ext.BULK_WRITE else v) for n, v in found.versions)
        )
    )


@contextmanager
def counted_commit_entries() -> Iterator[dict[str, int]]:
    """How many bulk commit entries of each kind the driver sent: per part, or per stream."""
    counts = {"per_part": 0, "per_stream": 0, "parts_in_stream_entries": 0}
    single, multi = BulkWrites.commit, BulkWrites.commit_parts

    def commit(self: BulkWrites, entries: Any) -> Any:
        counts["per_part"] += len(entries)
        return single(self, entries)

    def commit_parts(self: BulkWrites, entries: Any) -> Any:
        counts["per_stream"] += len(entries)
        counts["parts_in_stream_entries"] += sum(len(entry.suffixes) for entry in entries)
        return multi(self, entries)

    BulkWrites.commit, BulkWrites.commit_parts = commit, commit_parts  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        BulkWrites.commit, BulkWrites.commit_parts = single, multi  # type: ignore[method-assign]


def test_on_bulk_write_2_a_stream_parts_are_one_entry_and_on_1_one_entry_each(harness) -> None:
    writer, root, base = harness
    with counted_commit_entries() as counts:
        _, figures = _write_batch(writer, base, epoch=0)
    assert counts == {"per_part": 0, "per_stream": STREAMS, "parts_in_stream_entries": 2 * STREAMS}
    assert {s.committed for s in figures.per_stream} == {2}
    _assert_every_stream_once(root, base)
    other = base + "-v1"
    with bulk_write_version(1), counted_commit_entries() as counts:
        _, figures = _write_batch(writer, other, epoch=0)
    assert counts == {"per_part": 2 * STREAMS, "per_stream": 0, "parts_in_stream_entries": 0}
    assert {s.committed for s in figures.per_stream} == {2}
    _assert_every_stream_once(root, other)


@pytest.mark.parametrize("first, replay", [(1, 2), (2, 1)])
def test_a_batch_replayed_across_bulk_write_versions_is_exactly_once(
    harness, first: int, replay: int
) -> None:
    """A batch committed as per-part entries (an older server's view, or a proxy) and replayed as
    one entry per stream, or the other way round: the same keyed commits under the same tuples, so
    the replay finds every part a duplicate and the data is there once."""
    writer, root, base = harness
    with bulk_write_version(first):
        _write_batch(writer, base, epoch=5)
    with bulk_write_version(replay):
        _, figures = _write_batch(writer, base, epoch=5, attempt=1)
    assert {(s.committed, s.duplicates) for s in figures.per_stream} == {(0, 2)}
    _assert_every_stream_once(root, base)


def test_a_failed_attempt_then_a_multi_part_commit_is_exactly_once(harness) -> None:
    """Partition 0's attempt 0 wrote and failed (its message never reached the driver: its inline
    parts are gone with it); attempts 1 of both partitions are committed, one entry per stream."""
    writer, root, base = harness
    writer.write(record_batches(ARROW, _rows(base, 0), 250), epoch=2, partition=0, attempt=0)
    messages = _write_messages(writer, base, epoch=2, attempt=1)
    with counted_commit_entries() as counts:
        figures = commit_batch(writer.plan.client, writer.plan.options, messages, batch_id=2)
    assert counts["per_stream"] == STREAMS
    assert {s.committed for s in figures.per_stream} == {2}
    _assert_every_stream_once(root, base)


@pytest.mark.parametrize("route_bytes", [None, 700])
def test_routed_input_in_any_batches_makes_the_same_requests(
    harness, monkeypatch, route_bytes
) -> None:
    """Batches are split by target together (up to ``ROUTE_BYTES``): each stream's rows reach its
    batcher in the same order however Spark cut the input, so the inline parts are byte-identical
    and the staged requests as many (``maxMessagesPerRequest=3``: full requests staged from the
    task), and every stream holds its rows once, in order. 700 bytes: a split every few batches."""
    _, root, base = harness
    if route_bytes is not None:
        monkeypatch.setattr(partition, "ROUTE_BYTES", route_bytes)
    rows = _rows(base, 0)
    for extra in ({}, {"maxMessagesPerRequest": "3"}):
        options = {"url": root, "exactlyOnce": "transactional", **extra}
        shapes = []
        for size in (len(rows), 250, 7):
            writer = WriterHarness(options, SCHEMA, unique("fanout-batches"))
            message = writer.write(
                record_batches(ARROW, rows, size), epoch=0, partition=0, attempt=0
            )
            shapes.append(
                [
                    (p.stream, p.rows, p.bytes, p.requests, len(p.handles), p.inline)
                    for p in message.parts
                ]
            )
            if size == 7:  # the last shape committed: the rows land once, in input order
                commit_batch(writer.plan.client, writer.plan.options, [message], batch_id=0)
        assert shapes[0] == shapes[1] == shapes[2]
        assert any(shape[4] for shape in shapes[0]) == bool(extra)  # staged only with the cap
    for s in (0, 77, 149):
        got = [m["n"] for m in read_stream(root, f"{base}/s{s:03d}")]
        assert got == 2 * [r * STREAMS + s for r in range(ROWS_PER_STREAM)]


def test_a_null_target_names_its_row_in_the_partition(harness) -> None:
    """Batches are split together, so the error counts the row in the partition, not in a batch:
    row 7 is in the third batch of three rows."""
    writer, _, base = harness
    rows = [{"n": n, "stream": None if n == 7 else f"{base}/s{n % 2}"} for n in range(10)]
    with pytest.raises(UnsupportedWrite, match="Row 7 of this partition .* null 'stream'"):
        writer.write(record_batches(ARROW, rows, 3), epoch=0, partition=0, attempt=0)


def test_a_later_df_write_job_to_a_remembered_stream_closed_since_fails_naming_it(logged) -> None:
    """s005, remembered as ensured, was closed before the second job: the job is not told by an
    ensure (none is sent) but by the commit, which fails naming the stream; the other streams are
    committed and s005 holds only the first job's rows."""
    _, root, base, _ = logged
    client = client_for(root)
    _save(root, base)
    client.close(f"{base}/s005")
    with pytest.raises(CommitError, match=f"stream '{base}/s005'") as failed:
        _save(root, base)
    assert "closed" in str(failed.value).lower()
    assert len(read_stream(root, f"{base}/s005")) == 2 * ROWS_PER_STREAM
    assert len(read_stream(root, f"{base}/s006")) == 2 * 2 * ROWS_PER_STREAM


def test_a_failed_slice_of_the_commit_fails_only_its_streams_and_a_replay_completes(
    harness, monkeypatch
) -> None:
    """The driver commits a routed batch in slices of streams (``_stream_slices``), several in
    flight. One slice's bulk request fails outright: its streams' parts fail, named by stream and
    partition; the other slices' are committed; committing the batch again (its replay) commits the
    failed slice's parts and finds the rest duplicates: every stream's rows once."""
    from durastream_spark.errors import RequestContext, TransportError
    from durastream_spark.sink import transactional

    writer, root, base = harness
    monkeypatch.setattr(transactional, "MAX_ENTRIES", 40)  # 150 streams: 4 slices
    messages = _write_messages(writer, base, epoch=4)
    doomed = f"{base}/s050"  # in the second slice (s040-s079)
    original = BulkWrites.commit_parts
    failed: list[str] = []

    def commit_parts(self, entries):
        paths = [entry.path for entry in entries]
        if doomed in paths and not failed:
            failed.extend(paths)
            context = RequestContext("POST", root, body_bytes=1)
            raise TransportError(
                context, ConnectionResetError("reset"), attempts=3, maybe_applied=False
            )
        return original(self, entries)

    monkeypatch.setattr(BulkWrites, "commit_parts", commit_parts)
    with pytest.raises(CommitError) as raised:
        commit_batch(writer.plan.client, writer.plan.options, messages, batch_id=4)
    assert sorted(failed) == [f"{base}/s{s:03d}" for s in range(40, 80)]
    text = str(raised.value)
    assert f"failed for 80 of {2 * STREAMS} (stream, partition) parts" in text
    for stream in failed:
        assert f"stream '{stream}' partition 0" in text and f"stream '{stream}' partition 1" in text
    assert f"stream '{base}/s039'" not in text and f"stream '{base}/s080'" not in text
    again = commit_batch(writer.plan.client, writer.plan.options, messages, batch_id=4)
    by_stream = {s.stream: (s.committed, s.duplicates) for s in again.per_stream}
    assert {by_stream[stream] for stream in failed} == {(2, 0)}
    assert {v for k, v in by_stream.items() if k not in failed} == {(0, 2)}
    _assert_every_stream_once(root, base)
