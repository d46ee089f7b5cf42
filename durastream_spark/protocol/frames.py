"""Decoding ``format=frames`` / ``format=frames-lines`` bodies into Arrow arrays without copying values.

Layout (docs/extensions.md section 2; all integers little-endian)::

    0       4           magic "DSF1"
    4       4  u32      count N
    8       4  u32      flags: bit 0 = values are LF-terminated lines (format=frames-lines)
    12      4  u32      reserved, 0
    16      8*N u64     positions (offset token = "0"*16 + "_" + %016d)
    .       8*N i64     timestamps: server append time, ms since the Unix epoch
    .       8*(N+1) u64 value boundaries: value i = values[b[i] : b[i+1] - (1 if bit 0 else 0)]
    .       b[N]        values

The server lays the sections out so that they can be wrapped as they are: ``positions`` becomes a ``uint64``
array, ``timestamps`` a ``timestamp[ms, UTC]`` array and, in ``frames`` mode, the boundaries and values
become a ``large_binary`` array (the boundaries are exactly Arrow's int64 offsets) with
``pa.Array.from_buffers``. The only per-message Python work is none at all: a Spark source decodes a
multi-megabyte chunk in microseconds and the value bytes are never copied.

In ``frames-lines`` mode each value ends with an LF, so the values section is NDJSON that
``pyarrow.json.read_json`` parses directly (``Frames.ndjson``); the ``values`` array then includes each
value's trailing LF (``Frames.values_without_newline`` strips it, at the cost of a copy).

Every length and boundary is validated before any buffer is wrapped: a truncated or corrupt body raises
``MalformedFrames`` instead of yielding wrong rows.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from durastream_spark.errors import MalformedFrames

MAGIC = b"DSF1"
HEADER_BYTES = 16
FLAG_LINES = 1
KNOWN_FLAGS = FLAG_LINES
OFFSET_PREFIX = "0" * 16 + "_"
POSITION_DIGITS = 16
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")

_HEADER = struct.Struct("<4sIII")
_BOUNDS = struct.Struct("<q")


@dataclass(frozen=True)
class Frames:
    """A decoded frames body. Arrays share memory with the response body (kept alive by ``buffer``)."""

    count: int
    lines: bool
    positions: pa.UInt64Array
    timestamps: pa.TimestampArray
    values: pa.LargeBinaryArray
    buffer: pa.Buffer

    @property
    def ndjson(self) -> pa.Buffer:
        """The values section as one buffer (zero-copy): NDJSON in ``frames-lines`` mode, the values back
        to back in ``frames`` mode; ``pyarrow.json.read_json(pa.BufferReader(frames.ndjson), ...)`` parses
        either (it is whitespace-insensitive between values)."""
        _, boundaries, data = self.values.buffers()
        if data is None or not self.count:
            return pa.py_buffer(b"")
        at = self.values.offset  # a slice (one range of a multi-range answer) starts here
        first, last = (
            _BOUNDS.unpack_from(boundaries, 8 * at)[0],
            _BOUNDS.unpack_from(boundaries, 8 * (at + self.count))[0],
        )
        return data if first == 0 and last == data.size else data.slice(first, last - first)

    def slice(self, start: int, count: int) -> Frames:
        """Messages ``start`` to ``start + count`` (zero-copy): one range of a multi-range answer."""
        return Frames(
            count=count,
            lines=self.lines,
            positions=self.positions.slice(start, count),
            timestamps=self.timestamps.slice(start, count),
            values=self.values.slice(start, count),
            buffer=self.buffer,
        )

    def offsets(self) -> pa.StringArray:
        """Offset token of each message (its own position, not the next one)."""
        return offset_tokens(self.positions)

    def values_without_newline(self) -> pa.LargeBinaryArray:
        """The values with the ``frames-lines`` LF removed (a copy). In ``frames`` mode, ``values`` itself."""
        if not self.lines:
            return self.values
        return pc.binary_slice(self.values, 0, -1)


def _as_buffer(body: bytes | bytearray | memoryview | pa.Buffer) -> pa.Buffer:
    if isinstance(body, pa.Buffer):
        return body
    return pa.py_buffer(body)


def decode_frames(body: bytes | bytearray | memoryview | pa.Buffer) -> Frames:
    """Decode and validate a frames body. Raises ``MalformedFrames`` on any inconsistency."""
    if (
        sys.byteorder != "little"
    ):  # pragma: no cover - every platform Spark runs on is little-endian
        raise MalformedFrames("frames bodies are little-endian; this host is big-endian")
    buffer = _as_buffer(body)
    size = buffer.size
    if size < HEADER_BYTES:
        raise MalformedFrames(
            f"frames body of {size} bytes is shorter than the {HEADER_BYTES}-byte header"
        )
    magic, count, flags, reserved = _HEADER.unpack_from(buffer, 0)
    if magic != MAGIC:
        raise MalformedFrames(f"frames body starts with {magic!r}, expected magic {MAGIC!r}")
    if flags & ~KNOWN_FLAGS:
        raise MalformedFrames(f"frames body has unknown flags {flags:#x} (known: {KNOWN_FLAGS:#x})")
    if reserved != 0:
        raise MalformedFrames(f"frames body has a non-zero reserved field ({reserved})")
    lines = bool(flags & FLAG_LINES)

    positions_at = HEADER_BYTES
    timestamps_at = positions_at + 8 * count
    boundaries_at = timestamps_at + 8 * count
    values_at = boundaries_at + 8 * (count + 1)
    if size < values_at:
        raise MalformedFrames(
            f"frames body of {size} bytes is too short for {count} messages "
            f"(header and index need {values_at} bytes)"
        )
    values_size = size - values_at

    boundaries = pa.Array.from_buffers(
        pa.int64(), count + 1, [None, buffer[boundaries_at:values_at]]
    )
    first = boundaries[0].as_py()
    last = boundaries[count].as_py()
    if first != 0:
        raise MalformedFrames(f"frames value boundaries start at {first}, expected 0")
    if last != values_size:
        raise MalformedFrames(
            f"frames value boundaries end at {last} but the values section holds {values_size} bytes"
        )
    if count:
        steps = pc.subtract(boundaries[1:], boundaries[:-1])
        if pc.min(steps).as_py() < (1 if lines else 0):
            raise MalformedFrames(
                "frames value boundaries decrease"
                + (" or leave a value without its LF" if lines else "")
            )

    values_buffer = buffer[values_at:]
    if lines and count:
        as_bytes = pa.Array.from_buffers(pa.uint8(), values_size, [None, values_buffer])
        terminators = pc.take(as_bytes, pc.subtract(boundaries[1:], 1))
        if not pc.all(pc.equal(terminators, 10)).as_py():
            raise MalformedFrames("frames-lines body has a value that does not end with LF")

    positions = pa.Array.from_buffers(
        pa.uint64(), count, [None, buffer[positions_at:timestamps_at]]
    )
    timestamps = pa.Array.from_buffers(
        TIMESTAMP_TYPE, count, [None, buffer[timestamps_at:boundaries_at]]
    )
    values = pa.Array.from_buffers(
        pa.large_binary(), count, [None, buffer[boundaries_at:values_at], values_buffer]
    )
    return Frames(
        count=count,
        lines=lines,
        positions=positions,
        timestamps=timestamps,
        values=values,
        buffer=buffer,
    )


def offset_tokens(positions: pa.Array) -> pa.StringArray:
    """Positions to offset tokens ``"0"*16 + "_" + %016d``, vectorised (one cast, one pad, one join)."""
    if len(positions) == 0:
        return pa.array([], pa.string())
    digits = pc.utf8_lpad(pc.cast(positions, pa.string()), POSITION_DIGITS, "0")
    if pc.max(pc.utf8_length(digits)).as_py() > POSITION_DIGITS:
        raise MalformedFrames(f"a position exceeds {POSITION_DIGITS} digits")
    return pc.binary_join_element_wise(OFFSET_PREFIX, digits, "")


def offset_token(position: int) -> str:
    """One position's offset token (scalar form of ``offset_tokens``)."""
    if not 0 <= position < 10**POSITION_DIGITS:
        raise ValueError(f"position {position} does not fit the offset format")
    return f"{OFFSET_PREFIX}{position:0{POSITION_DIGITS}d}"


def encode_frames(
    positions: list[int], timestamps_ms: list[int], values: list[bytes], *, lines: bool = False
) -> bytes:
    """Build a frames body by the documented layout. For tests and tools; the server builds its own.

    In ``lines`` mode each value is given without its LF; one is appended.
    """
    if not len(positions) == len(timestamps_ms) == len(values):
        raise ValueError("positions, timestamps and values must have the same length")
    stored = [value + b"\n" for value in values] if lines else list(values)
    boundaries = [0]
    for value in stored:
        boundaries.append(boundaries[-1] + len(value))
    count = len(values)
    return b"".join(
        [
            _HEADER.pack(MAGIC, count, FLAG_LINES if lines else 0, 0),
            struct.pack(f"<{count}Q", *positions),
            struct.pack(f"<{count}q", *timestamps_ms),
            struct.pack(f"<{count + 1}Q", *boundaries),
            *stored,
        ]
    )
