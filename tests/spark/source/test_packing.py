"""Packing a batch's ranges into tasks (``packing.py``): pure, so these need neither server nor Spark."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from durastream_spark.source.measure import position_bytes, position_spans
from durastream_spark.source.packing import (
    Piece,
    TaskCaps,
    byte_caps,
    pack,
    pack_bytes,
    parts_needed,
    task_caps,
)
from durastream_spark.source.planner import RangeSize, SplitRules, StreamRange


def pieces_of(sizes: list[tuple[int, int]]) -> list[Piece]:
    return [
        Piece(f"s{i:05d}", "-1", f"end{i}", RangeSize(messages, size))
        for i, (messages, size) in enumerate(sizes)
    ]


def test_small_ranges_share_tasks_up_to_the_caps() -> None:
    pieces = pieces_of([(10, 1000)] * 25)
    tasks = pack(pieces, TaskCaps(bytes=10_000, messages=None))
    assert [len(task) for task in tasks] == [10, 10, 5]
    by_messages = pack(pieces, TaskCaps(bytes=10**9, messages=45))
    assert [len(task) for task in by_messages] == [4, 4, 4, 4, 4, 4, 1]
    assert [p for task in tasks for p in task] == pieces  # in order, each once


def test_a_piece_over_a_cap_is_a_task_of_its_own() -> None:
    tasks = pack(
        pieces_of([(1, 10), (1, 500), (1, 10), (1, 10)]), TaskCaps(bytes=100, messages=None)
    )
    assert [[p.stream for p in task] for task in tasks] == [
        ["s00000"],
        ["s00001"],
        ["s00002", "s00003"],
    ]


def test_min_partitions_lowers_the_caps_to_an_even_share() -> None:
    sizes = [RangeSize(100, 10_000)] * 8
    rules = SplitRules(max_bytes_per_partition=256 << 20, min_partitions=4)
    caps = task_caps(sizes, rules)
    assert caps == TaskCaps(bytes=20_000, messages=200)
    assert len(pack(pieces_of([(100, 10_000)] * 8), caps)) == 4
    # The options stay the caps when they are lower than the share.
    assert task_caps(
        sizes,
        SplitRules(max_bytes_per_partition=5000, max_messages_per_partition=7, min_partitions=2),
    ) == TaskCaps(5000, 7)
    assert task_caps(sizes, SplitRules(max_bytes_per_partition=5000)) == TaskCaps(5000, None)


def test_parts_needed() -> None:
    assert parts_needed(RangeSize(1000, 2_500_000), TaskCaps(1_000_000, None)) == 3
    assert parts_needed(RangeSize(95, 95), TaskCaps(10**9, 10)) == 10
    assert parts_needed(RangeSize(2, 10**9), TaskCaps(10, None)) == 2  # never more than messages
    assert parts_needed(RangeSize(5, 50), TaskCaps(100, None)) == 1


@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(0, 5000)), min_size=1, max_size=200),
    st.integers(1, 20_000),
    st.one_of(st.none(), st.integers(1, 200)),
)
def test_packing_is_pure_ordered_and_within_the_caps(
    sizes: list[tuple[int, int]], cap_bytes: int, cap_messages: int | None
) -> None:
    pieces = pieces_of(sizes)
    caps = TaskCaps(cap_bytes, cap_messages)
    tasks = pack(pieces, caps)
    assert tasks == pack(list(pieces), caps)  # a replay gets the same tasks
    assert [p for task in tasks for p in task] == pieces
    for task in tasks:
        if len(task) > 1:
            assert sum(p.size.bytes for p in task) <= cap_bytes
            assert cap_messages is None or sum(p.size.messages for p in task) <= cap_messages
    # Greedy: a task ends only because the next piece would not fit.
    for task, following in zip(tasks, tasks[1:], strict=False):
        nxt = following[0].size
        over_bytes = sum(p.size.bytes for p in task) + nxt.bytes > cap_bytes
        over_messages = (
            cap_messages is not None
            and sum(p.size.messages for p in task) + nxt.messages > cap_messages
        )
        assert over_bytes or over_messages


@given(
    st.lists(st.integers(1, 5000), max_size=200),
    st.integers(1, 20_000),
    st.one_of(st.none(), st.integers(1, 9)),
)
def test_the_columnar_packing_makes_the_same_tasks(
    sizes: list[int], cap_bytes: int, min_partitions: int | None
) -> None:
    """A batch sized by byte positions is packed as a column of integers (``pack_bytes``, caps from
    ``byte_caps``): exactly the tasks ``pack`` makes of the same ranges as ``Piece``s, so a replay
    planned either way reads the same tasks."""
    pieces = pieces_of([(0, size) for size in sizes])
    rules = SplitRules(cap_bytes, None, min_partitions)
    caps = task_caps([piece.size for piece in pieces], rules, counted=False)
    assert byte_caps(sum(sizes), rules) == caps
    ends = pack_bytes(sizes, caps.bytes)
    starts = [0, *ends][: len(ends)]
    assert [pieces[first:last] for first, last in zip(starts, ends, strict=True)] == pack(
        pieces, caps
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["-1", "start", "other-generation", "not-a-token", "after-end"]),
            st.integers(0, 10**6),
            st.integers(0, 10**6),
        ),
        min_size=1,
        max_size=50,
    )
)
def test_position_spans_agree_with_position_bytes(rows: list[tuple[str, int, int]]) -> None:
    """The whole-batch column of sizes is each range's ``position_bytes`` size, or None when any
    range's offsets do not read as positions (then the batch is sized range by range)."""
    ranges = []
    for i, (kind, first, size) in enumerate(rows):
        end = f"{7:016d}_{first + size:016d}"
        start = {
            "-1": "-1",
            "start": f"{7:016d}_{first:016d}",
            "other-generation": f"{8:016d}_{first:016d}",
            "not-a-token": "12",
            "after-end": f"{7:016d}_{first + size + 1:016d}",
        }[kind]
        ranges.append(StreamRange(f"s{i:05d}", start, end))
    found, unknown = position_bytes(ranges)
    spans = position_spans([r.start for r in ranges], [r.end for r in ranges])
    if unknown:
        assert spans is None
    else:
        assert spans == [found[r.stream] for r in ranges]
    assert position_spans(["-1"], [f"{7:016d}_{1:016d}\n"]) is None
    assert (
        position_spans(["-1", "-1"], [f"{7:016d}_{1:016d}\n{7:016d}", "_0000000000000001"]) is None
    )
