"""Forks across shards with ``--workers N`` (decision 0009, "What is left" 3).

A fork shares its source's stored data (the engine references the source's log up to the fork
point), so it must live in the worker that holds its source: in its source's shard, whatever shard
its own path hashes to. Placement:

* The fork's **home** (``shard_of(fork path)``, where every worker sends its requests, as for any
  stream) keeps a small table, fork path -> the shard that holds it (``ForkPlacements``), durable in
  its shard directory (``meta/fork-placements``, written whole: ``atomic_write``, a temporary file, fsync,
  rename, fsync of the directory) *before* the create is forwarded, so a fork that exists is always found
  after a SIGKILL or restart of any worker. The home forwards every request for that path there,
  marked as placed (``PLACED_HEADER``, honoured only from a worker's Unix socket): the holder serves
  it whatever its path hashes to.
* The holder serves a path it holds (``ShardRouter.hosts``, its engine's streams) when a request for
  it reaches it from anywhere, e.g. a connection handed over to it: only the home's table decides
  where a create goes.
* Requests naming many streams (bulk writes, multi-range reads) are split by where each path lives,
  read from every shard's table file (``PlacementFiles``; read again when it changed).
* Where a source lives (``location``): its home's table, asked over the Unix sockets when the home is
  another worker (``PLACEMENT_HEADER`` on a ``GET`` of the source's path, answered with the shard
  number), so a fork of a fork goes where its source was placed.

A placement is never removed: once a path is placed in a shard, that path lives there (deleted and
created again, it is created there), so no request is ever routed by a stale table; a path placed
where it no longer exists is placed again when a fork of a source elsewhere is created at it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Final

from durastream_server.subscriptions.store import atomic_write

logger = logging.getLogger(__name__)

FILE: Final = "fork-placements"
# A request forwarded by a fork's home to the shard holding it (served there, not routed again).
PLACED_HEADER: Final = "x-durastream-placed"
# A worker asking a path's home where it lives (the answer's body: the shard number).
PLACEMENT_HEADER: Final = "x-durastream-placement"


class ForkPlacements:
    """This shard's table of forks whose path hashes here but which live in another shard."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._where: dict[str, int] = _load(path)
        self._lock = asyncio.Lock()

    def get(self, path: str) -> int | None:
        return self._where.get(path)

    @property
    def where(self) -> dict[str, int]:
        """The table now (replaced, never changed in place, by ``place``)."""
        return self._where

    async def place(self, path: str, shard: int) -> None:
        """Record that ``path`` lives in ``shard``, durably, before returning."""
        async with self._lock:  # one writer at a time: the file is written whole
            if self._where.get(path) == shard:
                return
            updated = {**self._where, path: shard}
            await asyncio.to_thread(_write, self._path, updated)
            self._where = updated


class PlacementFiles:
    """Every shard's placement table as its file now says, for splitting requests that name many
    streams (bulk writes, multi-range reads: ``ShardRouter.holders``) without asking each
    path's home. A file is read again only when its ``stat`` changed; a home writes its table (and
    renames it into place) before it forwards the fork's create, so a client that saw the fork
    created finds it here."""

    def __init__(self, files: dict[int, Path]) -> None:
        self._files = files
        self._seen: dict[int, tuple[tuple[int, int, int], dict[str, int]]] = {}

    def table(self, shard: int) -> dict[str, int]:
        path = self._files[shard]
        try:
            info = path.stat()
        except FileNotFoundError:
            return {}
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        seen = self._seen.get(shard)
        if seen is None or seen[0] != key:
            try:
                seen = (key, _load(path))
            except (OSError, ValueError, KeyError):  # being replaced: as it was
                return seen[1] if seen is not None else {}
            self._seen[shard] = seen
        return seen[1]


def _load(path: Path) -> dict[str, int]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    placements = document["placements"]
    if document.get("version") != 1 or not isinstance(placements, dict):
        raise ValueError(f"{path}: not a fork placement table of version 1")
    return {str(fork): int(shard) for fork, shard in placements.items()}


def _write(path: Path, placements: dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = json.dumps({"version": 1, "placements": placements}, sort_keys=True)
    atomic_write(path, document.encode("utf-8"), mode=0o644)
