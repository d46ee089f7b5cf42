"""The pack index (decision 0010, "Step 2: the pack index"): ``packs/<generation>.idx`` names every
entry of its pack (byte range, kind, stream id, and the path a packed create's header holds), so that a
pack entry whose bytes fail their CRC (its stream id is under that CRC) is still attributed to its
stream, which is then quarantined instead of served as if it ended before the entry (hazard 32).

It is a *hint that is validated, never trusted blindly*: a checksum over the whole file, and the
generation and byte size of the pack it describes. It is written after its pack: ``write_pack`` removes
the old index (durably) before it renames a rewritten pack in, and writes the new one (a temporary file,
synced, renamed, directory synced) once the pack's rename is durable. So a crash at any step leaves
either no index (start-up then falls back to attributing nothing: today's behaviour, logged) or the
index of the pack that is there; the size check is a second guard. ``settle`` writes the index of a pack
that has none and scans clean (packs written before this version, or a crash between the two renames).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from json.decoder import scanstring as _scanstring
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path
from typing import NamedTuple

from durastream_server.storage import codec
from durastream_server.storage.files import fsync_dir, replace_file
from durastream_server.storage.wal import FIXED_SIZE, HEAD_SIZE, Kind, Scan, WalEntry

log = logging.getLogger(__name__)

MAGIC = "durastream-pack-index"
VERSION = 1
SUFFIX = ".idx"


def index_name(generation: int) -> str:
    return f"{generation:020d}{SUFFIX}"


class Row(NamedTuple):
    """One entry of a pack: its bytes ``[offset, offset + length)``, its kind, its stream, the logical
    position of its records in the stream's virtual segment 0 (for a start-up from the index alone,
    not built yet), and for a packed create the path its header names (to quarantine that path when
    the create is damaged). A named tuple: a checkpoint makes one per entry (100,000 for a pack of
    100,000 packed creates)."""

    offset: int
    length: int
    kind: int
    log_id: str
    position: int
    path: str | None


_PATH_KEY = b'"path":'


def _create_path(header: bytes) -> str | None:
    """The path a packed create's header record names, or None. Not a full decode (~10 us a header,
    1 s of the checkpoint thread for 100,000 creates): the key is found in the record's JSON body (a
    quote inside a JSON string is escaped, so ``"path":`` is a key) and only its string value is
    decoded. A hint for quarantining a damaged create, checked to be a string."""
    try:  # the header's body only: a create with data has its data's frame after it
        end = codec.FRAME_SIZE + codec.FRAME.unpack_from(header)[3]
    except struct.error:
        return None
    at = header.find(_PATH_KEY, codec.FRAME_SIZE, end)
    if at < 0:
        return None
    try:
        path, _ = _scanstring(header[at + len(_PATH_KEY) + 1 : end].decode(), 0)
    except (ValueError, UnicodeDecodeError):
        return None
    return path if isinstance(path, str) else None


def rows_of_entries(entries: list[WalEntry], sizes: list[int]) -> list[Row]:
    """The rows of a pack ``write_pack`` lays out from ``entries``, in order; ``sizes``: each
    entry's records bytes (``packs.records_sizes``; summing them here was ~10% of a routed save's
    server CPU, issue 16)."""
    return [Row(*fields) for fields in _entry_fields(entries, sizes)]


def _entry_fields(
    entries: list[WalEntry], sizes: list[int]
) -> Iterator[tuple[int, int, int, str, int, str | None]]:
    """``rows_of_entries``'s fields, one tuple at a time (``encode_entries`` keeps none)."""
    at = 0
    fixed = HEAD_SIZE + FIXED_SIZE
    packed = Kind.PACKED
    for entry, size in zip(entries, sizes, strict=True):
        length = fixed + len(entry.log_id) + size
        path = _create_path(entry.records[0]) if entry.kind == packed and entry.records else None
        yield at, length, entry.kind, entry.log_id, entry.offset, path
        at += length


def rows_of_scan(scanned: Scan) -> list[Row]:
    """The rows of a pack that scanned clean (no damage: every entry is known)."""
    rows = []
    for (log_id, _segment, position, records, kind), records_at in zip(
        scanned.entries, scanned.records_at, strict=True
    ):
        start = records_at - HEAD_SIZE - FIXED_SIZE - len(log_id.encode("ascii"))
        length = records_at + len(records) - start
        path = _create_path(records) if kind == Kind.PACKED else None
        rows.append(Row(start, length, kind, log_id, position, path))
    return rows


