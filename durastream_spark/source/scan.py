"""One Spark task: read ``[start, end)`` of one stream (``RangePartition``), or the ranges of many small
streams packed into one task (``PackedPartition``), and yield Arrow ``RecordBatch``es.

Three routes, chosen on the driver from what the server advertises and carried by the partition:

- ``frames`` (durastream-server): bounded reads (``end=``) in ``format=frames``: each message with its own
  offset and append time, never past ``end``. JSON columns are parsed from the values section as it is
  (``arrow.py``), so the server sends each stored record's messages as one buffer.
- ``bounded``: bounded reads without frames (a server with only the bounded-read extension); messages are
  cut out of the JSON array body.
- ``pinned``: servers without bounded reads; the range is read through a fork pinned at ``end``
  (``fallback.py``).

On the bounded routes a task is a pipeline: one thread follows the responses of the range, a pool of threads
converts them to Arrow (``pyarrow`` parses JSON without holding the GIL), and the task hands the batches to
Spark in offset order, so one task keeps the network, the server and both cores of a small machine busy.
A packed task runs the same pipeline over multi-range reads (docs/extensions.md section 10): one request
answers as many of its ranges as fit in a server chunk, and becomes one batch.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from durastream_spark.errors import (
    DurastreamError,
    EndBeyondTail,
    MalformedResponse,
    StreamGone,
    StreamNotFound,
)
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.extensions import Extensions
from durastream_spark.protocol.frames import decode_frames
from durastream_spark.protocol.jsonarray import split_json_array
from durastream_spark.protocol.models import (
    FRAMES,
    RAW,
    MultiReadChunk,
    ReadChunk,
    is_json_content_type,
)
from durastream_spark.source.arrow import FramesBlock, MessageBlock, OutputLayout, ValuesBlock
from durastream_spark.source.data_loss import DataLossReporter
from durastream_spark.source.fallback import pinned_blocks
from durastream_spark.worker_heap import freeze_startup_heap

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


class Segment(NamedTuple):
    """One range of a packed task, with its size as planned (to decide how many to ask for at once;
    ``messages`` is 0 when the range was sized by its offsets' byte positions, which count no messages).
    A tuple: the driver makes one per range of a batch (10,000 for a read of 10,000 streams), and a
    tuple is built in C where a frozen dataclass sets each field in Python."""

    stream: str
    start: str
    end: str
    content_type: str
    messages: int
    bytes: int

    def alone(self, packed: PackedPartition) -> RangePartition:
        return RangePartition(
            stream=self.stream,
            start=self.start,
            end=self.end,
            content_type=self.content_type,
            route=packed.route,
            extensions=packed.extensions,
        )


class SegmentColumns(NamedTuple):
    """The ranges of a packed task as columns, one tuple a field of ``Segment``, aligned: what the
    driver plans (``partitions.py`` builds them by slicing the batch's columns, no object a range)
    and what Spark pickles (a few C-level tuples of strings and small integers, not 10,000 tuples)."""

    streams: tuple[str, ...]
    starts: tuple[str, ...]
    ends: tuple[str, ...]
    content_types: tuple[str, ...]
    messages: tuple[int, ...]
    bytes: tuple[int, ...]


@dataclass(frozen=True)
class PackedPartition(InputPartition):
    """A task of many small ranges (``packing.py``), in path order, held as columns. Frozen and
    picklable."""

    columns: SegmentColumns
    route: str
    extensions: Extensions

    @classmethod
    def of(cls, segments: Iterable[Segment], route: str, extensions: Extensions) -> PackedPartition:
        """The partition of these ``segments`` (tests, and tasks planned range by range)."""
        listed = tuple(segments)
        if not listed:
            return cls(SegmentColumns((), (), (), (), (), ()), route, extensions)
        return cls(SegmentColumns(*map(tuple, zip(*listed, strict=True))), route, extensions)

    @property
    def streams(self) -> tuple[str, ...]:
        return self.columns.streams

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The ranges one tuple each (the task's fallback without multi-range reads, and tests)."""
        return tuple(map(Segment, *self.columns))

    def segment(self, index: int) -> Segment:
        return Segment(*(column[index] for column in self.columns))

    def __len__(self) -> int:
        return len(self.columns.streams)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled as its columns. Spark pickles every partition on the driver and unpickles it in
        the task. Equal starts (mostly "-1") and content types are made one object each first, so
        pickle writes each text once and memo references after it. The partition unpickles equal to
        this one (same ranges, same order)."""
        streams, starts, ends, content_types, messages, sizes = self.columns
        return _packed_from_columns, (
            (streams, _interned(starts), ends, _interned(content_types), messages, sizes),
            self.route,
            self.extensions,
        )


def _interned(column: tuple[str, ...]) -> tuple[str, ...]:
    """``column`` with equal texts as one object (pickle then writes each text once)."""
    seen: dict[str, str] = {}
    return tuple([seen.setdefault(value, value) for value in column])


def _packed_from_columns(
    columns: tuple[tuple[object, ...], ...], route: str, extensions: Extensions
) -> PackedPartition:
    """``PackedPartition.__reduce__``'s inverse."""
    return PackedPartition(SegmentColumns(*columns), route, extensions)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RangeScanner:
    """Reads partitions on the executors (frozen and picklable: it travels inside the reader)."""

    connection: ConnectionOptions
    layout: OutputLayout
    data_loss: DataLossReporter

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, PackedPartition):
            freeze_startup_heap()
            client = StreamClient(self.connection, extensions=partition.extensions)
            yield from self._packed_batches(client, partition)
            return
        if not isinstance(partition, RangePartition):
            return  # Spark's placeholder when a batch read has nothing to read
        freeze_startup_heap()
        client = StreamClient(self.connection, extensions=partition.extensions)
        rows = 0
        try:
            if partition.route == PINNED_ROUTE:
                batches = self._pinned_batches(client, partition)
            else:
                batches = self._bounded_batches(client, partition)
            for batch in batches:
                rows += batch.num_rows
                yield batch
        except (StreamNotFound, StreamGone, EndBeyondTail) as error:
            self.data_loss.report(
                partition.stream,
                partition.start,
                partition.end,
                f"the data is no longer readable ({type(error).__name__}: {error})",
            )
        log.debug(
            "read %d messages of %r in [%s, %s)",
            rows,
            partition.stream,
            partition.start,
            partition.end,
        )

    def _pinned_batches(
        self, client: StreamClient, partition: RangePartition
    ) -> Iterator[pa.RecordBatch]:
        for block in pinned_blocks(
            client,
            stream=partition.stream,
            start=partition.start,
            end=partition.end,
            content_type=partition.content_type,
            prefix=partition.pin_prefix,
            ttl_seconds=partition.pin_ttl_seconds,
        ):
            if block.count:
                yield self.layout.batch(partition.stream, block)

    def _bounded_batches(
        self, client: StreamClient, partition: RangePartition
    ) -> Iterator[pa.RecordBatch]:
        """Read, convert and hand over in a pipeline, in offset order.

        One thread follows the chunks of ``[start, end)`` (each request needs the previous response's
        ``Stream-Next-Offset``); each response is converted to a batch in a pool of threads (``pyarrow``
        parses and wraps without the GIL), and this thread hands the batches to Spark in order. At most
        ``READ_AHEAD`` responses are in flight, so memory stays a few chunks per task.
        """
        read_format = FRAMES if partition.route == FRAMES_ROUTE else RAW
        pipeline = _Pipeline(READ_AHEAD)

        def convert(chunk: ReadChunk) -> pa.RecordBatch | None:
            block = _block(chunk, read_format, partition.is_json)
            return self.layout.batch(partition.stream, block) if block.count else None

        def follow(converters: ThreadPoolExecutor) -> None:
            offset = partition.start
            while not pipeline.stopped:
                chunk = client.read(partition.stream, offset, partition.end, read_format)
                if not pipeline.put(converters.submit(convert, chunk)) or chunk.end_reached:
                    return
                if chunk.next_offset == offset:
                    raise MalformedResponse(
                        f"stream '{partition.stream}': a read from {offset} bounded by "
                        f"{partition.end} made no progress"
                    )
                offset = chunk.next_offset

        return pipeline.drain(follow)

    def _packed_batches(
        self, client: StreamClient, partition: PackedPartition
    ) -> Iterator[pa.RecordBatch]:
        """A packed task: its ranges read together, many per request (multi-range extension), in the
        same pipeline as one range. Each response becomes one batch whose ``stream`` column names each
        message's stream. Without the extension the ranges are read one after another."""
        if not partition.extensions.multi_range:
            for segment in partition.segments:
                yield from self._guarded(
                    segment, self._bounded_batches(client, segment.alone(partition))
                )
            return
        pipeline = _Pipeline(READ_AHEAD)
        layout = self.layout

        def convert(chunk: MultiReadChunk, runs: list[tuple[str, int]]) -> pa.RecordBatch | None:
            frames = decode_frames(pa.py_buffer(chunk.body)[chunk.frames_at :])
            if not frames.count:
                return None
            live = [(stream, count) for stream, count in runs if count]
            if len(live) == 1:
                return layout.batch(live[0][0], FramesBlock(frames))
            streams = stream_column(live)
            try:
                return layout.batch(live[0][0], FramesBlock(frames), streams)
            except DurastreamError:
                # Name the stream and message that failed: convert range by range.
                at = 0
                for stream, count in live:
                    layout.batch(stream, FramesBlock(frames.slice(at, count)))
                    at += count
                raise

        def follow(converters: ThreadPoolExecutor) -> None:
            # The task's ranges as the partition holds them (columns): the next one to ask for is
            # ``at``, and ``offsets`` where each is read from (a range cut short goes on from there).
            streams, _, ends, _, messages, sizes = partition.columns
            offsets = list(partition.columns.starts)
            at, total = 0, len(streams)
            while at < total and not pipeline.stopped:
                stop = at + _window(messages, sizes, at)
                chunk = client.read_ranges(
                    list(zip(streams[at:stop], offsets[at:stop], ends[at:stop], strict=True)),
                    FRAMES,
                )
                runs: list[tuple[str, int]] = []
                for i, answer in enumerate(chunk.ranges, at):
                    if answer.error is not None:
                        self._lost(partition.segment(i), answer.error)
                        continue
                    runs.append((streams[i], answer.messages))
                    if not answer.end_reached:
                        if answer.next_offset == offsets[i]:
                            raise MalformedResponse(
                                f"stream '{streams[i]}': a read from {offsets[i]} bounded by "
                                f"{ends[i]} made no progress"
                            )
                        offsets[i] = answer.next_offset  # cut short: continued by the next request
                last = chunk.ranges[-1]
                at += len(chunk.ranges) - (0 if last.end_reached or last.error else 1)
                if not pipeline.put(converters.submit(convert, chunk, runs)):
                    return

        yield from pipeline.drain(follow)

    def _guarded(
        self, segment: RangePartition, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except (StreamNotFound, StreamGone, EndBeyondTail) as error:
            self._lost(segment, error)

    def _lost(self, segment: Segment | RangePartition, error: Exception) -> None:
        """A range of the task cannot be read: the data-loss choke point decides (fail, or warn)."""
        if not isinstance(error, (StreamNotFound, StreamGone, EndBeyondTail)):
            raise error
        self.data_loss.report(
            segment.stream,
            segment.start,
            segment.end,
            f"the data is no longer readable ({type(error).__name__}: {error})",
        )


# Ranges sent in one multi-range request: the server answers a prefix of them within its chunk size, so
# asking for far more than a chunk holds only makes the request (and its parsing) bigger.
WINDOW_RANGES = 2000
WINDOW_BYTES = 8 << 20


def stream_column(runs: list[tuple[str, int]]) -> pa.Array:
    """The ``stream`` column of a response holding ``count`` messages of each stream in turn: the
    names taken by index. (One repeated array per stream, concatenated, cost 0.24-0.85 s for the
    10,000 streams of one packed response; one ``take`` costs 0.02-0.04 s.)"""
    names = pa.array([stream for stream, _ in runs], pa.string())
    indices = pa.array(
        list(
            itertools.chain.from_iterable(
                itertools.repeat(i, count) for i, (_, count) in enumerate(runs)
            )
        ),
        pa.int32(),
    )
    return names.take(indices)


def _window(messages: Sequence[int], sizes: Sequence[int], at: int) -> int:
    """How many ranges from ``at`` one request asks for: up to ``WINDOW_RANGES``, fewer when their
    planned bytes (and 24 a message of framing) reach ``WINDOW_BYTES``."""
    size = 0
    stop = min(len(sizes), at + WINDOW_RANGES)
    for count, i in enumerate(range(at, stop), 1):
        size += sizes[i] + 24 * messages[i]
        if size >= WINDOW_BYTES:
            return count
    return stop - at


# Conversions running at once per task, and responses read ahead of the batch Spark is taking. Two
# converters let one task use both cores of a small machine while it waits for Spark or the server;
# four responses in flight keep the server busy without holding more than a few chunks in memory.
CONVERT_THREADS = 2
READ_AHEAD = 4


def _block(chunk: ReadChunk, read_format: str, is_json: bool) -> MessageBlock:
    if read_format != RAW:
        return FramesBlock(decode_frames(chunk.body))
    values = split_json_array(chunk.body) if is_json else [chunk.body]
    return ValuesBlock([v for v in values if v or is_json], chunk.offset)


_DONE = object()


class _Pipeline:
    """A bounded, ordered hand-over from the reading thread to the consumer, which can be stopped.

    The producer's return ends the iteration; its exception is re-raised in the consumer. ``stop()``
    (the consumer left early: an error, or Spark closed the iterator) makes ``put`` return False so the
    producer ends without blocking.
    """

    def __init__(self, capacity: int) -> None:
        self._queue: queue.Queue[object] = queue.Queue(capacity)
        self._stop = threading.Event()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self, producer: Callable[..., None], *args: object) -> None:
        try:
            producer(*args)
        except BaseException as error:  # handed to the consumer, which raises it
            self.put(error)
        else:
            self.put(_DONE)

    def put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def stop(self) -> None:
        self._stop.set()

    def drain(self, follow: Callable[[ThreadPoolExecutor], None]) -> Iterator[pa.RecordBatch]:
        """Run ``follow(converters)`` on a reading thread and yield the batches it queued, in order."""
        converters = ThreadPoolExecutor(CONVERT_THREADS, thread_name_prefix="durastream-convert")
        reader = ThreadPoolExecutor(1, thread_name_prefix="durastream-read")
        try:
            reader.submit(self.run, follow, converters)
            for pending in self:
                batch = pending.result()
                if batch is not None:
                    yield batch
        finally:
            self.stop()
            reader.shutdown(wait=True, cancel_futures=True)
            converters.shutdown(wait=True, cancel_futures=True)

    def __iter__(self) -> Iterator[Future[pa.RecordBatch | None]]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
