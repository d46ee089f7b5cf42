"""Idempotent producers (section 5.2.1) as pure functions over ``storage.state.StreamState``.

The state these functions read is the log's *accepted* state (staged entries included), and the engine
calls them and ``StreamLog.stage()`` with no ``await`` in between, so validation is serialized per stream
and therefore per ``(stream, producerId)`` as the spec requires.

Producer state lives in the log next to the data; in memory, a producer that stays idle is first
compacted and then forgotten (``producer_sweep.py``, docs/decisions/0005-producer-state.md). A request
of a producer the stream does not know is a new producer, as section 5.2.1 says; a client that must never
have a retry of a forgotten producer taken for new data asks for ``refuse_forgotten`` (hazard 34), and
gets 409 ``PRODUCER_FORGOTTEN`` wherever a forgotten producer of the same group could have sent it.
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
    ProducerForgotten,
    SequenceGap,
    StaleEpoch,
)
from durastream_server.storage.records import ProducerTuple
from durastream_server.storage.state import DIGEST_BYTES, StreamState, producer_group

MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True, slots=True)
class Accept:
    """The tuple is new: append it."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The tuple was already accepted: answer 204 without appending."""

    epoch: int
    highest_seq: int  # the Producer-Seq to report: highest accepted in this epoch
    # The accepted request's digest was remembered and equals this one's. False: it could not be
    # compared (older than the digest window, or written by an earlier version).
    verified: bool = False


Decision = Accept | Duplicate


# Digests are DIGEST_SIZE bytes of BLAKE3 (the ``blake3`` package). The digest covers every byte of
# every append and stage request, so its speed is the server's: BLAKE3 hashes about 6 GB/s on one core
# of the benchmark machine, SHA-256 1.7 GB/s even on the CPU's SHA extensions. With SHA-256 it was a
# fifth of the server's CPU on the Spark sink's staged appends (docs/decisions/0004, section 6). It is
# still a cryptographic hash: two requests with one tuple cannot be made to look alike. Digests written
# by earlier versions are 16-byte BLAKE2b or 20-byte SHA-256: a digest of another size cannot be
# compared: the fold keeps it as unknown (``storage/state.py``).
DIGEST_SIZE = DIGEST_BYTES


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


# ``request_digest``'s first two pieces per content type essence, for ``append_digest`` (a handful
# of distinct essences in practice; bounded anyway).
_APPEND_PREFIXES: dict[str, bytes] = {}
_APPEND_PREFIXES_MAX = 256


def append_digest(content_type_essence: str, body: bytes) -> bytes:
    """``request_digest(content_type_essence, body, False)`` (an append with a body that does not
    close), the same bytes: BLAKE3 is a stream, so hashing the prefix and the body in one piece
    equals hashing them in turn. One hasher and no ``update`` per piece for a small append (issue
    17); a copy of the body, so for small bodies only."""
    prefix = _APPEND_PREFIXES.get(content_type_essence)
    if prefix is None:
        prefix = b"A" + content_type_essence.encode("utf-8") + b"\n"
        if len(_APPEND_PREFIXES) < _APPEND_PREFIXES_MAX:
            _APPEND_PREFIXES[content_type_essence] = prefix
    return blake3.blake3(prefix + body).digest(DIGEST_SIZE)


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
    """True if two request digests show different requests. ``remembered`` may be a prefix of a digest
    (a quiet producer keeps short ones, ``storage/state.py``); one longer than ``digest`` (of another
    hash) cannot be compared and proves nothing."""
    return len(remembered) <= len(digest) and digest[: len(remembered)] != remembered


def check_tuple_syntax(producer: ProducerTuple) -> None:
    """Reject tuples the HTTP layer should already have rejected; cheap defence in depth."""
    if not producer.producer_id:
        raise BadRequest("Producer-Id must not be empty")
    for name, value in (("Producer-Epoch", producer.epoch), ("Producer-Seq", producer.seq)):
        if not 0 <= value <= MAX_SAFE_INTEGER:
            raise BadRequest(f"{name} must be an integer in [0, 2^53-1]")


