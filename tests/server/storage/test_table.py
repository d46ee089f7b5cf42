"""``CowTable``: a dict whose snapshot (``freeze``) is O(parts) and never sees later changes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st

from durastream_server.storage import table
from durastream_server.storage.table import CowTable


def test_a_frozen_picture_never_changes_and_only_touched_parts_are_copied() -> None:
    cow: CowTable[int] = CowTable()
    for n in range(table.SPLIT_AT + 10):  # split into PARTS dicts
        cow[f"k{n}"] = n
    frozen = cow.freeze()
    assert len(frozen) == table.PARTS
    cow["k0"] = -1
    del cow["k1"]
    cow["new"] = 7
    picture = {k: v for part in frozen for k, v in part.items()}
    assert picture["k0"] == 0 and picture["k1"] == 1 and "new" not in picture
    assert cow["k0"] == -1 and "k1" not in cow and cow.get("new") == 7
    assert len(cow) == table.SPLIT_AT + 10
    unchanged = [i for i, part in enumerate(cow.parts()) if part is frozen[i]]
    assert len(unchanged) >= table.PARTS - 3  # at most the three touched parts were copied


@contextlib.contextmanager
def _small_parts() -> Iterator[None]:
    """Split at 8 entries into 4 parts, so short runs cross the split and share parts."""
    saved = table.SPLIT_AT, table.PARTS
    table.SPLIT_AT, table.PARTS = 8, 4
    try:
        yield
    finally:
        table.SPLIT_AT, table.PARTS = saved


@given(st.lists(st.tuples(st.sampled_from("sdp"), st.integers(0, 40)), max_size=200))
def test_it_behaves_like_a_dict(operations: list[tuple[str, int]]) -> None:
    with _small_parts():
        _check_against_a_dict(operations)


def _check_against_a_dict(operations: list[tuple[str, int]]) -> None:
    cow: CowTable[int] = CowTable()
    model: dict[str, int] = {}
    pictures = []
    for op, n in operations:
        key = f"k{n % 30}"
        if op == "s":
            cow[key] = n
            model[key] = n
        elif op == "d":
            assert cow.pop(key) == model.pop(key, None)
        else:
            pictures.append((cow.freeze(), dict(model)))
    assert cow == model and dict(cow.items()) == model and len(cow) == len(model)
    for frozen, then in pictures:
        assert {k: v for part in frozen for k, v in part.items()} == then
