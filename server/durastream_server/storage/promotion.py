"""A packed stream's promotion to a directory of its own, made by the commit round of its first write.

A packed stream (``packs.py``) has no directory. Its first write (append, close, producer state, soft
delete, a staged-append commit) gives it one, in the same round as the write (``committer.py``), at the
cost of today's create + append minus one round:

1. before the round's WAL write nothing of it is written (its records are laid out only);
2. the round's WAL entries carry a CREATE entry (the header record at offset 0 of segment 0) followed by
   the records' entries, synced once with the round;
3. after the sync its directory is made in ``streams/`` with segment 0 holding the header and the
   records after it (unsynced, as a create's: the checkpoint of that WAL file syncs the segment, the
   directory and ``streams/``, and only then makes the packed create void).

A crash before the sync leaves nothing: the stream comes back packed and empty (a torn round). A crash
after it leaves the CREATE entry durable: the replay makes the directory and writes the header and the
records back wherever they did not reach the disk, and the directory wins over the pack at start-up
(``packs.settle``). A failure after the sync (making the directory or writing it) removes what was made, writes an
UNPROMOTE entry (synced) that voids the round's CREATE and records entries of that stream, and only then
fails that write; the stream stays packed. So a restart never brings the failed write back (the replay
skips a stream's entries before its UNPROMOTE, and removes a directory the failure left behind). If even
the UNPROMOTE cannot be written, or the directory cannot be removed, the committer stops every write
until a restart (``committer.py``).

Without a WAL (``--durability none`` over a data directory written with fsync) the directory is built
under ``staging/`` and renamed into ``streams/`` once whole (hazard 20).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from durastream_server.storage import catalog
from durastream_server.storage.extents import Extents
from durastream_server.storage.files import FdCache, Handle, pwrite_all
from durastream_server.storage.packs import read_virtual
from durastream_server.storage.segments import segment_name

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Promotion:
    """``committer.Promotion`` for one packed stream (made per promoting round, not kept)."""

    __slots__ = ("log_id", "header_frame", "staged", "final", "_cache", "_entry", "_packed")

    def __init__(
        self,
        log_id: str,
        header_frame: bytes,
        final: str,
        cache: FdCache,
        entry: catalog.Entry,
        packed: tuple[Path, Extents] | None = None,
    ) -> None:
        self.log_id = log_id
        self.header_frame = header_frame
        self.final = final  # <data-dir>/streams/<id>
        self.staged = staging_dir(final, log_id)
        self._cache = cache
        self._entry = entry
        # Decision 0010 step 2: a stream with packed records (data directory, its extents): its
        # segment 0 is its virtual segment 0, read back in the round (``load``).
        self._packed = packed

    @property
    def carries_records(self) -> bool:
        return self._packed is not None

    def load(self) -> None:
        """In the round's worker, under the committer's pack lock (no carry moves the entries):
        the header record and packed records, byte for byte what segment 0 must hold; the round's
        CREATE entry carries them (so a crash after its sync replays the whole stream)."""
        if self._packed is not None:
            root, extents = self._packed
            data = read_virtual(root, extents)
            if data[: len(self.header_frame)] != self.header_frame:
                raise OSError(errno.EIO, f"packed stream {self.log_id}: its header does not match")
            self.header_frame = data

    def make(self) -> Handle:
        fd = make_first_segment(self.final, self.header_frame)
        return self._cache.adopt((self.log_id, 0), fd)

    def stage(self) -> Handle:
        fd = make_first_segment(self.staged, self.header_frame)
        return self._cache.adopt((self.log_id, 0), fd)

    def place(self) -> None:
        os.rename(self.staged, self.final)

    def abandon(self) -> None:
        shutil.rmtree(self.staged, ignore_errors=True)
        shutil.rmtree(self.final, ignore_errors=True)

    def catalog_line(self) -> bytes:
        return catalog.encode(self.log_id, self._entry)


def make_first_segment(directory: str, data: bytes) -> int:
    """Make ``directory`` and its segment 0 holding ``data``, unsynced; returns the segment's fd
    (open for reading and writing). On an error it leaves nothing behind (hazard 20)."""
    os.mkdir(directory)
    try:
        path = os.path.join(directory, segment_name(0))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        try:
            pwrite_all(fd, [data], 0)
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return fd


def staging_dir(final: str, log_id: str) -> str:
    """``<data-dir>/staging/<id>`` for ``<data-dir>/streams/<id>``."""
    return os.path.join(os.path.dirname(os.path.dirname(final)), "staging", log_id)