def encode(generation: int, size: int, rows: list[Row]) -> bytes:
    return _framed(generation, size, [_line(*row) for row in rows])


def encode_entries(generation: int, size: int, entries: list[WalEntry], sizes: list[int]) -> bytes:
    """``encode(generation, size, rows_of_entries(entries, sizes))`` without a ``Row`` an entry: a
    checkpoint of 10,000 streams made 10,000 named tuples the collector tracked (issue 16)."""
    return _framed(generation, size, [_line(*fields) for fields in _entry_fields(entries, sizes)])


def _line(offset: int, length: int, kind: int, log_id: str, position: int, path: str | None) -> str:
    return f"{offset} {length} {kind} {log_id} {position} {_quote(path) if path else '-'}"


def _framed(generation: int, size: int, lines: list[str]) -> bytes:
    """The index file: its first line, ``lines`` (one a row), and the checksum of both."""
    lines.insert(0, f"{MAGIC} {VERSION} {generation} {size} {len(lines)}")
    body = ("\n".join(lines) + "\n").encode()
    return body + f"crc {zlib.crc32(body):08x}\n".encode()


def decode(raw: bytes, generation: int, size: int) -> list[Row]:
    """The rows, or ValueError saying why the index does not describe this pack."""
    body, sep, trailer = raw.rpartition(b"crc ")
    if not sep or trailer.strip() != f"{zlib.crc32(body):08x}".encode():
        raise ValueError("its checksum fails (torn or damaged)")
    lines = body.decode().splitlines()
    head = lines[0].split(" ")
    if head[:2] != [MAGIC, str(VERSION)] or len(head) != 5:
        raise ValueError(f"not a version {VERSION} pack index")
    if int(head[2]) != generation or int(head[3]) != size or int(head[4]) != len(lines) - 1:
        raise ValueError(
            f"it describes generation {head[2]} of {head[3]} bytes, not this pack "
            f"(generation {generation}, {size} bytes): stale"
        )
    rows = []
    for line in lines[1:]:
        offset, length, kind, log_id, position, path = line.split(" ", 5)
        rows.append(
            Row(
                int(offset),
                int(length),
                int(kind),
                log_id,
                int(position),
                None if path == "-" else json.loads(path),
            )
        )
    return rows


def write(directory: Path, generation: int, size: int, rows: list[Row], *, sync: bool) -> None:
    """``packs/<generation>.idx`` for the pack of ``size`` bytes that is there (renamed in, durable)."""
    write_encoded(directory, generation, encode(generation, size, rows), sync=sync)


def write_encoded(directory: Path, generation: int, encoded: bytes, *, sync: bool) -> None:
    """``write`` of an index already encoded (``encode_entries``)."""
    replace_file(directory / index_name(generation), [encoded], sync=sync)


def remove(directory: Path, generation: int, *, sync: bool) -> None:
    """Before a pack of ``generation`` is replaced: its index must never describe the new bytes."""
    try:
        os.unlink(directory / index_name(generation))
    except FileNotFoundError:
        return
    if sync:
        fsync_dir(directory)


def read(directory: Path, generation: int, size: int) -> list[Row] | None:
    """The index of pack ``generation`` (``size`` bytes), or None (missing, or logged as invalid)."""
    try:
        raw = (directory / index_name(generation)).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode(raw, generation, size)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        log.warning("pack index %s is not used: %s", index_name(generation), exc)
        return None


def describes(directory: Path, generation: int, size: int) -> bool:
    """Whether pack ``generation``'s index names that generation and ``size`` in its first line (a
    cheap start-up check: a stale index, from before a rewrite, is replaced by ``settle``; the
    checksum is checked when the index is used)."""
    try:
        with open(directory / index_name(generation), "rb") as fh:
            first = fh.read(128).split(b"\n", 1)[0]
    except FileNotFoundError:
        return False
    return first.split(b" ")[:4] == f"{MAGIC} {VERSION} {generation} {size}".encode().split(b" ")


def blamed(rows: list[Row], damaged: list[tuple[int, int]]) -> list[Row]:
    """The rows whose bytes overlap a damaged byte range of the pack."""
    return [
        r
        for r in rows
        if any(r.offset < end and start < r.offset + r.length for start, end in damaged)
    ]
