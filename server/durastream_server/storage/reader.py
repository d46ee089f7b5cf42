"""Blocking read algorithms over a log's durable records: ranged reads.

They start at an index point (a record start at or before the wanted position), walk record headers
forward and read only the payload they return. Callers run ``read_range`` in a worker thread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from itertools import accumulate, islice, repeat

from durastream_server.storage import codec
from durastream_server.storage.codec import APPEND_FIXED_SIZE, FRAME, CorruptRecord, Kind
from durastream_server.storage.crc import crc32
from durastream_server.storage.files import FdCache
from durastream_server.storage.records import AppendEntry, MessageRun, MessageSlice
from durastream_server.storage.segments import (
    FRAME_SIZE,
    READ_BLOCK,
    VERIFY_WHOLE_LIMIT,
    SegmentView,
    Window,
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
    segs: SegmentView,
    cache: FdCache,
    scan_from: int,
    start: int,
    cap: int,
    max_bytes: int,
    whole_messages: bool,
    runs: bool = False,
) -> tuple[list[MessageSlice | MessageRun], int]:
    """Read payload in ``[start, cap)`` (about ``max_bytes``), scanning records from ``scan_from``.

    Returns the slices and the position after the last returned byte. Raises ``NotABoundary`` for a
    whole-message read that starts inside a message and ``codec.CorruptRecord`` on checksum failure.
    This is the read hot path, so it parses headers inline rather than through ``iter_appends``.

    With ``runs`` (whole-message reads only), a record whose messages are all returned comes back as one
    ``MessageRun`` instead of a ``MessageSlice`` per message.
    """
    out: list[MessageSlice | MessageRun] = []
    got = 0
    next_pos = start
    budget = max(1, max_bytes)
    end = segs.end
    off = scan_from
    with Window(segs, cache) as window:
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
            # with from/to relative to the record's payload.
            picks: list[tuple[int, int, int, bool]] = []
            m_pos = position
            rel_m = 0
            done = False
            # The common case of catch-up and frames reads: every message of the record is returned.
            # Decided per record, and the slices are then built with C-level iteration (below)
            # instead of this loop's per-message Python work, which was a sixth of a frames read.
            whole_record = (
                whole_messages
                and n > 1
                and position >= next_pos
                and position + payload_len <= cap
                and got + payload_len <= budget
                and min(lengths) > 0
            )
            if whole_record:
                picks.append((position, 0, payload_len, True))
                got += payload_len
                next_pos = position + payload_len
            for length in () if whole_record else lengths:
                m_end = m_pos + length
                if m_end > next_pos:
                    if whole_messages:
                        if m_pos < next_pos:
                            raise NotABoundary(f"position {start} is inside a message")
                        if m_end > cap or (got and got + length > budget):
                            done = True
                            break
                        picks.append((m_pos, rel_m, rel_m + length, True))
                        got += length
                        next_pos = m_end
                    else:
                        lo = m_pos if m_pos > next_pos else next_pos
                        hi = min(m_end, cap, lo + (budget - got))
                        if hi <= lo:
                            done = True
                            break
                        picks.append(
                            (
                                lo,
                                rel_m + lo - m_pos,
                                rel_m + hi - m_pos,
                                lo == m_pos and hi == m_end,
                            )
                        )
                        got += hi - lo
                        next_pos = hi
                        if hi < m_end:
                            done = True
                            break
                m_pos = m_end
                rel_m += length
            if picks:
                first, last = picks[0][1], picks[-1][2]
                if first == 0 and last == payload_len and payload_len > READ_BLOCK:
                    # The whole payload of a large record (catch-up reads): checksum the record's
                    # head, then its payload (crc32 continues across the two), which ``ensure``
                    # preads into a bytes object of its own. Slicing all of it below is then free
                    # (CPython returns the same object), so each byte is copied once, by the kernel.
                    head_len = _HEAD_SIZE + meta_len
                    hbuf, hrel = ensure(off, head_len)
                    running = crc32(
                        memoryview(hbuf)[hrel + FRAME_SIZE : hrel + head_len], _APPEND_SEED
                    )
                    rbuf, p = ensure(off + head_len, payload_len)
                    if crc32(memoryview(rbuf)[p : p + payload_len], running) != crc:
                        raise CorruptRecord(f"checksum mismatch in record at file offset {off}")
                elif rec_len <= VERIFY_WHOLE_LIMIT or (first == 0 and last == payload_len):
                    rbuf, rrel = ensure(off, rec_len)
                    body_at = rrel + FRAME_SIZE
                    if crc32(memoryview(rbuf)[body_at : body_at + body_len], _APPEND_SEED) != crc:
                        raise CorruptRecord(f"checksum mismatch in record at file offset {off}")
                    p = body_at + APPEND_FIXED_SIZE + meta_len
                else:
                    # A part of a large record: read just that part (no whole-record checksum).
                    rbuf, rrel = ensure(off + _HEAD_SIZE + meta_len + first, last - first)
                    p = rrel - first
                if whole_record and runs:
                    out.append(MessageRun(position, rbuf[p : p + payload_len], lengths, ts))
                elif whole_record:
                    bounds = list(accumulate(lengths, initial=p))
                    out.extend(
                        map(
                            MessageSlice,
                            accumulate(lengths[:-1], initial=position),
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
    return out, next_pos


def read_entries(
    entries: Iterable[AppendEntry], start: int, cap: int, max_bytes: int, whole_messages: bool
) -> tuple[list[MessageSlice], int]:
    """``read_range`` over entries still in memory (a log's just-committed tail), with the same result.

    ``entries`` must be contiguous and cover ``start``. Runs on the event loop: no I/O, and the messages
    are returned as the very bytes objects the append stored (slices only for partial byte reads).
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
                    if m_end > cap or (got and got + length > budget):
                        done = True
                        break
                    out.append(MessageSlice(m_pos, message, ts, True))
                    got += length
                    next_pos = m_end
                else:
                    lo = m_pos if m_pos > next_pos else next_pos
                    hi = min(m_end, cap, lo + (budget - got))
                    if hi <= lo:
                        done = True
                        break
                    whole = lo == m_pos and hi == m_end
                    data = message if whole else message[lo - m_pos : hi - m_pos]
                    out.append(MessageSlice(lo, data, ts, whole))
                    got += hi - lo
                    next_pos = hi
                    if hi < m_end:
                        done = True
                        break
            m_pos = m_end
        if done:
            break
    return out, next_pos
