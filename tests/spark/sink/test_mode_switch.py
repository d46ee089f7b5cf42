"""Issue 15, item 1: a batch's exactly-once mode changes between its runs, and nothing is lost or duplicated.

Both modes write under the same producer per (stream, partition) and batch. Before this was fixed, a batch
that an ordered run had partly written was "committed" by a transactional replay, which took the ordered
run's requests for its own earlier commit and discarded the rest of the partition (25 rows in, 20 in the
stream), and the reverse switch failed with a misleading "reordered rows" error.

Now (``sink/batch_mode.py``, decision 0006): a transactional replay refuses a part that ordered mode started
(``BatchModeConflict``, before anything of it is visible), and an ordered replay finishes any batch,
skipping parts a transactional run committed. These tests drive the sink's task and driver code by hand
(``WriterHarness``) against a real server: the runs of a batch are what a restart from one checkpoint with
other options produces (same query id, new attempts), and a driver that dies in the middle of a commit is
a commit of some of the batch's messages. ``auto`` flips when a proxy hides the extension advertisement.
The Spark-level run of the same story is ``test_mode_switch_spark.py``.
"""

from __future__ import annotations

import uuid

import pytest

from durastream_spark.sink.errors import BatchModeConflict, CommitError
from tests.spark.sink.support import (
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    WriterHarness,
    assert_exactly_once,
    read_stream,
    record_batches,
    unique,
)
from tests.support.hiding_proxy import ExtensionHidingProxy

SCHEMA, ARROW_SCHEMA = ROW_SCHEMA, ROW_ARROW_SCHEMA
# Rows per partition: partitions 0 and 1 fill full requests (of 10 rows), partition 2 fits in the final
# partial request, which ordered mode only sends from the driver's commit.
ROWS = {0: 25, 1: 40, 2: 7}


def _rows(partition: int) -> list[dict]:
    start = 1000 * partition
    return [{"p": partition, "n": start + i, "pad": "x" * 50} for i in range(ROWS[partition])]


def _all_keys() -> list[int]:
    return [row["n"] for partition in ROWS for row in _rows(partition)]


def _harness(root: str, stream: str, mode: str, query_id: str) -> WriterHarness:
    options = {"url": root, "stream": stream, "exactlyOnce": mode, "maxMessagesPerRequest": "10"}
    return WriterHarness(options, SCHEMA, query_id=query_id)


def _write_all(harness: WriterHarness, epoch: int, attempt: int = 0) -> list:
    return [
        harness.write(
            record_batches(ARROW_SCHEMA, _rows(p), 4), epoch=epoch, partition=p, attempt=attempt
        )
        for p in ROWS
    ]


def _keys(root: str, stream: str) -> list[int]:
    return [m["n"] for m in read_stream(root, stream)]


def test_ordered_batch_replayed_as_transactional_fails_loudly_then_ordered_finishes_it(
    durastream_server,
) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("switch-o-t-o")
    query = str(uuid.uuid4())
    ordered = _harness(root, stream, "ordered", query)
    # Run 1, ordered: every task sends its full requests, then the batch fails (no commit): partition 0
    # has 2 requests visible, partition 1 has 4, partition 2 none (its rows wait in the remainder).
    _write_all(ordered, epoch=0)
    visible = _keys(root, stream)
    assert len(visible) == 20 + 40

    # Run 2, transactional (the advice the old ReorderedRetryError gave, or auto after a server swap).
    transactional = _harness(root, stream, "transactional", query)
    messages = _write_all(transactional, epoch=0)
    with pytest.raises(CommitError, match=r"restart the query .* exactlyOnce=ordered") as raised:
        transactional.commit(messages, 0)
    # Partitions 0 and 1 (started by run 1) conflict; partition 2 commits.
    failures = raised.value.failures
    assert [type(e) for e in failures] == [BatchModeConflict, BatchModeConflict]
    assert sorted(e.partition for e in failures) == [0, 1]
    conflict = failures[0]
    text = str(raised.value)
    assert "Batch 0, partition" in text and "ordered mode" in text and "transactional" in text
    assert "exactlyOnce=transactional" in text  # names this run's option
    assert conflict.batch == 0 and conflict.partition in (0, 1)
    # Nothing of run 2 became visible for partitions 0 and 1; partition 2 (nothing visible before) is
    # committed: the batch is now mixed.
    assert sorted(_keys(root, stream)) == sorted(visible + [r["n"] for r in _rows(2)])

    # Run 3, ordered: dedupes run 1's requests, adds the rest, keeps partition 2's commit as it is.
    _write_and_commit(ordered, epoch=0, attempt=0)
    assert_exactly_once(read_stream(root, stream), _all_keys())

    # And back: the next batch in transactional mode.
    _commit_one_row(transactional, epoch=1, partition=0, key=5000)
    assert_exactly_once(read_stream(root, stream), [*_all_keys(), 5000])


def _write_and_commit(harness: WriterHarness, epoch: int, attempt: int = 0) -> None:
    harness.commit(_write_all(harness, epoch, attempt), epoch)


