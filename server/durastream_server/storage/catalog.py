"""The stream catalog: which path (and fork source) each stream directory holds, without opening it.

Start-up must know which directory holds which path before it can serve a request for that path, and with
100,000 streams opening every directory for its header costs seconds (tens of microseconds per ``open``
here, whatever is read). So every create also appends one line to ``<data-dir>/catalog``: the new storage
id, its path and its fork source's id. Start-up reads that one file and lists ``streams/``; only directories
the catalog does not name are opened for their header.

The catalog is a *hint*, never the truth. ``streams/`` decides which streams exist (an id the catalog names
that is not there was deleted or quarantined: dropped), and each stream's header record decides what it is:
recovery compares the two (``engine/recovery.py``), and a disagreement makes the server stop trusting the
catalog for the rest of that start-up. The facts it holds never change (a header is written once, an id
is never reused), so it needs no fsync: a line lost in a power cut, or one that fails its checksum, only
means that directory's header is read at the next start-up. Lines are appended with ``O_APPEND`` in one
``write`` each (the I/O threads create concurrently). When the file holds lines of streams that are gone
(deleted, quarantined) or damaged ones, it is rewritten with the live streams only (a new file renamed
over the old one), in the background once the server serves, so deletes do not accumulate across
restarts.

Line format, cheap to parse (start-up reads 100,000 lines in a fraction of a second):
``<crc32 of the rest, 8 hex digits> <storage id> <source id, or -> <path>`` and a newline; the path in
UTF-8, with backslash and newline escaped as two characters each (backslash backslash, backslash n).
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CATALOG_NAME = "catalog"
_CATALOG_TMP = "catalog.tmp"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BACKSLASH = b"\\"
_NEWLINE = b"\n"


@dataclass(frozen=True, slots=True)
class Entry:
    """What a stream directory holds, as its create recorded it."""

    path: str
    source_id: str | None


def encode(storage_id: str, entry: Entry) -> bytes:
    path = entry.path.encode("utf-8")
    if _BACKSLASH in path or _NEWLINE in path:
        path = path.replace(_BACKSLASH, _BACKSLASH * 2).replace(_NEWLINE, _BACKSLASH + b"n")
    data = b"%s %s %s" % (storage_id.encode(), (entry.source_id or "-").encode(), path)
    return b"%08x %s\n" % (zlib.crc32(data), data)


def _decode_path(raw: bytes) -> str:
    if _BACKSLASH in raw:
        out = bytearray()
        i = 0
        while i < len(raw):
            if raw[i : i + 1] == _BACKSLASH:
                out += _NEWLINE if raw[i + 1 : i + 2] == b"n" else raw[i + 1 : i + 2]
                i += 2
            else:
                out += raw[i : i + 1]
                i += 1
        raw = bytes(out)
    return raw.decode("utf-8")


@dataclass(frozen=True, slots=True)
class Loaded:
    """The catalog as read: its entries, and how many lines it holds (whether it needs a rewrite)."""

    entries: dict[str, Entry]
    lines: int


def load(root: Path) -> Loaded:
    """Every well-formed line of the catalog (a bad one is skipped: its directory is read instead)."""
    try:
        raw = (root / CATALOG_NAME).read_bytes()
    except FileNotFoundError:
        return Loaded({}, 0)
    entries: dict[str, Entry] = {}
    bad = 0
    lines = raw.split(_NEWLINE)
    if lines and not lines[-1]:
        lines.pop()
    crc32 = zlib.crc32
    for line in lines:
        try:
            data = line[9:]
            if crc32(data) != int(line[:8], 16) or line[8:9] != b" ":
                raise ValueError("checksum")
            storage_id, source_id, path = data.split(b" ", 2)
            entries[storage_id.decode()] = Entry(
                _decode_path(path), None if source_id == b"-" else source_id.decode()
            )
        except (ValueError, UnicodeDecodeError):
            bad += 1
    if bad:
        log.warning("catalog %s: skipped %d damaged lines", root / CATALOG_NAME, bad)
    return Loaded(entries, len(lines))


class Catalog:
    """The open catalog file: one line appended per create, from any I/O thread."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._path = root / CATALOG_NAME
        self._fd = self._open()
        self._opened_size = os.fstat(self._fd).st_size  # lines after this were added since
        self._lock = threading.Lock()

    def _open(self) -> int:
        return os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC, 0o644)

    def add(self, storage_id: str, entry: Entry) -> None:
        """Record a created stream. A failure is logged, never raised: the create is complete without it."""
        line = encode(storage_id, entry)
        try:
            with self._lock:  # one write per line, never during a rewrite or after close
                if self._fd >= 0:
                    os.write(self._fd, line)
        except OSError as exc:
            log.warning(
                "catalog: could not record stream %s (read at start-up): %s", storage_id, exc
            )

    def add_lines(self, lines: list[bytes]) -> None:
        """Record many created streams (``encode``d lines) in one ``write``: a commit round's creates
        (``committer.py``) cost one system call here, not one each. Logged, never raised, as ``add``."""
        if not lines:
            return
        data = b"".join(lines)
        try:
            with self._lock:
                if self._fd >= 0:
                    os.write(self._fd, data)  # a line cut short is skipped on load, as add's
        except OSError as exc:
            log.warning("catalog: could not record %d created streams: %s", len(lines), exc)

    def rewrite(self, entries: dict[str, Entry]) -> None:
        """Replace the file by one holding ``entries`` (the streams that existed when it was opened)
        and the lines added since. Blocking; creates meanwhile wait for it."""
        tmp = self._root / _CATALOG_TMP
        try:
            with self._lock:
                if self._fd < 0:
                    return
                with open(tmp, "wb") as out:
                    out.writelines(encode(i, entry) for i, entry in entries.items())
                    with open(self._path, "rb") as old:
                        old.seek(self._opened_size)
                        out.write(old.read())
                os.replace(tmp, self._path)
                os.close(self._fd)
                self._fd = self._open()
        except OSError as exc:
            log.warning("catalog: rewrite failed (the old file is kept): %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
