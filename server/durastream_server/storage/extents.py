"""Where a packed stream's bytes are (decision 0010, step 2): a compact list of extents.

A packed stream with appends (step 2) has no segment file: its records are in the WAL files and packs
that hold its entries. Each entry says where its records belong in the stream's *virtual segment 0*
(the bytes a promoted stream's first segment would hold: the header record at 0, then the records in
order), so an extent maps a range of logical positions ``[position, position + length)`` to the same
bytes at ``offset`` in one file, a WAL file or a pack of ``generation``.

Memory per idle stream is the point (issue 17: <= 2 KiB RSS per idle stream). An extent is four machine
integers in one ``array('q')`` per stream (32 bytes an extent plus ~80 bytes for the array), not a tuple
of four ints (~200 bytes) in a list. A checkpoint writes a stream's entries of a retired WAL file into
its pack as one entry (``coalesce``), so a stream has one extent per file that holds its bytes: its
pack(s) and the WAL files not yet retired. Each checkpoint that carries a stream adds a pack; past a
bound that grows with the log of the stream's bytes, the checkpoint merges its last pack extents
with the new records into one entry (``merge_choice``, step 2c), so a stream appended every
checkpoint keeps a handful (7 after 128 checkpoints), not one a checkpoint.

Everything here runs on the event loop (the reading thread gets an immutable ``pieces`` list, a
checkpoint's carry thread flat copies of the extents it moves: ``in_file_flat``, ``flat_iter``).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from durastream_server.storage.wal import FIXED_SIZE, HEAD_SIZE, WalEntry

# Where an extent's file is: the same generation may name a WAL file and the pack written from it.
IN_WAL = 0
IN_PACK = 1
_FIELDS = 4  # file key (generation * 2 + where), file offset, length, logical position
FIELDS = _FIELDS  # for the flat copies (``Extents.in_file_flat``) other modules slice
_EXACT_UP_TO = 16  # extents kept in an exact-size buffer (``Extents.add``)


@dataclass(frozen=True, slots=True)
class Piece:
    """A part of a read: ``length`` bytes at ``offset`` in file (``where``, ``generation``), holding
    logical positions from ``position`` on."""

    where: int
    generation: int
    offset: int
    length: int
    position: int


class Extents:
    """A packed stream's extents, in logical order, contiguous from ``start`` to ``end``."""

    __slots__ = ("_a",)

    def __init__(self) -> None:
        self._a = array("q")

    def __len__(self) -> int:
        return len(self._a) // _FIELDS

    @property
    def start(self) -> int:
        return self._a[3] if self._a else 0

    @property
    def end(self) -> int:
        a = self._a
        return a[-1] + a[-2] if a else 0

    @property
    def nbytes(self) -> int:
        """What the extents take in memory (the array object and its buffer)."""
        return sys.getsizeof(self._a)

    def add(self, where: int, generation: int, offset: int, length: int, position: int) -> None:
        """Records at ``offset`` of a file hold ``[position, position + length)``, which must follow
        the last extent (a log writes its records in order). Merged with the last extent when they
        follow it in the same file too."""
        if length <= 0:
            raise ValueError(f"an extent of {length} bytes")
        a = self._a
        if a and position != a[-1] + a[-2]:  # ``end``, without a property call per round
            raise ValueError(f"an extent at {position}: the stream's bytes end at {self.end}")
        key = generation * 2 + where
        if a and a[-4] == key and a[-3] + a[-2] == offset:
            a[-2] += length
            return
        a.extend((key, offset, length, position))
        # array over-allocates as it grows (by up to 7 items past 8, a ~60% excess for the handful of
        # extents an idle stream keeps): keep a small buffer exact. Not a large one: a hot stream adds
        # an extent per round until the checkpoint coalesces them, and copying each time would be
        # quadratic, while past _EXACT_UP_TO extents the excess is a few percent.
        if _FIELDS < len(a) <= _EXACT_UP_TO * _FIELDS:
            self._a = array("q", a)

    def rows(self) -> tuple[int, ...]:
        """Every extent as four integers in a row (file key = generation * 2 + where, file offset,
        length, logical position), as one flat tuple: a reader thread's copy, made on the loop in
        well under a microsecond for a few extents (``packview.PackedView``)."""
        return tuple(self._a)

    def files(self) -> set[tuple[int, int]]:
        """The (where, generation) of every file holding some of the stream's bytes."""
        a = self._a
        return {(a[i] & 1, a[i] >> 1) for i in range(0, len(a), _FIELDS)}

    def pieces(self, start: int, stop: int) -> list[Piece]:
        """The parts of the files that hold logical ``[start, stop)`` (clipped to the extents).
        Raises ValueError for a ``start`` before the first extent."""
        a = self._a
        n = len(a) // _FIELDS
        if start < self.start:
            raise ValueError(f"position {start} before the stream's first extent at {self.start}")
        i = bisect_right(range(n), start, key=lambda k: a[k * _FIELDS + 3]) - 1
        out: list[Piece] = []
        while i < n and start < stop:
            key, offset, length, position = a[i * _FIELDS : (i + 1) * _FIELDS]
            skip = start - position
            take = min(length - skip, stop - start)
            if take > 0:
                out.append(Piece(key & 1, key >> 1, offset + skip, take, start))
                start += take
            i += 1
        return out

    def in_file(self, where: int, generation: int) -> list[tuple[int, int, int]]:
        """The extents in file (``where``, ``generation``) as (offset, length, position), in order
        (``in_file_flat``, as rows)."""
        return flat_rows(self.in_file_flat(where, generation))

    def in_file_flat(self, where: int, generation: int) -> array:
        """``in_file`` as a flat copy of the extents (file key, offset, length, position each): one
        C-level slice when they are one run, and an object the garbage collector does not track. A
        checkpoint's ``PackBook.plan`` takes this of every stream it carries, on the loop, and the
        carry thread makes the rows (``flat_rows``): a tuple a row on the loop (10 for a stream with
        10 rounds in the file) was the largest item of ``plan``, with the young collections they
        set off (issue 16). The keys are copied out and counted at C speed (``_matching``): a
        retired WAL file's extents are the stream's last ones but those of the WAL files after it."""
        a = self._a
        matched = self._matching(where, generation)
        if not matched:
            return array("q")
        start, stop = matched[0], matched[-1] + _FIELDS
        if stop - start == len(matched) * _FIELDS:
            return a[start:stop]
        out = array("q")
        for i in matched:
            out += a[i : i + _FIELDS]
        return out

    def _matching(self, where: int, generation: int) -> list[int]:
        """The array index of each extent in file (``where``, ``generation``), in order. Counted
        and checked at C speed when they are one run (the usual case: a checkpoint asks this of
        every stream it carries, ``in_file`` and ``relocate``)."""
        a = self._a
        key = generation * 2 + where
        keys = a[::_FIELDS]
        try:
            first = keys.index(key)
        except ValueError:
            return []
        count = keys.count(key)
        if count == 1 or keys[first : first + count].count(key) == count:
            return list(range(first * _FIELDS, (first + count) * _FIELDS, _FIELDS))
        return [k * _FIELDS for k in range(first, len(keys)) if keys[k] == key]

    def relocate(
        self,
        where: int,
        generation: int,
        moved: Iterable[tuple[int, int, int]],
        to: tuple[int, int],
        *,
        known_only: bool = False,
    ) -> None:
        """The extents in file (``where``, ``generation``) are now the ``moved`` ranges (offset,
        length, position) of file ``to`` (a checkpoint carried them into a pack). The logical ranges
        they cover must be exactly the ones removed: the bytes moved, none were lost or added.

        The extents before the first one moved stay as they are (one C-level slice): only the rest is
        rebuilt, so relocating a retired WAL file's extents (the stream's last ones) costs what they
        are, not every pack the stream has (issue 16). With ``known_only`` the ``moved`` ranges that
        do not start where one of the file's extents starts are left out (a pack's rewrite moves
        every entry of the stream, the void ones too), and a stream with none there is left as is."""
        a = self._a
        matched = self._matching(where, generation)
        if known_only:
            if not matched:
                return
            starts = {a[i + 3] for i in matched}
            moved = [row for row in moved if row[2] in starts]
        self._replace(matched, {generation * 2 + where}, list(moved), to)

    def merge(
        self,
        files: Iterable[tuple[int, int]],
        moved: list[tuple[int, int, int]],
        to: tuple[int, int],
    ) -> None:
        """The extents in any of ``files`` ((where, generation) each) are now the ``moved`` ranges
        (offset, length, position) of file ``to``: a checkpoint merged the stream's last pack extents
        and its retired WAL file's records into one entry of the new pack (``merge_choice``). The
        logical ranges must be exactly the ones removed, as for ``relocate``."""
        keys = {generation * 2 + where for where, generation in files}
        a = self._a
        matched = [i for i in range(0, len(a), _FIELDS) if a[i] in keys]
        self._replace(matched, keys, moved, to)

    def _replace(
        self,
        matched: list[int],
        keys: set[int],
        moved: list[tuple[int, int, int]],
        to: tuple[int, int],
    ) -> None:
        """``relocate`` and ``merge``: the extents at array indexes ``matched`` (those whose file
        key is in ``keys``, in order) replaced by ``moved``; the ones before the first are kept as
        they are (one C-level slice)."""
        a = self._a
        if self._replace_run(matched, moved, to):
            return
        head = matched[0] if matched else len(a)
        gone = [(a[i + 3], a[i + 2]) for i in matched]
        came = [(position, length) for _, length, position in moved]
        if _covered(gone) != _covered(came):
            raise ValueError(
                f"relocating extents of files {sorted(keys)}: {sorted(came)} do not cover "
                f"{sorted(gone)}"
            )
        new_key = to[1] * 2 + to[0]
        tail = [
            (a[i], a[i + 1], a[i + 2], a[i + 3])
            for i in range(head, len(a), _FIELDS)
            if a[i] not in keys
        ]
        tail += [(new_key, offset, length, position) for offset, length, position in moved]
        tail.sort(key=lambda extent: extent[3])
        fresh = Extents()
        fresh._a = a[:head]  # a new array: the old one is left as it was
        for k, offset, length, position in tail:
            if fresh._a and position != fresh.end:
                raise ValueError(f"relocating leaves a gap at {fresh.end}")
            fresh.add(k & 1, k >> 1, offset, length, position)
        self._a = fresh._a

    def _replace_run(
        self, matched: list[int], moved: list[tuple[int, int, int]], to: tuple[int, int]
    ) -> bool:
        """``_replace`` when ``matched`` is one run of extents and ``moved`` covers exactly its
        logical bytes (every checkpoint's relocation of a retired WAL file's extents, and every
        merge): the extents before and after the run kept as two C-level slices, only ``moved``
        added in Python. The same array ``_replace`` builds (the run's bytes are contiguous in
        logical order, so sorting puts ``moved`` in its place); False, nothing changed, for any
        other case (``_replace`` checks it and says what is wrong). Issue 16: the general path's
        sorts, coverage lists and an ``add`` per extent were the largest item of ``carried_out``."""
        a = self._a
        if not matched or not moved:
            return False
        head, stop = matched[0], matched[-1] + _FIELDS
        if stop - head != len(matched) * _FIELDS:
            return False
        new_key = to[1] * 2 + to[0]
        rows = sorted(moved, key=lambda row: row[2]) if len(moved) > 1 else moved
        end = a[head + 3]
        for _, length, position in rows:
            if position != end or length <= 0:
                return False
            end += length
        if end != a[stop - 1] + a[stop - 2]:
            return False
        if stop < len(a) and a[stop] == new_key:
            return False  # the next extent could join the last moved one: the general path
        fresh = Extents()
        fresh._a = a[:head]  # a new array: the old one is left as it was
        for offset, length, position in rows:
            fresh.add(to[0], to[1], offset, length, position)
        self._a = fresh._a + a[stop:] if stop < len(a) else fresh._a
        return True


