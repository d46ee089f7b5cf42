"""Reads of a packed stream through its extents (decision 0010, step 2, piece 2).

A packed stream with records has no segment file: its virtual segment 0 (header record, then its
records) lies in pieces of shared files, WAL files and packs (``extents.py``). ``PackedView`` is the
``segments.SegmentView`` of such a stream: the same global offsets (the index's), so the read
algorithms (``reader.py``, ``ordinals.py``, ``times.py``) run unchanged over a ``PackedWindow``, which
maps each offset to its piece's file. Files go through the shared ``FdCache`` keyed by the file, not
the stream: one fd per WAL file or pack however many streams it holds (10,000 small streams in two
packs read through two fds, where their directories took 10,000 opens).

Why a view can be stale, and what keeps a read right. A view is planned on the loop from the log's
extents and read later in a worker thread. Meanwhile a checkpoint may rewrite a pack under the same name
(its void entries dropped: the live ones move to other offsets) or remove a WAL file whose records it
carried into a pack; the loop then relocates the extents (``Extents.relocate``). A read that opened the
file before the rename reads the old inode, which still holds the bytes its extents name; a read that
opened it after the rename would read other bytes at those offsets. ``PackFiles`` is a sequence lock
over such moves: the loop counts a move as begun, naming the files it may rename over or remove, before
the thread that does it starts (``moving``), and as done after the extents are relocated (``moved``). A
view carries the count of moves done when it was planned (``stamp``) and its handles are cached under
it; after acquiring a file's handle the reader checks that no move of *that file* has begun since (nor
was in flight when it was planned). If one has, the view may be stale and the read raises ``Replan``:
``StreamLog`` plans it again (after the move, the extents are the new ones). Reads of the other files
go on during a move. A handle cached under an old stamp is never used by a later view (a different
key) and ages out of the LRU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from durastream_server.storage import codec
from durastream_server.storage.extents import IN_PACK, Extents
from durastream_server.storage.files import FdCache, Handle
from durastream_server.storage.segments import READ_BLOCK, Window

_PACK_TAG = "pack"
_new_tuple = tuple.__new__
_WAL_TAG = "wal"


class Replan(Exception):
    """A packed read's files moved since it was planned (a checkpoint rewrote or removed one): plan
    it again from the log's current extents."""


class PackFiles:
    """Where packs and WAL files are, and the sequence lock over their moves (module docstring).
    ``moving``/``moved`` and planning run on the loop; ``acquire`` in worker threads."""

    __slots__ = ("root", "_packs", "_wal", "_paths", "_touched", "begun", "done")

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._packs = os.path.join(os.fspath(root), "packs")
        self._wal = os.path.join(os.fspath(root), "wal")
        self._paths: dict[tuple[int, int], str] = {}
        # (where, generation) -> the count of the last move that named it (``moving``).
        self._touched: dict[tuple[int, int], int] = {}
        self.begun = 0
        self.done = 0

    def moving(self, files: Iterable[tuple[int, int]]) -> None:
        """Before ``files`` ((where, generation) each), which extents may name, are renamed over or
        removed (the checkpoint's packs)."""
        self.begun += 1
        touched = self._touched
        if len(touched) >= 4096:  # forget moves long done (none of them is in flight)
            for key in [k for k, n in touched.items() if n <= self.done]:
                del touched[key]
        for key in files:
            touched[key] = self.begun

    def moved(self) -> None:
        """After the extents point at where the bytes are now (or the move failed and nothing moved
        that extents name)."""
        self.done = self.begun

    def path(self, where: int, generation: int) -> str:
        path = self._paths.get((where, generation))
        if path is None:  # a few files: their names are kept, not formatted per read
            if where == IN_PACK:
                path = f"{self._packs}{os.sep}{generation:020d}.pack"
            else:
                path = f"{self._wal}{os.sep}{generation:020d}.wal"
            if len(self._paths) >= 4096:  # generations come and go over a server's life
                self._paths.clear()
            self._paths[(where, generation)] = path
        return path

    def acquire(self, cache: FdCache, where: int, generation: int, stamp: int) -> Handle:
        """The cached handle of the file (``where``, ``generation``) as it was when a view with
        ``stamp`` was planned. Raises ``Replan`` if a move began since (or the file is gone)."""
        key = (_PACK_TAG if where == IN_PACK else _WAL_TAG, generation, stamp)
        try:
            handle = cache.acquire(key, self.path(where, generation))
        except FileNotFoundError:
            raise Replan(f"file {self.path(where, generation)} is gone") from None
        if self._touched.get((where, generation), 0) > stamp:
            cache.release(handle)
            raise Replan("a checkpoint moved packed records since the read was planned")
        return handle


