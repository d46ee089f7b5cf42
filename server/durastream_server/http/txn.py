"""Staged appends over HTTP (docs/extensions.md section 5).

``POST {stream}`` becomes a stage, a commit or an abort when it carries ``Durastream-Txn``,
``Durastream-Commit`` or ``Durastream-Abort``. This module checks the syntax of those requests (one
place, strictly, naming the header and what is accepted), hands them to the engine and renders the
answers. Requests without any of these headers are ordinary appends and never come here.

A commit or abort lists its handles in the header, or, with the header's value ``@body``, in the
request body (``staged-append=2``): a header is capped by the server's header limit (32 KiB by
default, about 1,000 handles), a body only by ``MAX_HANDLES_PER_COMMIT``. Both forms parse to the same
request, so a commit retried in the other form is still the same commit (a 204 duplicate).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Final

from durastream_server.engine.expiry import format_rfc3339
from durastream_server.engine.txnapi import (
    HANDLE_RE,
    HANDLE_SYNTAX,
    MAX_HANDLES_PER_COMMIT,
    AbortRequest,
    CommitRequest,
    StageRequest,
    first_invalid_handle,
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
KEY: Final = "durastream-commit-key"
_NAMES: Final = {TXN: "Durastream-Txn", COMMIT: "Durastream-Commit", ABORT: "Durastream-Abort"}
# ``Durastream-Commit: @body`` / ``Durastream-Abort: @body``: the handle list is the request body.
LIST_IN_BODY: Final = "@body"
# The longest list body: every handle at the longest name, a comma and a little whitespace. Checked
# before the body is parsed, so the parse (on the event loop) stays bounded whatever the body size.
MAX_LIST_BODY_BYTES: Final = MAX_HANDLES_PER_COMMIT * 256
_LIST_WHITESPACE: Final = " \t\r\n"

TxnRequest = StageRequest | CommitRequest | AbortRequest


def is_txn(headers: dict[str, str]) -> bool:
    """Cheap test for the append hot path: does this POST use staged appends at all?"""
    return (
        TXN in headers or COMMIT in headers or ABORT in headers or TTL in headers or KEY in headers
    )


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
        if KEY in headers:
            raise BadRequest("Durastream-Commit-Key is only valid together with Durastream-Commit")
        raise BadRequest("Durastream-Txn-TTL is only valid together with Durastream-Txn")
    kind = present[0]
    if kind != TXN and TTL in headers:
        raise BadRequest("Durastream-Txn-TTL is only valid together with Durastream-Txn")
    if kind != COMMIT and KEY in headers:
        raise BadRequest("Durastream-Commit-Key is only valid together with Durastream-Commit")
    if kind == TXN:
        return _stage(path, headers, body)
    handles = _listed_handles(kind, headers[kind], body)
    if kind == COMMIT:
        return _commit(path, headers, handles)
    return AbortRequest(path=path, handles=handles)


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


def _commit(path: str, headers: dict[str, str], handles: tuple[str, ...]) -> CommitRequest:
    producer = parse.producer(headers)
    if producer is None:
        raise BadRequest(
            "Durastream-Commit requires the producer headers Producer-Id, Producer-Epoch and "
            "Producer-Seq (a commit is deduplicated by them)"
        )
    key = headers.get(KEY)
    if key is not None:
        key = key.strip()
        if not HANDLE_RE.match(key):
            raise BadRequest(f"Durastream-Commit-Key must be {HANDLE_SYNTAX}, got {headers[KEY]!r}")
    return CommitRequest(
        path=path,
        handles=handles,
        producer=producer,
        close=parse.stream_closed(headers),
        stream_seq=headers.get("stream-seq"),
        key=key,
        refuse_forgotten=parse.refuse_forgotten(headers, producer),
    )


def _listed_handles(header: str, value: str, body: bytes) -> tuple[str, ...]:
    """The handles of a commit or abort: the header's list, or the body's when the header says
    ``@body`` (the header form takes an empty body)."""
    name = _NAMES[header]
    if value.strip() != LIST_IN_BODY:
        if body:
            raise BadRequest(
                f"{name} takes an empty body when it lists the handles itself ({len(body)} bytes "
                f"sent); stage data with Durastream-Txn, or send '{name}: {LIST_IN_BODY}' with the "
                "handle list as the body"
            )
        return _handle_list(name, value, "header")
    if not body:
        raise BadRequest(f"'{name}: {LIST_IN_BODY}' needs the handle list as the request body")
    if len(body) > MAX_LIST_BODY_BYTES:
        raise BadRequest(
            f"the handle list of {name} is {len(body)} bytes; at most {MAX_LIST_BODY_BYTES} bytes "
            f"({MAX_HANDLES_PER_COMMIT} handles) are accepted"
        )
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(
            f"the handle list of {name} must be ASCII: handles are {HANDLE_SYNTAX}"
        ) from None
    return _handle_list(name, text, "body")


def _handle_list(name: str, value: str, where: str) -> tuple[str, ...]:
    """``h1, h2, ...`` (whitespace, line breaks included, around names is ignored): at least one, each
    valid, none twice (order matters for a commit), at most ``MAX_HANDLES_PER_COMMIT``."""
    handles = tuple(part.strip(_LIST_WHITESPACE) for part in value.split(","))
    if len(handles) > MAX_HANDLES_PER_COMMIT:
        raise BadRequest(
            f"{name} lists {len(handles)} handles; at most {MAX_HANDLES_PER_COMMIT} per request"
        )
    bad = first_invalid_handle(handles)
    if bad is not None:
        raise BadRequest(
            f"{name} must list handles separated by commas, each {HANDLE_SYNTAX}; got {bad!r} in "
            f"the {where} ({_excerpt(value)})"
        )
    if len(set(handles)) != len(handles):
        seen: set[str] = set()
        for handle in handles:
            if handle in seen:
                raise BadRequest(f"{name} lists handle {handle!r} more than once")
            seen.add(handle)
    return handles


def _excerpt(value: str, limit: int = 200) -> str:
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


def _rfc3339_ms(ms: int) -> str:
    return format_rfc3339(datetime.fromtimestamp(ms / 1000, tz=timezone.utc))


async def serve(engine: Engine, send: Send, request: TxnRequest) -> None:
    """Run ``request`` and send its answer (errors propagate to the app's error mapping)."""
    status, headers = await answer(engine, request)
    await responses.send_response(send, status, headers)


async def answer(engine: Engine, request: TxnRequest) -> tuple[int, Headers]:
    """Run ``request``; the status and headers of its answer (which has no body). Bulk requests
    (``bulk.py``) answer each of their entries with this, so an entry is answered as its own request."""
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
        return 204 if staged.duplicate else 200, headers
    if isinstance(request, CommitRequest):
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
        if committed.duplicate:
            headers.append(parse.digest_header(committed.verified))
        else:
            headers.append(("Durastream-Txn-Messages", str(committed.messages)))
            headers.append(("Durastream-Txn-Bytes", str(committed.bytes)))
        return 204 if committed.duplicate else 200, headers
    aborted = await engine.abort(request)
    headers.append(("Stream-Next-Offset", aborted.next_offset))
    return 204, headers
