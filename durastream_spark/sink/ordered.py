"""Ordered mode: for servers without staged appends (e.g. the Node reference server).

Task side (``OrderedPartitionWriter``): each target stream gets a ``RequestBatcher`` and a pipelined
producer ``(<producerId>-<writer key>-<partition>, epoch = batch id, seq)``. Only *full* requests are sent
from the task, under seqs ``0, 1, ...``: their content depends only on the rows that closed them, so an
attempt that is retried (or truncated, or run twice by speculation) and fed the same rows in the same order
sends byte-identical requests under the same seqs, which the server answers as duplicates. The *remainder*
(the last partial request, whose content depends on where the input ended) is not sent: it travels to the
driver in the commit message.

Driver side (``commit_part``): sends each remainder under the next seq. Spark calls ``commit`` only with the
messages of successful attempts, so only a remainder of complete input becomes visible. A commit repeated
after a driver crash resends the same bytes under the same tuple: a duplicate.

Precondition: a retry must see its partition's rows in the same order. Where the server checks payload
digests (durastream-server), a reordered retry reuses a seq for different bytes and gets 409
``DUPLICATE_PAYLOAD_MISMATCH``: the task fails loudly (``ReorderedRetryError``), nothing is lost or
duplicated silently. A duplicate the server can no longer compare (older than the digests it keeps) fails
as loudly (``UnverifiedDuplicate``), and so does a request of a producer it has forgotten
(``ProducerForgottenError``). Elsewhere the server would answer 204 and drop the different bytes; see
docs/guarantees.md for the conditions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from durastream_spark.errors import DuplicatePayloadMismatch
from durastream_spark.protocol.body import RequestBody
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.models import AppendResult
from durastream_spark.sink.batcher import Request, RequestBatcher
from durastream_spark.sink.errors import ReorderedRetryError
from durastream_spark.sink.messages import (
    COMMITTED,
    DUPLICATE,
    NOTHING,
    PartResult,
    SinkCommitMessage,
    StreamPart,
)
from durastream_spark.sink.mode_writer import ModeWriter
from durastream_spark.sink.options import ORDERED, SinkOptions
from durastream_spark.sink.producer import PipelinedProducer

log = logging.getLogger(__name__)

GUARANTEE_HINT = (
    "Make the row order of each partition deterministic (e.g. .sortWithinPartitions(<unique key>) after a "
    "shuffle), or use exactlyOnce=transactional on a server with staged appends. See docs/guarantees.md."
)


@dataclass
class _StreamState:
    batcher: RequestBatcher
    producer: PipelinedProducer[AppendResult]
    rows: int = 0
    bytes: int = 0
    last_offset: str | None = None
    results: list[AppendResult] = field(default_factory=list)


class OrderedPartitionWriter(ModeWriter[_StreamState]):
    """One task attempt's ordered writes to its target streams."""

    mode = ORDERED

    def finish(self) -> tuple[StreamPart, ...]:
        """Wait for every full request; return the parts, remainders included (unsent)."""
        parts = []
        for stream, state in self._streams.items():
            results = state.producer.drain()
            remainder = state.batcher.remainder()
            if remainder is not None and not remainder.body:
                remainder = None
            offsets = [r.next_offset for r in results if r.next_offset]
            parts.append(
                StreamPart(
                    stream=stream,
                    rows=state.rows,
                    bytes=state.bytes + (len(remainder.body) if remainder else 0),
                    requests=state.producer.submitted,
                    remainder=bytes(remainder.body) if remainder else None,
                    remainder_rows=remainder.rows if remainder else 0,
                    last_offset=max(offsets) if offsets else None,
                )
            )
        return tuple(parts)

    def discard(self) -> None:
        """After a failure. Nothing can be taken back: the full requests already sent stay visible, and a
        retry of the task (or a replay of the batch) resends them under the same seqs as duplicates."""

    # ---- internals ---------------------------------------------------------------------------------------

    def _open(self, stream: str) -> _StreamState:
        options = self._options
        epoch = self._identity.epoch
        pid = self.producer_id
        identity = self._identity
        client = self._client

        def send(seq: int, body: bytes | RequestBody) -> AppendResult:
            try:
                return client.append(
                    stream,
                    body,
                    options.content_type,
                    producer=(pid, epoch, seq),
                    require_verified=True,  # a replay the server cannot compare fails loudly
                )
            except DuplicatePayloadMismatch as error:
                raise ReorderedRetryError(
                    f"Ordered mode, stream '{stream}', {identity.describe()}: seq {seq} of producer "
                    f"'{pid}' (epoch {epoch}) was already used by an earlier attempt for different bytes: "
                    "this attempt saw the partition's rows in another order (or with other values). The "
                    "server kept the earlier request and refused this one, so nothing was lost or "
                    f"duplicated; the task fails instead. {GUARANTEE_HINT}"
                ) from error

        return _StreamState(
            batcher=self._batcher(),
            producer=PipelinedProducer(
                send, self._pool, label=f"producer '{pid}' epoch {epoch} on stream '{stream}'"
            ),
        )

    def _submit(self, stream: str, state: _StreamState, request: Request) -> None:
        if not request.body:  # only empty values of a byte stream: nothing to append, no seq used
            return
        state.bytes += len(request.body)
        state.producer.submit(request.body)


def commit_part(
    client: StreamClient, options: SinkOptions, message: SinkCommitMessage, part: StreamPart
) -> PartResult:
    """Driver: send the part's remainder under seq ``part.requests``; a 204 means it is already there."""
    if part.remainder is None:
        return PartResult(
            part.stream, message.partition, part.rows, part.bytes, NOTHING, part.last_offset
        )
    producer = (message.producer_id, message.epoch, part.requests)
    try:
        result = client.append(
            part.stream,
            part.remainder,
            options.content_type,
            producer=producer,
            require_verified=True,
        )
    except DuplicatePayloadMismatch as error:
        raise ReorderedRetryError(
            f"Ordered mode, stream '{part.stream}', batch {message.epoch}, partition {message.partition}: "
            f"the final request (seq {part.requests} of producer '{message.producer_id}') was already "
            "committed with different bytes by an earlier run of this batch: the replay produced other rows "
            f"or another order. Nothing was duplicated. {GUARANTEE_HINT}"
        ) from error
    return PartResult(
        part.stream,
        message.partition,
        part.rows,
        part.bytes,
        DUPLICATE if result.duplicate else COMMITTED,
        result.next_offset,
    )
