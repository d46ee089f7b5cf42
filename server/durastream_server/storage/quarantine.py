"""Setting damaged streams aside: ``<data-dir>/quarantine/``.

A stream that cannot be served must neither stop the server nor be served partially or reset to offset
0 (hazard 32). Whatever found the damage (recovery: a bad header, mid-file corruption, a missing
segment; the engine: a header it cannot use, staged-append state it cannot read), the stream goes
through one path, ``DataDir.quarantine``, which uses this module:

- ``quarantine/<name>.json`` (``{"id", "path", "reason", "at_ms"}``) is written first, atomically;
- then ``streams/<id>/`` is renamed to ``quarantine/<name>/``, unchanged and never deleted (``<name>``
  is the storage id, with a suffix if that name is already taken). A crash in between leaves the stream
  in ``streams/``, where the next start-up finds the damage again; the description without its
  directory is then ignored and replaced.

An entry counts while its directory is in ``quarantine/``: at every start-up ``load`` reads them back, so
a quarantined path stays reserved across restarts (its requests answer ``500 CORRUPT_STREAM`` and a
``PUT`` cannot re-create it empty) and ``/healthz`` keeps listing it. An operator releases it by moving
the directory back into ``streams/`` after a repair, or by removing it, together with its ``.json``.

Everything here is blocking file work, for the I/O pool.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from durastream_server.storage.files import fsync_dir, write_file

log = logging.getLogger(__name__)

QUARANTINE_DIR: Final = "quarantine"
_META_SUFFIX: Final = ".json"
_TMP_SUFFIX: Final = ".tmp"


@dataclass(frozen=True, slots=True)
class QuarantinedStream:
    """One set-aside stream directory, as ``/healthz`` reports it."""

    name: str  # its entry under quarantine/
    id: str  # the storage id it had under streams/
    path: str | None  # the stream path; None when even the header is unreadable
    reason: str
    at_ms: int  # when it was set aside

    @property
    def location(self) -> str:
        """Where it is, relative to the data directory."""
        return f"{QUARANTINE_DIR}/{self.name}"


def free_name(taken: set[str], storage_id: str) -> str:
    """The entry name for ``storage_id``: the id itself, or ``<id>.<n>`` if an entry has it already
    (the same directory quarantined twice, e.g. after an operator copied it back)."""
    name, n = storage_id, 1
    while name in taken:
        name, n = f"{storage_id}.{n}", n + 1
    return name


def set_aside(root: Path, source: Path, entry: QuarantinedStream, *, sync: bool) -> None:
    """Blocking: describe ``entry`` in ``quarantine/<name>.json``, then rename ``source`` (a stream
    directory under ``root``) to ``quarantine/<name>``. Raises ``OSError``."""
    directory = root / QUARANTINE_DIR
    directory.mkdir(exist_ok=True)
    meta = directory / (entry.name + _META_SUFFIX)
    tmp = directory / (entry.name + _META_SUFFIX + _TMP_SUFFIX)
    text = json.dumps(asdict(entry), ensure_ascii=False, sort_keys=True).encode()
    write_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, text, sync=sync)
    os.replace(tmp, meta)
    os.rename(source, directory / entry.name)
    if sync:
        fsync_dir(directory)
        fsync_dir(source.parent)


def load(root: Path) -> list[QuarantinedStream]:
    """Blocking: the entries under ``quarantine/`` (none if it does not exist). A directory without a
    readable description is reported with an unknown path; a description without its directory (a
    crash before the rename, or a released entry) is removed."""
    directory = root / QUARANTINE_DIR
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    entries = []
    listed = set(names)
    for name in names:
        if name.endswith(_META_SUFFIX + _TMP_SUFFIX):
            _unlink(directory / name)
            continue
        if name.endswith(_META_SUFFIX):
            if name[: -len(_META_SUFFIX)] not in listed:
                log.info("quarantine: %s describes no directory any more; removing it", name)
                _unlink(directory / name)
            continue
        entries.append(_describe(directory, name))
    return entries


def _describe(directory: Path, name: str) -> QuarantinedStream:
    try:
        data = json.loads((directory / (name + _META_SUFFIX)).read_bytes())
        path = data["path"]
        return QuarantinedStream(
            name=name,
            id=str(data["id"]),
            path=path if isinstance(path, str) else None,
            reason=str(data["reason"]),
            at_ms=int(data["at_ms"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("quarantine: %s has no readable description (%s)", name, exc)
        return QuarantinedStream(name, name, None, "set aside (no readable description)", 0)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        log.warning("quarantine: could not remove %s: %s", path, exc)
