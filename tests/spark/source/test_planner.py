"""The source's offset-range arithmetic, without I/O: batch ends, batch ranges, budgets and task splits."""

from __future__ import annotations

import bisect
import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durastream_spark.errors import OptionError
from durastream_spark.source.offsets import (
    EARLIEST,
    LATEST,
    EarliestSpec,
    LatestSpec,
    SourceOffset,
    SpecificSpec,
)
from durastream_spark.source.planner import (
    RangeSize,
    StreamRange,
    allocate,
    batch_ranges,
    plan_next_end,
    ranges_between,
    split_points,
)


def tok(position: int) -> str:
    return f"{0:016d}_{position:016d}"


# ---- plan_next_end ----------------------------------------------------------------------------------------


def test_earliest_streams_advance_to_their_tails() -> None:
    plan = plan_next_end(SourceOffset.of({"a": EARLIEST, "b": tok(5)}), {"a": tok(10), "b": tok(9)})
    assert plan.pending == [StreamRange("a", EARLIEST, tok(10)), StreamRange("b", tok(5), tok(9))]
    assert plan.fixed == {} and plan.losses == []


def test_latest_resolves_to_the_tail_and_reads_nothing_in_the_first_batch() -> None:
    start = SourceOffset.of({"a": LATEST})
    plan = plan_next_end(start, {"a": tok(42)})
    assert plan.fixed == {"a": tok(42)} and plan.pending == []
    # The first batch is [latest, tail): empty whatever the tail was when it was planned.
    ranges, losses = ranges_between(start, SourceOffset.of(plan.fixed))
    assert ranges == [] and losses == []


def test_pattern_latest_marker_applies_to_streams_existing_at_the_first_batch_only() -> None:
    initial = SourceOffset((), LATEST)
    first = plan_next_end(initial, {"p/a": tok(7)})
    assert first.fixed == {"p/a": tok(7)}
    end0 = SourceOffset.of(first.fixed)
    assert end0.json() != initial.json()  # so Spark records batch 0, even when no stream exists
    assert SourceOffset.of(plan_next_end(initial, {}).fixed).json() != initial.json()
    # A stream that appears later is absent from the checkpoint, so it starts at its beginning.
    second = plan_next_end(end0, {"p/a": tok(9), "p/new": tok(3)})
    assert second.pending == [
        StreamRange("p/a", tok(7), tok(9)),
        StreamRange("p/new", EARLIEST, tok(3)),
    ]


def test_a_deleted_stream_is_reported_unless_it_was_read_to_its_closed_end() -> None:
    start = SourceOffset.of({"a": tok(5), "b": tok(3)})
    plan = plan_next_end(start, {"b": tok(3)})
    assert [(n.stream, n.start) for n in plan.losses] == [("a", tok(5))]
    assert "a" not in plan.fixed and plan.fixed == {"b": tok(3)}
    quiet = plan_next_end(start, {"b": tok(3)}, finished={"a": tok(5)})
    assert quiet.losses == []


def test_a_stream_not_created_yet_is_no_loss() -> None:
    plan = plan_next_end(SourceOffset.of({"a": EARLIEST, "b": LATEST}), {})
    assert plan.losses == [] and plan.fixed == {"a": EARLIEST}


def test_a_stream_shorter_than_the_checkpoint_is_reported_and_reread_from_its_beginning() -> None:
    plan = plan_next_end(SourceOffset.of({"a": tok(100)}), {"a": tok(20)})
    assert plan.losses and plan.losses[0].end == tok(20)
    assert plan.pending == [StreamRange("a", EARLIEST, tok(20))]
    ranges, losses = ranges_between(
        SourceOffset.of({"a": tok(100)}), SourceOffset.of({"a": tok(20)})
    )
    assert ranges == [StreamRange("a", EARLIEST, tok(20))] and len(losses) == 1


def test_available_now_target_caps_and_excludes_new_streams() -> None:
    start = SourceOffset.of({"a": tok(1), "b": tok(2)})
    target = {"a": tok(5), "b": tok(2)}
    plan = plan_next_end(start, {"a": tok(9), "b": tok(8), "new": tok(4)}, target=target)
    assert plan.pending == [StreamRange("a", tok(1), tok(5))]
    assert plan.fixed == {"b": tok(2)}
    assert "new" not in plan.fixed


# ---- ranges_between ---------------------------------------------------------------------------------------


def test_ranges_read_only_streams_that_advanced() -> None:
    start = SourceOffset.of({"a": tok(1), "b": tok(2), "gone": tok(3)})
    end = SourceOffset.of({"a": tok(4), "b": tok(2), "c": tok(6), "d": EARLIEST})
    ranges, losses = ranges_between(start, end)
    assert ranges == [StreamRange("a", tok(1), tok(4)), StreamRange("c", EARLIEST, tok(6))]
    assert losses == []


@given(
    st.dictionaries(st.sampled_from("abcd"), st.integers(0, 50), max_size=4),
    st.dictionaries(st.sampled_from("abcd"), st.integers(0, 50), max_size=4),
)
def test_ranges_are_a_pure_function_of_the_two_offsets(starts: dict, ends: dict) -> None:
    start = SourceOffset.of({k: tok(v) for k, v in starts.items()})
    end = SourceOffset.of({k: tok(v) for k, v in ends.items()})
    first = ranges_between(start, end)
    again = ranges_between(SourceOffset.from_json(start.json()), SourceOffset.from_json(end.json()))
    assert first == again
    for item in first[0]:
        assert item.end == end.get(item.stream)


# ---- batch_ranges -----------------------------------------------------------------------------------------


