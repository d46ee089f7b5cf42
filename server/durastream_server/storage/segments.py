"""Segment files of one log and blocking, bounded reads over them.

A log is a sequence of segment files ``<base:020d>.seg``; ``base`` is the global file offset of the
segment's first byte, so a log has one continuous "global offset" space and the next segment's name is
always the previous one's base plus its size (recovery uses that to spot a missing segment). A record
never spans two segments; appends only go to the last one.

Everything here runs in a worker thread (or, for the rare sync boundary checks, briefly on the loop)
and reads with ``pread`` through the shared ``FdCache``: a read costs the record headers between the
index point and the start, plus the payload it returns, never a whole segment.
"""

from __future__ import annotations

import os
import re
import sys
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from durastream_server.storage import codec
from durastream_server.storage.codec import APPEND_FIXED, APPEND_FIXED_SIZE, FRAME, FRAME_SIZE
from durastream_server.storage.files import FdCache, Handle, pread_exact

SEGMENT_RE = re.compile(r"\A(\d{20})\.seg\Z")
READ_BLOCK = 64 * 1024
# Records up to this size are read whole (and checksummed) even when only part of them is returned.
VERIFY_WHOLE_LIMIT = 256 * 1024


def segment_name(base: int) -> str:
    return f"{base:020d}.seg"


_new_tuple = tuple.__new__
_FIRST = (0,)  # the bases of a log with its first segment only (shared: tuples are immutable)


class SegmentTable:
    """The segment bases of one log. Replaced (never changed in place) only on the loop; readers work
    on a ``view()``.

    ``bases`` is a tuple: most logs have one segment for life, and a tuple of one is half the memory of
    a list of one (issue 17); a new segment (every ``--segment-bytes``) builds a new tuple (``extend``),
    and a view shares it instead of copying it.
    """

    # The stream directory is the data directory's ``streams/`` (one interned string for every log)
    # joined with the log id when asked for: not a ~100-byte path string per stream (issue 17).
    __slots__ = ("_root", "log_id", "bases")

    def __init__(self, directory: str, log_id: str, bases: Sequence[int]) -> None:
        root, name = os.path.split(directory)
        if name != log_id:
            raise ValueError(
                f"segment directory {directory!r} is not named after its log {log_id!r}"
            )
        self._root = sys.intern(root)
        self.log_id = log_id
        self.bases = tuple(bases)

    @classmethod
    def first(cls, root: str, log_id: str) -> SegmentTable:
        """The table of a new log in ``root``/``log_id`` with its first segment only: a create's,
        without ``__init__``'s split and check of a joined path (``root`` already interned)."""
        table = cls.__new__(cls)
        table._root = root
        table.log_id = log_id
        table.bases = _FIRST
        return table

    def extend(self, bases: Sequence[int]) -> None:
        """New segments (ascending, after the last)."""
        self.bases += tuple(bases)

    @property
    def directory(self) -> str:
        return os.path.join(self._root, self.log_id)

    def path(self, base: int) -> str:
        return os.path.join(self.directory, segment_name(base))

    def key(self, base: int) -> tuple[str, int]:
        return (self.log_id, base)

    @property
    def last(self) -> int:
        return self.bases[-1]

    def view(self, end: int) -> SegmentView:
        # The streams directory, not the log's: a multi-range read plans a view of each of 10,000
        # logs on the loop, and joining their paths there cost ~5 us a range (the reading thread
        # joins a segment's path in one step when it opens it).
        # ``tuple.__new__``: not the NamedTuple's Python ``__new__`` (one view a range planned).
        return _new_tuple(SegmentView, (self._root, self.log_id, self.bases, end))


class SegmentView(NamedTuple):
    """An immutable picture of a log's segments up to a durable ``end`` (for a worker thread). A
    tuple: a multi-range read plans one a range on the loop, and a frozen dataclass sets each field
    through ``object.__setattr__`` in Python (~0.6 us more a view)."""

    root: str  # the data directory's ``streams/``: the log's directory is ``root/log_id``
    log_id: str
    bases: tuple[int, ...]
    end: int

    @property
    def directory(self) -> str:
        return os.path.join(self.root, self.log_id)

    def path(self, base: int) -> str:
        """The file of the segment at ``base`` (formatted in one step, not joined: ~1 us a range of a
        multi-range read, which opens 10,000 files)."""
        return f"{self.root}{os.sep}{self.log_id}{os.sep}{base:020d}.seg"

    def locate(self, offset: int) -> tuple[int, int]:
        """(base, segment end) of the segment holding global ``offset``."""
        i = bisect_right(self.bases, offset) - 1
        if i < 0:
            raise ValueError(f"offset {offset} before the first segment")
        seg_end = self.bases[i + 1] if i + 1 < len(self.bases) else self.end
        return self.bases[i], seg_end

    def window(self, cache: FdCache, block: int = READ_BLOCK, *, evict: bool = True) -> Window:
        """A ``Window`` over this view (a packed stream's view gives its own: ``packview.py``)."""
        return Window(self, cache, block, evict=evict)

    @property
    def last_start(self) -> int:
        """Where the last segment starts (``reader.read_one_record`` reads within it only)."""
        return self.bases[-1]

    def acquire_last(self, cache: FdCache, evict: bool) -> tuple[Handle, int]:
        """The last segment's file handle and its shift (global offset - file offset)."""
        base = self.bases[-1]
        return cache.acquire((self.log_id, base), self.path(base), evict=evict), base


