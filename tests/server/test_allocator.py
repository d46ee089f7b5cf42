"""The server's allocator settings (allocator.py): large request bodies come from the heap and their memory
stays in the process between requests, instead of being mapped and unmapped (and faulted in) per request."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Run in a child so the test process keeps glibc's defaults. mallinfo2().hblkhd is the memory glibc holds
# in mmapped chunks: a fresh process maps an 8 MiB block (the default dynamic threshold starts at 128 KiB)
# and, with the server's fixed thresholds, serves it from the heap instead.
_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from durastream_server import allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    configured = allocator.keep_freed_memory() if sys.argv[1] == "server" else None
    before = libc.mallinfo2().hblkhd
    block = ctypes.create_string_buffer(8 * 1024 * 1024)
    print(configured, libc.mallinfo2().hblkhd - before)
    """
)


def _probe(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def _glibc_with_mallinfo2() -> bool:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallinfo2  # noqa: B018
    except (OSError, AttributeError):
        return False
    return True


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")
def test_large_blocks_come_from_the_heap_once_the_server_configured_malloc() -> None:
    _, mapped = _probe("default")
    assert mapped >= 8 * 1024 * 1024
    assert _probe("server") == ("True", 0)


# With the server's thresholds, 40 MB of small blocks freed at once stay resident (under the 64 MiB trim
# threshold) until release_free_memory hands them back, as it does after background recovery.
_TRIM_PROBE = textwrap.dedent(
    """
    import ctypes, os
    from durastream_server import allocator

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    assert allocator.keep_freed_memory()
    blocks = [libc.malloc(1000) for _ in range(40_000)]
    for block in blocks:
        ctypes.memset(block, 1, 1000)
    for block in blocks:
        libc.free(block)
    kept = rss()
    released = allocator.release_free_memory()
    print(released, kept - rss())
    """
)


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc (malloc_trim)")
def test_release_free_memory_hands_freed_heap_memory_back_to_the_kernel() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _TRIM_PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "True"
    assert int(out[1]) >= 20 * 1024 * 1024, f"only {int(out[1])} bytes of RSS released"
