"""Idempotent producers (section 5.2.1) as pure functions over ``storage.state.StreamState``.

The state these functions read is the log's *accepted* state (staged entries included), and the engine
calls them and ``StreamLog.stage()`` with no ``await`` in between, so validation is serialized per stream
and therefore per ``(stream, producerId)`` as the spec requires.

Producer state is never expired (hazard 34): it lives in the log next to the data, so it is retained
exactly as long as the stream, and a late retry of an old tuple is always recognized.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Final

import blake3

from durastream_server.errors import (
    BadRequest,
    DuplicateMismatch,
    SequenceGap,
    StaleEpoch,
)
from durastream_server.storage.records import ProducerTuple
from durastream_server.storage.state import StreamState

MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True, slots=True)
class Accept:
    """The tuple is new: append it."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The tuple was already accepted: answer 204 without appending."""

    epoch: int
    highest_seq: int  # the Producer-Seq to report: highest accepted in this epoch


Decision = Accept | Duplicate


# Digests are DIGEST_SIZE bytes of BLAKE3 (the ``blake3`` package). The digest covers every byte of
# every append and stage request, so its speed is the server's: BLAKE3 hashes about 6 GB/s on one core
# of the benchmark machine, SHA-256 1.7 GB/s even on the CPU's SHA extensions. With SHA-256 it was a
# fifth of the server's CPU on the Spark sink's staged appends (docs/decisions/0004, section 6). It is
# still a cryptographic hash: two requests with one tuple cannot be made to look alike. Digests written
# by earlier versions are 16-byte BLAKE2b or 20-byte SHA-256: a digest of another size cannot be
# compared and counts as forgotten (see ``differ``).
DIGEST_SIZE = 24


def new_hasher(prefix: bytes) -> blake3.blake3:
    """A hasher for a digest, started with ``prefix`` (which kind of request it is)."""
    return blake3.blake3(prefix)


def request_digest(content_type_essence: str | None, body: bytes, closes: bool) -> bytes:
    """Digest of what an append request asks for, to tell a true retry from a reused tuple (hazard 4).

    It covers the body, the content type essence (absent for close-only requests, whose Content-Type
    the protocol says to ignore) and the close flag: reusing a tuple to close a stream that the
    original request left open is not a retry either.
    """
    h = new_hasher(b"C" if closes else b"A")
    h.update((content_type_essence or "").encode("utf-8"))
    h.update(b"\n")
    h.update(body)
    return h.digest(DIGEST_SIZE)


# Bodies at least this large are hashed in a worker thread. blake3 releases the GIL while it hashes, so
# the digest runs on another core while the event loop validates the same body (together they were a
# third of a JSON append's server time); below this, the thread hand-off costs more than it saves.
DIGEST_IN_THREAD_BYTES: Final = 64 << 10


def request_digest_soon(
    content_type_essence: str | None, body: bytes, closes: bool
) -> Awaitable[bytes]:
    """``request_digest``, started now and awaited later: in a worker thread for a large body, so the
    caller can validate the body meanwhile. Awaiting it yields to the loop only for a large body."""
    loop = asyncio.get_running_loop()
    if len(body) < DIGEST_IN_THREAD_BYTES:
        done: asyncio.Future[bytes] = loop.create_future()
        done.set_result(request_digest(content_type_essence, body, closes))
        return done
    return loop.run_in_executor(None, request_digest, content_type_essence, body, closes)


def differ(remembered: bytes, digest: bytes) -> bool:
    """True if two request digests show different requests. A digest of another size (written by an
    earlier version with another hash) cannot be compared: like a forgotten one, it proves nothing."""
    return len(remembered) == len(digest) and remembered != digest


def check_tuple_syntax(producer: ProducerTuple) -> None:
    """Reject tuples the HTTP layer should already have rejected; cheap defence in depth."""
    if not producer.producer_id:
        raise BadRequest("Producer-Id must not be empty")
    for name, value in (("Producer-Epoch", producer.epoch), ("Producer-Seq", producer.seq)):
        if not 0 <= value <= MAX_SAFE_INTEGER:
            raise BadRequest(f"{name} must be an integer in [0, 2^53-1]")


def validate(state: StreamState, producer: ProducerTuple, digest: bytes) -> Decision:
    """Section 5.2.1 validation. Raises StaleEpoch (403), BadRequest (400), SequenceGap (409) or
    DuplicateMismatch (409); returns Accept or Duplicate.

    - unknown producer: must start at seq 0, else 409 expecting 0 (a producer whose state we never had
      cannot resume mid-sequence);
    - epoch below the server's: 403 with the current epoch (zombie fencing);
    - epoch above: a new session, which must start at seq 0 (400 otherwise);
    - same epoch: ``seq <= last`` is a duplicate, ``last + 1`` is next, anything higher is a gap.
    A duplicate whose payload digest is still remembered and differs is a reused tuple, not a retry:
    409 ``DuplicateMismatch`` instead of a 204 that would silently drop the new data.
    """
    current = state.producers.get(producer.producer_id)
    if current is None:
        if producer.seq != 0:
            raise _gap(expected=0, received=producer.seq)
        return Accept()
    if producer.epoch < current.epoch:
        raise StaleEpoch(
            f"producer epoch {producer.epoch} is stale; current epoch is {current.epoch}",
            headers={"Producer-Epoch": str(current.epoch)},
        )
    if producer.epoch > current.epoch:
        if producer.seq != 0:
            raise BadRequest(f"a new producer epoch must start at seq 0, got {producer.seq}")
        return Accept()
    if producer.seq <= current.last_seq:
        check_duplicate_digest(state, producer, digest)
        return Duplicate(epoch=current.epoch, highest_seq=current.last_seq)
    if producer.seq == current.last_seq + 1:
        return Accept()
    raise _gap(expected=current.last_seq + 1, received=producer.seq)


def check_duplicate_digest(state: StreamState, producer: ProducerTuple, digest: bytes) -> None:
    """Raise DuplicateMismatch if the accepted request for this tuple is remembered and differs."""
    current = state.producers.get(producer.producer_id)
    if current is None or current.epoch != producer.epoch:
        return
    remembered = current.digests.get(producer.seq)
    if remembered and differ(remembered, digest):
        raise DuplicateMismatch(
            f"producer tuple ({producer.producer_id}, {producer.epoch}, {producer.seq}) was already "
            "used for a different request",
            headers={
                "Producer-Epoch": str(current.epoch),
                "Producer-Seq": str(current.last_seq),
            },
        )


def stale_or_duplicate_after_close(state: StreamState, producer: ProducerTuple) -> Decision | None:
    """Producer checks that still apply once the stream is closed (hazard 35).

    Returns Duplicate for the closing tuple and for already-accepted earlier tuples of the current
    epoch, raises StaleEpoch for an old epoch, and returns None when the request would have been new
    data (the caller answers 409 Stream-Closed).
    """
    current = state.producers.get(producer.producer_id)
    if current is None:
        return None
    if producer.epoch < current.epoch:
        raise StaleEpoch(
            f"producer epoch {producer.epoch} is stale; current epoch is {current.epoch}",
            headers={"Producer-Epoch": str(current.epoch)},
        )
    if producer.epoch == current.epoch and producer.seq <= current.last_seq:
        return Duplicate(epoch=current.epoch, highest_seq=current.last_seq)
    return None


def _gap(*, expected: int, received: int) -> SequenceGap:
    return SequenceGap(
        f"producer sequence gap: expected {expected}, received {received}",
        headers={
            "Producer-Expected-Seq": str(expected),
            "Producer-Received-Seq": str(received),
        },
    )
