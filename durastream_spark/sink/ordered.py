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

A replay of a batch that an earlier run committed in transactional mode (the mode changed in between)
meets that commit at seq 0 of a part: such a part is complete, and is skipped (``batch_mode.py``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from durastream_spark.errors import DuplicatePayloadMismatch, request_id_note
from durastream_spark.protocol.body import RequestBody
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.models import AppendResult
from durastream_spark.sink.batch_mode import COMMIT_SEQ, committed_transactionally
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
    "Restart the query from its checkpoint: the replay finishes the batch exactly once if it sees the "
    "partition's rows in the order of the earlier attempt. Switching exactlyOnce does not finish it (a "
    "transactional run refuses a batch that ordered mode started). To keep later batches from failing "
    "so, make each partition's row order deterministic (e.g. .sortWithinPartitions(<unique key>) after "
    "a shuffle), or write them in transactional mode; both only apply to batches that have not started. "
    "See docs/guarantees.md."
)


@dataclass
class _StreamState:
    batcher: RequestBatcher
    producer: PipelinedProducer[AppendResult | None]
    # Set by seq 0 when an earlier run of the batch committed this part transactionally: from then
    # on nothing is sent (None results), the part is complete.
    committed_earlier: threading.Event
    rows: int = 0
    bytes: int = 0
    last_offset: str | None = None


class OrderedPartitionWriter(ModeWriter[_StreamState]):
    """One task attempt's ordered writes to its target streams."""

    mode = ORDERED

    def finish(self) -> tuple[StreamPart, ...]:
        """Wait for every full request; return the parts, remainders included (unsent)."""
        parts = []
        for stream, state in self._streams.items():
            results = state.producer.drain()
            remainder = state.batcher.remainder()
            if (remainder is not None and not remainder.body) or state.committed_earlier.is_set():
                remainder = None
            offsets = [r.next_offset for r in results if r is not None and r.next_offset]
            parts.append(
                StreamPart(
                    stream=stream,
                    rows=state.rows,
                    bytes=state.bytes + (len(remainder.body) if remainder else 0),
                    requests=state.producer.submitted,
                    remainder=bytes(remainder.body) if remainder else None,
                    remainder_rows=remainder.rows if remainder else 0,
                    last_offset=max(offsets) if offsets else None,
                    committed_earlier=state.committed_earlier.is_set(),
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
        committed_earlier = threading.Event()

        def send(seq: int, body: bytes | RequestBody) -> AppendResult | None:
            # Seqs above 0 are sent only after seq 0 was answered (PipelinedProducer), so they see
            # what seq 0 found.
            if committed_earlier.is_set():
                return None
            try:
                return client.append(
                    stream,
                    body,
                    options.content_type,
                    producer=(pid, epoch, seq),
                    require_verified=True,  # a replay the server cannot compare fails loudly
                )
            except DuplicatePayloadMismatch as error:
                if seq == COMMIT_SEQ and committed_transactionally(client, stream, pid, epoch):
                    log.info(
                        "stream '%s', %s: an earlier run of this batch committed the part in "
                        "transactional mode; it is complete, nothing more is sent",
                        stream,
                        identity.describe(),
                    )
                    committed_earlier.set()
                    return None
                raise ReorderedRetryError(
                    f"Ordered mode, stream '{stream}', {identity.describe()}: seq {seq} of producer "
                    f"'{pid}' (epoch {epoch}) was already used by an earlier attempt for different bytes: "
                    "this attempt saw the partition's rows in another order (or with other values). The "
                    "server kept the earlier request and refused this one, so nothing was lost or "
                    f"duplicated; the task fails instead. {GUARANTEE_HINT}{request_id_note(error)}"
                ) from error

        return _StreamState(
            batcher=self._batcher(),
            producer=PipelinedProducer(
                send, self._pool, label=f"producer '{pid}' epoch {epoch} on stream '{stream}'"
            ),
            committed_earlier=committed_earlier,
        )

    def _submit(self, stream: str, state: _StreamState, request: Request) -> None:
        if not request.body:  # only empty values of a byte stream: nothing to append, no seq used
            return
        state.bytes += len(request.body)
        if state.committed_earlier.is_set():  # complete already: no need to queue more
            return
        state.producer.submit(request.body)


def commit_part(
    client: StreamClient, options: SinkOptions, message: SinkCommitMessage, part: StreamPart
) -> PartResult:
    """Driver: send the part's remainder under seq ``part.requests``; a 204 means it is already there."""
    if (
        part.committed_earlier
    ):  # an earlier run committed it in transactional mode (see batch_mode.py)
        return PartResult(part.stream, message.partition, part.rows, part.bytes, DUPLICATE, None)
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
        if part.requests == COMMIT_SEQ and committed_transactionally(
            client, part.stream, message.producer_id, message.epoch
        ):
            log.info(
                "stream '%s', batch %d, partition %d: an earlier run of this batch committed the part "
                "in transactional mode; nothing more is sent",
                part.stream,
                message.epoch,
                message.partition,
            )
            return PartResult(
                part.stream, message.partition, part.rows, part.bytes, DUPLICATE, None
            )
        raise ReorderedRetryError(
            f"Ordered mode, stream '{part.stream}', batch {message.epoch}, partition {message.partition}: "
            f"the final request (seq {part.requests} of producer '{message.producer_id}') was already "
            "committed with different bytes by an earlier run of this batch: the replay produced other rows "
            f"or another order. Nothing was duplicated. {GUARANTEE_HINT}{request_id_note(error)}"
        ) from error
    return PartResult(
        part.stream,
        message.partition,
        part.rows,
        part.bytes,
        DUPLICATE if result.duplicate else COMMITTED,
        result.next_offset,
    )
