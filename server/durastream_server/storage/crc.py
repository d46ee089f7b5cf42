"""CRC-32 for record checksums: zlib's polynomial, computed by zlib-ng's SIMD code when it is installed.

Every byte a catch-up read returns is checksummed on the way out (codec.py, reader.py), so the checksum
speed bounds read throughput: CPython's ``zlib.crc32`` (the system zlib) does about 3.5 GiB/s on the
benchmark machine, which made it a third of a 1 MiB read's server time; zlib-ng's ``crc32`` (same
polynomial, same values, so the on-disk format is unchanged) does about 50 GiB/s there. See
docs/decisions/0004-performance.md. The fallback keeps the server correct without the wheel.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a declared dependency; this is a safety net
    from zlib import crc32

__all__ = ["crc32"]
