"""A dict whose snapshot costs the event loop O(1) instead of a copy: ``CowTable``.

A stream's producer table (and its committed-handle names) can hold a million entries, and a snapshot
needs a picture of it as of one moment while appends go on. ``dict.copy()`` of a million entries held
the loop (and the GIL) for about 100 ms on this VM. ``CowTable`` keeps its entries in one dict until it
outgrows ``SPLIT_AT``, then in ``PARTS`` dicts chosen by key hash; ``freeze`` hands out the parts as they
are and marks them shared, and the first change to a shared part copies that part only (``1/PARTS`` of
the table). Small tables, which most streams have, stay one plain dict.

It is used on the event loop only; a frozen picture (``Frozen``) is read from any thread, since nothing
ever changes a shared part again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import chain
from typing import Generic, TypeVar

V = TypeVar("V")

SPLIT_AT = 4096  # entries: beyond this, the table is split (once, O(SPLIT_AT))
PARTS = 256

Frozen = tuple[dict[str, V], ...]

# The parts of every table that was never written to. Never changed: ``_writable`` replaces it first.
_NO_PARTS: list[dict] = [{}]  # type: ignore[type-arg]


class CowTable(Generic[V]):
    """``str -> V`` with the mapping methods the server uses, plus ``freeze`` (see the module
    docstring)."""

    __slots__ = ("_parts", "_shared", "_len")

    def __init__(self, items: Mapping[str, V] | None = None) -> None:
        # Every empty table shares one empty part until its first write (``_writable``): most of a
        # server's streams never have a producer, a committed handle or a forgotten group, and three
        # empty tables were about 400 bytes of each idle stream (issue 17).
        self._parts: list[dict[str, V]] = _NO_PARTS  # type: ignore[assignment]
        self._shared = 0  # bit i: part i is referenced by a frozen picture
        self._len = 0
        if items:
            for key, value in items.items():
                self[key] = value

    def _part(self, key: str) -> int:
        return 0 if len(self._parts) == 1 else hash(key) % PARTS

    def _writable(self, index: int) -> dict[str, V]:
        if self._parts is _NO_PARTS:
            self._parts = [{}]
            return self._parts[0]
        bit = 1 << index
        if self._shared & bit:
            self._parts[index] = self._parts[index].copy()
            self._shared &= ~bit
        return self._parts[index]

    def get(self, key: str, default: V | None = None) -> V | None:
        return self._parts[self._part(key)].get(key, default)

    def __getitem__(self, key: str) -> V:
        return self._parts[self._part(key)][key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._parts[self._part(key)]

    def __setitem__(self, key: str, value: V) -> None:
        part = self._writable(self._part(key))
        if key not in part:
            self._len += 1
        part[key] = value
        if len(self._parts) == 1 and self._len > SPLIT_AT:
            self._split()

    def __delitem__(self, key: str) -> None:
        index = self._part(key)
        if key not in self._parts[index]:
            raise KeyError(key)
        part = self._writable(index)
        del part[key]
        self._len -= 1
        if not part:  # a dict never shrinks: drop the emptied one (the sweep empties whole tables)
            self._parts[index] = {}

    def pop(self, key: str, default: V | None = None) -> V | None:
        if key not in self:
            return default
        value = self[key]
        del self[key]
        return value

    def _split(self) -> None:
        parts: list[dict[str, V]] = [{} for _ in range(PARTS)]
        for key, value in self._parts[0].items():
            parts[hash(key) % PARTS][key] = value
        self._parts = parts
        self._shared = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(list(self._parts))

    def keys(self) -> Iterator[str]:
        return iter(self)

    def items(self) -> Iterator[tuple[str, V]]:
        return chain.from_iterable(part.items() for part in list(self._parts))

    def values(self) -> Iterator[V]:
        return chain.from_iterable(part.values() for part in list(self._parts))

    def parts(self) -> list[dict[str, V]]:
        """The current parts (for a caller that works through the table a part at a time; a part it
        holds may be replaced by a copy before it gets to it, so it should look keys up again)."""
        return list(self._parts)

    def freeze(self) -> Frozen[V]:
        """The table as of now, in O(number of parts)."""
        self._shared = (1 << len(self._parts)) - 1
        return tuple(self._parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CowTable):
            other = dict(other.items())
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and all(
            key in other and other[key] == value for key, value in self.items()
        )

    def __repr__(self) -> str:
        return f"CowTable({dict(self.items())!r})"


class _EmptyTable(CowTable):
    """``EMPTY``: the one table every stream state holds until its first write. A write to it is a
    bug (the writer must put a table of its own in place first, ``writable``); it raises instead of
    changing every stream's table."""

    __slots__ = ()

    def _writable(self, index: int) -> dict:  # type: ignore[type-arg]
        raise TypeError("the shared empty table is read-only: replace it with writable() first")

    def freeze(self) -> Frozen:  # type: ignore[type-arg]
        return tuple(_NO_PARTS)


# Most of a server's streams never have a producer, a committed handle or a forgotten group: their
# states share this one instead of three empty tables of about 60 bytes each (issue 17).
EMPTY: CowTable = _EmptyTable()


def empty() -> CowTable:
    """``EMPTY`` (for a dataclass field's default_factory)."""
    return EMPTY


def table_of(items: Mapping[str, V]) -> CowTable[V]:
    """A table of ``items``; the shared ``EMPTY`` one when there are none."""
    return CowTable(items) if items else EMPTY
