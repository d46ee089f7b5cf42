"""``spark.read.format("durastream")``: one bounded read of every selected stream.

``startingOffsets`` (default ``earliest``) and ``endingOffsets`` (default ``latest``) are resolved once,
when Spark plans the read on the driver: ``latest`` becomes each stream's tail at that moment, so a closed
stream is read to its final offset and an open one to its tail at planning time. Instants
(``startingTimestamp``, ``endingOffsetsByTimestamp``, ...) become offsets there too, through the server's
time lookup (``time_resolution.py``). Tasks then read exactly those ranges (``scan.py``), never past them,
even while writers keep appending.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from durastream_spark.boundary import spark_entry_points
from durastream_spark.errors import DurastreamError, stream_root_hint
from durastream_spark.protocol.client import StreamClient
from durastream_spark.source.arrow import OutputLayout
from durastream_spark.source.data_loss import DataLossReporter
from durastream_spark.source.discovery import StreamCatalog, check_pattern_supported
from durastream_spark.source.options import SourceOptions
from durastream_spark.source.partitions import Partitioner
from durastream_spark.source.planner import batch_ranges
from durastream_spark.source.scan import RangeScanner
from durastream_spark.source.time_resolution import TimeResolver
from durastream_spark.worker_heap import collections_held


class StreamsNotFound(DurastreamError):
    """A batch read names streams that do not exist."""


@spark_entry_points
class DurableStreamBatchReader(DataSourceReader):
    """Plans on the driver (``partitions``), reads on the executors (``read``)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.layout = OutputLayout.for_schema(schema)
        self.data_loss = DataLossReporter(options.fail_on_data_loss)
        self.scanner = RangeScanner(options.connection, self.layout, self.data_loss)

    def partitions(self) -> list[InputPartition]:
        # A tuple a stream or so (``StreamRange``; columns elsewhere), all alive until returned.
        with collections_held():
            return self._partitions()

    def _partitions(self) -> list[InputPartition]:
        client = StreamClient(self.options.connection)
        selection = self.options.selection
        if selection.pattern is not None:
            check_pattern_supported(client, selection.pattern)
        catalog = StreamCatalog(
            client,
            streams=selection.streams,
            pattern=selection.pattern,
            exclude_prefix=self.options.pin_prefix,
        )
        listed = catalog.snapshot_columns()  # columns: no object a stream (10,000 of them)
        tails = dict(zip(listed.paths, listed.next_offsets, strict=True))
        missing = [path for path in selection.streams if path not in tails]
        if missing:
            url = self.options.connection.url
            fix = stream_root_hint(url) or "check the names, or create the streams first"
            raise StreamsNotFound(
                f"Stream(s) {', '.join(repr(p) for p in missing)} (option 'streams') do not exist under "
                f"{url}: {fix}."
            )
        times = TimeResolver(self.options, client)
        times.check_supported()
        ranges = batch_ranges(
            times.concrete(self.options.starting, tails, ending=False),
            times.concrete(self.options.ending, tails, ending=True),
            tails,
            starting_raw=self.options.starting_time_text or self.options.starting_text,
            ending_raw=self.options.ending_time_text or self.options.ending_text,
            starting_option=self.options.starting_time_option or "startingOffsets",
            ending_option=self.options.ending_option,
        )
        partitioner = Partitioner(self.options, client, self.layout, self.data_loss)
        content_types = dict(zip(listed.paths, listed.content_types, strict=True))
        return list(partitioner.partitions(ranges, content_types))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.scanner.read(partition)