def _commit_one_row(harness: WriterHarness, *, epoch: int, partition: int, key: int) -> None:
    rows = [{"p": partition, "n": key, "pad": ""}]
    message = harness.write(
        record_batches(ARROW_SCHEMA, rows, 1), epoch=epoch, partition=partition, attempt=0
    )
    harness.commit([message], epoch)


def test_transactional_batch_cut_by_a_driver_kill_is_finished_in_ordered_mode(
    durastream_server,
) -> None:
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("switch-t-o-t")
    query = str(uuid.uuid4())
    transactional = _harness(root, stream, "transactional", query)
    messages = _write_all(transactional, epoch=0)
    # The driver dies in the middle of the commit: partitions 0 and 2 are committed, 1 is not.
    transactional.commit([messages[0], messages[2]], 0)
    assert len(_keys(root, stream)) == ROWS[0] + ROWS[2]

    # The restart runs in ordered mode. Partition 0's tasks meet the commit at seq 0 of a full request,
    # partition 2's driver at seq 0 of its remainder: both parts are complete and skipped.
    ordered = _harness(root, stream, "ordered", query)
    _write_and_commit(ordered, epoch=0)
    assert_exactly_once(read_stream(root, stream), _all_keys())
    # A retried task of that run, and a repeated commit, change nothing either.
    retry = ordered.write(
        record_batches(ARROW_SCHEMA, _rows(0), 4), epoch=0, partition=0, attempt=1
    )
    assert retry.parts[0].committed_earlier
    ordered.commit([retry], 0)
    assert_exactly_once(read_stream(root, stream), _all_keys())

    # And back to transactional for the next batch.
    _commit_one_row(transactional, epoch=1, partition=1, key=7000)
    assert_exactly_once(read_stream(root, stream), [*_all_keys(), 7000])


def test_auto_flips_when_a_proxy_hides_the_extensions(durastream_server) -> None:
    direct = durastream_server.base_url + "/v1/stream"
    with ExtensionHidingProxy(durastream_server.port) as proxy:
        hidden = proxy.base_url + "/v1/stream"

        # Ordered first (through the proxy), then auto sees the real server: transactional.
        stream = unique("auto-flip-o-t")
        query = str(uuid.uuid4())
        through_proxy = _harness(hidden, stream, "auto", query)
        assert through_proxy.plan.mode == "ordered" and proxy.hidden >= 1
        _write_all(through_proxy, epoch=0)  # the batch fails after its tasks
        direct_auto = _harness(direct, stream, "auto", query)
        assert direct_auto.plan.mode == "transactional"
        with pytest.raises(CommitError, match="exactlyOnce=auto chose transactional") as raised:
            direct_auto.commit(_write_all(direct_auto, epoch=0), 0)
        assert [type(e) for e in raised.value.failures] == [BatchModeConflict] * 2
        _write_and_commit(_harness(direct, stream, "ordered", query), epoch=0)
        assert_exactly_once(read_stream(direct, stream), _all_keys())

        # Transactional first (direct), the driver dies mid-commit, the restart goes through the
        # proxy: auto is ordered now, and it finishes the batch (the proxy also hides the header).
        stream = unique("auto-flip-t-o")
        query = str(uuid.uuid4())
        direct_auto = _harness(direct, stream, "auto", query)
        messages = _write_all(direct_auto, epoch=0)
        direct_auto.commit(messages[1:], 0)
        through_proxy = _harness(hidden, stream, "auto", query)
        assert through_proxy.plan.mode == "ordered"
        _write_and_commit(through_proxy, epoch=0)
        assert_exactly_once(read_stream(direct, stream), _all_keys())


def test_an_ordered_run_longer_than_the_digest_window_is_still_recognised(durastream_server):
    """An ordered run of 75 requests: seq 0's digest may be forgotten (the server remembered 64 seqs),
    so the transactional commit can get a 204 instead of a 409. Its Producer-Seq (74) gives the ordered
    run away: a commit only ever uses seq 0."""
    root = durastream_server.base_url + "/v1/stream"
    stream = unique("switch-window")
    query = str(uuid.uuid4())
    rows = [{"p": 0, "n": n, "pad": ""} for n in range(75)]
    options = {"url": root, "stream": stream, "maxMessagesPerRequest": "1"}
    ordered = WriterHarness({**options, "exactlyOnce": "ordered"}, SCHEMA, query_id=query)
    ordered.write(record_batches(ARROW_SCHEMA, rows, 5), epoch=0, partition=0, attempt=0)
    assert len(_keys(root, stream)) == 75  # one full request per row, sent by the task
    transactional = WriterHarness({**options, "exactlyOnce": "transactional"}, SCHEMA, query)
    message = transactional.write(
        record_batches(ARROW_SCHEMA, rows, 5), epoch=0, partition=0, attempt=0
    )
    with pytest.raises(CommitError) as raised:
        transactional.commit([message], 0)
    (conflict,) = raised.value.failures
    assert isinstance(conflict, BatchModeConflict) and conflict.visible_requests == 75
    ordered.commit(
        [ordered.write(record_batches(ARROW_SCHEMA, rows, 5), epoch=0, partition=0, attempt=0)], 0
    )
    assert _keys(root, stream) == list(range(75))
