"""Typed errors of the durastream connector.

Every failure the connector reports is a ``DurastreamError``. Protocol errors are chosen from the HTTP status,
the server's machine-readable JSON error code (``{"error": {"code": ...}}``, sent by durastream-server) and the
protocol's own headers (``Stream-Closed``, ``Producer-Epoch``, ``Producer-Expected-Seq``), never from message
text (hazard 38): a reworded server message must not turn a fenced producer into a generic conflict.

Each message is written for the person who has to act on it: it names the stream, the offsets, the producer
tuple or the option involved and says what to do. The response status, code and the protocol-relevant response
headers stay on the exception as attributes, so callers branch on data, not on strings.

Secrets never reach an exception: request headers (``Authorization``, ``header.*`` options) are not stored on
errors at all, response headers are whitelisted (``RELEVANT_HEADERS``), and option values of secret options
are shown as ``<redacted>``.

Exceptions are picklable (Spark moves objects between processes), whatever their constructor signature.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Response headers worth keeping on an error: protocol signals and hints, never anything credential-like.
REQUEST_ID = "X-Request-Id"  # the server's id of a request, in its access log and JSON logs

RELEVANT_HEADERS = (
    "Content-Type",
    "Retry-After",
    "Stream-Next-Offset",
    "Stream-Closed",
    "Stream-Up-To-Date",
    "Producer-Epoch",
    "Producer-Seq",
    "Producer-Expected-Seq",
    "Producer-Received-Seq",
    "Durastream-Extensions",
    "Durastream-Forgotten-Epoch",
    "Location",
    REQUEST_ID,  # the server's id of the request: the same id is in its access log and JSON logs
)

MAYBE_APPLIED = (
    "The request may or may not have been applied. It is not safe to repeat (a plain append without "
    "producer headers could land twice; hazard 11), so it was not retried: check the stream before "
    "sending it again, or use an idempotent producer."
)

# Bound on how much of a server's error message is quoted (a proxy may answer with a whole HTML page).
_MAX_SERVER_MESSAGE = 300


def _rebuild(cls: type, args: tuple, state: dict) -> BaseException:
    error = cls.__new__(cls)
    BaseException.__init__(error, *args)
    error.__dict__.update(state)
    return error


class DurastreamError(Exception):
    """Base class of every error raised by durastream_spark."""

    def __reduce__(self) -> tuple:
        # The default reduce calls ``cls(*self.args)``, which breaks for keyword-only constructors.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class OptionError(DurastreamError, ValueError):
    """An option is missing, malformed or inconsistent. Raised where options are parsed (``load()``/``start()``).

    ``value`` is ``None`` when the option was missing; it is ``"<redacted>"`` for secret options.
    """

    def __init__(
        self,
        option: str,
        value: str | None,
        accepted: str,
        *,
        reason: str | None = None,
        secret: bool = False,
        message: str | None = None,
    ) -> None:
        shown = "<redacted>" if secret and value is not None else value
        if message is None:
            if value is None:
                message = f"Option '{option}' is required but was not set. Accepted: {accepted}."
            else:
                message = f"Option '{option}' has an invalid value {shown!r}. Accepted: {accepted}."
            if reason:
                message = f"{message} ({reason})"
        super().__init__(message)
        self.option = option
        self.value = shown
        self.accepted = accepted
        self.reason = reason


class ExtensionNotSupported(DurastreamError):
    """The server does not advertise a durastream protocol extension that the requested operation needs.

    Raised before anything is sent: a server that ignores an unknown query parameter such as ``end=`` would
    otherwise answer with more data than asked for, silently.
    """

    def __init__(self, extension: str, url: str, purpose: str, *, version: int = 1) -> None:
        wanted = f"'{extension}' protocol extension" + (
            f" at version {version} or later" if version > 1 else ""
        )
        super().__init__(
            f"The server at {url} does not advertise the {wanted} (Durastream-Extensions header / "
            f"discovery endpoint), which is needed to {purpose}. Use durastream-server"
            + (" (an up-to-date one)" if version > 1 else "")
            + ", or an operation of the base protocol."
        )
        self.extension = extension
        self.url = url
        self.version = version


class DataLossError(DurastreamError):
    """Data the source should have read is gone: a stream was deleted (404/410), re-created or truncated
    below the checkpointed offset, or an offset precedes the retained data.

    Raised by the source's single data-loss choke point (``durastream_spark.source.data_loss``) when
    ``failOnDataLoss`` is true. Attributes: ``stream``, ``start`` and ``end`` (the offsets of the range that
    could not be read; ``end`` may be ``None`` when it is unknown).
    """

    def __init__(self, message: str, *, stream: str, start: str | None, end: str | None) -> None:
        super().__init__(message)
        self.stream = stream
        self.start = start
        self.end = end


class MalformedResponse(DurastreamError):
    """The server answered something the protocol does not allow (missing header, bad JSON, bad frames)."""


class MalformedFrames(MalformedResponse, ValueError):
    """A ``format=frames`` / ``frames-lines`` body does not follow the layout of docs/extensions.md section 2."""


@dataclass(frozen=True)
class RequestContext:
    """What an error message needs to know about the request that failed. Holds no request headers."""

    method: str
    url: str
    stream: str | None = None
    offset: str | None = None
    end: str | None = None
    producer: tuple[str, int, int] | None = None
    content_type: str | None = None
    body_bytes: int | None = None

    def describe(self) -> str:
        target = f"stream '{self.stream}'" if self.stream is not None else self.url
        return f"{self.method} {target}"


class TransportError(DurastreamError):
    """The server could not be reached or the exchange broke off (connection refused/reset, timeout, TLS).

    The message leads with what is wrong and what to do, in the user's terms (``summary``: "the server at
    URL is not answering (is it running? is the port right?)"), then the request, the attempts and the
    time they took. The low-level exception chain is not part of it; the retry loop logs it at DEBUG.

    ``maybe_applied`` is true when a request that is not safe to repeat (a plain append) may have reached the
    server: it was not retried, and the caller cannot know whether it took effect.
    """

    def __init__(
        self,
        context: RequestContext,
        cause: BaseException,
        *,
        attempts: int,
        maybe_applied: bool,
        hint: str | None = None,
        summary: str | None = None,
        elapsed_s: float | None = None,
    ) -> None:
        if summary is None:
            summary = f"{context.describe()} failed at the transport level: {type(cause).__name__}: {cause}"
        over = f" in {elapsed_s:.1f} s" if elapsed_s is not None else ""
        message = f"{summary} ({context.describe()}; {attempts} attempt(s){over})."
        if maybe_applied:
            message += " " + MAYBE_APPLIED
        if hint:
            message += f" {hint}"
        super().__init__(message)
        self.method = context.method
        self.url = context.url
        self.stream = context.stream
        self.attempts = attempts
        self.maybe_applied = maybe_applied
        self.reason = type(cause).__name__


class ProtocolError(DurastreamError):
    """The server answered with an error status. Attributes: ``status``, ``code`` (the server's JSON error code
    or ``None``), ``headers`` (whitelisted response headers), ``request_id`` (the server's ``X-Request-Id``), ``server_message``, ``stream``, ``method``,
    ``url``, ``attempts``, and ``maybe_applied`` (a 5xx to a request that is not safe to repeat: the server,
    or a proxy in front of it, may have applied it before failing)."""

    maybe_applied: bool = False

    def __init__(
        self,
        message: str,
        *,
        context: RequestContext,
        status: int,
        code: str | None,
        headers: Mapping[str, str],
        server_message: str | None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = dict(headers)
        self.server_message = server_message
        self.stream = context.stream
        self.method = context.method
        self.url = context.url
        self.attempts = attempts

    @property
    def request_id(self) -> str | None:
        """The server's ``X-Request-Id`` of the failed request (durastream-server logs it), if any."""
        return self.headers.get(REQUEST_ID)


class BadRequest(ProtocolError):
    """400: the server rejected the request as malformed (a bug in the caller or a bad offset)."""


class EndBeyondTail(BadRequest):
    """400 ``END_BEYOND_TAIL``: a bounded read's ``end`` is past the durable tail (``tail`` attribute)."""

    tail: str | None = None


class AccessDenied(ProtocolError):
    """401, or 403 without a producer epoch: authentication or authorization failed."""


class StaleEpochError(ProtocolError):
    """403 with ``Producer-Epoch``: a newer epoch owns the producer; this writer is fenced (a zombie).

    Never claim a newer epoch automatically in response (hazard 36): fail the attempt.
    ``current_epoch`` is the server's epoch, when it said.
    """

    current_epoch: int | None = None


class StreamNotFound(ProtocolError):
    """404: the stream does not exist (never created, deleted, or expired)."""


class NotSupported(ProtocolError):
    """405/501: the server does not support this operation on this URL."""


class ConflictError(ProtocolError):
    """409 not covered by a more specific subclass."""


class StreamClosedError(ConflictError):
    """409 with ``Stream-Closed: true``: the stream is closed and accepts no appends. ``final_offset``."""

    final_offset: str | None = None


class ContentTypeMismatch(ConflictError):
    """409: the request's content type differs from the stream's. ``requested`` and ``existing`` when known."""

    requested: str | None = None
    existing: str | None = None


class SequenceGapError(ConflictError):
    """409 with ``Producer-Expected-Seq``/``Producer-Received-Seq``: an earlier seq has not been applied yet."""

    expected_seq: int | None = None
    received_seq: int | None = None


class DuplicatePayloadMismatch(ConflictError):
    """409 ``DUPLICATE_PAYLOAD_MISMATCH``: a (producer, epoch, seq) tuple was reused for different bytes.

    Exactly-once is broken for this tuple if this is ignored: the first payload stays, the second is lost.
    """


class ProducerForgottenError(ConflictError):
    """409 ``PRODUCER_FORGOTTEN`` (docs/extensions.md, section 8): the server no longer knows the producer,
    and forgot an idle producer of its group that reached this epoch, so this request may repeat one it
    already applied. Refused instead of being taken for new data; nothing of it was written.
    ``forgotten_epoch`` is the highest epoch the server forgot for the group."""

    forgotten_epoch: int | None = None


class UnverifiedDuplicate(ConflictError):
    """A producer request answered 204 (already applied) whose payload the server could not compare with the
    one it applied (``Durastream-Digest: unknown``), raised where a caller required the comparison
    (docs/extensions.md, section 6). Nothing of this request was written."""


class StreamSeqConflict(ConflictError):
    """409 ``STREAM_SEQ_REGRESSION``: ``Stream-Seq`` was not greater than the last one accepted."""


class StreamConfigMismatch(ConflictError):
    """409 on create: the stream exists with a different configuration (TTL, expiry, closure)."""


class TransactionError(ProtocolError):
    """Base of staged-append (transaction handle) errors."""


class TxnNotFound(TransactionError):
    """404 ``TXN_NOT_FOUND``: the server does not know the handle (never staged, or reclaimed)."""


class TxnExpired(TransactionError):
    """410 ``TXN_EXPIRED``: the handle's TTL lapsed before it was committed; its data is gone."""


class TxnAlreadyCommitted(TransactionError, ConflictError):
    """409 ``TXN_ALREADY_COMMITTED``: another commit request already made the handle visible."""


class TxnAborted(TransactionError, ConflictError):
    """409 ``TXN_ABORTED``: the handle was aborted; it can never be committed."""


class TxnTooLarge(TransactionError):
    """413 ``TXN_TOO_LARGE``: the handle's staged total would exceed the server's limit (--max-staged-bytes)."""


class TxnCorrupt(TransactionError):
    """500 ``TXN_CORRUPT``: the handle's staged data failed its checksums on the server; it cannot be committed."""


class StreamGone(ProtocolError):
    """410: the stream is soft-deleted, or the offset precedes the retained data."""


class PayloadTooLarge(ProtocolError):
    """413: the request body exceeds the server's limit."""


class TooManyMessages(PayloadTooLarge):
    """413 ``TOO_MANY_MESSAGES``: the request carries more messages than the server accepts in one request
    (its ``--max-messages-per-request``)."""


class RateLimited(ProtocolError):
    """429 that outlasted the retry budget."""


class ServerError(ProtocolError):
    """5xx (after retries, where the request was retryable)."""


# --------------------------------------------------------------------------------------------------------
# Mapping a response to an error
# --------------------------------------------------------------------------------------------------------


STREAM_ROOT_PATH = "/v1/stream"


def stream_root_hint(root: str) -> str | None:
    """How to fix a ``url`` option that does not look like a stream root; ``None`` when it does.

    The protocol lets a server put streams anywhere, but durastream-server and the reference server serve
    them under ``/v1/stream``: a ``url`` without it (``http://host:4437``) is the usual slip, and its 404s
    otherwise only say that the stream does not exist.
    """
    path = urlsplit(root).path.rstrip("/")
    if path.endswith(STREAM_ROOT_PATH):
        return None
    suggestion = root.rstrip("/") + ("/stream" if path.endswith("/v1") else STREAM_ROOT_PATH)
    return (
        f"option 'url' ({root}) does not look like a stream root; durastream-server serves streams "
        f'under {STREAM_ROOT_PATH}, so use .option("url", "{suggestion}")'
    )


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # ``requests`` gives a case-insensitive mapping; plain dicts from tests may not be.
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        for key, candidate in headers.items():
            if key.lower() == lowered:
                return candidate
    return value


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    value = _header(headers, name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def parse_error_body(content_type: str | None, body: bytes) -> tuple[str | None, str | None]:
    """The server's ``(code, message)`` from a JSON error body, or ``(None, None)``. Message only for display."""
    if not body:
        return None, None
    is_json = content_type is not None and "json" in content_type.split(";")[0].lower()
    if is_json:
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            document = None
        if isinstance(document, dict) and isinstance(document.get("error"), dict):
            error = document["error"]
            code = error.get("code") if isinstance(error.get("code"), str) else None
            message = error.get("message") if isinstance(error.get("message"), str) else None
            return code, _clip(message)
    text = body[:_MAX_SERVER_MESSAGE].decode("utf-8", errors="replace").strip()
    return None, _clip(text) or None


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= _MAX_SERVER_MESSAGE else text[: _MAX_SERVER_MESSAGE - 3] + "..."


def request_id_note(error: BaseException) -> str:
    """`` [request id X]``: the server request behind ``error`` (a ``ProtocolError``), for a message that
    re-words the server's answer, so it can still be matched to the server's log line; empty if none."""
    request_id = getattr(error, "request_id", None)
    return f" [request id {request_id}]" if request_id else ""


def error_from_response(
    context: RequestContext,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    attempts: int = 1,
    idempotent: bool = True,
    root: str | None = None,
) -> ProtocolError:
    """Build the typed error for an error response (status >= 400, or an unexpected 3xx).

    ``idempotent=False`` marks a request that was sent once because repeating it is unsafe; a 5xx answer
    then says the request may have been applied. ``root``: the ``url`` option; a 404 under a root that
    does not look like a stream root says how to fix the option.
    """
    code, server_message = parse_error_body(_header(headers, "Content-Type"), body)
    kept = {name: v for name in RELEVANT_HEADERS if (v := _header(headers, name)) is not None}
    closed = (_header(headers, "Stream-Closed") or "").strip().lower() == "true"
    where = context.describe()
    said = f" Server said: {server_message}" if server_message else ""
    request_id = _header(headers, REQUEST_ID)
    tail = (
        f" [HTTP {status}{' ' + code if code else ''}; {attempts} attempt(s)"
        f"{f'; request id {request_id}' if request_id else ''}]"
    )

    def make(cls: type[ProtocolError], message: str, **extra: Any) -> ProtocolError:
        error = cls(
            message + said + tail,
            context=context,
            status=status,
            code=code,
            headers=kept,
            server_message=server_message,
            attempts=attempts,
        )
        error.__dict__.update(extra)
        return error

    producer = context.producer
    producer_text = (
        f"producer '{producer[0]}' (epoch {producer[1]}, seq {producer[2]})"
        if producer
        else "the producer"
    )

    if 300 <= status < 400:
        location = _header(headers, "Location")
        return make(
            ProtocolError,
            f"{where}: unexpected redirect{f' to {location}' if location else ''}. The connector does not "
            "follow redirects (they could carry credentials to another host); set 'url' to the final address.",
        )
    if status == 400:
        if code == "END_BEYOND_TAIL":
            tail_offset = _header(headers, "Stream-Next-Offset")
            return make(
                EndBeyondTail,
                f"{where}: bounded read end offset {context.end} is beyond the stream's durable tail "
                f"{tail_offset}.",
                tail=tail_offset,
            )
        return make(BadRequest, f"{where}: the server rejected the request as invalid.")
    if status == 401:
        return make(
            AccessDenied,
            f"{where}: authentication required or rejected. Set 'header.Authorization' or 'tokenFile'.",
        )
    if status == 403:
        epoch = _int_header(headers, "Producer-Epoch")
        stale = code == "STALE_EPOCH" or (
            code is None and producer is not None and _header(headers, "Producer-Epoch") is not None
        )
        if stale:
            return make(
                StaleEpochError,
                f"{where}: {producer_text} was fenced: the server's epoch for this producer is now "
                f"{epoch if epoch is not None else 'newer'}. A newer batch owns the producer, so this writer "
                "(a stale or zombie attempt) must stop; it does not claim a newer epoch by itself.",
                current_epoch=epoch,
            )
        return make(
            AccessDenied,
            f"{where}: access denied. Check the credentials in 'header.*'/'tokenFile'.",
        )
    if status == 404:
        if code == "TXN_NOT_FOUND":
            return make(TxnNotFound, f"{where}: the server does not know the transaction handle.")
        root_fix = stream_root_hint(root) if root is not None else None
        if root_fix is not None:
            return make(StreamNotFound, f"{where}: not found (404): {root_fix}.")
        return make(
            StreamNotFound,
            f"{where}: the stream does not exist under {context.url.split('?')[0]} (never created, deleted "
            "or expired). Check 'url' and the stream path, or create the stream first.",
        )
    if status in (405, 501):
        return make(NotSupported, f"{where}: the server does not support this operation here.")
    if status == 409:
        return _conflict(make, code, headers, closed, where, producer_text, context)
    if status == 410:
        if code == "TXN_EXPIRED":
            return make(
                TxnExpired, f"{where}: the transaction handle expired before it was committed."
            )
        at = f" at offset {context.offset}" if context.offset is not None else ""
        return make(
            StreamGone,
            f"{where}{at}: gone. The stream was deleted while forks still reference it, or the offset "
            "precedes the data the server still retains.",
        )
    if status == 413 and code == "TXN_TOO_LARGE":
        return make(
            TxnTooLarge,
            f"{where}: the transaction handle's staged data would exceed the server's limit per handle. "
            "Stage less per handle (e.g. more, smaller tasks) or raise the server's --max-staged-bytes.",
        )
    if status == 413 and code == "TOO_MANY_MESSAGES":
        return make(
            TooManyMessages,
            f"{where}: the request carries more messages than the server accepts in one request. "
            "Lower the sink option maxMessagesPerRequest to at most the server's limit (named below), "
            "or raise the server's --max-messages-per-request.",
        )
    if status == 413:
        size = f" of {context.body_bytes} bytes" if context.body_bytes is not None else ""
        return make(
            PayloadTooLarge,
            f"{where}: the request body{size} exceeds the server's limit. Send smaller requests "
            "(e.g. lower maxBytesPerRequest).",
        )
    if status == 429:
        return make(RateLimited, f"{where}: rate limited by the server; the retry budget ran out.")
    if status >= 500 and code == "TXN_CORRUPT":
        return make(
            TxnCorrupt,
            f"{where}: the server found the transaction handle's staged data corrupt; it cannot be "
            "committed. Abort it and stage the data again under a new handle.",
        )
    if status >= 500:
        if not idempotent:
            return make(
                ServerError, f"{where}: the server failed. {MAYBE_APPLIED}", maybe_applied=True
            )
        return make(ServerError, f"{where}: the server failed.")
    return make(ProtocolError, f"{where}: unexpected error status.")


def _conflict(
    make: Any,
    code: str | None,
    headers: Mapping[str, str],
    closed: bool,
    where: str,
    producer_text: str,
    context: RequestContext,
) -> ProtocolError:
    if code == "STREAM_CLOSED" or (code is None and closed):
        final = _header(headers, "Stream-Next-Offset")
        return make(
            StreamClosedError,
            f"{where}: the stream is closed (final offset {final}) and accepts no more appends.",
            final_offset=final,
        )
    if code == "CONTENT_TYPE_MISMATCH":
        return make(
            ContentTypeMismatch,
            f"{where}: the request's content type '{context.content_type}' does not match the stream's.",
            requested=context.content_type,
        )
    if code == "SEQUENCE_GAP" or (
        code is None and _header(headers, "Producer-Expected-Seq") is not None
    ):
        expected = _int_header(headers, "Producer-Expected-Seq")
        received = _int_header(headers, "Producer-Received-Seq")
        return make(
            SequenceGapError,
            f"{where}: sequence gap for {producer_text}: the server expects seq {expected}, received "
            f"{received}. An earlier request of this producer has not been applied (yet).",
            expected_seq=expected,
            received_seq=received,
        )
    if code == "DUPLICATE_PAYLOAD_MISMATCH":
        return make(
            DuplicatePayloadMismatch,
            f"{where}: {producer_text} was already used for a different payload. The server kept the first "
            "payload; the writer reused a tuple for different bytes (hazard 4), so this request's data is "
            "NOT in the stream.",
        )
    if code == "PRODUCER_FORGOTTEN":
        forgotten = _int_header(headers, "Durastream-Forgotten-Epoch")
        return make(
            ProducerForgottenError,
            f"{where}: the server no longer knows {producer_text}: it forgot idle producers of this "
            f"group up to epoch {forgotten} (after --producer-expiry-seconds without a request), so this "
            "request may repeat one it already applied. It was refused rather than written a second "
            "time; nothing of it is in the stream. See docs/guarantees.md, 'When the server has "
            "forgotten a producer'.",
            forgotten_epoch=forgotten,
        )
    if code == "STREAM_SEQ_REGRESSION":
        return make(
            StreamSeqConflict, f"{where}: Stream-Seq is not greater than the last one accepted."
        )
    if code == "CONFIG_MISMATCH":
        return make(
            StreamConfigMismatch,
            f"{where}: the stream already exists with a different configuration.",
        )
    if code == "TXN_ALREADY_COMMITTED":
        return make(TxnAlreadyCommitted, f"{where}: a transaction handle was already committed.")
    if code == "TXN_ABORTED":
        return make(
            TxnAborted, f"{where}: a transaction handle was aborted and cannot be committed."
        )
    return make(ConflictError, f"{where}: conflict.")
