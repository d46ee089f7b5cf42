"""Blocking read algorithms over a log's durable records: ranged reads.

They start at an index point (a record start at or before the wanted position), walk record headers
forward and read only the payload they return. Callers run ``read_range`` in a worker thread.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import accumulate, islice, repeat

from durastream_server.storage import codec
from durastream_server.storage.codec import APPEND_FIXED_SIZE, FRAME, CorruptRecord, Kind
from durastream_server.storage.columns import MessageColumns
from durastream_server.storage.crc import crc32
from durastream_server.storage.files import FdCache, pread_exact
from durastream_server.storage.records import AppendEntry, MessageRun, MessageSlice
from durastream_server.storage.segments import (
    FRAME_SIZE,
    READ_BLOCK,
    VERIFY_WHOLE_LIMIT,
    ReadView,
    SegmentView,
)


class NotABoundary(ValueError):
    """A whole-message read or boundary lookup started inside a message."""


_HEAD = struct.Struct("<2sBBIIQqIIB")  # frame header + fixed APPEND fields, parsed in one go
_HEAD_SIZE = _HEAD.size
_APPEND = int(Kind.APPEND)
_APPEND_SEED = crc32(bytes([_APPEND]))
_VERSION = codec.FORMAT_VERSION
_MAGIC = codec.MAGIC


def read_range(
    segs: ReadView,
    cache: FdCache,
    scan_from: int,
    start: int,
    cap: int,
    max_bytes: int,
    whole_messages: bool,
    runs: bool = False,
    overhead: int = 0,
    *,
    evict: bool = True,
) -> tuple[list[MessageSlice | MessageRun], int, int]:
    """Read payload in ``[start, cap)`` (about ``max_bytes``), scanning records from ``scan_from``.
    ``evict``: as in ``FdCache.acquire``.

    Returns the slices, the position after the last returned byte and how many messages (or byte-stream
    pieces) they hold. Raises ``NotABoundary`` for a whole-message read that starts inside a message and
    ``codec.CorruptRecord`` on checksum failure. This is the read hot path, so it parses headers inline
    rather than through ``iter_appends``.

    Each message (or piece of one) costs its bytes plus ``overhead`` against ``max_bytes``, so a read
    of tiny messages returns a bounded number of them (whole-message reads still return at least one).
    With ``runs`` (whole-message reads only), the messages returned from one record come back as one
    ``MessageRun`` instead of a ``MessageSlice`` each; the messages of a record are picked with a binary
    search over their ends, never a Python loop per message.
    """
    out: list[MessageSlice | MessageRun] = []
    got = 0
    count = 0
    next_pos = start
    budget = max(1, max_bytes)
    end = segs.end
    off = scan_from
    with segs.window(cache, evict=evict) as window:
        ensure = window.ensure
        while off < end and got < budget:
            buf, rel = ensure(off, _HEAD_SIZE, partial=True)
            if len(buf) - rel >= _HEAD_SIZE:
                magic, version, kind, body_len, crc, position, ts, n, meta_len, _ = (
                    _HEAD.unpack_from(buf, rel)
                )
            else:  # a short non-APPEND record at the very end of a segment
                magic, version, kind, body_len, crc = FRAME.unpack_from(*ensure(off, FRAME_SIZE))
                if kind == _APPEND:
                    raise CorruptRecord(f"append record at {off} is cut short")
            if magic != _MAGIC or version != _VERSION:
                raise CorruptRecord(f"bad frame at file offset {off}")
            rec_len = FRAME_SIZE + body_len
            if kind != _APPEND:
                off += rec_len
                continue
            if position >= cap:
                break
            payload_len = body_len - APPEND_FIXED_SIZE - meta_len
            if position + payload_len <= next_pos:
                off += rec_len  # wholly before the start (or empty)
                continue
            if n == 1:
                lengths: tuple[int, ...] = (payload_len,)
            else:
                lbuf, lrel = ensure(off + _HEAD_SIZE + meta_len - 4 * n, 4 * n)
                lengths = struct.unpack_from(f"<{n}I", lbuf, lrel)
            # Pick the messages (or byte ranges of them) of this record: (pos, from, to, whole),
            # with from/to relative to the record's payload; whole-message reads pick one run [i, j).
            picks: list[tuple[int, int, int, bool]] = []
            run: tuple[int, int, list[int]] | None = None
            done = False
            if whole_messages and min(lengths) > 0:
                ends = list(accumulate(lengths, initial=position))  # ends[k]: message k's start
                i = bisect_left(ends, next_pos)
                if ends[i] != next_pos:
                    raise NotABoundary(f"position {start} is inside a message")
                last = bisect_right(ends, cap) - 1  # messages up to ``last`` end by ``cap``
                room = budget - got
                base = next_pos + i * overhead  # cost of [i, j) is ends[j] - base + j * overhead

                def cost(j: int, ends: list[int] = ends, base: int = base) -> int:
                    return ends[j] - base + j * overhead

                j = i + bisect_right(range(i, last + 1), room, key=cost) - 1
                if j == i and not got and last > i:
                    j = i + 1  # at least one message, however large
                done = j < n
                if j > i:
                    run = (i, j, ends)
                    got += cost(j)
                    count += j - i
                    next_pos = ends[j]
            else:
                m_pos = position
                rel_m = 0
                for length in lengths:
                    m_end = m_pos + length
                    if m_end > next_pos:
                        if whole_messages:
                            if m_pos < next_pos:
                                raise NotABoundary(f"position {start} is inside a message")
                            if m_end > cap or (got and got + length + overhead > budget):
                                done = True
                                break
                            picks.append((m_pos, rel_m, rel_m + length, True))
                            got += length + overhead
                            next_pos = m_end
                        else:
                            span = _byte_span(m_pos, m_end, next_pos, cap, budget, got, overhead)
                            if span is None:
                                done = True
                                break
                            lo, hi = span
                            picks.append(
                                (
                                    lo,
                                    rel_m + lo - m_pos,
                                    rel_m + hi - m_pos,
                                    lo == m_pos and hi == m_end,
                                )
                            )
                            got += hi - lo + overhead
                            next_pos = hi
                            if hi < m_end:
                                done = True
                                break
                    m_pos = m_end
                    rel_m += length
                count += len(picks)
            if run is not None:
                first, last_byte = run[2][run[0]] - position, run[2][run[1]] - position
            elif picks:
                first, last_byte = picks[0][1], picks[-1][2]
            else:
                if done:
                    break
                off += rec_len
                continue
            rbuf, p = _payload(ensure, off, meta_len, body_len, crc, payload_len, first, last_byte)
            if run is not None:
                i, j, ends = run
                if runs:
                    out.append(
                        MessageRun(ends[i], rbuf[p + first : p + last_byte], lengths[i:j], ts)
                    )
                else:
                    bounds = [p + e - position for e in ends[i : j + 1]]
                    out.extend(
                        map(
                            MessageSlice,
                            ends[i:j],
                            map(rbuf.__getitem__, map(slice, bounds, islice(bounds, 1, None))),
                            repeat(ts),
                        )
                    )
            else:
                for pos, lo, hi, whole in picks:
                    out.append(MessageSlice(pos, rbuf[p + lo : p + hi], ts, whole))
            if done:
                break
            off += rec_len
    return out, next_pos, count


def read_one_record(
    segs: ReadView,
    cache: FdCache,
    scan_from: int,
    start: int,
    cap: int,
    max_bytes: int,
    overhead: int,
    *,
    evict: bool = True,
) -> tuple[list[MessageSlice | MessageRun], int, int] | None:
    """``read_range`` of a whole-message read with runs, when ``[start, cap)`` is exactly the one
    APPEND record at ``scan_from`` of the last segment and fits ``max_bytes``: the common read of an
    idle small stream written in one append (a packed Spark task reads 10,000 of them in one
    multi-range request). One ``pread`` of the record, its checksum, one ``MessageRun``: about a third
    of ``read_range``'s Python for such a read (no window, no per-message search). None when the read
    is anything else (``read_range`` then reads it, with its errors)."""
    rec_max = segs.end - scan_from
    if type(segs) is SegmentView:  # a directory stream's (inline: the multi-range read's hot path)
        shift = segs.bases[-1]
        if scan_from < shift or not _HEAD_SIZE <= rec_max <= READ_BLOCK:
            return None  # not one whole APPEND record's worth of the last segment: no read at all
        handle = cache.acquire((segs.log_id, shift), segs.path(shift), evict=evict)
    else:
        if scan_from < segs.last_start or not _HEAD_SIZE <= rec_max <= READ_BLOCK:
            return None
        handle, shift = segs.acquire_last(cache, evict)
    try:
        buf = pread_exact(handle.fd, rec_max, scan_from - shift)
    finally:
        cache.release(handle)
    return parse_one_record(buf, scan_from, start, cap, max_bytes, overhead)


def parse_one_record(
    buf: bytes,
    scan_from: int,
    start: int,
    cap: int,
    max_bytes: int,
    overhead: int,
    at: int = 0,
    stop: int = -1,
) -> tuple[list[MessageSlice | MessageRun], int, int] | None:
    """``read_one_record`` of the bytes ``buf[at:stop]`` (``stop`` -1: to the end of ``buf``) read
    at ``scan_from`` (up to the view's end): its answer, or None when they are not exactly the one
    APPEND record of ``[start, cap)`` within ``max_bytes``. Raises ``CorruptRecord`` on a checksum
    mismatch.

    ``at``/``stop``: the record is parsed where it lies in a ``pread`` of several neighbouring
    records (``preread_records``), not from a copy of its own."""
    found = _one_record(
        buf, scan_from, start, cap, max_bytes, overhead, at, len(buf) if stop < 0 else stop
    )
    if found is None:
        return None
    lengths, ts, payload_at, rec_end = found
    return [MessageRun(start, buf[payload_at:rec_end], lengths, ts)], cap, len(lengths)


def parse_record_into(
    out: MessageColumns,
    pre: Preread,
    scan_from: int,
    start: int,
    cap: int,
    max_bytes: int,
    overhead: int,
) -> int:
    """``parse_one_record`` of a ``preread_records`` item with its messages put straight into
    ``out``'s columns (a multi-range frames read): the same checks and the same checksum, no list,
    run or payload copy of its own. Returns the record's message count, or 0 (``out`` untouched)
    where ``parse_one_record`` gives None. Raises ``CorruptRecord`` on a checksum mismatch."""
    buf, at, stop = pre
    found = _one_record(buf, scan_from, start, cap, max_bytes, overhead, at, stop)
    if found is None:
        return 0
    lengths, ts, payload_at, rec_end = found
    out.lengths.extend(lengths)
    values = out.values
    out.shifts.append(start - len(values))
    out.counts.append(len(lengths))
    out.times.append(ts)
    values += memoryview(buf)[payload_at:rec_end]
    return len(lengths)


def _one_record(
    buf: bytes,
    scan_from: int,
    start: int,
    cap: int,
    max_bytes: int,
    overhead: int,
    at: int,
    stop: int,
) -> tuple[tuple[int, ...], int, int, int] | None:
    """The APPEND record at ``buf[at:stop]`` if it is exactly ``[start, cap)``, whole messages
    within ``max_bytes``, checksum verified: its messages' lengths, its append time and where its
    payload starts and ends in ``buf``. None when it is anything else."""
    magic, version, kind, body_len, crc, position, ts, n, meta_len, _ = _HEAD.unpack_from(buf, at)
    rec_end = at + FRAME_SIZE + body_len
    payload_len = body_len - APPEND_FIXED_SIZE - meta_len
    if (
        magic != _MAGIC
        or version != _VERSION
        or kind != _APPEND
        or position != start
        or position + payload_len != cap
        or rec_end > stop
        or n < 1
        or payload_len + n * overhead > max(1, max_bytes)
    ):
        return None
    if crc32(memoryview(buf)[at + FRAME_SIZE : rec_end], _APPEND_SEED) != crc:
        raise CorruptRecord(f"checksum mismatch in record at file offset {scan_from}")
    payload_at = rec_end - payload_len
    if n == 1:
        if not payload_len:
            return None
        return (payload_len,), ts, payload_at, rec_end
    lengths = _lengths(n).unpack_from(buf, payload_at - 4 * n)
    if 0 in lengths:
        return None
    return lengths, ts, payload_at, rec_end


_LENGTHS: dict[int, struct.Struct] = {}  # a record's message lengths table, by message count


def _lengths(n: int) -> struct.Struct:
    found = _LENGTHS.get(n)
    if found is None:
        if len(_LENGTHS) >= 256:  # counts vary little in practice; keep the map bounded anyway
            _LENGTHS.clear()
        found = _LENGTHS[n] = struct.Struct(f"<{n}I")
    return found


Preread = tuple[bytes, int, int]  # a pread's bytes, where one record's bytes start and stop in them


def preread_records(reads: Sequence[tuple[ReadView, int]], cache: FdCache) -> list[Preread | None]:
    """The bytes ``read_one_record`` would read for each ``(view, scan_from)`` (the view's last
    record, up to its end), read together: a batch of many small reads (a multi-range read). Each
    as ``(buf, at, stop)``: its bytes are ``buf[at:stop]`` of a ``pread`` it may share with its
    neighbours (``parse_one_record`` parses them there, without a copy of their own).

    Packed streams' reads are grouped by file, so a file is acquired once for all of its records
    (a pack holding thousands of packed streams: one ``acquire``, not one a stream), sorted by
    offset, and records that lie side by side in a file are read with one ``pread`` of up to
    ``COALESCE_SPAN``. A directory stream's record is alone in its file: read without the grouping
    (``_pread_directories``). None for a read that is not one record's worth of its last piece or whose
    file could not be read (gone, moved since planned: ``Replan``, short): ``read_one_record`` /
    ``read_range`` then read it alone and raise the error a single read gets."""
    out: list[Preread | None] = [None] * len(reads)
    by_file: dict[Hashable, list[tuple[int, int, int]]] = {}  # file: (file offset, length, index)
    views: dict[Hashable, tuple[ReadView, int]] = {}  # file: a view naming it, its extent row
    alone: list[tuple[int, SegmentView, int, int]] = []  # a directory stream's: index, view, ...
    index = -1
    for segs, scan_from in reads:
        index += 1
        end = segs.end
        rec_max = end - scan_from
        if not _HEAD_SIZE <= rec_max <= READ_BLOCK:
            continue
        if type(segs) is SegmentView:
            shift = segs.bases[-1]
            if scan_from >= shift:
                alone.append((index, segs, scan_from - shift, rec_max))
            continue
        else:
            # ``PackedView.locate(end - 1)`` written out: the last extent holds it nearly always.
            rows = segs.rows
            if not rows:
                continue
            row = len(rows) - 4
            position = rows[row + 3]
            if not position <= end - 1 < position + rows[row + 2]:
                try:
                    row, _, _ = segs.locate(end - 1)
                except CorruptRecord:
                    continue  # read alone: the single read raises it
                position = rows[row + 3]
            if scan_from < position:
                continue
            shift = position - rows[row + 1]
            key = (segs.files, rows[row], segs.stamp)
        found = by_file.get(key)
        if found is None:
            by_file[key] = found = []
            views[key] = (segs, row)
        found.append((scan_from - shift, rec_max, index))
    if alone:
        _pread_directories(alone, cache, out)
    for key, items in by_file.items():
        segs, row = views[key]
        try:
            file = segs.rows[row]
            handle = segs.files.acquire(cache, file & 1, file >> 1, segs.stamp)
        except Exception:  # noqa: BLE001 - read alone, the single read raises the right error
            continue
        try:
            _pread_coalesced(handle.fd, items, out)
        except OSError:
            pass  # a short read: each of them read alone gives its error
        finally:
            cache.release(handle)
    return out


def _pread_directories(
    reads: list[tuple[int, SegmentView, int, int]], cache: FdCache, out: list[Preread | None]
) -> None:
    """``out[index]`` = the ``length`` bytes at ``offset`` of the last segment of each directory
    stream's view: a file a stream, so nothing to coalesce. The cached files are read through
    their handles (found under one lock); the others are opened here for this one ``pread`` and
    closed, never cached (``FdCache.acquire(evict=False)``: 10,000 idle streams read once must
    not push out the files of busy ones), relative to the streams directory opened once (the
    kernel walks one name, not the whole path: ~0.7 us of the ~7 us an open, ``pread`` and close
    cost here). A file that cannot be read (gone: the stream was deleted since it was planned)
    leaves its None: the single read gives its error."""
    handles = cache.acquire_cached([(segs.log_id, segs.bases[-1]) for _, segs, _, _ in reads])
    root = reads[0][1].root
    try:
        root_fd: int | None = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError:
        root_fd = None
    try:
        for (index, segs, offset, length), handle in zip(reads, handles, strict=True):
            try:
                if handle is not None:
                    try:
                        buf = pread_exact(handle.fd, length, offset)
                    finally:
                        cache.release(handle)
                else:
                    base = segs.bases[-1]
                    if root_fd is not None and segs.root == root:
                        fd = os.open(
                            f"{segs.log_id}{os.sep}{base:020d}.seg",
                            _O_RDONLY_CLOEXEC,
                            dir_fd=root_fd,
                        )
                    else:
                        fd = os.open(segs.path(base), _O_RDONLY_CLOEXEC)
                    try:
                        buf = pread_exact(fd, length, offset)
                    finally:
                        os.close(fd)
            except OSError:
                continue  # read alone: the single read raises the right error
            out[index] = (buf, 0, length)
    finally:
        if root_fd is not None:
            os.close(root_fd)


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_RDONLY_CLOEXEC = os.O_RDONLY | _O_CLOEXEC

COALESCE_SPAN = 1024 * 1024  # at most this many bytes in one pread of side-by-side records
COALESCE_GAP = 4096  # records at most this far apart are read in one pread (the gap is read too)


def _pread_coalesced(fd: int, items: list[tuple[int, int, int]], out: list[Preread | None]) -> None:
    """``out[index]`` = where the ``length`` bytes at ``offset`` of ``fd`` are, for each item:
    ``(buf, at, at + length)``, neighbours in one ``pread`` (their bytes are not copied again)."""
    items.sort()
    count = len(items)
    j = 0
    while j < count:
        first, length, index = items[j]
        stop = first + length
        k = j + 1
        while k < count:
            offset, length, _ = items[k]
            if offset > stop + COALESCE_GAP or offset + length - first > COALESCE_SPAN:
                break
            if offset + length > stop:
                stop = offset + length
            k += 1
        buf = pread_exact(fd, stop - first, first)
        for offset, length, index in items[j:k]:
            at = offset - first
            out[index] = (buf, at, at + length)
        j = k


def _byte_span(
    m_pos: int, m_end: int, next_pos: int, cap: int, budget: int, got: int, overhead: int
) -> tuple[int, int] | None:
    """The part ``[lo, hi)`` of the byte-stream message ``[m_pos, m_end)`` that a byte read returns
    next, or None when the budget (``overhead`` per piece; at least one byte per read) or ``cap`` ends
    the read before it."""
    lo = m_pos if m_pos > next_pos else next_pos
    room = budget - got - overhead
    if room <= 0:
        if got:
            return None
        room = 1
    hi = min(m_end, cap, lo + room)
    return (lo, hi) if hi > lo else None


def _payload(
    ensure: Callable[..., tuple[bytes, int]],
    off: int,
    meta_len: int,
    body_len: int,
    crc: int,
    payload_len: int,
    first: int,
    last: int,
) -> tuple[bytes, int]:
    """The bytes holding ``[first, last)`` of the payload of the APPEND record at ``off``, checksummed
    where the record is read whole, and where the payload starts in them."""
    rec_len = FRAME_SIZE + body_len
    if first == 0 and last == payload_len and payload_len > READ_BLOCK:
        # The whole payload of a large record (catch-up reads): checksum the record's head, then its
        # payload (crc32 continues across the two), which ``ensure`` preads into a bytes object of its
        # own. Slicing all of it is then free (CPython returns the same object), so each byte is
        # copied once, by the kernel.
        head_len = _HEAD_SIZE + meta_len
        hbuf, hrel = ensure(off, head_len)
        running = crc32(memoryview(hbuf)[hrel + FRAME_SIZE : hrel + head_len], _APPEND_SEED)
        rbuf, p = ensure(off + head_len, payload_len)
        if crc32(memoryview(rbuf)[p : p + payload_len], running) != crc:
            raise CorruptRecord(f"checksum mismatch in record at file offset {off}")
        return rbuf, p
    if rec_len <= VERIFY_WHOLE_LIMIT or (first == 0 and last == payload_len):
        rbuf, rrel = ensure(off, rec_len)
        body_at = rrel + FRAME_SIZE
        if crc32(memoryview(rbuf)[body_at : body_at + body_len], _APPEND_SEED) != crc:
            raise CorruptRecord(f"checksum mismatch in record at file offset {off}")
        return rbuf, body_at + APPEND_FIXED_SIZE + meta_len
    # A part of a large record: read just that part (no whole-record checksum).
    rbuf, rrel = ensure(off + _HEAD_SIZE + meta_len + first, last - first)
    return rbuf, rrel - first


def read_entries(
    entries: Iterable[AppendEntry],
    start: int,
    cap: int,
    max_bytes: int,
    whole_messages: bool,
    overhead: int = 0,
) -> tuple[list[MessageSlice], int, int]:
    """``read_range`` over entries still in memory (a log's just-committed tail), with the same result.

    ``entries`` must be contiguous and cover ``start``. Runs on the event loop: no I/O, and the messages
    are returned as the very bytes objects the append stored (slices only for partial byte reads). The
    log keeps few enough messages in memory (``HOT_MAX_BYTES`` counts ``overhead`` per message) that
    this loop stays short.
    """
    out: list[MessageSlice] = []
    got = 0
    next_pos = start
    budget = max(1, max_bytes)
    for entry in entries:
        position = entry.position
        if got >= budget or position >= cap:
            break
        if position + entry.size <= next_pos:
            continue
        ts = entry.timestamp_ms
        m_pos = position
        done = False
        for message in entry.messages:
            length = len(message)
            m_end = m_pos + length
            if m_end > next_pos:
                if whole_messages:
                    if m_pos < next_pos:
                        raise NotABoundary(f"position {start} is inside a message")
                    if m_end > cap or (got and got + length + overhead > budget):
                        done = True
                        break
                    out.append(MessageSlice(m_pos, message, ts, True))
                    got += length + overhead
                    next_pos = m_end
                else:
                    span = _byte_span(m_pos, m_end, next_pos, cap, budget, got, overhead)
                    if span is None:
                        done = True
                        break
                    lo, hi = span
                    whole = lo == m_pos and hi == m_end
                    data = message if whole else message[lo - m_pos : hi - m_pos]
                    out.append(MessageSlice(lo, data, ts, whole))
                    got += hi - lo + overhead
                    next_pos = hi
                    if hi < m_end:
                        done = True
                        break
            m_pos = m_end
        if done:
            break
    return out, next_pos, len(out)
