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
