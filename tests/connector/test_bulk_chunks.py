"""How the connector cuts bulk requests (``protocol/bulk.py``): at most ``MAX_ENTRIES`` entries and
``MAX_BULK_BYTES`` of bodies each, every entry in exactly one, in order; an entry larger than the byte
cap travels alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from durastream_spark.protocol import bulk

sizes = st.lists(st.integers(0, 3 * bulk.MAX_BULK_BYTES), max_size=40)


@given(sizes)
def test_chunks_cover_every_entry_once_within_the_caps(values: list[int]) -> None:
    chunks = bulk._chunks(values)
    assert [i for first, last in chunks for i in range(first, last)] == list(range(len(values)))
    for first, last in chunks:
        assert 1 <= last - first <= bulk.MAX_ENTRIES
        if last - first > 1:
            assert sum(values[first:last]) <= bulk.MAX_BULK_BYTES


def test_many_small_entries_fill_requests_up_to_the_entry_cap() -> None:
    chunks = bulk._chunks([10] * (2 * bulk.MAX_ENTRIES + 1))
    assert chunks == [
        (0, bulk.MAX_ENTRIES),
        (bulk.MAX_ENTRIES, 2 * bulk.MAX_ENTRIES),
        (2 * bulk.MAX_ENTRIES, 2 * bulk.MAX_ENTRIES + 1),
    ]


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 1000)), max_size=60))
def test_multi_part_entries_are_cut_by_their_parts_too(entries: list[tuple[int, int]]) -> None:
    """Commit entries of several parts (bulk-write 2): at most ``MAX_BULK_PARTS`` parts a request
    (each is an append on the server), unless one entry alone holds more."""
    sizes, parts = [size for size, _ in entries], [count for _, count in entries]
    chunks = bulk._chunks(sizes, parts)
    assert [i for first, last in chunks for i in range(first, last)] == list(range(len(entries)))
    for first, last in chunks:
        assert last - first == 1 or sum(parts[first:last]) <= bulk.MAX_BULK_PARTS


def test_a_stream_with_more_parts_than_an_entry_takes_is_split() -> None:
    """More partitions than the server takes parts in one entry: several entries of the stream."""
    from durastream_spark.sink import transactional
    from durastream_spark.sink.messages import SinkCommitMessage, StreamPart

    count = bulk.MAX_ENTRY_PARTS + 5
    jobs = [
        (
            SinkCommitMessage("transactional", "w", 7, p, 0, f"ds-w-{p}", ()),
            StreamPart("s", 1, 3, 0, inline=b"[1]"),
        )
        for p in range(count)
    ]
    groups = transactional._stream_groups(jobs)
    assert [len(group.indexes) for group in groups] == [bulk.MAX_ENTRY_PARTS, 5]
    assert groups[0].entry.producer_prefix == "ds-w-" and groups[0].entry.epoch == 7
    assert sorted(i for group in groups for i in group.indexes) == list(range(count))
