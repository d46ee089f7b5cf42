"""Staged appends over HTTP (docs/extensions.md section 5).

``POST {stream}`` becomes a stage, a commit or an abort when it carries ``Durastream-Txn``,
``Durastream-Commit`` or ``Durastream-Abort``. This module checks the syntax of those requests (one
place, strictly, naming the header and what is accepted), hands them to the engine and renders the
answers. Requests without any of these headers are ordinary appends and never come here.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Final

from durastream_server.engine.expiry import format_rfc3339
from durastream_server.engine.txnapi import (
    HANDLE_RE,
    HANDLE_SYNTAX,
    AbortRequest,
    CommitRequest,
    StageRequest,
)
from durastream_server.errors import BadRequest
from durastream_server.http import parse, responses
from durastream_server.http.responses import Headers, Send

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine

TXN: Final = "durastream-txn"
COMMIT: Final = "durastream-commit"
ABORT: Final = "durastream-abort"
TTL: Final = "durastream-txn-ttl"
_NAMES: Final = {TXN: "Durastream-Txn", COMMIT: "Durastream-Commit", ABORT: "Durastream-Abort"}

TxnRequest = StageRequest | CommitRequest | AbortRequest


def is_txn(headers: dict[str, str]) -> bool:
    """Cheap test for the append hot path: does this POST use staged appends at all?"""
    return TXN in headers or COMMIT in headers or ABORT in headers or TTL in headers


def route_class(headers: dict[str, str]) -> str:
    """The metrics route class of a POST: ``stage``, ``commit``, ``abort`` or a plain ``append``."""
    if TXN in headers:
        return "stage"
    if COMMIT in headers:
        return "commit"
    if ABORT in headers:
        return "abort"
    return "append"


def parse_request(path: str, headers: dict[str, str], body: bytes) -> TxnRequest:
    """The stage, commit or abort this POST asks for, or ``BadRequest`` naming what is wrong."""
    present = [name for name in (TXN, COMMIT, ABORT) if name in headers]
    if len(present) > 1:
        raise BadRequest(
            f"{' and '.join(_NAMES[n] for n in present)} cannot be combined: a POST stages "
            "(Durastream-Txn), commits (Durastream-Commit) or aborts (Durastream-Abort)"
        )
    if not present:
        raise BadRequest("Durastream-Txn-TTL is only valid together with Durastream-Txn")
    kind = present[0]
    if kind != TXN and TTL in headers:
        raise BadRequest("Durastream-Txn-TTL is only valid together with Durastream-Txn")
    if kind == TXN:
        return _stage(path, headers, body)
    if body:
        raise BadRequest(
            f"{_NAMES[kind]} takes an empty body ({len(body)} bytes sent); "
            "stage data with Durastream-Txn"
        )
    if kind == COMMIT:
        return _commit(path, headers)
    return AbortRequest(path=path, handles=_handle_list(ABORT, headers[ABORT]))


def _stage(path: str, headers: dict[str, str], body: bytes) -> StageRequest:
    handle = headers[TXN].strip()
    if not HANDLE_RE.match(handle):
        raise BadRequest(f"Durastream-Txn must be {HANDLE_SYNTAX}, got {headers[TXN]!r}")
    if not body:
        raise BadRequest("a stage (Durastream-Txn) needs a non-empty body")
    if parse.stream_closed(headers):
        raise BadRequest(
            "Stream-Closed cannot be sent with Durastream-Txn: close the stream with the commit "
            "(Durastream-Commit + Stream-Closed: true)"
        )
    if "stream-seq" in headers:
        raise BadRequest(
            "Stream-Seq cannot be sent with Durastream-Txn: it orders stream writes, so it goes "
            "on the commit"
        )
    content_type = parse.content_type(headers)
    if content_type is None:
        raise BadRequest("Content-Type is required when staging a body")
    return StageRequest(
        path=path,
        handle=handle,
        content_type=content_type,
        body=body,
        producer=parse.producer(headers),
        ttl_seconds=_ttl(headers.get(TTL)),
    )


def _ttl(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or text.startswith("0") or len(text) > 12:
        raise BadRequest(
            f"Durastream-Txn-TTL must be a positive number of seconds without sign or leading "
            f"zeros, got {value!r}"
        )
    return int(text)


def _commit(path: str, headers: dict[str, str]) -> CommitRequest:
    handles = _handle_list(COMMIT, headers[COMMIT])
    producer = parse.producer(headers)
    if producer is None:
        raise BadRequest(
            "Durastream-Commit requires the producer headers Producer-Id, Producer-Epoch and "
            "Producer-Seq (a commit is deduplicated by them)"
        )
    return CommitRequest(
        path=path,
        handles=handles,
        producer=producer,
        close=parse.stream_closed(headers),
        stream_seq=headers.get("stream-seq"),
    )


def _handle_list(header: str, value: str) -> tuple[str, ...]:
    """``h1, h2, ...``: at least one, each valid, none twice (order matters for a commit)."""
    name = _NAMES[header]
    handles = tuple(part.strip() for part in value.split(","))
    for handle in handles:
        if not HANDLE_RE.match(handle):
            raise BadRequest(
                f"{name} must be a comma-separated list of handles, each {HANDLE_SYNTAX}; "
                f"got {handle!r} in {value!r}"
            )
    if len(set(handles)) != len(handles):
        raise BadRequest(f"{name} lists a handle more than once: {value!r}")
    return handles


def _rfc3339_ms(ms: int) -> str:
    return format_rfc3339(datetime.fromtimestamp(ms / 1000, tz=timezone.utc))


async def serve(engine: Engine, send: Send, request: TxnRequest) -> None:
    """Run ``request`` and send its answer (errors propagate to the app's error mapping)."""
    headers: Headers = [("Cache-Control", responses.CACHE_NO_STORE)]
    if isinstance(request, StageRequest):
        staged = await engine.stage(request)
        headers += [
            ("Stream-Next-Offset", staged.next_offset),
            ("Durastream-Txn-Messages", str(staged.messages)),
            ("Durastream-Txn-Bytes", str(staged.bytes)),
            ("Durastream-Txn-Expires-At", _rfc3339_ms(staged.expires_at_ms)),
        ]
        if staged.producer_epoch is not None:
            headers.append(("Producer-Epoch", str(staged.producer_epoch)))
            headers.append(("Producer-Seq", str(staged.producer_seq)))
        await responses.send_response(send, 204 if staged.duplicate else 200, headers)
    elif isinstance(request, CommitRequest):
        committed = await engine.commit(request)
        headers.append(("Stream-Next-Offset", committed.next_offset))
        if committed.closed:
            headers.append(("Stream-Closed", "true"))
        epoch = committed.producer_epoch
        seq = committed.producer_seq
        headers.append(
            ("Producer-Epoch", str(epoch if epoch is not None else request.producer.epoch))
        )
        headers.append(("Producer-Seq", str(seq if seq is not None else request.producer.seq)))
        if not committed.duplicate:
            headers.append(("Durastream-Txn-Messages", str(committed.messages)))
            headers.append(("Durastream-Txn-Bytes", str(committed.bytes)))
        await responses.send_response(send, 204 if committed.duplicate else 200, headers)
    else:
        aborted = await engine.abort(request)
        headers.append(("Stream-Next-Offset", aborted.next_offset))
        await responses.send_response(send, 204, headers)
