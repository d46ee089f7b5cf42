"""Status + JSON code + protocol headers -> typed error; never the message text."""

from __future__ import annotations

import json
import pickle

import pytest

from durastream_spark import errors as e
from durastream_spark.errors import RequestContext, error_from_response

CONTEXT = RequestContext(
    "POST",
    "http://127.0.0.1:1/v1/stream/events/a",
    stream="events/a",
    offset="0000000000000000_0000000000000010",
    end="0000000000000000_0000000000000099",
    producer=("writer-7", 3, 12),
    content_type="application/json",
    body_bytes=2048,
)


def body(code: str, message: str = "whatever the server says") -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


JSON_HEADERS = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("status", "code", "headers", "expected"),
    [
        (400, "BAD_REQUEST", {}, e.BadRequest),
        (400, "END_BEYOND_TAIL", {"Stream-Next-Offset": "T"}, e.EndBeyondTail),
        (401, None, {}, e.AccessDenied),
        (403, "STALE_EPOCH", {"Producer-Epoch": "5"}, e.StaleEpochError),
        (
            403,
            None,
            {"Producer-Epoch": "5"},
            e.StaleEpochError,
        ),  # Node reference server: no JSON code
        (403, "FORBIDDEN", {}, e.AccessDenied),
        (404, "NOT_FOUND", {}, e.StreamNotFound),
        (404, "TXN_NOT_FOUND", {}, e.TxnNotFound),
        (405, None, {}, e.NotSupported),
        (
            409,
            "STREAM_CLOSED",
            {"Stream-Closed": "true", "Stream-Next-Offset": "F"},
            e.StreamClosedError,
        ),
        (409, None, {"Stream-Closed": "true", "Stream-Next-Offset": "F"}, e.StreamClosedError),
        (409, "CONTENT_TYPE_MISMATCH", {}, e.ContentTypeMismatch),
        (
            409,
            "SEQUENCE_GAP",
            {"Producer-Expected-Seq": "10", "Producer-Received-Seq": "12"},
            e.SequenceGapError,
        ),
        (
            409,
            None,
            {"Producer-Expected-Seq": "10", "Producer-Received-Seq": "12"},
            e.SequenceGapError,
        ),
        (409, "DUPLICATE_PAYLOAD_MISMATCH", {"Producer-Epoch": "3"}, e.DuplicatePayloadMismatch),
        (409, "STREAM_SEQ_REGRESSION", {}, e.StreamSeqConflict),
        (409, "CONFIG_MISMATCH", {}, e.StreamConfigMismatch),
        (409, "TXN_ALREADY_COMMITTED", {}, e.TxnAlreadyCommitted),
        (409, "TXN_ABORTED", {}, e.TxnAborted),
        (409, None, {}, e.ConflictError),
        (410, "GONE", {}, e.StreamGone),
        (410, "TXN_EXPIRED", {}, e.TxnExpired),
        (413, "PAYLOAD_TOO_LARGE", {}, e.PayloadTooLarge),
        (413, "TXN_TOO_LARGE", {}, e.TxnTooLarge),
        (413, "TOO_MANY_MESSAGES", {}, e.TooManyMessages),
        (500, "TXN_CORRUPT", {}, e.TxnCorrupt),
        (429, None, {"Retry-After": "3"}, e.RateLimited),
        (500, "INTERNAL", {}, e.ServerError),
        (503, "STORAGE_FAILURE", {}, e.ServerError),
        (418, None, {}, e.ProtocolError),
    ],
)
def test_mapping(status: int, code: str | None, headers: dict[str, str], expected: type) -> None:
    payload = body(code) if code else b""
    error = error_from_response(CONTEXT, status, {**JSON_HEADERS, **headers}, payload, attempts=2)
    assert type(error) is expected
    assert error.status == status and error.code == code
    assert error.stream == "events/a"
    assert "stream 'events/a'" in str(error)
    assert f"HTTP {status}" in str(error) and "2 attempt(s)" in str(error)
    for name, value in headers.items():
        assert error.headers[name] == value


def test_message_text_never_decides_the_type() -> None:
    """Hazard 38: a 500 saying 'not found' stays a server error; a 409 saying 'closed' is not 'closed'."""
    error = error_from_response(CONTEXT, 500, JSON_HEADERS, body("INTERNAL", "stream not found"))
    assert type(error) is e.ServerError
    error = error_from_response(CONTEXT, 409, {}, b"stream is closed; sequence gap; stale epoch")
    assert type(error) is e.ConflictError


def test_typed_attributes_and_actionable_messages() -> None:
    stale = error_from_response(
        CONTEXT, 403, {**JSON_HEADERS, "Producer-Epoch": "5"}, body("STALE_EPOCH")
    )
    assert isinstance(stale, e.StaleEpochError) and stale.current_epoch == 5
    assert "A newer batch owns the producer" in str(stale)
    assert "writer-7" in str(stale) and "epoch 3" in str(stale)

    gap = error_from_response(
        CONTEXT,
        409,
        {"Producer-Expected-Seq": "10", "Producer-Received-Seq": "12"},
        b"",
    )
    assert isinstance(gap, e.SequenceGapError)
    assert (gap.expected_seq, gap.received_seq) == (10, 12)
    assert "expects seq 10, received 12" in str(gap)

    closed = error_from_response(
        CONTEXT, 409, {"Stream-Closed": "true", "Stream-Next-Offset": "F9"}, b""
    )
    assert isinstance(closed, e.StreamClosedError) and closed.final_offset == "F9"
    assert "final offset F9" in str(closed)

    beyond = error_from_response(
        CONTEXT, 400, {**JSON_HEADERS, "Stream-Next-Offset": "T1"}, body("END_BEYOND_TAIL")
    )
    assert isinstance(beyond, e.EndBeyondTail) and beyond.tail == "T1"
    assert "0000000000000000_0000000000000099" in str(beyond) and "T1" in str(beyond)

    gone = error_from_response(CONTEXT, 410, {}, b"")
    assert "0000000000000000_0000000000000010" in str(gone)

    too_large = error_from_response(CONTEXT, 413, {}, b"")
    assert "2048 bytes" in str(too_large)


def test_only_relevant_headers_are_kept() -> None:
    error = error_from_response(
        CONTEXT,
        503,
        {"Set-Cookie": "session=secret", "WWW-Authenticate": "Bearer", "Retry-After": "1"},
        b"",
    )
    assert error.headers == {"Retry-After": "1"}


def test_long_non_json_bodies_are_clipped() -> None:
    error = error_from_response(
        CONTEXT, 502, {"Content-Type": "text/html"}, b"<html>" + b"x" * 5000
    )
    assert error.code is None
    assert len(str(error)) < 1000


@pytest.mark.parametrize(
    "error",
    [
        error_from_response(CONTEXT, 403, {"Producer-Epoch": "5"}, b""),
        error_from_response(
            CONTEXT, 409, {"Producer-Expected-Seq": "1", "Producer-Received-Seq": "2"}, b""
        ),
        e.TransportError(CONTEXT, ConnectionError("reset"), attempts=1, maybe_applied=True),
        e.ExtensionNotSupported("bounded-read", "http://x/v1/stream", "read exactly"),
        e.MalformedFrames("bad magic"),
    ],
)
def test_errors_pickle(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
