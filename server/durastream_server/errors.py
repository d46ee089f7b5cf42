"""Typed protocol errors. Every failure the server reports is one of these; the HTTP layer maps them to a
status code, headers and a JSON body ``{"error": {"code": ..., "message": ...}}``.

Status codes come from the exception *type*, never from message text (hazard 38). Anything that is not a
``ProtocolError`` and escapes a handler is an internal fault: it is logged with its traceback and answered
with a 500 carrying no internal detail.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: an error with a defined HTTP status, machine-readable code and extra headers."""

    status: int = 500
    code: str = "INTERNAL"
    # The answer closes the connection (``Connection: close``): the request body, if any, is left unread,
    # and reading it only to throw it away would let the client hold the connection while it trickles.
    closes_connection: bool = False

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})


class BadRequest(ProtocolError):
    status = 400
    code = "BAD_REQUEST"


class InvalidJson(BadRequest):
    code = "INVALID_JSON"


class EmptyJsonArray(BadRequest):
    code = "EMPTY_ARRAY"


class InvalidReadOffset(BadRequest):
    """A read offset that is not a message boundary where whole messages are required."""

    code = "INVALID_OFFSET"


class InvalidEnd(BadRequest):
    """Bounded reads (extension): ``end`` is malformed, before the start, or inside a message."""

    code = "INVALID_END"


class EndBeyondTail(BadRequest):
    """Bounded reads (extension): ``end`` is past the durable tail. Carries ``Stream-Next-Offset``."""

    code = "END_BEYOND_TAIL"


class InvalidParameter(BadRequest):
    """An extension query parameter with a value the server does not accept (the message names it)."""

    code = "INVALID_PARAMETER"


class Unauthorized(ProtocolError):
    status = 401
    code = "UNAUTHORIZED"
    closes_connection = True  # an anonymous client gets nothing more from this connection


class StaleEpoch(ProtocolError):
    """The producer's epoch is older than the server's: the writer is a zombie (fenced)."""

    status = 403
    code = "STALE_EPOCH"


class Forbidden(ProtocolError):
    status = 403
    code = "FORBIDDEN"


class NotFound(ProtocolError):
    status = 404
    code = "NOT_FOUND"


class SelectionNotFound(NotFound):
    """Change feed (extension): the selection id is unknown (never registered, forgotten, or the
    server restarted). Register the paths again."""

    code = "SELECTION_NOT_FOUND"


class MethodNotAllowed(ProtocolError):
    status = 405
    code = "METHOD_NOT_ALLOWED"


class Conflict(ProtocolError):
    status = 409
    code = "CONFLICT"


class StreamClosed(Conflict):
    """Append to a closed stream. Carries ``Stream-Closed: true`` and the final ``Stream-Next-Offset``."""

    code = "STREAM_CLOSED"


class ContentTypeMismatch(Conflict):
    code = "CONTENT_TYPE_MISMATCH"


class StreamSeqRegression(Conflict):
    code = "STREAM_SEQ_REGRESSION"


class SequenceGap(Conflict):
    """Producer seq skipped ahead. Carries Producer-Expected-Seq and Producer-Received-Seq."""

    code = "SEQUENCE_GAP"


class DuplicateMismatch(Conflict):
    """A duplicate (producer, epoch, seq) whose payload digest differs from the accepted one."""

    code = "DUPLICATE_PAYLOAD_MISMATCH"


class ProducerForgotten(Conflict):
    """An unknown producer whose request may repeat one of a forgotten producer, refused because the
    client asked (``Durastream-Forgotten-Producer: refuse``). Carries ``Durastream-Forgotten-Epoch``."""

    code = "PRODUCER_FORGOTTEN"


class ConfigMismatch(Conflict):
    code = "CONFIG_MISMATCH"


class PlacedElsewhere(ConfigMismatch):
    """With ``--workers N``: a create of a path whose home placed it in another shard (a fork of a
    stream there, ``shards/forks.py``) while the create waited for the path's lock. The ordinary path
    forwards the create to ``shard`` (``body``: the request's, already read), which answers as one
    process serialising the create after the fork; a direct create that meets it is answered this
    409 (``CONFIG_MISMATCH``), as one process answers a create that differs from the fork created
    first (a bulk ``ensure`` too)."""

    def __init__(self, path: str, shard: int, body: bytes) -> None:
        super().__init__(f"the stream at {path!r} was just created as a fork in another shard")
        self.shard = shard
        self.body = body


class Gone(ProtocolError):
    status = 410
    code = "GONE"


class PayloadTooLarge(ProtocolError):
    status = 413
    code = "PAYLOAD_TOO_LARGE"
    closes_connection = True  # don't keep reading an oversized body we refused


class TooManyMessages(PayloadTooLarge):
    """A JSON request body with more messages (top-level array elements) than the server accepts per
    request (``--max-messages-per-request``): its per-message cost, not its size, is over the limit."""

    code = "TOO_MANY_MESSAGES"


class UnsupportedMediaType(ProtocolError):
    status = 415
    code = "UNSUPPORTED_MEDIA_TYPE"


class StorageFailure(ProtocolError):
    """An I/O error in the storage layer (disk full, EIO, fsync failure). The data dir needs attention."""

    status = 503
    code = "STORAGE_FAILURE"


class InsufficientStorage(StorageFailure):
    status = 507
    code = "INSUFFICIENT_STORAGE"


class CorruptStream(ProtocolError):
    """A stream's log failed its checksums mid-file. It is quarantined, never served as data."""

    status = 500
    code = "CORRUPT_STREAM"


# Staged (transactional) appends, docs/extensions.md section 5.


class TxnNotFound(NotFound):
    """A commit names a handle that was never staged into this stream incarnation (or was forgotten)."""

    code = "TXN_NOT_FOUND"


class TxnExpired(Gone):
    """The handle outlived its TTL before it was committed; its staged data is gone."""

    code = "TXN_EXPIRED"


class TxnAborted(Conflict):
    """The handle was aborted: it can never be committed or staged into again."""

    code = "TXN_ABORTED"


class TxnAlreadyCommitted(Conflict):
    """The handle was committed by another request (a retry of *that* request is a 204 duplicate)."""

    code = "TXN_ALREADY_COMMITTED"


class TxnTooLarge(PayloadTooLarge):
    """Staging this body would take the handle past the server's per-handle limit."""

    code = "TXN_TOO_LARGE"


class TxnCorrupt(ProtocolError):
    """The handle's staging file failed its checksums; it is never committed."""

    status = 500
    code = "TXN_CORRUPT"


# Worker processes (``--workers N``, decision 0009, ``shards/``).


class NotWithWorkers(ProtocolError):
    """A request across streams (subscriptions) that a server with ``--workers`` > 1 does not serve
    yet: each shard only sees its own streams, and fanning out to every shard is not built."""

    status = 501
    code = "NOT_AVAILABLE_WITH_WORKERS"


class ForkAcrossShards(Conflict):
    """A fork whose source lives in another shard than the fork's own path (``--workers`` > 1)."""

    code = "FORK_ACROSS_SHARDS"


class ShardUnavailable(ProtocolError):
    """The worker owning the stream did not answer (it is restarting); the client retries."""

    status = 503
    code = "SHARD_UNAVAILABLE"