# Merging (decision 0010, "Step 2c: merging a stream's pack extents"): a stream with more pack extents
# than ``MERGE_BASE_EXTENTS`` plus half the log2 of (its packed bytes / the round's new bytes) has its
# last ones merged with the new records into one entry of the new pack (``merge_choice``).
MERGE_BASE_EXTENTS = 4


def flat_iter(flat: array) -> Iterator[tuple[int, int, int]]:
    """The (offset, length, position) rows of ``Extents.in_file_flat``'s extents, in order, one at
    a time (``zip`` reuses its tuple when the caller keeps none)."""
    return zip(flat[1::_FIELDS], flat[2::_FIELDS], flat[3::_FIELDS], strict=True)


def flat_lengths(flats: Iterable[array]) -> dict[int, int]:
    """The (file offset -> length) of every extent of ``flats`` (``Extents.in_file_flat`` copies),
    for ``packs._read_ranges``: built at C speed, ints only (an (offset, length, position) tuple a
    record, 100,000 a checkpoint of 10,000 streams x 10 rounds, kept the carry thread's collector
    busy: issue 16)."""
    lengths: dict[int, int] = {}
    for flat in flats:
        lengths.update(zip(flat[1::_FIELDS], flat[2::_FIELDS], strict=True))
    return lengths


