"""One Spark task: read ``[start, end)`` of one stream and yield Arrow ``RecordBatch``es.

Three routes, chosen on the driver from what the server advertises and carried by the partition:

- ``frames`` (durastream-server): bounded reads (``end=``) in ``format=frames`` (or ``frames-lines`` when
  JSON columns are parsed): each message with its own offset and append time, never past ``end``.
- ``bounded``: bounded reads without frames (a server with only the bounded-read extension); messages are
  cut out of the JSON array body.
- ``pinned``: servers without bounded reads; the range is read through a fork pinned at ``end``
  (``fallback.py``).

The next response is fetched while the current one is converted and handed to Spark, so one task keeps the
network and the CPU busy at the same time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from durastream_spark.errors import EndBeyondTail, MalformedResponse, StreamGone, StreamNotFound
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.extensions import Extensions
from durastream_spark.protocol.frames import decode_frames
from durastream_spark.protocol.jsonarray import split_json_array
from durastream_spark.protocol.models import (
    FRAMES,
    FRAMES_LINES,
    RAW,
    ReadChunk,
    is_json_content_type,
)
from durastream_spark.source.arrow import FramesBlock, MessageBlock, OutputLayout, ValuesBlock
from durastream_spark.source.data_loss import DataLossReporter
from durastream_spark.source.fallback import pinned_blocks

log = logging.getLogger(__name__)

FRAMES_ROUTE = "frames"
BOUNDED_ROUTE = "bounded"
PINNED_ROUTE = "pinned"


def choose_route(extensions: Extensions) -> str:
    if extensions.bounded_read and extensions.message_frames:
        return FRAMES_ROUTE
    if extensions.bounded_read:
        return BOUNDED_ROUTE
    return PINNED_ROUTE


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """What one task reads. Frozen and picklable; everything the task needs, so it asks nothing first."""

    stream: str
    start: str  # EARLIEST ("-1") or an offset token
    end: str  # an offset token
    content_type: str
    route: str
    extensions: Extensions
    pin_prefix: str = ""
    pin_ttl_seconds: int = 0

    @property
    def is_json(self) -> bool:
        return is_json_content_type(self.content_type)


@dataclass(frozen=True)
class RangeScanner:
    """Reads partitions on the executors (frozen and picklable: it travels inside the reader)."""

    connection: ConnectionOptions
    layout: OutputLayout
    data_loss: DataLossReporter

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # Spark's placeholder when a batch read has nothing to read
        client = StreamClient(self.connection, extensions=partition.extensions)
        rows = 0
        for block in self._blocks(client, partition):
            if block.count:
                rows += block.count
                yield self.layout.batch(partition.stream, block)
        log.debug(
            "read %d messages of %r in [%s, %s)",
            rows,
            partition.stream,
            partition.start,
            partition.end,
        )

    def _blocks(self, client: StreamClient, partition: RangePartition) -> Iterator[MessageBlock]:
        try:
            if partition.route == PINNED_ROUTE:
                yield from pinned_blocks(
                    client,
                    stream=partition.stream,
                    start=partition.start,
                    end=partition.end,
                    content_type=partition.content_type,
                    prefix=partition.pin_prefix,
                    ttl_seconds=partition.pin_ttl_seconds,
                )
            else:
                yield from self._bounded_blocks(client, partition)
        except (StreamNotFound, StreamGone, EndBeyondTail) as error:
            self.data_loss.report(
                partition.stream,
                partition.start,
                partition.end,
                f"the data is no longer readable ({type(error).__name__}: {error})",
            )

    def _bounded_blocks(
        self, client: StreamClient, partition: RangePartition
    ) -> Iterator[MessageBlock]:
        if partition.route == FRAMES_ROUTE:
            lines = self.layout.needs_json and partition.is_json
            read_format = FRAMES_LINES if lines else FRAMES
        else:
            read_format = RAW
        with ThreadPoolExecutor(1, thread_name_prefix="durastream-read") as prefetch:

            def fetch(offset: str) -> ReadChunk:
                return client.read(partition.stream, offset, partition.end, read_format)

            offset = partition.start
            pending: Future[ReadChunk] = prefetch.submit(fetch, offset)
            while True:
                chunk = pending.result()
                done = chunk.end_reached
                if not done:
                    if chunk.next_offset == offset:
                        raise MalformedResponse(
                            f"stream '{partition.stream}': a read from {offset} bounded by "
                            f"{partition.end} made no progress"
                        )
                    offset = chunk.next_offset
                    pending = prefetch.submit(fetch, offset)  # overlaps the conversion below
                if read_format == RAW:
                    values = split_json_array(chunk.body) if partition.is_json else [chunk.body]
                    yield ValuesBlock([v for v in values if v or partition.is_json], chunk.offset)
                else:
                    yield FramesBlock(decode_frames(chunk.body))
                if done:
                    return
