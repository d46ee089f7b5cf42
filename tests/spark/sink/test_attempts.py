"""Issue 4, tests 4, 5 and 6: concurrent attempts, zombies and reordered retries, at the writer level.

Spark cannot be made to run two attempts of one task at the same moment, keep a zombie of an older batch
alive, or hand a retry its rows in another order on demand in local mode. These tests therefore drive the
sink's production code by hand (``WriterHarness``): ``PartitionWrite`` with an explicit task identity (what
``write()`` reads from ``TaskContext``) in real threads, and the Spark writer's ``commit`` with the commit
messages Spark would pass. Everything else (encoding, batching, producers, the server) is the real thing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from durastream_spark.errors import StaleEpochError
from durastream_spark.sink.errors import CommitError, ReorderedRetryError
from durastream_spark.sink.messages import SinkCommitMessage
from tests.spark.sink.support import (
    WriterHarness,
    assert_exactly_once,
    read_stream,
    record_batches,
    unique,
)

SCHEMA = StructType(
    [
        StructField("p", LongType()),
        StructField("n", LongType()),
        StructField("pad", StringType()),
    ]
)
ARROW_SCHEMA = pa.schema([("p", pa.int64()), ("n", pa.int64()), ("pad", pa.string())])
PAD = "y" * 200
MODES = ["transactional", "ordered"]


def _rows(partition: int, start: int, count: int) -> list[dict]:
    return [{"p": partition, "n": n, "pad": PAD} for n in range(start, start + count)]


def _harness(root: str, stream: str, mode: str, **extra: str) -> WriterHarness:
    options = {
        "url": root,
        "stream": stream,
        "exactlyOnce": mode,
        "maxMessagesPerRequest": "25",
        "maxInFlight": "4",
        **extra,
    }
    return WriterHarness(options, SCHEMA, query_id=str(uuid.uuid4()))


def _paused(
    batches: list[pa.RecordBatch], after: int, reached: threading.Event, resume: threading.Event
) -> Iterator[pa.RecordBatch]:
    """Yields ``after`` batches, signals, waits to be resumed, then yields the rest."""
    for index, batch in enumerate(batches):
        if index == after:
            reached.set()
            assert resume.wait(60), "the test never resumed the paused attempt"
        yield batch


# ---- 4. two concurrent attempts of the same task (speculation) -------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("messages", ["spark_keeps_one", "both_reach_commit"])
def test_two_concurrent_attempts_write_once(durastream_server, mode, messages) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique(f"speculation-{mode}")
    harness = _harness(root, stream, mode)
    batches = record_batches(ARROW_SCHEMA, _rows(0, 0, 1000), 40)
    start = threading.Barrier(2)

    def attempt(number: int):
        def together() -> Iterator[pa.RecordBatch]:
            start.wait(30)
            yield from batches

        return harness.write(together(), epoch=0, partition=0, attempt=number)

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(attempt, [0, 1])
    other = harness.write(
        record_batches(ARROW_SCHEMA, _rows(1, 1000, 500), 40), epoch=0, partition=1, attempt=0
    )
    if messages == "spark_keeps_one":
        harness.commit([second, other], 0)
    else:  # defensive path: the sink commits one attempt per partition and discards the other
        harness.commit([first, second, other], 0)
    assert_exactly_once(read_stream(root, stream), range(1500))


# ---- 5. a zombie attempt of an older batch ----------------------------------------------------------------


def _zombie_race(harness: WriterHarness) -> Future[SinkCommitMessage]:
    """Attempt 0 of batch 0 pauses mid-write (a zombie) while attempt 1 wins and is committed and batch 1
    writes and commits partition 0 under epoch 1; only then does the zombie resume. Returns its future,
    finished."""
    batches0 = record_batches(ARROW_SCHEMA, _rows(0, 0, 1000), 50)
    reached, resume = threading.Event(), threading.Event()
    with ThreadPoolExecutor(1) as pool:
        zombie = pool.submit(
            harness.write, _paused(batches0, 10, reached, resume), epoch=0, partition=0, attempt=0
        )
        assert reached.wait(60)
        # The batch completes without the zombie (Spark gave up on it and ran attempt 1)...
        winner = harness.write(batches0, epoch=0, partition=0, attempt=1)
        harness.commit([winner], 0)
        # ...and the next batch starts writing partition 0 under epoch 1.
        batch1 = harness.write(
            record_batches(ARROW_SCHEMA, _rows(0, 1000, 1000), 50), epoch=1, partition=0, attempt=0
        )
        harness.commit([batch1], 1)
        resume.set()
    return zombie


def test_zombie_of_an_older_batch_is_fenced_in_ordered_mode(durastream_server) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("zombie-ordered")
    harness = _harness(root, stream, "ordered")
    zombie = _zombie_race(harness)
    with pytest.raises(StaleEpochError, match="newer batch owns the producer"):
        zombie.result(60)
    assert_exactly_once(read_stream(root, stream), range(2000))


def test_zombie_of_an_older_batch_never_becomes_visible_in_transactional_mode(
    durastream_server,
) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("zombie-txn")
    harness = _harness(root, stream, "transactional")
    late = _zombie_race(harness).result(60)  # it only staged into its own handle
    # Even a commit of the zombie's output (a stale driver) is fenced by the newer epoch.
    with pytest.raises(CommitError) as raised:
        harness.commit([late], 0)
    assert [type(error) for error in raised.value.failures] == [StaleEpochError]
    assert_exactly_once(read_stream(root, stream), range(2000))


# ---- 6. a retry that sees the same rows in another order --------------------------------------------------


def _truncated(batches: list[pa.RecordBatch], keep: int) -> Iterator[pa.RecordBatch]:
    """What Spark does to a failing task's writer: the input ends early, cleanly."""
    yield from batches[:keep]


def test_reordered_retry_is_exactly_once_in_transactional_mode(durastream_server) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("reorder-txn")
    harness = _harness(root, stream, "transactional")
    rows = _rows(0, 0, 1000)
    harness.write(
        _truncated(record_batches(ARROW_SCHEMA, rows, 40), 15), epoch=0, partition=0, attempt=0
    )
    retry = harness.write(
        record_batches(ARROW_SCHEMA, rows[::-1], 40), epoch=0, partition=0, attempt=1
    )
    harness.commit([retry], 0)  # Spark discarded attempt 0's message: its task failed
    messages = read_stream(root, stream)
    assert_exactly_once(messages, range(1000), partition=None)
    assert [m["n"] for m in messages] == list(range(999, -1, -1))  # the retry's order, whole


def test_reordered_retry_fails_loudly_in_ordered_mode(durastream_server) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("reorder-ordered")
    harness = _harness(root, stream, "ordered")
    rows = _rows(0, 0, 1000)
    harness.write(
        _truncated(record_batches(ARROW_SCHEMA, rows, 40), 15), epoch=0, partition=0, attempt=0
    )
    with pytest.raises(ReorderedRetryError, match="sortWithinPartitions"):
        harness.write(record_batches(ARROW_SCHEMA, rows[::-1], 40), epoch=0, partition=0, attempt=1)
    # The batch failed loudly; what is visible is the first attempt's full requests, each row once.
    visible = read_stream(root, stream)
    assert [m["n"] for m in visible] == list(range(len(visible)))
    assert len(visible) == 600  # 15 batches of 40 rows = 24 full requests of 25 rows
