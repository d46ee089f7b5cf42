"""Low-level file helpers: a bounded, reference-counted fd cache and fsync/pwrite utilities.

Why reference counts: a cached fd may be evicted (or its stream deleted) while a worker thread is still
writing, fsyncing or reading through it. Closing it then would either skip an fsync (hazard 30) or, worse,
let the number be reused by another open() so the thread writes into the wrong file. A handle is therefore
closed only when it is both evicted and no longer in use; whoever wrote through a handle fsyncs that same
handle before releasing it.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_IOV_MAX = 1024
# The most one write call carries (see pwrite_all).
WRITE_CALL_BYTES = 1 << 20
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Handle:
    """One open file descriptor shared by readers and the writer of a segment."""

    __slots__ = ("fd", "key", "refs", "retired")

    def __init__(self, fd: int, key: Hashable) -> None:
        self.fd = fd
        self.key = key
        self.refs = 0
        self.retired = False


class FdCache:
    """A bounded LRU of segment fds. Thread-safe: acquired on the loop and in worker threads.

    The bound is soft: handles in use are never closed, so a burst can exceed ``capacity`` briefly.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._lock = threading.Lock()
        self._open: OrderedDict[Hashable, Handle] = OrderedDict()

    @property
    def capacity(self) -> int:
        return self._capacity

    def acquire(self, key: Hashable, path: str, *, evict: bool = True) -> Handle:
        """Return the handle for ``key``, opening ``path`` if needed. Pair with ``release``.

        ``evict=False``: if ``path`` is not cached and the cache is full, open it for the caller
        alone (closed on ``release``) rather than evict another file. A multi-range read of 10,000
        idle streams opens each file once: cached, it would evict every file the writers and
        readers of busy streams use, for nothing (it reads each file once), and each eviction
        costs a walk of the LRU. Like a cached handle in use, such a file counts towards the
        burst over the bound, at most one per reading thread."""
        with self._lock:
            handle = self._open.get(key)
            if handle is not None:
                self._open.move_to_end(key)
                handle.refs += 1
                return handle
            private = not evict and len(self._open) >= self._capacity
        if private:
            handle = Handle(os.open(path, os.O_RDONLY | _O_CLOEXEC), key)
            handle.refs = 1
            handle.retired = True  # never cached: closed when released
            return handle
        fd = os.open(path, os.O_RDWR | _O_CLOEXEC)
        to_close: list[int] = []
        with self._lock:
            handle = self._open.get(key)
            if handle is not None:  # another thread opened it meanwhile
                to_close.append(fd)
                handle.refs += 1
            else:
                handle = Handle(fd, key)
                handle.refs = 1  # before evicting, so the new handle is never a victim
                self._open[key] = handle
                to_close.extend(self._evict_locked())
        for extra in to_close:
            os.close(extra)
        return handle

    def acquire_cached(self, keys: Iterable[Hashable]) -> list[Handle | None]:
        """The handles of those ``keys`` that are cached (each referenced once: pair with
        ``release``), None for the others, under one lock: a batch of one read a file (a
        multi-range read of 10,000 directory streams) opens the files not cached itself, for
        itself, and caches none of them (``acquire(evict=False)``'s reasons), without a lock
        round and a ``Handle`` a file. Their LRU order is left alone."""
        got: list[Handle | None] = []
        append = got.append
        with self._lock:
            find = self._open.get
            for key in keys:
                handle = find(key)
                if handle is not None:
                    handle.refs += 1
                append(handle)
        return got

    def adopt(self, key: Hashable, fd: int) -> Handle:
        """Cache ``fd`` (just opened by the caller, e.g. a file it created) under ``key``, which must not
        be cached yet; returns its handle, referenced once (pair with ``release``)."""
        with self._lock:
            if key in self._open:
                raise ValueError(f"{key!r} is cached already")
            handle = Handle(fd, key)
            handle.refs = 1
            self._open[key] = handle
            to_close = self._evict_locked()
        for extra in to_close:
            os.close(extra)
        return handle

    def release(self, handle: Handle) -> None:
        with self._lock:
            handle.refs -= 1
            close_now = handle.retired and handle.refs == 0
            if close_now:
                handle.retired = False
                handle.fd, fd = -1, handle.fd
        if close_now:
            os.close(fd)

    def discard(self, predicate: Callable[[Hashable], bool]) -> None:
        """Forget every handle whose key matches; close those not in use (the rest on release)."""
        to_close: list[int] = []
        with self._lock:
            for key in [k for k in self._open if predicate(k)]:
                to_close.extend(self._retire_locked(self._open.pop(key)))
        for fd in to_close:
            os.close(fd)

    def discard_keys(self, keys: Iterable[Hashable]) -> None:
        """``discard`` of the handles of ``keys``: a log forgetting its own segments costs its number
        of segments, not the cache's size (closing 100,000 logs must not scan the cache each time)."""
        to_close: list[int] = []
        with self._lock:
            for key in keys:
                handle = self._open.pop(key, None)
                if handle is not None:
                    to_close.extend(self._retire_locked(handle))
        for fd in to_close:
            os.close(fd)

    def trim(self) -> None:
        """Close the least recently used handles not in use, down to ``capacity``: after a checkpoint
        releases the handles it kept in use (``committer.py``), a cache that grew past its bound
        meanwhile shrinks now, not at its next acquire (which an idle server may never make)."""
        with self._lock:
            to_close = self._evict_locked()
        for fd in to_close:
            os.close(fd)

    def close_all(self) -> None:
        self.discard(lambda _key: True)

    def __len__(self) -> int:
        return len(self._open)

    def _evict_locked(self) -> list[int]:
        """Close the least recently used handles not in use, down to ``capacity``. Walks from the old
        end only as far as it must: writes to many streams (a bulk commit to 2,000) evict on almost
        every acquire, and copying the whole LRU's keys each time cost ~7% of the server's CPU."""
        excess = len(self._open) - self._capacity
        if excess <= 0:
            return []
        victims = []
        for key, handle in self._open.items():
            if handle.refs == 0:
                victims.append(key)
                if len(victims) == excess:
                    break
        closed: list[int] = []
        for key in victims:
            closed.extend(self._retire_locked(self._open.pop(key)))
        return closed

    @staticmethod
    def _retire_locked(handle: Handle) -> list[int]:
        if handle.refs == 0:
            fd, handle.fd = handle.fd, -1
            return [fd]
        handle.retired = True
        return []


