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