class PackedView(NamedTuple):
    """An immutable picture of a packed stream's pieces up to a durable ``end`` (for a worker thread):
    the counterpart of ``segments.SegmentView``. ``rows``: ``Extents.rows()``, four integers an
    extent (file key = generation * 2 + where, file offset, length, logical position), copied on the
    loop when the read is planned (a tuple copy: planning 10,000 reads on the loop must stay cheap).
    A tuple itself for the same reason (``segments.SegmentView``)."""

    log_id: str
    rows: tuple[int, ...]
    end: int
    files: PackFiles
    stamp: int

    @classmethod
    def of(cls, log_id: str, extents: Extents, end: int, files: PackFiles) -> PackedView:
        """Planned on the loop, from the log's extents as they are now."""
        # ``tuple.__new__``: not the NamedTuple's Python ``__new__`` (one view a range planned).
        return _new_tuple(cls, (log_id, extents.rows(), end, files, files.done))

    def window(self, cache: FdCache, block: int = READ_BLOCK, *, evict: bool = True) -> Window:
        # Always cached (``evict`` ignored): a few files hold every packed stream, so a read of
        # 10,000 of them must reuse their fds, not open one privately per stream.
        return PackedWindow(self, cache, block)

    @property
    def last_start(self) -> int:
        """Where the piece holding the last byte starts (``reader.read_one_record`` reads within
        it only)."""
        if self.end <= 0 or not self.rows:
            return self.end
        return self.rows[self.locate(self.end - 1)[0] + 3]

    def acquire_last(self, cache: FdCache, evict: bool) -> tuple[Handle, int]:
        """The file handle of the piece holding the last byte, and its shift (global offset - file
        offset)."""
        i, shift, _ = self.locate(self.end - 1)
        key = self.rows[i]
        return self.files.acquire(cache, key & 1, key >> 1, self.stamp), shift

    def locate(self, offset: int) -> tuple[int, int, int]:
        """(row index, shift, piece end) of the extent holding global ``offset``: searched from the
        last (reads are mostly near the end, and a stream has a handful of extents)."""
        rows = self.rows
        if 0 <= offset < self.end:
            for i in range(len(rows) - 4, -1, -4):
                position = rows[i + 3]
                if position <= offset:
                    stop = position + rows[i + 2]
                    if offset >= stop:
                        break
                    return i, position - rows[i + 1], min(stop, self.end)
        raise codec.CorruptRecord(f"offset {offset} outside the packed stream's extents")


class PackedWindow(Window):
    """``segments.Window`` over a ``PackedView``: a piece is read as a segment is (a record never
    spans two pieces: a piece is a round's or a checkpoint's whole records, or the header), its file
    handle kept while consecutive pieces are in the same file."""

    def __init__(self, view: PackedView, cache: FdCache, block: int = READ_BLOCK) -> None:
        super().__init__(view, cache, block)  # type: ignore[arg-type]
        self._view = view
        self._file = -1

    def _segment(self, offset: int) -> tuple[Handle, int, int]:
        view = self._view
        i, shift, piece_end = view.locate(offset)
        key = view.rows[i]
        if self._handle is None or self._file != key:
            self.close()
            self._handle = view.files.acquire(self._cache, key & 1, key >> 1, view.stamp)
            self._file = key
        return self._handle, shift, piece_end
