"""Driver side: turn a batch's ranges into Spark input partitions (tasks).

Every range of the batch is sized: by its offsets alone where the server advertises ``byte-positions``
and no ``maxMessagesPerPartition`` needs message counts (no request: docs/extensions.md section 12), else
with the server's limit lookups (one multi-range request per 10,000 ranges, ``measure.py``). Ranges
larger than ``maxBytesPerPartition`` / ``maxMessagesPerPartition`` are cut at message boundaries
(``planner.split_points``: limit lookups either way), and the pieces are packed into tasks up to those
caps (``packing.py``; ``minPartitions`` lowers the caps to an even share of the batch): a batch over
10,000 small streams is a few tasks, each reading many ranges (``scan.PackedPartition``), and one large
stream can use every core. Sizes and cuts depend only on the ranges (their offsets, and their data
never changes), so a replayed batch gets the same tasks. Without limit lookups each range is one task;
without bounded reads each range is pinned first (``fallback.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from durastream_spark.errors import StreamGone, StreamNotFound
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.extensions import Extensions
from durastream_spark.protocol.models import is_json_content_type
from durastream_spark.source.arrow import OutputLayout, SchemaNotSupported
from durastream_spark.source.data_loss import DataLossReporter
from durastream_spark.source.fallback import ensure_pin
from durastream_spark.source.measure import SizeCache, measure, position_bytes, position_spans
from durastream_spark.source.options import SourceOptions
from durastream_spark.source.packing import (
    Piece,
    TaskCaps,
    byte_caps,
    pack,
    pack_bytes,
    parts_needed,
    task_caps,
)
from durastream_spark.source.planner import RangeSize, SplitRules, StreamRange, split_points
from durastream_spark.source.scan import (
    PINNED_ROUTE,
    PackedPartition,
    RangePartition,
    Segment,
    SegmentColumns,
    choose_route,
)

log = logging.getLogger(__name__)


class Partitioner:
    """Builds the tasks (``RangePartition``s and ``PackedPartition``s) of a batch (driver only)."""

    def __init__(
        self,
        options: SourceOptions,
        client: StreamClient,
        layout: OutputLayout,
        data_loss: DataLossReporter,
    ) -> None:
        self.options = options
        self.client = client
        self.layout = layout
        self.data_loss = data_loss
        self.rules = SplitRules(
            max_bytes_per_partition=options.max_bytes_per_partition,
            max_messages_per_partition=options.max_messages_per_partition,
            min_partitions=options.min_partitions,
        )

    def check_schema(self, stream: str, content_type: str) -> None:
        """A user schema parses JSON: refuse other content types before any task runs."""
        if self.layout.needs_json and not is_json_content_type(content_type):
            raise SchemaNotSupported(
                f"Stream '{stream}' has content type '{content_type}', but the query's schema has columns "
                "parsed from JSON messages, which needs application/json streams. Read it without "
                ".schema() (raw 'value' bytes), or select only JSON streams."
            )

    def partitions(
        self,
        ranges: list[StreamRange],
        content_types: Mapping[str, str],
        sizes: SizeCache | None = None,
        on_pin: Callable[[str, str, str], None] | None = None,
    ) -> list[RangePartition | PackedPartition]:
        extensions = self.client.extensions()
        route = choose_route(extensions)
        sizes = {} if sizes is None else sizes
        checked: set[str] = set()  # content types: 10,000 streams usually share one
        for item in ranges:
            known = content_types.get(item.stream)
            # Unknown: the stream is gone, and reading it reports data loss.
            if known is not None and known not in checked:
                self.check_schema(item.stream, known)
                checked.add(known)
        if extensions.limit_lookup and route != PINNED_ROUTE:  # pins are per range end
            result = self._packed(ranges, content_types, sizes, route, extensions)
        else:
            result = self._one_per_range(ranges, content_types, route, extensions, on_pin)
        if result:
            log.info("planned %d task(s) over %d stream range(s)", len(result), len(ranges))
        return result

    def _packed(
        self,
        ranges: list[StreamRange],
        content_types: Mapping[str, str],
        sizes: SizeCache,
        route: str,
        extensions: Extensions,
    ) -> list[RangePartition | PackedPartition]:
        """Size every range, cut the large ones, pack the rest into tasks (``packing.py``): a pure
        function of the ranges, so replays match."""
        if extensions.byte_positions and self.rules.max_messages_per_partition is None:
            columnar = self._packed_by_positions(ranges, content_types, route, extensions)
            if columnar is not None:
                return columnar
            measured, caps = self._sized_by_positions(ranges, sizes)
        else:
            measured = measure(self.client, ranges, sizes, self._lost)
            caps = task_caps(measured.values(), self.rules)
        pieces: list[Piece] = []
        add = pieces.append
        most_bytes, most_messages = caps.bytes, caps.messages
        for item in ranges:  # one pass; a range within the caps is one piece, no cut to plan
            size = measured.get(item.stream)
            if size is None or not (size.messages or size.bytes):
                continue  # lost since the listing, or empty
            if size.bytes <= most_bytes and (
                most_messages is None or size.messages <= most_messages
            ):
                add(Piece(item.stream, item.start, item.end, size))
            else:
                pieces.extend(self._pieces(item, size, caps))
        result: list[RangePartition | PackedPartition] = []
        for task in pack(pieces, caps):
            if len(task) == 1:
                (piece,) = task
                content_type = self._content_type(content_types, piece.stream)
                result.append(
                    RangePartition(
                        piece.stream, piece.start, piece.end, content_type, route, extensions
                    )
                )
                continue
            fallback = self._content_type({}, "")  # a stream gone since the listing
            known = content_types.get
            segments = tuple(
                Segment(stream, start, end, known(stream, fallback), size[0], size[1])
                for stream, start, end, size in task
            )
            result.append(PackedPartition.of(segments, route, extensions))
        return result

    def _packed_by_positions(
        self,
        ranges: list[StreamRange],
        content_types: Mapping[str, str],
        route: str,
        extensions: Extensions,
    ) -> list[RangePartition | PackedPartition] | None:
        """The common batch planned as columns: every range sized by its offsets' positions and
        none larger than a task (a batch of many small streams). The same tasks as the range-by-range
        path (same sizes, caps and greedy cut: ``packing.pack_bytes``), built by slicing the batch's
        columns, without a ``RangeSize``, ``Piece`` or ``Segment`` a range (for 10,000 ranges that
        was most of the driver's planning CPU). None: the batch needs the range-by-range path (a
        range to cut, or offsets that are not positions)."""
        if not ranges:
            return []
        streams, starts, ends = zip(*ranges, strict=True)
        spans = position_spans(starts, ends)
        if spans is None:
            return None
        caps = byte_caps(sum(spans), self.rules)
        if max(spans) > caps.bytes:
            return None  # a range to cut at message boundaries: limit lookups
        if 0 in spans:  # empty ranges are no task's (as in the range-by-range path)
            kept = [i for i, size in enumerate(spans) if size]
            streams = tuple([streams[i] for i in kept])
            starts = tuple([starts[i] for i in kept])
            ends = tuple([ends[i] for i in kept])
            spans = [spans[i] for i in kept]
        fallback = self._content_type({}, "")  # a stream gone since the listing
        known = content_types.get
        types = tuple([known(stream, fallback) for stream in streams])
        no_messages = (0,) * len(streams)  # sized by positions: messages not counted
        result: list[RangePartition | PackedPartition] = []
        first = 0
        for last in pack_bytes(spans, caps.bytes):
            if last - first == 1:
                result.append(
                    RangePartition(
                        streams[first], starts[first], ends[first], types[first], route, extensions
                    )
                )
            else:
                columns = SegmentColumns(
                    streams[first:last],
                    starts[first:last],
                    ends[first:last],
                    types[first:last],
                    no_messages[first:last],
                    tuple(spans[first:last]),
                )
                result.append(PackedPartition(columns, route, extensions))
            first = last
        return result

    def _sized_by_positions(
        self, ranges: list[StreamRange], sizes: SizeCache
    ) -> tuple[dict[str, RangeSize], TaskCaps]:
        """``byte-positions``: each range's bytes are its offsets' difference, so packing needs no
        request. Only a range too large for one task is measured (its cuts need its messages), and
        any range whose offsets do not read as positions. A range lost since the listing is found when
        its task reads it, as for any packed task."""
        found, unknown = position_bytes(ranges)
        measured = {stream: RangeSize(0, size) for stream, size in found.items()}
        caps = task_caps(measured.values(), self.rules, counted=False)
        large = [item for item in ranges if found.get(item.stream, 0) > caps.bytes]
        if large or unknown:
            for item in large:
                del measured[item.stream]
            measured.update(measure(self.client, large + unknown, sizes, self._lost))
        return measured, caps

    def _one_per_range(
        self,
        ranges: list[StreamRange],
        content_types: Mapping[str, str],
        route: str,
        extensions: Extensions,
        on_pin: Callable[[str, str, str], None] | None,
    ) -> list[RangePartition | PackedPartition]:
        """Servers without limit lookups: one task per range (without bounded reads, pinned first)."""
        result: list[RangePartition | PackedPartition] = []
        for item in ranges:
            content_type = self._content_type(content_types, item.stream)
            if route == PINNED_ROUTE:
                try:
                    ensure_pin(
                        self.client,
                        self.options.pin_prefix,
                        item.stream,
                        item.end,
                        content_type,
                        self.options.pin_ttl_seconds,
                    )
                except (StreamNotFound, StreamGone) as error:
                    self.data_loss.report(
                        item.stream, item.start, item.end, f"the stream cannot be pinned: {error}"
                    )
                    continue
                if on_pin is not None:
                    on_pin(item.stream, item.end, self.options.pin_prefix)
            result.append(
                RangePartition(
                    stream=item.stream,
                    start=item.start,
                    end=item.end,
                    content_type=content_type,
                    route=route,
                    extensions=extensions,
                    pin_prefix=self.options.pin_prefix,
                    pin_ttl_seconds=self.options.pin_ttl_seconds,
                )
            )
        return result

    def _content_type(self, content_types: Mapping[str, str], stream: str) -> str:
        known = content_types.get(stream)
        if known is not None:
            return known
        return "application/json" if self.layout.needs_json else "application/octet-stream"

    def _lost(self, item: StreamRange, error: Exception) -> None:
        self.data_loss.report(
            item.stream, item.start, item.end, f"the range is no longer readable: {error}"
        )

    def _pieces(self, item: StreamRange, size: RangeSize, caps: TaskCaps) -> list[Piece]:
        """``item`` whole, or cut at message boundaries into parts within the caps, each with its size
        (the cuts' limit lookups count them; the last part is what remains)."""
        parts = parts_needed(size, caps)
        if parts <= 1:
            return [Piece(item.stream, item.start, item.end, size)]
        found: dict[str, tuple[str, int, int]] = {}

        def lookup(start: str, max_messages: int, max_bytes: int) -> tuple[str, int, int]:
            answer = self.client.lookup_limit(
                item.stream, start, max_messages=max_messages, max_bytes=max_bytes, end=item.end
            )
            found[start] = (answer.end, answer.messages, answer.bytes)
            return found[start]

        cuts = split_points(
            item.start,
            item.end,
            size,
            parts,
            lookup,
            # The options are hard caps; a minPartitions share only sets the number of parts.
            max_messages_per_part=self.rules.max_messages_per_partition,
            max_bytes_per_part=self.rules.max_bytes_per_partition,
        )
        bounds = [item.start, *cuts, item.end]
        pieces: list[Piece] = []
        left = size
        for begin, finish in zip(bounds, bounds[1:], strict=False):
            if finish == item.end:
                part = left
            else:
                _, messages, size_bytes = found[begin]
                part = RangeSize(messages, size_bytes)
            left = RangeSize(left.messages - part.messages, left.bytes - part.bytes)
            pieces.append(Piece(item.stream, begin, finish, part))
        return pieces
