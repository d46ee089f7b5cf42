"""Staged (transactional) appends as plain engine requests and results (docs/extensions.md section 5).

The HTTP layer parses ``Durastream-Txn`` / ``Durastream-Commit`` / ``Durastream-Abort`` requests into
these (syntax only); ``staging.TxnManager`` applies the semantics.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from durastream_server.storage.records import ProducerTuple

HANDLE_RE: Final = re.compile(r"\A[A-Za-z0-9._:-]{1,200}\Z")
HANDLE_SYNTAX: Final = "1-200 characters of [A-Za-z0-9._:-]"
_NOT_HANDLE_CHARS: Final = str.maketrans("", "", string.ascii_letters + string.digits + "._:-")


def first_invalid_handle(names: Sequence[str]) -> str | None:
    """The first of ``names`` that is not a valid handle name, or None if all are.

    Checked for the whole list at once (a character set and two lengths: a millisecond or two for the
    10,000 names a commit may list, on the event loop); the per-name regex only runs to find the
    culprit of an invalid list.
    """
    if not names:
        return None
    lengths = list(map(len, names))
    if (
        min(lengths) >= 1
        and max(lengths) <= 200
        and not "".join(names).translate(_NOT_HANDLE_CHARS)
    ):
        return None
    return next(name for name in names if not HANDLE_RE.match(name))


GIB: Final = 1024 * 1024 * 1024
# A commit or abort names at most this many handles (in its body: docs/extensions.md section 5).
MAX_HANDLES_PER_COMMIT: Final = 10000


@dataclass(frozen=True, slots=True)
class TxnLimits:
    """Server-side bounds on staged appends."""

    max_handle_bytes: int = GIB  # payload one handle may hold, plus MESSAGE_OVERHEAD per message
    default_ttl_seconds: int = 3600
    max_ttl_seconds: int = 604800  # 7 days
    max_handles_per_commit: int = MAX_HANDLES_PER_COMMIT  # also per abort
    # Aborted/expired handle names stay unusable this long (the longest a handle can live).
    tombstone_seconds: int = 604800
    # Names an abort lists that the stream does not know (never staged, or long forgotten) are fenced
    # too, so a late stage of a zombie cannot create them, but only for the default handle TTL and at
    # most this many per stream (the oldest go first): each costs memory, and only a stage racing its
    # abort needs one (docs/extensions.md, section 5).
    fence_seconds: int = 3600
    max_fenced_per_stream: int = 1024

    def __post_init__(self) -> None:
        if self.max_handle_bytes < 1:
            raise ValueError(f"max handle bytes must be >= 1, got {self.max_handle_bytes}")
        if not 1 <= self.default_ttl_seconds <= self.max_ttl_seconds:
            raise ValueError("default TTL must be in [1, max TTL]")
        if self.max_fenced_per_stream < 0 or self.fence_seconds < 1:
            raise ValueError("fenced names need a positive lifetime and a cap >= 0")


@dataclass(frozen=True, slots=True)
class StageRequest:
    path: str
    handle: str
    content_type: str | None
    body: bytes
    producer: ProducerTuple | None = None  # sequences the stages of this handle only
    ttl_seconds: int | None = None  # used by the first stage of a handle; later ones ignore it


@dataclass(frozen=True, slots=True)
class StageResult:
    handle: str
    messages: int  # the handle's totals after this request
    bytes: int
    expires_at_ms: int
    next_offset: str  # the stream's tail, which staging does not move
    duplicate: bool = False
    producer_epoch: int | None = None
    producer_seq: int | None = None


@dataclass(frozen=True, slots=True)
class CommitRequest:
    path: str
    handles: tuple[str, ...]
    producer: ProducerTuple
    close: bool = False
    stream_seq: str | None = None
    # Durastream-Commit-Key: deduplicate by this key instead of the handle list (txnspace.commit_digest)
    key: str | None = None
    # Durastream-Forgotten-Producer: refuse (extensions.md section 8)
    refuse_forgotten: bool = False


@dataclass(frozen=True, slots=True)
class CommitResult:
    next_offset: str
    closed: bool
    duplicate: bool = False
    producer_epoch: int | None = None
    producer_seq: int | None = None
    verified: bool = False  # a duplicate: its digest was compared with the accepted one
    messages: int = 0  # what this commit made visible (0 for a duplicate)
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class AbortRequest:
    path: str
    handles: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AbortResult:
    next_offset: str
    aborted: int  # handles that held staged data and were discarded