def test_batch_ranges_resolve_specs_against_tails() -> None:
    tails = {"a": tok(10), "b": tok(20)}
    assert batch_ranges(EarliestSpec(), LatestSpec(), tails) == [
        StreamRange("a", EARLIEST, tok(10)),
        StreamRange("b", EARLIEST, tok(20)),
    ]
    starting = SpecificSpec((("a", tok(4)), ("b", LATEST)), EARLIEST)
    ending = SpecificSpec((("a", tok(8)),), LATEST)
    assert batch_ranges(starting, ending, tails) == [StreamRange("a", tok(4), tok(8))]


def test_the_default_read_takes_every_stream_whole_as_the_general_rules_do() -> None:
    """earliest -> latest skips the per-stream checks (nothing can be out of bounds) and gives what the
    general path gives for the same ends: an empty stream whose tail is ``-1`` has no range."""
    tails = {"b": tok(20), "a": tok(10), "empty": EARLIEST, "zero": tok(0)}
    every = SpecificSpec((), EARLIEST)  # the general path with the same ends
    assert (
        batch_ranges(EarliestSpec(), LatestSpec(), tails)
        == batch_ranges(every, SpecificSpec((), LATEST), tails)
        == [
            StreamRange("a", EARLIEST, tok(10)),
            StreamRange("b", EARLIEST, tok(20)),
            StreamRange("zero", EARLIEST, tok(0)),
        ]
    )


@pytest.mark.parametrize(
    "starting, ending, option",
    [
        (EarliestSpec(), SpecificSpec((("a", tok(11)),), LATEST), "endingOffsets"),
        (SpecificSpec((("a", tok(11)),), EARLIEST), LatestSpec(), "startingOffsets"),
        (
            SpecificSpec((("a", tok(8)),), EARLIEST),
            SpecificSpec((("a", tok(4)),), LATEST),
            "startingOffsets",
        ),
    ],
)
def test_batch_ranges_refuse_impossible_specs(starting, ending, option) -> None:
    with pytest.raises(OptionError) as caught:
        batch_ranges(starting, ending, {"a": tok(10)})
    assert caught.value.option == option and "'a'" in str(caught.value)


# ---- allocate ---------------------------------------------------------------------------------------------


def test_allocate_examples() -> None:
    assert allocate({"a": 10, "b": 2}, None) == {"a": 10, "b": 2}
    assert allocate({"a": 10, "b": 2}, 100) == {"a": 10, "b": 2}
    assert allocate({"a": 10, "b": 2}, 3) == {"a": 3, "b": 0}
    assert allocate({"a": 5, "b": 5, "c": 5}, 1) == {"a": 1, "b": 0, "c": 0}
    assert allocate({"a": 4, "b": 5, "c": 5}, 1) == {"a": 0, "b": 1, "c": 0}


@given(
    st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.integers(0, 10**6)),
    st.integers(0, 10**6),
)
def test_allocate_is_exact_bounded_proportional_and_deterministic(lags: dict, limit: int) -> None:
    shares = allocate(lags, limit)
    total = sum(lags.values())
    assert sum(shares.values()) == min(limit, total)
    for path, share in shares.items():
        assert 0 <= share <= lags[path]
        if total > limit:
            assert abs(share - lags[path] * limit / total) < 1
    assert allocate(dict(reversed(list(lags.items()))), limit) == shares


# ---- split_points ----------------------------------------------------------------------------------------


class SimulatedStream:
    """Messages of given sizes; ``lookup`` answers like the server's lookup=limit (bytes soft)."""

    def __init__(self, sizes: list[int]) -> None:
        self.bounds = [0, *itertools.accumulate(sizes)]
        self.calls = 0

    def index(self, offset: str) -> int:
        return 0 if offset == EARLIEST else self.bounds.index(int(offset.split("_")[1]))

    def lookup(self, start: str, max_messages: int, max_bytes: int) -> tuple[str, int, int]:
        self.calls += 1
        first = self.index(start)
        last = min(len(self.bounds) - 1, first + max_messages)
        byte_end = bisect.bisect_right(self.bounds, self.bounds[first] + max_bytes) - 1
        last = min(last, max(byte_end, first + 1))
        return tok(self.bounds[last]), last - first, self.bounds[last] - self.bounds[first]


@given(
    st.lists(st.integers(1, 500), min_size=1, max_size=300),
    st.integers(1, 12),
    st.one_of(st.none(), st.integers(1, 50)),
)
def test_split_points_cut_at_boundaries_into_balanced_parts(
    sizes: list[int], parts: int, cap
) -> None:
    stream = SimulatedStream(sizes)
    end = tok(stream.bounds[-1])
    size = RangeSize(len(sizes), stream.bounds[-1])
    cuts = split_points(EARLIEST, end, size, parts, stream.lookup, max_messages_per_part=cap)
    bounds = [0, *(int(c.split("_")[1]) for c in cuts), stream.bounds[-1]]
    assert bounds == sorted(set(bounds))  # strictly increasing, inside the range
    assert all(b in stream.bounds for b in bounds)  # message boundaries only
    counts = [stream.bounds.index(b) for b in bounds]
    messages_per_part = [b - a for a, b in zip(counts, counts[1:], strict=False)]
    if cap:
        assert max(messages_per_part) <= cap
    expected_parts = min(len(sizes), max(parts, math.ceil(len(sizes) / cap) if cap else parts))
    assert len(messages_per_part) <= expected_parts + 1
    assert len(cuts) == len(messages_per_part) - 1


def test_uniform_messages_split_evenly() -> None:
    stream = SimulatedStream([1024] * 1000)
    cuts = split_points(EARLIEST, tok(1024 * 1000), RangeSize(1000, 1024 * 1000), 4, stream.lookup)
    assert [int(c.split("_")[1]) // 1024 for c in cuts] == [250, 500, 750]
    assert stream.calls == 3
