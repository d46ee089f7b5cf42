"""The staged-append state of one stream incarnation: open handles, tombstones, and how a handle name
that has no open handle answers. Also its rebuild at start-up from the files in ``<stream dir>/txn/``.

``staging.TxnManager`` owns one ``StreamTxns`` per incarnation and does all I/O through the executor;
this module holds the plain state and the decisions that only depend on it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from durastream_server.engine import producers
from durastream_server.engine.registry import KeyedLocks
from durastream_server.engine.txnapi import HANDLE_SYNTAX, first_invalid_handle
from durastream_server.errors import (
    BadRequest,
    ProtocolError,
    StorageFailure,
    TxnAborted,
    TxnAlreadyCommitted,
    TxnCorrupt,
    TxnExpired,
    TxnNotFound,
)
from durastream_server.storage import txnfile
from durastream_server.storage.records import StagedSource
from durastream_server.storage.state import StreamState
from durastream_server.storage.txnfile import HandleHeader, Tombstone

logger = logging.getLogger(__name__)

ABORTED = "aborted"
EXPIRED = "expired"
CORRUPT = "corrupt"
FENCED = "fenced"  # aborted before anything was staged under it (or after it was long forgotten)


def commit_digest(handles: tuple[str, ...], closes: bool, key: str | None = None) -> bytes:
    """What a commit asks for, to tell its retry (204) from a reused tuple (409, hazard 4). Prefixed
    with ``T`` so it can never equal an append's digest; same hash and size as ``request_digest``.

    With a commit key (``Durastream-Commit-Key``) the digest covers the key and the close flag instead
    of the handle list, prefixed with ``K``: a writer that re-stages its data under new handles (a Spark
    batch replayed after its driver died) then gets a 204 for a commit that an earlier run of it made,
    and a 409 when the tuple was used by anything else: an append, a commit without the key, or a
    commit with another key (the sink tells its two exactly-once modes apart this way, decision 0006).
    """
    if key is not None:
        digest = producers.new_hasher(b"KC" if closes else b"KA")
        digest.update(key.encode())
        return digest.digest(producers.DIGEST_SIZE)
    digest = producers.new_hasher(b"TC" if closes else b"TA")
    digest.update("\n".join(handles).encode())
    return digest.digest(producers.DIGEST_SIZE)


def check_handle_names(handles: tuple[str, ...], header: str) -> None:
    """Defence in depth (the HTTP layer checks first): valid and distinct names."""
    bad = first_invalid_handle(handles)
    if bad is not None:
        raise BadRequest(f"{header}: invalid handle {bad!r}; expected {HANDLE_SYNTAX}")
    if len(set(handles)) != len(handles):
        raise BadRequest(f"{header} lists a handle more than once")


@dataclass(slots=True)
class StagedHandle:
    """One open handle: its staging file and its fold (totals and stage dedupe state)."""

    name: str
    path: str
    header: HandleHeader
    data_start: int  # file offset of the first staged record
    end: int  # durable end of the file
    state: StreamState  # tail = staged payload bytes; producers = the handle's stage producers
    n_messages: int = 0
    committing: bool = False  # a commit holding this handle is being written
    corrupt: str | None = None
    broken: str | None = None  # a write failed: memory may disagree with the file until restart
    movable: bool = True  # the file has the current layout: a commit may move it into the log

    @property
    def expires_at_ms(self) -> int:
        return self.header.expires_at_ms

    @property
    def size(self) -> int:
        return self.state.tail

    def source(self) -> StagedSource:
        return StagedSource(
            self.path, self.data_start, self.end, self.n_messages, self.size, self.movable
        )

    def check_open(self, now_ms: int) -> None:
        """Raise unless the handle can take a stage or a commit now."""
        if self.committing:
            raise TxnAlreadyCommitted(f"handle {self.name!r} is being committed")
        if self.corrupt is not None:
            raise TxnCorrupt(f"handle {self.name!r}: {self.corrupt}")
        if self.broken is not None:
            raise StorageFailure(f"handle {self.name!r}: {self.broken}")
        if now_ms >= self.expires_at_ms:
            raise TxnExpired(f"handle {self.name!r} expired before it was committed")


@dataclass(slots=True)
class Loaded:
    """What start-up found in a stream's ``txn/`` directory (read in a worker thread)."""

    tombstones: dict[str, Tombstone]
    handles: list[txnfile.RecoveredHandle]
    stale: list[str]  # files that can be removed whatever the stream's state


