"""The sharded data directory and which shard owns a stream (decision 0009, ``--workers N``).

``<data-dir>/``
  ``SHARDS``       the number of shards, fixed when the directory was made sharded; a server started with
                   another ``--workers`` refuses to start (changing it is an offline re-shard).
  ``shards/<k>/``  shard ``k``'s own data directory (``storage/datadir.py``: its own LOCK, WAL, committer).

A stream lives in shard ``crc32(path) % N`` of its canonical engine path (``http/paths.py``). CRC-32 and
not Python's ``hash``: the placement must be the same in every process and after every restart
(``hash`` of a str is salted per process).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from durastream_server.storage.files import fsync_dir, replace_file

MARKER: Final = "SHARDS"
SHARDS_DIR: Final = "shards"
# What an unsharded data directory holds once a server has opened it (storage/datadir.py).
_UNSHARDED_SIGNS: Final = ("LOCK", "streams", "wal", "catalog", "FEATURES")


class LayoutMismatch(ValueError):
    """The data directory was made for another number of workers; the message says what to do."""


def shard_of(path: str, count: int) -> int:
    """The shard that owns the stream at canonical engine ``path`` among ``count`` shards."""
    if count == 1:
        return 0
    return zlib.crc32(path.encode("utf-8", "surrogatepass")) % count


def shard_dir(root: Path, index: int) -> Path:
    return root / SHARDS_DIR / str(index)


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """What a data directory is: unsharded (``count`` 1, no marker) or made for ``count`` workers."""

    root: Path
    count: int

    @classmethod
    def read(cls, root: Path) -> ShardLayout:
        """The layout recorded in ``root``; an unsharded (or new, empty) directory is ``count`` 1."""
        marker = root / MARKER
        try:
            text = marker.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return cls(root, 1)
        if not text.isdigit() or int(text) < 2:
            raise LayoutMismatch(
                f"{marker} holds {text!r}, not a number of workers >= 2; it was not written by this "
                "server: restore it from a backup or move the directory away"
            )
        return cls(root, int(text))

    def check(self, workers: int) -> None:
        """Refuse to serve this directory with ``workers`` processes unless that is what it was made for
        (a new, empty directory takes any number)."""
        if workers == self.count:
            return
        flag = f"--workers {workers}"
        if self.count > 1:
            raise LayoutMismatch(
                f"--data-dir {self.root} is sharded for --workers {self.count} ({self.root / MARKER}), "
                f"not {flag}: start with --workers {self.count} (changing the number of workers is an "
                "offline re-shard, not available yet)"
            )
        if _is_unsharded_data(self.root):
            raise LayoutMismatch(
                f"--data-dir {self.root} holds an unsharded data directory (--workers 1), not one for "
                f"{flag}: start with --workers 1, or give an empty directory for {flag} (moving streams "
                "into shards is an offline re-shard, not available yet)"
            )

    def create(self, workers: int) -> ShardLayout:
        """``check`` ``workers``, then make ``root`` sharded for them if it is new (``workers`` > 1):
        the shard directories, then the marker, written and synced before any worker opens a shard (so
        a crash leaves either no marker and empty shard directories, which the next start completes,
        or the whole layout)."""
        self.check(workers)
        if self.count == workers:
            return self
        for index in range(workers):
            shard_dir(self.root, index).mkdir(parents=True, exist_ok=True)
        fsync_dir(self.root / SHARDS_DIR)
        replace_file(self.root / MARKER, [f"{workers}\n".encode("ascii")], sync=True)
        return ShardLayout(self.root, workers)


def _is_unsharded_data(root: Path) -> bool:
    return any((root / name).exists() for name in _UNSHARDED_SIGNS)
