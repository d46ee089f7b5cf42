"""What the two exactly-once modes' task-side writers share: one attempt's per-stream state, fed in order.

``PartitionWrite`` (``partition.py``) hands each mode writer the encoded rows of each target stream. Both
modes cut them into requests with a ``RequestBatcher`` per stream and differ only in what they do with a
full request (``ordered.py`` appends it under the next seq of its producer, ``transactional.py`` stages it
under a handle of its own), with the remainder, and on failure.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from durastream_spark.protocol.client import StreamClient
from durastream_spark.sink.batcher import Request, RequestBatcher
from durastream_spark.sink.encoding import EncodedRows
from durastream_spark.sink.identity import TaskIdentity, producer_id
from durastream_spark.sink.messages import StreamPart
from durastream_spark.sink.options import SinkOptions
from durastream_spark.sink.producer import RequestPool


class StreamState(Protocol):
    batcher: RequestBatcher
    rows: int


State = TypeVar("State", bound=StreamState)


class ModeWriter(Generic[State]):
    """One task attempt's writes to its target streams, in one exactly-once mode."""

    mode: str  # TRANSACTIONAL or ORDERED (sink/options.py)

    def __init__(
        self,
        client: StreamClient,
        options: SinkOptions,
        identity: TaskIdentity,
        pool: RequestPool,
        *,
        json_framing: bool,
    ) -> None:
        self._client = client
        self._options = options
        self._identity = identity
        self._pool = pool
        self._json_framing = json_framing
        self.producer_id = producer_id(
            options.producer_prefix, identity.writer_key, identity.partition
        )
        self._streams: dict[str, State] = {}

    def add(self, stream: str, rows: EncodedRows) -> None:
        """Rows for ``stream``, in order; every request they complete is handed on at once."""
        state = self._streams.get(stream)
        if state is None:
            state = self._streams[stream] = self._open(stream)
        state.rows += len(rows)
        for request in state.batcher.add(rows):
            self._submit(stream, state, request)

    def finish(self) -> tuple[StreamPart, ...]:
        """After the last rows: wait for every request; the parts for the commit message."""
        raise NotImplementedError

    def discard(self) -> None:
        """After a failure: clean up what the mode can (see each mode)."""
        raise NotImplementedError

    # ---- for the modes -----------------------------------------------------------------------------------

    def _batcher(self) -> RequestBatcher:
        options = self._options
        return RequestBatcher(
            options.max_messages_per_request,
            options.request_bytes(self.mode),
            json_framing=self._json_framing,
        )

    def _open(self, stream: str) -> State:
        raise NotImplementedError

    def _submit(self, stream: str, state: State, request: Request) -> None:
        raise NotImplementedError