def validate(
    state: StreamState, producer: ProducerTuple, digest: bytes, *, refuse_forgotten: bool = False
) -> Decision:
    """Section 5.2.1 validation. Raises StaleEpoch (403), BadRequest (400), SequenceGap (409),
    DuplicateMismatch (409) or ProducerForgotten (409); returns Accept or Duplicate.

    - unknown producer: with ``refuse_forgotten``, 409 ``ProducerForgotten`` if the stream forgot a
      producer of the same group at this epoch or a later one (it may be that producer repeating a
      request); otherwise it must start at seq 0, else 409 expecting 0 (a producer whose state we do not
      have cannot resume mid-sequence);
    - epoch below the server's: 403 with the current epoch (zombie fencing);
    - epoch above: a new session, which must start at seq 0 (400 otherwise);
    - same epoch: ``seq <= last`` is a duplicate, ``last + 1`` is next, anything higher is a gap.
    A duplicate whose payload digest is still remembered and differs is a reused tuple, not a retry:
    409 ``DuplicateMismatch`` instead of a 204 that would silently drop the new data.
    """
    current = state.producers.get(producer.producer_id)
    if current is None:
        if refuse_forgotten:
            check_not_forgotten(state, producer)
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
        verified = check_duplicate_digest(state, producer, digest)
        return Duplicate(epoch=current.epoch, highest_seq=current.last_seq, verified=verified)
    if producer.seq == current.last_seq + 1:
        return Accept()
    raise _gap(expected=current.last_seq + 1, received=producer.seq)


def check_not_forgotten(state: StreamState, producer: ProducerTuple) -> None:
    """For a producer the stream does not know: raise ProducerForgotten if a forgotten producer of its
    group reached this epoch (docs/extensions.md, section 8). A group's producers count epochs alike
    (the Spark sink's: batch ids), so a forgotten one that never got this far cannot have sent it."""
    group = producer_group(producer.producer_id)
    forgotten = state.forgotten.get(group)
    if forgotten is None or producer.epoch > forgotten.epoch:
        return
    raise ProducerForgotten(
        f"producer {producer.producer_id!r} is not known to this stream, which forgot idle producers of "
        f"group {group!r} up to epoch {forgotten.epoch}: this request (epoch {producer.epoch}, seq "
        f"{producer.seq}) may repeat one they made, and cannot be checked. Refused, as asked "
        "(Durastream-Forgotten-Producer: refuse)",
        headers={"Durastream-Forgotten-Epoch": str(forgotten.epoch)},
    )


def check_duplicate_digest(state: StreamState, producer: ProducerTuple, digest: bytes) -> bool:
    """Raise DuplicateMismatch if the accepted request for this tuple is remembered and differs.
    True if it is remembered (and equal), False if it could not be compared."""
    current = state.producers.get(producer.producer_id)
    if current is None or current.epoch != producer.epoch:
        return False
    remembered = current.digest(producer.seq)
    if remembered is None or len(remembered) > len(digest):
        return False
    if differ(remembered, digest):
        raise DuplicateMismatch(
            f"producer tuple ({producer.producer_id}, {producer.epoch}, {producer.seq}) was already "
            "used for a different request",
            headers={
                "Producer-Epoch": str(current.epoch),
                "Producer-Seq": str(current.last_seq),
            },
        )
    return True


def stale_or_duplicate_after_close(state: StreamState, producer: ProducerTuple) -> Decision | None:
    """Producer checks that still apply once the stream is closed (hazard 35).

    Returns Duplicate for already-accepted earlier tuples of the current epoch, raises StaleEpoch for
    an old epoch, and returns None when the request would have been new data (the caller answers 409
    Stream-Closed). The closing tuple itself is the caller's (``closed_by``).
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