def pwrite_all(fd: int, buffers: Iterable[bytes | bytearray], offset: int) -> int:
    """Write every buffer at ``offset`` (pwritev of at most ``WRITE_CALL_BYTES`` and IOV_MAX buffers per
    call, resuming after short writes); returns the bytes written.

    Why at most 1 MiB per call: the kernel sizes the page-cache folios of a buffered write by the
    call's length, and on the virtual machines we measured, one call of 2 MiB or more intermittently
    ran at about 0.45 GB/s instead of 5 GB/s. A 4 MiB staged request took 13.6 ms to write in one
    call, 0.8 ms in four. (Once a few hundred MB of memory the guest has not used recently are being
    written, calls of any size run at that speed, and calls smaller than 1 MiB did not help:
    docs/decisions/0004, section 7.)
    """
    total = 0
    batch: list[bytes | bytearray | memoryview] = []
    batch_bytes = 0
    for buffer in buffers:
        size = len(buffer)
        if size > WRITE_CALL_BYTES:
            view = memoryview(buffer).cast("B")
            pieces: Sequence[bytes | bytearray | memoryview] = [
                view[start : start + WRITE_CALL_BYTES] for start in range(0, size, WRITE_CALL_BYTES)
            ]
        else:
            pieces = (buffer,)
        for piece in pieces:
            length = len(piece)
            if batch and (batch_bytes + length > WRITE_CALL_BYTES or len(batch) == _IOV_MAX):
                _pwritev_exact(fd, batch, batch_bytes, offset + total)
                total += batch_bytes
                batch = []
                batch_bytes = 0
            batch.append(piece)
            batch_bytes += length
    if batch:
        _pwritev_exact(fd, batch, batch_bytes, offset + total)
        total += batch_bytes
    return total


def _pwritev_exact(
    fd: int, batch: list[bytes | bytearray | memoryview], want: int, offset: int
) -> None:
    done = os.pwritev(fd, batch, offset)
    if done < want:
        rest = b"".join(batch)
        while done < want:
            n = os.pwrite(fd, memoryview(rest)[done:], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            done += n


def pread_exact(fd: int, length: int, offset: int) -> bytes:
    """``pread`` exactly ``length`` bytes or raise (a short read inside known data means the file shrank)."""
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise OSError(errno.EIO, f"short read at {offset + got} (wanted {length} bytes)")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def write_file(path: str | os.PathLike[str], flags: int, data: bytes, *, sync: bool) -> None:
    """Open ``path`` with ``flags`` (and O_CLOEXEC, mode 0o644), write all of ``data``, fdatasync it
    if ``sync``, close it."""
    fd = os.open(path, flags | _O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def replace_file(
    final: Path, buffers: Iterable[bytes | bytearray | memoryview], *, sync: bool
) -> int:
    """Put ``buffers`` at ``final`` whole or not at all: written to ``final`` + ``.tmp``, fdatasync'd,
    renamed over ``final``, its directory fsync'd (with ``sync``). A crash leaves the old file or the
    new one, never part of either, plus maybe a stray ``.tmp`` the owner removes at start-up. Returns
    the bytes written."""
    temporary = final.with_name(final.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
    try:
        size = pwrite_all(fd, buffers, 0)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, final)
    if sync:
        fsync_dir(final.parent)
    return size


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (creates, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_out_of_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))
