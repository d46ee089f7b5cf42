"""The record checksum's arithmetic: swapping a record's leading bytes without reading the rest."""

from __future__ import annotations

import random
import zlib

import pytest

from durastream_server.storage import crc


@pytest.mark.parametrize("rest_len", [0, 1, 7, 4096, 1_000_003])
def test_replace_prefix_equals_the_checksum_of_the_new_bytes(rest_len: int) -> None:
    rng = random.Random(rest_len)
    seed = zlib.crc32(b"\x02")
    old, new = rng.randbytes(25), rng.randbytes(25)
    rest = rng.randbytes(rest_len)
    stored = zlib.crc32(old + rest, seed)
    derived = crc.replace_prefix(stored, zlib.crc32(old, seed), zlib.crc32(new, seed), rest_len)
    assert derived == zlib.crc32(new + rest, seed)


def test_damage_in_the_rest_survives_the_swap() -> None:
    """A stored checksum that no longer matches its bytes gives a derived one that does not match the
    new bytes either: the swap never turns damaged data into valid data."""
    rng = random.Random(1)
    old, new, rest = rng.randbytes(25), rng.randbytes(25), bytearray(rng.randbytes(5000))
    stored = zlib.crc32(old + rest)
    rest[1234] ^= 0x40
    derived = crc.replace_prefix(stored, zlib.crc32(old), zlib.crc32(new), len(rest))
    assert derived != zlib.crc32(new + rest)


@pytest.mark.parametrize("length", [0, 1, 2, 255, 4 << 20, (1 << 32) + 5])
def test_the_fallback_shift_matches_zlib_ng(length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without zlib-ng's crc32_combine the same value comes from the GF(2) arithmetic in crc.py."""
    if crc.crc32_combine is None:
        pytest.skip("zlib-ng is not installed; the fallback is the only implementation")
    values = [0, 1, 0xDEADBEEF, 0xFFFFFFFF]
    expected = [crc.crc32_combine_zeros(v, length) for v in values]
    monkeypatch.setattr(crc, "crc32_combine", None)
    assert [crc.crc32_combine_zeros(v, length) for v in values] == expected