def load(txn_dir: str, now_ms: int, *, sync: bool, reclaim_only: bool) -> Loaded:
    """Blocking: read the tombstones (compacting them if any were dropped) and every staging file.
    With ``reclaim_only`` (closed or deleted stream) nothing is read: every staging file is stale."""
    if reclaim_only:
        return Loaded({}, [], txnfile.list_staging_files(txn_dir))
    tombstones, dropped = txnfile.load_tombstones(txn_dir, now_ms)
    if dropped:
        txnfile.rewrite_tombstones(txn_dir, tombstones, sync=sync)
    loaded = Loaded(tombstones, [], [])
    for path in txnfile.list_staging_files(txn_dir):
        recovered = txnfile.recover_staging_file(path, sync=sync)
        if recovered is None:
            loaded.stale.append(path)  # no valid header: a create that never completed
        else:
            loaded.handles.append(recovered)
    return loaded


@dataclass(slots=True)
class StreamTxns:
    """The staged-append state of one stream incarnation."""

    log_id: str
    txn_dir: str
    handles: dict[str, StagedHandle] = field(default_factory=dict)
    tombstones: dict[str, Tombstone] = field(default_factory=dict)
    # FENCED tombstones, oldest first (bounded: ``fence``).
    fenced: dict[str, Tombstone] = field(default_factory=dict)
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    tombstone_lines: int = 0  # lines in the tombstone file (live or not), for compaction

    def dead(self, name: str) -> Tombstone | None:
        return self.tombstones.get(name) or self.fenced.get(name)

    def fence(self, name: str, tombstone: Tombstone, cap: int) -> None:
        """Remember an unknown name an abort listed; past ``cap`` the oldest are forgotten."""
        self.fenced.pop(name, None)
        self.fenced[name] = tombstone
        while len(self.fenced) > cap:
            del self.fenced[next(iter(self.fenced))]

    def forget_tombstones(self, now_ms: int) -> None:
        """Drop tombstones past their time (fenced ones expire in the order they were made)."""
        for name in [n for n, t in self.tombstones.items() if t.forget_at_ms <= now_ms]:
            del self.tombstones[name]
        fenced = self.fenced
        while fenced:
            name = next(iter(fenced))
            if fenced[name].forget_at_ms > now_ms:
                break
            del fenced[name]

    @property
    def live_tombstones(self) -> dict[str, Tombstone]:
        return {**self.tombstones, **self.fenced}

    def dead_error(self, state: StreamState, name: str) -> ProtocolError:
        """The error for a handle name that has no open handle (``state``: the stream's)."""
        if name in state.txn_committed:
            return TxnAlreadyCommitted(f"handle {name!r} was already committed into this stream")
        tombstone = self.dead(name)
        if tombstone is not None:
            if tombstone.status in (ABORTED, FENCED):
                return TxnAborted(f"handle {name!r} was aborted")
            if tombstone.status == EXPIRED:
                return TxnExpired(f"handle {name!r} expired before it was committed")
            return TxnCorrupt(f"handle {name!r}: its staged data failed its checksums")
        return TxnNotFound(f"handle {name!r} has no staged data in this stream")

    def adopt(self, loaded: Loaded, state: StreamState, path: str, fence_cap: int) -> list[str]:
        """Take over what start-up found; returns the staging files to remove.

        A file whose handle the log says was committed (a crash between a commit and its cleanup) or
        whose name is tombstoned (a crash between an abort's tombstone and its unlink) is removed,
        never served again.
        """
        self.tombstones = {n: t for n, t in loaded.tombstones.items() if t.status != FENCED}
        fenced = sorted(
            ((n, t) for n, t in loaded.tombstones.items() if t.status == FENCED),
            key=lambda item: item[1].forget_at_ms,
        )
        self.fenced = dict(fenced[-fence_cap:] if fence_cap else [])
        self.tombstone_lines = len(loaded.tombstones)
        stale = list(loaded.stale)
        for item in loaded.handles:
            name = item.header.handle
            if name in state.txn_committed:
                logger.info(
                    "stream %r: handle %r was committed before a restart; removing its staging file",
                    path,
                    name,
                )
                stale.append(item.path)
            elif self.dead(name) is not None or item.path != os.path.join(
                self.txn_dir, txnfile.staging_file_name(name)
            ):
                stale.append(item.path)
            else:
                self.handles[name] = StagedHandle(
                    name=name,
                    path=item.path,
                    header=item.header,
                    data_start=item.data_start,
                    end=item.end,
                    state=item.state,
                    n_messages=item.n_messages,
                    corrupt=item.corrupt,
                    movable=item.movable,
                )
        return stale
