"""The ``format=frames`` / ``format=frames-lines`` body (extension, ``docs/extensions.md`` section 2).

Layout, all integers little-endian::

    "DSF1" | u32 count N | u32 flags | u32 reserved
    u64 x N      positions (logical position of each message)
    i64 x N      server append times, ms since the epoch
    u64 x (N+1)  value boundaries: value i = values[b[i] : b[i+1] - (1 if FLAG_LINES else 0)]
    values

Every section is a multiple of 8 bytes from offset 16, so the connector can wrap the positions and
timestamps as Arrow ``uint64``/``timestamp[ms]`` buffers and the boundaries plus values as an Arrow
``binary`` array (``Array.from_buffers``) without copying. With ``FLAG_LINES`` (JSON streams only) the
values section is also valid NDJSON, which ``pyarrow.json`` parses directly: raw CR and LF can only be
insignificant whitespace inside a JSON value, so turning them into spaces changes no value.

The body is built with C-level operations only (``array.tobytes``, ``itertools.accumulate``,
``bytes.join``, ``bytes.translate``): no per-message ``struct.pack``.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, islice, repeat
from operator import add, attrgetter, contains, mul, sub
from typing import Final

from durastream_server.storage.columns import MessageColumns
from durastream_server.storage.records import MessageRun, MessageSlice

CONTENT_TYPE: Final = "application/vnd.durastream.frames"
MAGIC: Final = b"DSF1"
FLAG_LINES: Final = 0x1
HEADER: Final = struct.Struct("<4sIII")
_I64: Final = struct.Struct("<q")
# Metadata bytes per message (position, timestamp, one boundary): what a message costs beyond its
# value against the chunk budget.
PER_MESSAGE_OVERHEAD: Final = 24
# A frames-lines value also carries its LF.
PER_LINE_OVERHEAD: Final = PER_MESSAGE_OVERHEAD + 1

# frames-lines: raw CR/LF inside a value become spaces.
_CRLF_TO_SPACE: Final = bytes.maketrans(b"\r\n", b"  ")
_LITTLE: Final = sys.byteorder == "little"
# C-level field access: ``encode`` runs once per message of every frames response.
_DATA: Final = attrgetter("data")
_POSITION: Final = attrgetter("position")
_TIMESTAMP: Final = attrgetter("timestamp_ms")
_LENGTHS: Final = attrgetter("lengths")


def _le(values: array) -> bytes:
    if not _LITTLE:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def encode(items: Sequence[MessageSlice | MessageRun], *, lines: bool) -> bytes:
    """The frames body for ``items`` (whole messages, one per slice or several per run, in stream
    order)."""
    kinds = set(map(type, items))
    if kinds == {MessageRun} and not lines:
        return _encode_only_runs(items)  # type: ignore[arg-type]
    if MessageRun in kinds:
        return _encode_runs(items, lines=lines)
    return _encode_slices(items, lines=lines)  # type: ignore[arg-type]


def _encode_only_runs(runs: Sequence[MessageRun]) -> bytes:
    """``encode`` of plain frames for runs only (a multi-range read of many small streams: a run
    a range), with no Python step per run: each message's position is its run's position plus its
    offset in the run, i.e. ``boundary + (run position - run start in the values)``, and every
    column is built by C-level iteration (``map``, ``accumulate``, ``repeat``)."""
    lengths = list(map(_LENGTHS, runs))
    counts = list(map(len, lengths))
    n = sum(counts)
    boundaries = array("Q", accumulate(chain.from_iterable(lengths), initial=0))
    values = list(map(_DATA, runs))
    # Where each run's bytes start in the values section, and so its messages' position shift.
    shifts = map(sub, map(_POSITION, runs), accumulate(map(len, values), initial=0))
    positions = array(
        "Q", map(add, islice(boundaries, n), chain.from_iterable(map(repeat, shifts, counts)))
    )
    # A run's messages share its time: its 8 bytes repeated, a bytes product a run.
    timestamps = b"".join(map(mul, map(_I64.pack, map(_TIMESTAMP, runs)), counts))
    head = HEADER.pack(MAGIC, n, 0, 0)
    return b"".join([head, _le(positions), timestamps, _le(boundaries), *values])


def encode_columns(columns: MessageColumns) -> bytes:
    """The plain frames body of ``columns`` (a multi-range read's messages, gathered as columns
    while reading: ``storage/columns.py``), by C-level passes only: the boundaries accumulate the
    lengths, each message's position is its boundary plus its run's shift, a run's time is repeated
    for its messages, and the values are the buffer the read filled."""
    n = columns.messages
    boundaries = array("Q", accumulate(columns.lengths, initial=0))
    shifts = chain.from_iterable(map(repeat, columns.shifts, columns.counts))
    positions = array("Q", map(add, islice(boundaries, n), shifts))
    timestamps = b"".join(map(mul, map(_I64.pack, columns.times), columns.counts))
    head = HEADER.pack(MAGIC, n, 0, 0)
    return b"".join([head, _le(positions), timestamps, _le(boundaries), columns.values])


def _encode_runs(items: Sequence[MessageSlice | MessageRun], *, lines: bool) -> bytes:
    """``encode`` for reads that returned runs: the per-message work is C-level iteration over each
    run's lengths, and a plain frames body carries each run's buffer as it is."""
    lengths = [item.lengths if type(item) is MessageRun else (len(item.data),) for item in items]
    flat = list(chain.from_iterable(lengths))
    n = len(flat)
    positions = array(
        "Q",
        chain.from_iterable(
            accumulate(sizes[:-1], initial=item.position)
            for item, sizes in zip(items, lengths, strict=True)
        ),
    )
    timestamps = array(
        "q",
        chain.from_iterable(
            repeat(item.timestamp_ms, len(sizes))
            for item, sizes in zip(items, lengths, strict=True)
        ),
    )
    head = HEADER.pack(MAGIC, n, FLAG_LINES if lines else 0, 0)
    if not lines:
        boundaries = array("Q", accumulate(flat, initial=0))
        return b"".join(
            [head, _le(positions), _le(timestamps), _le(boundaries), *map(_DATA, items)]
        )
    boundaries = array("Q", map(add, accumulate(flat, initial=0), range(n + 1)))
    parts: list[bytes] = [head, _le(positions), _le(timestamps), _le(boundaries)]
    for item, sizes in zip(items, lengths, strict=True):
        data = item.data
        if len(sizes) == 1:
            values: Iterable[bytes] = (data,)
        else:
            cuts = list(accumulate(sizes, initial=0))
            values = map(data.__getitem__, map(slice, cuts, islice(cuts, 1, None)))
        if b"\n" in data or b"\r" in data:  # pretty-printed JSON (rare): line breaks become spaces
            values = [value.translate(_CRLF_TO_SPACE) for value in values]
        parts.extend(chain.from_iterable(zip(values, repeat(b"\n"))))
    return b"".join(parts)


def _encode_slices(slices: Sequence[MessageSlice], *, lines: bool) -> bytes:
    """``encode`` for a read of single messages (the in-memory tail, the edges of a range)."""
    n = len(slices)
    values = list(map(_DATA, slices))
    positions = array("Q", map(_POSITION, slices))
    timestamps = array("q", map(_TIMESTAMP, slices))
    head = HEADER.pack(MAGIC, n, FLAG_LINES if lines else 0, 0)
    if not lines:
        boundaries = array("Q", accumulate(map(len, values), initial=0))
        return b"".join([head, _le(positions), _le(timestamps), _le(boundaries), *values])
    boundaries = array("Q", map(add, accumulate(map(len, values), initial=0), range(n + 1)))
    parts: list[bytes] = [head, _le(positions), _le(timestamps), _le(boundaries)]
    values_at = sum(map(len, parts))
    parts.extend([b"\n"] * (2 * n))
    # A raw LF or CR inside a value (pretty-printed JSON, rare) would break the lines; they become
    # spaces. The checks run at C speed without a joined copy of the values: a second chunk-sized
    # buffer per response made the allocator map and unmap fresh pages every time.
    if any(map(contains, values, repeat(b"\n"))):
        values = [value.translate(_CRLF_TO_SPACE) for value in values]
    parts[4::2] = values
    body = b"".join(parts)
    if body.find(b"\r", values_at) < 0:
        return body
    del body
    parts[4::2] = [value.translate(_CRLF_TO_SPACE) for value in values]
    return b"".join(parts)
