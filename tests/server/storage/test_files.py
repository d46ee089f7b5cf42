"""``pwrite_all``: every byte lands in order, whatever the buffers, in calls of at most 1 MiB."""

from __future__ import annotations

import os
import random
from collections import OrderedDict

import pytest

from durastream_server.storage import files
from durastream_server.storage.files import WRITE_CALL_BYTES, pwrite_all


def _buffers(rng: random.Random) -> list[bytes | bytearray | memoryview]:
    sizes = [rng.choice([0, 1, 7, 1000, 70_000]) for _ in range(2500)]  # > IOV_MAX buffers
    sizes += [WRITE_CALL_BYTES, WRITE_CALL_BYTES + 1, 3 * WRITE_CALL_BYTES + 12345]
    rng.shuffle(sizes)
    out: list[bytes | bytearray | memoryview] = []
    for index, size in enumerate(sizes):
        data = rng.randbytes(size)
        out.append((bytes, bytearray, memoryview)[index % 3](data))
    return out


def test_buffers_land_in_order_in_calls_of_at_most_one_mebibyte(tmp_path, monkeypatch) -> None:
    rng = random.Random(4)
    buffers = _buffers(rng)
    calls: list[int] = []
    real_pwritev = os.pwritev

    def counting_pwritev(fd: int, batch: list, offset: int) -> int:
        calls.append(sum(len(b) for b in batch))
        assert len(batch) <= 1024
        return real_pwritev(fd, batch, offset)

    monkeypatch.setattr(files.os, "pwritev", counting_pwritev)
    path = tmp_path / "out"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"head", 0)
        written = pwrite_all(fd, buffers, 4)
    finally:
        os.close(fd)
    expected = b"".join(bytes(b) for b in buffers)
    assert written == len(expected)
    assert path.read_bytes() == b"head" + expected
    assert max(calls) <= WRITE_CALL_BYTES
    assert sum(calls) == len(expected)


@pytest.mark.parametrize("short_by", [1, 4096, 700_000])
def test_short_writes_are_resumed(tmp_path, monkeypatch, short_by: int) -> None:
    """A pwritev that writes less than asked (a signal, a full disk's last blocks) is finished by pwrite."""
    buffers = _buffers(random.Random(short_by))
    real_pwritev = os.pwritev

    def short_pwritev(fd: int, batch: list, offset: int) -> int:
        want = sum(len(b) for b in batch)
        keep = max(0, want - short_by)
        data = b"".join(bytes(b) for b in batch)[:keep]
        return real_pwritev(fd, [data], offset) if data else 0

    monkeypatch.setattr(files.os, "pwritev", short_pwritev)
    path = tmp_path / "out"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        written = pwrite_all(fd, buffers, 0)
    finally:
        os.close(fd)
    expected = b"".join(bytes(b) for b in buffers)
    assert written == len(expected)
    assert path.read_bytes() == expected


class _CountingLru(OrderedDict):
    """The cache's LRU, counting the entries any walk over it visits."""

    visited = 0

    def __iter__(self):
        for key in super().__iter__():
            _CountingLru.visited += 1
            yield key

    def items(self):
        for item in super().items():
            _CountingLru.visited += 1
            yield item


def test_eviction_walks_only_as_far_as_it_must_and_spares_handles_in_use(tmp_path) -> None:
    """Writes to more streams than the cache holds evict on every acquire: each eviction visits the
    few oldest entries, not the whole LRU (main copied all its keys each time: 100 per eviction here),
    and never closes a handle in use."""
    capacity, extra = 100, 50
    paths = []
    for index in range(capacity + extra):
        path = tmp_path / f"segment-{index}"
        path.write_bytes(b"x")
        paths.append(str(path))
    cache = files.FdCache(capacity)
    cache._open = _CountingLru()
    held = cache.acquire("k0", paths[0])  # the oldest entry, in use throughout
    for index in range(1, capacity):
        cache.release(cache.acquire(f"k{index}", paths[index]))
    _CountingLru.visited = 0
    for index in range(capacity, capacity + extra):
        cache.release(cache.acquire(f"k{index}", paths[index]))
    assert _CountingLru.visited <= 3 * extra, _CountingLru.visited
    assert len(cache) == capacity
    assert list(cache._open)[:2] == ["k0", f"k{extra + 1}"]  # k1..k50 evicted, in LRU order
    assert os.read(held.fd, 1) == b"x"  # still open
    cache.release(held)
    cache.close_all()


def test_an_acquire_that_may_not_evict_opens_a_file_for_its_caller_alone(tmp_path) -> None:
    """``acquire(evict=False)`` (a multi-range read of many files, each read once) uses a cached
    file, caches a new one while there is room, and once the cache is full opens the file for its
    caller alone: no cached file is evicted, and the private one is closed on release."""
    paths = []
    for index in range(4):
        path = tmp_path / f"segment-{index}"
        path.write_bytes(b"%d" % index)
        paths.append(str(path))
    cache = files.FdCache(2)
    cache.release(cache.acquire("k0", paths[0]))
    cached = cache.acquire("k0", paths[0], evict=False)
    assert os.pread(cached.fd, 1, 0) == b"0" and list(cache._open) == ["k0"]
    cache.release(cached)
    cache.release(cache.acquire("k1", paths[1], evict=False))  # room: cached
    assert list(cache._open) == ["k0", "k1"]
    kept = [cache._open["k0"].fd, cache._open["k1"].fd]
    private = cache.acquire("k2", paths[2], evict=False)
    assert os.pread(private.fd, 1, 0) == b"2"
    assert list(cache._open) == ["k0", "k1"]  # nothing evicted, the new file not cached
    fd = private.fd
    cache.release(private)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed on release (no other file was opened meanwhile to reuse it)
    assert [cache._open["k0"].fd, cache._open["k1"].fd] == kept
    assert all(os.fstat(fd) for fd in kept)
    cache.release(cache.acquire("k3", paths[3]))  # an ordinary acquire still evicts
    assert list(cache._open) == ["k1", "k3"]
    cache.close_all()
