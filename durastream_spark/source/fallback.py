"""Replay-determinism on servers without the bounded-read extension (e.g. the Node reference server).

A micro-batch must read exactly ``[start, end)`` of a stream, however often it is re-read, even after more
data was appended. The base protocol has no ``end=`` parameter: a catch-up read from ``start`` returns
everything up to the *current* tail, and without per-message offsets a reader cannot cut it at ``end``.

The base protocol does have one way to freeze a range: a fork (spec 4.2). A fork created with
``Stream-Fork-Offset: end`` holds the source's data before ``end`` and nothing appended to the source later;
created closed, nobody can append to it either. Reading the fork from ``start`` up to its tail is therefore
exactly ``[start, end)``, forever. Forks share the source's offset space, so ``start`` needs no translation.

So the source *pins* each range: ``{fallback.pinPrefix}/{stream}/{end}``, created with an idempotent ``PUT``
(the same path and configuration answer 200), with a TTL (``fallback.pinTtl``, sliding on reads) so that
pins of crashed queries disappear by themselves; a streaming query also deletes the pins of a batch once
Spark commits it. Tasks create the pin again before reading (a no-op when it exists), so a pin that expired
or was deleted while a batch was retried comes back as long as the source still holds the data.

The server must really fork: the ``PUT`` must answer with ``Stream-Next-Offset`` equal to ``end``. A server
that ignores the fork headers would create an empty stream instead; the source then refuses to read
(``ReplayNotGuaranteed``), because it could not re-read a batch identically after a failure, and never reads
past ``end`` silently. Rows read this way have no server timestamp (null) and carry, as ``offset``, the offset
their read started at (see ``arrow.ValuesBlock``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator

from durastream_spark.errors import (
    BadRequest,
    ConflictError,
    DurastreamError,
    MalformedResponse,
    NotSupported,
    RequestContext,
    StreamGone,
    StreamNotFound,
)
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.jsonarray import split_json_array
from durastream_spark.protocol.models import RAW, is_json_content_type
from durastream_spark.source.arrow import MessageBlock, ValuesBlock
from durastream_spark.source.offsets import offset_after

log = logging.getLogger(__name__)

_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9._~-]{1,200}$")


class ReplayNotGuaranteed(DurastreamError):
    """The server offers neither bounded reads nor forks: batches could not be re-read identically."""


def pin_path(prefix: str, stream: str, end: str) -> str:
    """Where the pin of ``stream`` at ``end`` lives. Injective: ``end`` is the last segment."""
    segment = (
        end if _SAFE_SEGMENT.match(end) else "h" + hashlib.sha256(end.encode()).hexdigest()[:40]
    )
    return f"{prefix}/{stream}/{segment}"


def ensure_pin(
    client: StreamClient, prefix: str, stream: str, end: str, content_type: str, ttl_seconds: int
) -> str:
    """Create (or confirm) the pin of ``[.., end)`` of ``stream``; return its path.

    Raises ``StreamNotFound``/``StreamGone`` when the source is gone (the caller reports data loss) and
    ``ReplayNotGuaranteed`` when the server does not fork.
    """
    path = pin_path(prefix, stream, end)
    try:
        created = client.create(
            path,
            content_type,
            ttl_seconds=ttl_seconds,
            closed=True,
            forked_from=stream,
            fork_offset=end,
        )
    except ConflictError as conflict:
        # The pin exists with another configuration (a different fallback.pinTtl), or the source was
        # deleted while forks hold it. An existing pin at exactly ``end`` is still exactly the range.
        try:
            meta = client.head(path)
        except StreamNotFound:
            raise StreamGone(
                f"stream '{stream}': cannot pin offset {end}: {conflict}",
                context=_context(client, stream),
                status=conflict.status,
                code=conflict.code,
                headers=conflict.headers,
                server_message=conflict.server_message,
            ) from conflict
        if meta.next_offset != end:
            raise ReplayNotGuaranteed(
                f"Stream '{path}' exists but is not a pin of '{stream}' at {end} (its tail is "
                f"{meta.next_offset}). Remove it, or choose another fallback.pinPrefix."
            ) from conflict
        return path
    except (BadRequest, NotSupported) as error:
        if isinstance(error, BadRequest) and _tail_before(client, stream, end):
            raise StreamGone(
                f"stream '{stream}' is now shorter than offset {end} (deleted and re-created, or "
                "truncated)",
                context=_context(client, stream),
                status=error.status,
                code=error.code,
                headers=error.headers,
                server_message=error.server_message,
            ) from error
        raise _not_guaranteed(client, stream, end, f"the fork request failed: {error}") from error
    if created.next_offset != end:
        if created.created:  # an ordinary stream, not a pin: leave nothing behind
            delete_pin(client, path)
        raise _not_guaranteed(
            client,
            stream,
            end,
            f"the server answered the fork request with tail {created.next_offset} instead of {end}, so "
            "it ignored the fork headers",
        )
    return path


def delete_pin(client: StreamClient, path: str) -> None:
    """Best effort: a pin left behind expires with its TTL."""
    try:
        client.delete(path)
    except (StreamNotFound, StreamGone):
        pass
    except DurastreamError as error:
        log.info("could not delete pin %r (it expires by its TTL): %s", path, error)


def pinned_blocks(
    client: StreamClient,
    *,
    stream: str,
    start: str,
    end: str,
    content_type: str,
    prefix: str,
    ttl_seconds: int,
) -> Iterator[MessageBlock]:
    """The messages of ``[start, end)`` read through the pin, one block per response.

    ``StreamNotFound``/``StreamGone`` propagate when the data is gone (the caller reports data loss).
    """
    path = ensure_pin(client, prefix, stream, end, content_type, ttl_seconds)
    is_json = is_json_content_type(content_type)
    offset = start
    recreated = False
    while True:
        try:
            chunk = client.read(path, offset, None, RAW)
        except StreamNotFound:
            if recreated:
                raise
            # Deleted under us (another query committed the same pin, or its TTL ran out): pin again.
            path = ensure_pin(client, prefix, stream, end, content_type, ttl_seconds)
            recreated = True
            continue
        if offset_after(chunk.next_offset, end):
            raise MalformedResponse(
                f"stream '{stream}': the pin at {end} returned data up to {chunk.next_offset}, past its "
                "end; refusing it (a batch must never read past its end offset)"
            )
        values = split_json_array(chunk.body) if is_json else ([chunk.body] if chunk.body else [])
        if values:
            yield ValuesBlock(values, offset)
        if chunk.next_offset == end:
            return
        if chunk.up_to_date or chunk.closed or chunk.next_offset == offset:
            raise MalformedResponse(
                f"stream '{stream}': the pin at {end} ended at {chunk.next_offset}, before its end"
            )
        offset = chunk.next_offset


def _tail_before(client: StreamClient, stream: str, end: str) -> bool:
    try:
        return offset_after(end, client.head(stream).next_offset)
    except DurastreamError:
        return False


def _context(client: StreamClient, stream: str) -> RequestContext:
    return RequestContext("PUT", client.stream_url(stream), stream=stream)


def _not_guaranteed(client: StreamClient, stream: str, end: str, why: str) -> ReplayNotGuaranteed:
    return ReplayNotGuaranteed(
        f"Cannot read stream '{stream}' up to offset {end} replay-deterministically from "
        f"{client.connection.url}: the server advertises no bounded-read extension (end=), and {why}. "
        "Without one of the two, a micro-batch could not be re-read identically after a failure (more "
        "data may have been appended since), which would break exactly-once processing, so the source "
        "refuses instead of reading past the batch's end. Use durastream-server, or a server that "
        "implements forks (protocol section 4.2) and lets this client create streams under "
        "fallback.pinPrefix."
    )
