"""A packed stream's promotion to a directory of its own, made by the commit round of its first write.

A packed stream (``packs.py``) has no directory. Its first write (append, close, producer state, soft
delete, a staged-append commit) gives it one, in the same round as the write (``committer.py``):

1. before the round's WAL write, its directory is made under ``staging/<id>/`` with segment 0 holding the
   header record, and the write's records are written after it (all unsynced, as every round's);
2. the round's WAL entries carry a CREATE entry (the header record at offset 0 of segment 0) followed by
   the records' entries, synced once with the round;
3. after the sync, the directory is renamed into ``streams/`` (unsynced: the checkpoint of that WAL file
   syncs the segment, the directory and ``streams/``, and only then makes the packed create void).

A crash before 3 leaves the directory under ``staging/``, emptied at start-up: the stream is still packed,
and if the round's WAL write was whole its replay makes the directory with the write (acknowledged or
about to be); if not, the stream comes back packed and empty. A crash after 3 leaves the directory in
``streams/``, which wins over the pack at start-up (``packs.settle``). A failure before the sync removes
the staged directory: the stream stays packed and correct, and only that write fails.
"""

from __future__ import annotations

import os
import shutil

from durastream_server.storage import catalog
from durastream_server.storage.files import FdCache, Handle, pwrite_all
from durastream_server.storage.segments import segment_name

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Promotion:
    """``committer.Promotion`` for one packed stream (made per promoting round, not kept)."""

    __slots__ = ("log_id", "header_frame", "staged", "final", "_cache", "_entry")

    def __init__(
        self,
        log_id: str,
        header_frame: bytes,
        final: str,
        cache: FdCache,
        entry: catalog.Entry,
    ) -> None:
        self.log_id = log_id
        self.header_frame = header_frame
        self.final = final  # <data-dir>/streams/<id>
        self.staged = staging_dir(final, log_id)
        self._cache = cache
        self._entry = entry

    def stage(self) -> Handle:
        return self._cache.adopt(
            (self.log_id, 0), make_first_segment(self.staged, self.header_frame)
        )

    def place(self) -> str:
        os.rename(self.staged, self.final)
        return self.final

    def abandon(self) -> None:
        shutil.rmtree(self.staged, ignore_errors=True)

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
