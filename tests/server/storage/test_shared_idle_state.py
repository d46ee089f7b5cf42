"""What idle streams share instead of holding one each (issue 17): empty producer tables and one-point
sparse indexes, the side object of a log's rarely used state. Sharing must never let one stream's change
show in another's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durastream_server.storage import table
from durastream_server.storage.index import LogIndex, SparseIndex
from durastream_server.storage.records import AppendEntry, CommittedHandle, ProducerTuple
from durastream_server.storage.segments import SegmentTable
from durastream_server.storage.state import (
    ForgottenGroup,
    ProducerState,
    StreamState,
    apply_entry,
    forget_producer,
    note_committed,
)
from durastream_server.storage.table import CowTable


def test_empty_tables_share_nothing_once_written() -> None:
    a: CowTable[int] = CowTable()
    b: CowTable[int] = CowTable()
    frozen = b.freeze()
    a["x"] = 1
    assert dict(a.items()) == {"x": 1}
    assert len(b) == 0 and "x" not in b and list(b.items()) == []
    assert frozen == ({},)
    b["y"] = 2
    assert dict(b.items()) == {"y": 2} and dict(a.items()) == {"x": 1}
    assert frozen == ({},)  # a picture taken before the write stays as it was
    del b["y"]
    assert len(b) == 0 and CowTable() == {}


def test_one_point_indexes_share_arrays_until_their_second_point() -> None:
    a, b = SparseIndex(100), SparseIndex(100)
    a.note(0, 120, 0)
    b.note(0, 120, 0)
    assert a.positions is b.positions and a.offsets is b.offsets  # shared, read-only
    a.note(0, 150, 1, 5)  # within the interval: counted, no new point
    a.note(10, 400, 2, 7)  # a second point: a's own arrays from now on
    assert list(a.positions) == [0, 10] and list(a.offsets) == [120, 400]
    assert list(a.ordinals) == [0, 1] and list(a.times) == [0, 7]
    assert list(b.positions) == [0] and list(b.offsets) == [120]
    assert list(b.ordinals) == [0] and list(b.times) == [0]
    assert b.floor_entry(50) == (0, 120, 0) and a.floor_entry(50) == (10, 400, 1)
    c = SparseIndex(100)
    c.note(0, 120, 0)
    assert list(c.offsets) == [120]  # the shared array did not grow


def test_a_first_point_that_is_not_shared_is_the_indexs_own() -> None:
    big = SparseIndex(100, last_time=1_900_000_000_000)
    big.note(5_000_000, 300, 0)
    big.note(5_000_100, 500, 1, 1_900_000_000_001)
    assert list(big.positions) == [5_000_000, 5_000_100]
    assert list(big.times) == [1_900_000_000_000, 1_900_000_000_001]


@pytest.mark.parametrize(
    ("position", "offset", "last_time"), [(0, 120, 0), (5_000_000, 300, 1_900_000_000_000)]
)
def test_an_index_started_in_one_step_is_the_one_noted_in_two(
    position: int, offset: int, last_time: int
) -> None:
    """``SparseIndex.starting_at`` (a create's) against the index it replaces, shared arrays or not:
    the same points, and its second point leaves every other index as it was."""
    two = SparseIndex(100, last_time=last_time)
    two.note(position, offset, 0)
    one = SparseIndex.starting_at(100, position, offset, last_time)
    other = SparseIndex.starting_at(100, position, offset, last_time)
    for index in (one, two):
        index.note(position + 10, offset + 200, 2, last_time + 1)
    for name in ("positions", "offsets", "ordinals", "times"):
        assert list(getattr(one, name)) == list(getattr(two, name))
        assert len(getattr(other, name)) == 1  # untouched by the others' second point
    assert (one.messages, one.last_time) == (two.messages, two.last_time) == (2, last_time + 1)


def test_a_new_logs_segment_table_is_the_one_made_from_its_directory(tmp_path: Path) -> None:
    root = str(tmp_path / "streams")
    made = SegmentTable.first(root, "0123abcd")
    joined = SegmentTable(os.path.join(root, "0123abcd"), "0123abcd", [0])
    assert (made.directory, made.bases, made.last) == (joined.directory, joined.bases, joined.last)
    assert made.path(0) == joined.path(0) and made.key(0) == joined.key(0)
    made.extend([4096])
    assert made.bases == (0, 4096) and SegmentTable.first(root, "x").bases == (0,)


def test_the_recent_window_is_dropped_when_idle_and_made_again_by_the_next_record() -> None:
    index = LogIndex(SparseIndex(1 << 20))
    index.sparse.note(0, 100, 0)
    index.note(0, 100, 1, 1)
    index.note(5, 140, 1, 2)
    assert index.exact(5) == 1 and index.floor(7) == (5, 140)
    index.forget_recent()
    assert index.exact(5) is None  # not known exactly any more: a lookup scans from a sparse point
    assert index.floor(7) == (0, 100)
    index.note(9, 180, 1, 3)
    assert index.exact(9) == 2 and index.floor(10) == (9, 180)


def test_stream_states_share_one_read_only_empty_table_until_their_first_write() -> None:
    a, b = StreamState(tail=0), StreamState(tail=0)
    assert a.producers is b.producers is a.forgotten is a.txn_committed is table.EMPTY
    with pytest.raises(TypeError, match="read-only"):
        a.producers["p"] = ProducerState(0, 0)  # a writer that forgot producers_of()
    assert len(table.EMPTY) == 0 and table.EMPTY.freeze() == ({},)
    apply_entry(a, AppendEntry(0, (b'"x"',), 1000, producer=ProducerTuple("p-1", 0, 0)))
    forget_producer(a, "p-1")  # the producer moves to the forgotten groups
    note_committed(b, (CommittedHandle("h", 5000),), 1000)
    assert a.producers is not table.EMPTY and a.forgotten is not table.EMPTY
    assert len(a.producers) == 0 and dict(a.forgotten.items()) == {"p": ForgottenGroup(0, 1000)}
    assert dict(b.txn_committed.items()) == {"h": 5000}
    assert b.producers is b.forgotten is a.txn_committed is table.EMPTY and len(table.EMPTY) == 0
    assert table.table_of({}) is table.EMPTY and dict(table.table_of({"k": 1}).items()) == {"k": 1}