def flat_rows(flat: array) -> list[tuple[int, int, int]]:
    """``flat_iter`` as a list."""
    return list(flat_iter(flat))


def may_merge(extents: Extents, first: int) -> bool:
    """False if ``merge_choice`` must say [] for the stream's new records from logical ``first``
    on, whatever else it is given: it merges only when more than ``MERGE_BASE_EXTENTS`` - 1 pack
    extents come before the new records' first extent, so with fewer extents than that ahead of
    it there is nothing to choose. A C-level search instead of copying the rows and walking them
    in Python, for every stream a checkpoint carries (issue 16: most have too few)."""
    try:
        ahead = extents._a[3::_FIELDS].index(first)
    except ValueError:  # no extent starts there: ``merge_choice`` says [] too
        return False
    return ahead >= MERGE_BASE_EXTENTS


def merge_choice(
    rows: tuple[int, ...], create_pack: int, first: int, new_bytes: int
) -> list[tuple[int, int, int, int]]:
    """The pack extents (generation, offset, length, position), in order, that a checkpoint should
    merge with a stream's ``new_bytes`` of records carried from its retired WAL file (from logical
    ``first`` on) into one entry of the new pack; [] for none. ``rows``: ``Extents.rows()``.

    Why: a checkpoint adds one pack extent to each stream it carries, so a stream appended once per
    micro-batch gained one extent (and one more file a read touches, 32 bytes of memory, an index row)
    per checkpoint forever. The bound grows with the log of the stream's bytes, and a merge takes the
    newest extent and then each older one no larger than what is merged so far (a binary counter
    over sizes): each byte is rewritten O(log) times over the stream's life, never the whole stream
    every checkpoint. The create's pack (header record, and the records of its first WAL file) is
    never merged: its entries there include the create, which only a drop or promotion voids. The
    stream's entries in a pack are voided together (by id, in its sidecar), so a pack is merged
    whole or not at all."""
    try:  # the new records' first extent (a C-level search: every carried stream asks)
        stop = rows[3::_FIELDS].index(first) * _FIELDS
    except ValueError:
        stop = -1
    start = stop
    while start > 0:
        key = rows[start - _FIELDS]
        if key & 1 != IN_PACK or key >> 1 == create_pack:
            break
        start -= _FIELDS
    count = (stop - start) // _FIELDS
    if count <= 0:
        return []
    total = new_bytes + sum(rows[i + 2] for i in range(start, stop, _FIELDS))
    ratio = max(1, total // max(1, new_bytes))
    if count + 1 <= MERGE_BASE_EXTENTS + (ratio.bit_length() - 1) // 2:
        return []
    acc = new_bytes
    cut = stop
    while cut > start:
        length = rows[cut - _FIELDS + 2]
        if cut < stop and length > acc:
            break
        acc += length
        cut -= _FIELDS
    # Never split a pack: take the older extents of a pack already taken (if they are candidates).
    while True:
        taken = {rows[i] >> 1 for i in range(cut, stop, _FIELDS)}
        before = [
            i for i in range(0, cut, _FIELDS) if rows[i] & 1 == IN_PACK and rows[i] >> 1 in taken
        ]
        if not before:
            break
        if before[0] < start:
            return []
        cut = before[0]
    if not {g * 2 + IN_PACK for g in taken}.isdisjoint(rows[stop::_FIELDS]):
        return []
    return [
        (rows[i] >> 1, rows[i + 1], rows[i + 2], rows[i + 3]) for i in range(cut, stop, _FIELDS)
    ]


def _covered(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` (position, length) merged where they touch: the logical bytes they cover."""
    out: list[tuple[int, int]] = []
    for position, length in sorted(ranges):
        if out and out[-1][0] + out[-1][1] == position:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((position, length))
    return out


def coalesce(entries: list[WalEntry]) -> list[WalEntry]:
    """One stream's packed entries of a file, in order, merged where their records follow each other
    (``offset`` is the logical position in the virtual segment 0): a checkpoint writes a stream's
    rounds of one WAL file into its pack as one entry, so the stream has one extent there. The
    records are the same bytes; only the entry framing between them goes.

    Linear: each run's records and end are kept as it grows (re-summing and re-copying the run at
    every entry made a stream of 5,000 rounds cost 250 ms of the checkpoint)."""
    runs: list[tuple[WalEntry, list[bytes | bytearray | memoryview], int]] = []
    for entry in entries:
        size = sum(map(len, entry.records))
        if runs:
            first, records, end = runs[-1]
            if first.log_id == entry.log_id and first.kind == entry.kind and end == entry.offset:
                records += entry.records
                runs[-1] = (first, records, end + size)
                continue
        if size:
            runs.append((entry, [*entry.records], entry.offset + size))
    return [
        first
        if len(records) == len(first.records)
        else WalEntry(first.log_id, first.segment, first.offset, records, first.kind)
        for first, records, _ in runs
    ]


def records_offsets(
    entries: list[WalEntry], base: int = 0, sizes: list[int] | None = None
) -> list[int]:
    """Where each entry's records start in a file that holds ``entries`` encoded one after the other
    from ``base`` (``wal.encode_entry``): the ``offset`` of their extents. ``sizes``: each entry's
    records bytes, if the caller knows them (a checkpoint does: not summed again)."""
    if sizes is None:
        sizes = [sum(map(len, entry.records)) for entry in entries]  # no generator frame per entry
    out = []
    at = base
    for entry, size in zip(entries, sizes, strict=True):
        start = at + HEAD_SIZE + FIXED_SIZE + len(entry.log_id)
        out.append(start)
        at = start + size
    return out
