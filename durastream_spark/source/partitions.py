"""Driver side: turn a batch's ranges into Spark input partitions (tasks).

Each stream's range is at least one task. With the server's limit lookups, a range larger than
``maxBytesPerPartition`` / ``maxMessagesPerPartition`` (or a batch with fewer tasks than ``minPartitions``) is
cut at message boundaries into several tasks (``planner.part_counts`` / ``planner.split_points``), so one
large stream can use every core. The cuts depend only on the range (its data never changes), so a replayed
batch gets the same tasks. Without limit lookups each range is one task; without bounded reads each range
is pinned first (``fallback.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping

from durastream_spark.errors import EndBeyondTail, StreamGone, StreamNotFound
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.models import is_json_content_type
from durastream_spark.source.arrow import OutputLayout, SchemaNotSupported
from durastream_spark.source.data_loss import DataLossReporter
from durastream_spark.source.fallback import ensure_pin
from durastream_spark.source.options import SourceOptions
from durastream_spark.source.planner import (
    RangeSize,
    SplitRules,
    StreamRange,
    part_counts,
    split_points,
)
from durastream_spark.source.scan import PINNED_ROUTE, RangePartition, choose_route

log = logging.getLogger(__name__)

SizeCache = MutableMapping[tuple[str, str, str], RangeSize]


class Partitioner:
    """Builds ``RangePartition``s for ranges of a batch (driver only)."""

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
    ) -> list[RangePartition]:
        extensions = self.client.extensions()
        route = choose_route(extensions)
        sizes = {} if sizes is None else sizes
        splitting = extensions.limit_lookup and route != PINNED_ROUTE  # pins are per range end
        measured: dict[str, RangeSize] = {}
        readable: list[StreamRange] = []
        for item in ranges:
            known = content_types.get(item.stream)
            if known is not None:  # unknown: the stream is gone, and reading it reports data loss
                self.check_schema(item.stream, known)
            if splitting:
                size = self._size(item, sizes)
                if size is None or size.messages == 0:
                    continue
                measured[item.stream] = size
            readable.append(item)

        counts = part_counts(measured, self.rules) if splitting else {}
        result: list[RangePartition] = []
        for item in readable:
            content_type = content_types.get(item.stream) or self._assumed_content_type()
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
            bounds = [item.start]
            if splitting and counts.get(item.stream, 1) > 1:
                bounds += self._cuts(item, measured[item.stream], counts[item.stream])
            bounds.append(item.end)
            for begin, finish in zip(bounds, bounds[1:], strict=False):
                result.append(
                    RangePartition(
                        stream=item.stream,
                        start=begin,
                        end=finish,
                        content_type=content_type,
                        route=route,
                        extensions=extensions,
                        pin_prefix=self.options.pin_prefix,
                        pin_ttl_seconds=self.options.pin_ttl_seconds,
                    )
                )
        if result:
            log.info("planned %d task(s) over %d stream range(s)", len(result), len(readable))
        return result

    def _assumed_content_type(self) -> str:
        return "application/json" if self.layout.needs_json else "application/octet-stream"

    def _size(self, item: StreamRange, sizes: SizeCache) -> RangeSize | None:
        key = (item.stream, item.start, item.end)
        cached = sizes.get(key)
        if cached is not None:
            return cached
        try:
            found = self.client.lookup_limit(item.stream, item.start, end=item.end)
        except (StreamNotFound, StreamGone, EndBeyondTail) as error:
            self.data_loss.report(
                item.stream, item.start, item.end, f"the range is no longer readable: {error}"
            )
            return None
        size = RangeSize(found.messages, found.bytes)
        sizes[key] = size
        return size

    def _cuts(self, item: StreamRange, size: RangeSize, parts: int) -> list[str]:
        def lookup(start: str, max_messages: int, max_bytes: int) -> tuple[str, int, int]:
            found = self.client.lookup_limit(
                item.stream, start, max_messages=max_messages, max_bytes=max_bytes, end=item.end
            )
            return found.end, found.messages, found.bytes

        return split_points(
            item.start,
            item.end,
            size,
            parts,
            lookup,
            max_messages_per_part=self.options.max_messages_per_partition,
            max_bytes_per_part=self.options.max_bytes_per_partition,
        )
