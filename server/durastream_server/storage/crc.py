"""CRC-32 for record checksums: zlib's polynomial, computed by zlib-ng's SIMD code when it is installed.

Every byte a catch-up read returns is checksummed on the way out (codec.py, reader.py), so the checksum
speed bounds read throughput: CPython's ``zlib.crc32`` (the system zlib) does about 3.5 GiB/s on the
benchmark machine, which made it a third of a 1 MiB read's server time; zlib-ng's ``crc32`` (same
polynomial, same values, so the on-disk format is unchanged) does about 50 GiB/s there. See
docs/decisions/0004-performance.md. The fallback keeps the server correct without the wheel.

``replace_prefix`` updates a stored checksum for new leading bytes without reading the rest: a staged-
append commit rewrites only the 25 fixed bytes at the front of each moved record, and the payload
behind them (megabytes) must not have to be read back just to checksum it again (group.py).
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32, crc32_combine
except ImportError:  # pragma: no cover - zlib-ng is a declared dependency; this is a safety net
    from zlib import crc32

    crc32_combine = None

__all__ = ["crc32", "crc32_combine_zeros", "replace_prefix"]

_POLY = 0xEDB88320  # zlib's polynomial, bit-reflected


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial, both bit-reflected (bit 31 is x^0)."""
    m = 1 << 31
    product = 0
    while a:
        if a & m:
            product ^= b
            a ^= m
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _x8nmodp(n: int) -> int:
    """x^(8n) modulo the polynomial: the effect of n zero bytes on the CRC register."""
    power = 1 << 31  # x^0
    square = 1 << 23  # x^8 (one zero byte)
    while n:
        if n & 1:
            power = _multmodp(square, power)
        square = _multmodp(square, square)
        n >>= 1
    return power


def crc32_combine_zeros(crc: int, length: int) -> int:
    """``crc32_combine(crc, 0, length)``: the contribution of the register state ``crc`` after
    ``length`` more bytes, independent of what those bytes are (CRC-32 is linear over GF(2))."""
    if crc32_combine is not None:
        return crc32_combine(crc, 0, length)
    return _multmodp(_x8nmodp(length), crc)


def replace_prefix(stored: int, old_prefix_crc: int, new_prefix_crc: int, rest_len: int) -> int:
    """The checksum of ``new_prefix + rest`` from the stored checksum of ``old_prefix + rest``.

    ``old_prefix_crc`` and ``new_prefix_crc`` are the checksums of the two (same-length) prefixes,
    computed from the same seed; ``rest_len`` is the length of the unchanged bytes after them. Since
    ``crc(P + R) = shift(crc(P), len(R)) ^ crc(R)``, swapping the prefix changes the checksum by
    ``shift(old ^ new, len(R))``. If ``rest`` no longer holds what ``stored`` was computed over, the
    result is wrong for it in the same way: damage is carried into the new checksum, never hidden.
    """
    return stored ^ crc32_combine_zeros(old_prefix_crc ^ new_prefix_crc, rest_len)