class ReadView(Protocol):
    """What the read algorithms need of a log's bytes: a ``SegmentView`` (a stream directory) or a
    ``packview.PackedView`` (a packed stream's pieces in shared files), both up to a durable ``end``."""

    @property
    def log_id(self) -> str: ...

    @property
    def end(self) -> int: ...

    @property
    def last_start(self) -> int: ...

    def window(self, cache: FdCache, block: int = READ_BLOCK, *, evict: bool = True) -> Window: ...

    def acquire_last(self, cache: FdCache, evict: bool) -> tuple[Handle, int]: ...


class Window:
    """Read-ahead over a log's global offset space, one segment at a time, holding at most one block.

    Small reads (record headers, small payloads) come from a READ_BLOCK buffer; larger ones go straight
    to ``pread`` so big messages are never copied twice.
    """

    def __init__(
        self, segs: SegmentView, cache: FdCache, block: int = READ_BLOCK, *, evict: bool = True
    ) -> None:
        self._segs = segs
        self._cache = cache
        self._block = block
        self._evict = evict  # FdCache.acquire: False for reads of many files once each
        self._buf = b""
        self._buf_off = 0
        self._handle: Handle | None = None
        self._handle_base = -1

    def close(self) -> None:
        if self._handle is not None:
            self._cache.release(self._handle)
            self._handle = None
            self._handle_base = -1

    def __enter__(self) -> Window:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _segment(self, offset: int) -> tuple[Handle, int, int]:
        base, seg_end = self._segs.locate(offset)
        if self._handle is None or self._handle_base != base:
            self.close()
            segs = self._segs
            self._handle = self._cache.acquire(
                (segs.log_id, base), segs.path(base), evict=self._evict
            )
            self._handle_base = base
        return self._handle, base, seg_end

    def ensure(self, offset: int, length: int, *, partial: bool = False) -> tuple[bytes, int]:
        """``(buf, i)`` with ``buf[i : i + length]`` the bytes at global ``offset``.

        The range must lie in one segment, else ``CorruptRecord``; with ``partial`` it is clipped to the
        segment end instead (at least one byte must remain).
        """
        buf = self._buf
        rel = offset - self._buf_off
        if rel >= 0 and rel + length <= len(buf):
            return buf, rel
        handle, base, seg_end = self._segment(offset)
        if offset + length > seg_end:
            if not partial or offset >= seg_end:
                raise codec.CorruptRecord(f"record at {offset} runs past the end of its segment")
            length = seg_end - offset
            if rel >= 0 and rel + length <= len(buf):
                return buf, rel
        if length > self._block:
            return pread_exact(handle.fd, length, offset - base), 0
        want = min(max(length, self._block), seg_end - offset)
        self._buf = buf = pread_exact(handle.fd, want, offset - base)
        self._buf_off = offset
        return buf, 0

    def get(self, offset: int, length: int) -> memoryview:
        """Exactly ``length`` bytes at global ``offset`` (within one segment), or raise CorruptRecord."""
        buf, rel = self.ensure(offset, length)
        return memoryview(buf)[rel : rel + length]


@dataclass(slots=True)
class RecordRef:
    """An APPEND record found by a scan: where it is and what it covers, without its payload."""

    offset: int  # global offset of the frame
    frame: codec.FrameInfo
    position: int
    timestamp_ms: int
    n_messages: int
    meta_len: int

    @property
    def payload_offset(self) -> int:
        return self.offset + FRAME_SIZE + APPEND_FIXED_SIZE + self.meta_len

    @property
    def payload_len(self) -> int:
        return self.frame.body_len - APPEND_FIXED_SIZE - self.meta_len

    @property
    def end(self) -> int:
        return self.position + self.payload_len

    @property
    def record_len(self) -> int:
        return FRAME_SIZE + self.frame.body_len

    def lengths(self, window: Window) -> tuple[int, ...]:
        n = self.n_messages
        if n == 1:
            return (self.payload_len,)
        if n == 0:
            return ()
        at = self.payload_offset - 4 * n
        return codec.struct.unpack(f"<{n}I", window.get(at, 4 * n))


def iter_appends(window: Window, offset: int, end: int) -> Iterator[RecordRef]:
    """APPEND records from ``offset`` (a record start) to global ``end``; other kinds are skipped."""
    while offset < end:
        magic, version, kind, body_len, crc = FRAME.unpack(window.get(offset, FRAME_SIZE))
        if magic != codec.MAGIC or version != codec.FORMAT_VERSION:
            raise codec.CorruptRecord(f"bad frame at file offset {offset}")
        frame = codec.FrameInfo(kind, body_len, crc)
        if kind == codec.Kind.APPEND:
            position, ts, n, meta_len, _flags = APPEND_FIXED.unpack(
                window.get(offset + FRAME_SIZE, APPEND_FIXED_SIZE)
            )
            yield RecordRef(offset, frame, position, ts, n, meta_len)
        offset += FRAME_SIZE + body_len
