"""Keep the memory of large request bodies in the server process instead of handing it back per request.

glibc's malloc serves a large allocation (a 4 MiB staged request body, the frame it becomes) from its heap
only after its *dynamic* mmap threshold has risen past that size, and gives the top of a heap back to the
kernel as soon as more than twice that threshold is free. Under the Spark sink's steady stream of 4 MiB
requests, spread over the event loop and the I/O threads' arenas, that meant 12,000-40,000 page faults per
300 MB batch: memory returned to the kernel and faulted back in, zero-filled, moments later (about 6% of
the server's CPU on the sink benchmark, more on virtual machines whose fresh memory is slow to touch).

Fixed thresholds end that: allocations below ``MMAP_THRESHOLD`` come from the heap, and a heap keeps up
to ``TRIM_THRESHOLD`` of free memory at its top for the next request. The cost is that much resident
memory after a burst of large requests, per heap, bounded and reused.

Only the server's entry point (``cli.main``) calls this: it changes the whole process's allocator, which
is not a library's decision to make for an application that embeds the server.

``release_free_memory`` is the other direction, once: after background recovery (``engine/recovery.py``)
the heaps hold the freed temporaries of 100,000 stream recoveries (file buffers, batch lists, decoded
records) between and above the long-lived objects, kept resident by the trim threshold above; handing
them back is about 300 bytes of RSS per idle stream (issue 17). It changes no setting.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's own ceiling for its dynamic threshold
TRIM_THRESHOLD = 64 * 1024 * 1024
_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def _glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (whose malloc the functions here tune); None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError on a libc that is not glibc
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds; False (and nothing changed) where malloc is not glibc's."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    if not done:
        log.debug("mallopt refused the thresholds; the allocator keeps its defaults")
    return done


def release_free_memory() -> bool:
    """Give the free memory of every malloc heap back to the kernel (glibc's ``malloc_trim(0)``: the
    free top of each heap, and whole free pages inside it); False where malloc is not glibc's.

    It walks every heap under that heap's lock, some milliseconds for a few hundred MiB: call it from a
    worker thread, never on the event loop, and only after a burst that freed much (recovery).
    """
    libc = _glibc()
    if libc is None:
        return False
    trim = libc.malloc_trim
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    released = trim(0) == 1
    log.debug("malloc_trim: %s", "memory released" if released else "nothing to release")
    return True
