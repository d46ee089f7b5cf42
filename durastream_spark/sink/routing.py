"""Where each row goes: decided once on the driver (``Routing.decide``), applied to every batch in the tasks.

The rule, as in Spark's Kafka sink (whose ``topic`` option overrides a ``topic`` column):

- the ``stream`` option, when set, is the target of every row. A ``stream`` column is then not used for
  routing (nor written: a column named ``stream`` is never payload). So a DataFrame read from the durastream
  source, whose default schema has a ``stream`` column, goes where the option says:
  ``readStream.format("durastream")...load().writeStream.format("durastream").option("stream", "copy")``
  copies into ``copy``;
- without the option, a STRING ``stream`` column names each row's target (a null is an error: there is no
  default target). Except the source's own ``stream`` column (``columns.SOURCE_STREAM_MARK`` in its field
  metadata): routing by it would write every row back into the stream it was read from, and a streaming
  query would then read its own output forever. That is refused when the query starts, naming the fix:
  set the option, or derive the target from the column (a computed column carries no mark).

Target paths are normalised before rows are grouped by them, so spellings of one stream cannot split the
rows of a partition into groups written one after the other (which reordered them): surrounding ``/`` and
ASCII whitespace are not part of a path (``"s"``, ``"/s"``, ``"s/"`` and ``" s "`` are the same stream, as
for the option); inner characters are kept as they are (``"a b"`` and ``"a/b"`` are streams of their own).
Grouping is a stable sort, so each target gets its rows in input order. Validation (non-empty segments,
no ``.`` or ``..``) runs once per distinct target.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StringType, StructType

from durastream_spark.columns import is_source_stream
from durastream_spark.sink.encoding import STREAM_COLUMN, EncodedRows, PayloadLayout
from durastream_spark.sink.errors import UnsupportedWrite
from durastream_spark.sink.options import (
    PATH_TRIM,
    STREAM,
    SinkOptions,
    check_stream_path,
    normalize_path,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Routing:
    """``fixed``: the ``stream`` option's path, every row's target; else ``column``, the index of the
    ``stream`` column that names each row's target. Picklable."""

    fixed: str | None
    column: int | None

    @classmethod
    def decide(cls, options: SinkOptions, layout: PayloadLayout, schema: StructType) -> Routing:
        index = layout.stream_index
        if options.stream is not None:
            if index is not None:
                source = is_source_stream(schema.fields[index].metadata)
                (log.info if source else log.warning)(
                    "option '%s' is set: every row goes to '%s'; the DataFrame's '%s' column is not "
                    "used for routing nor written (the option overrides the column, as Kafka's 'topic' "
                    "option does)%s",
                    STREAM,
                    options.stream,
                    STREAM_COLUMN,
                    ""
                    if source
                    else "; earlier versions of the sink routed by the column and used the option "
                    "only for nulls",
                )
            return cls(fixed=options.stream, column=None)
        if index is None:
            raise UnsupportedWrite(
                f"No target stream: set option '{STREAM}' (a path relative to 'url'), or add a STRING "
                f"column '{STREAM_COLUMN}' naming each row's target stream."
            )
        field = schema.fields[index]
        if not isinstance(field.dataType, StringType):
            raise UnsupportedWrite(
                f"Column '{STREAM_COLUMN}' routes rows to streams (the option '{STREAM}' is not set) and "
                f"must be STRING, got {field.dataType.simpleString()}. Cast it, or set the option."
            )
        if is_source_stream(field.metadata):
            raise UnsupportedWrite(
                f"The DataFrame's '{STREAM_COLUMN}' column comes from the durastream source: it names the "
                "stream each row was read from, so routing by it would write every row back into its "
                "own source stream (and a streaming query would read its own output again, forever). "
                f"Set option '{STREAM}' to the target stream, e.g. .option('stream', 'copy/events'). To "
                "route by the source stream on purpose, derive the target from it, e.g. "
                "withColumn('stream', concat(lit('copy/'), col('stream')))."
            )
        return cls(fixed=None, column=index)


def normalize_paths(values: pa.Array) -> pa.Array:
    """``normalize_path`` for a column of routing values, vectorised (nulls stay null)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return pc.utf8_trim(values, PATH_TRIM)


def split(values: pa.Array, payloads: pa.Array) -> Iterator[tuple[str, pa.Array]]:
    """``(target path, its payloads in input order)`` for each distinct target of a batch.

    ``values`` is the batch's routing column, ``payloads`` its encoded rows. Targets are normalised and
    checked first; a null target is an error. One distinct target (the common case) costs a
    ``unique``; more cost one stable sort of the batch.
    """
    names, grouped, counts = _grouped(values, payloads)
    start = 0
    for name, count in zip(names, counts, strict=True):
        yield name, grouped.slice(start, count)
        start += count


def split_rows(
    values: pa.Array, payloads: pa.Array, separator: int, *, first: int | None = None
) -> Iterator[tuple[str, EncodedRows]]:
    """``split``, each target's payloads as ``EncodedRows`` (what the mode writers take) over the one
    grouped buffer: its offsets are read into Python once per batch, not once per target (a batch
    routed to 10,000 targets built 10,000 offset lists). ``first``: the partition's row number of
    the batch's first row, for errors."""
    names, grouped, counts = _grouped(values, payloads, first)
    rows = EncodedRows.from_arrow(grouped, separator)
    start = 0
    for name, count in zip(names, counts, strict=True):
        yield name, rows.slice(start, count)
        start += count


def _grouped(
    values: pa.Array, payloads: pa.Array, first: int | None = None
) -> tuple[list[str], pa.Array, list[int]]:
    """The batch's distinct targets (checked), its payloads grouped by target (a stable sort: each
    target's rows in input order) and each target's row count, in the order of the targets."""
    targets = normalize_paths(values)
    if targets.null_count:
        position = int(pc.index(pc.is_null(targets), True).as_py())
        where = (
            f"Row {position} of this batch"
            if first is None
            else f"Row {first + position} of this partition (counting from 0)"
        )
        raise UnsupportedWrite(
            f"{where} has a null '{STREAM_COLUMN}' column, so it has no target "
            f"stream (the option '{STREAM}' is not set: the column names every row's target). Filter "
            "such rows out, or fill the column, e.g. coalesce(col('stream'), lit('events/other'))."
        )
    encoded = targets.dictionary_encode()
    names = [_checked(name) for name in encoded.dictionary.to_pylist()]
    if len(names) == 1:
        return names, payloads, [len(payloads)]
    codes = encoded.indices
    order = pc.sort_indices(codes)  # stable: each target's rows keep their order
    tally = pc.value_counts(codes)
    by_code = dict(
        zip(tally.field("values").to_pylist(), tally.field("counts").to_pylist(), strict=True)
    )
    return names, payloads.take(order), [by_code[code] for code in range(len(names))]


def target_of(value: str | None) -> str:
    """The target path of one routing value (the row writer's path)."""
    if value is None:
        raise UnsupportedWrite(
            f"A row has a null '{STREAM_COLUMN}' column, so it has no target stream (the option "
            f"'{STREAM}' is not set: the column names every row's target). Filter such rows out, or "
            "fill the column, e.g. coalesce(col('stream'), lit('events/other'))."
        )
    return _checked(normalize_path(value))


def _checked(path: str) -> str:
    try:
        return check_stream_path(path)
    except ValueError as error:
        raise UnsupportedWrite(
            f"Column '{STREAM_COLUMN}' holds {path!r}, which is not a stream path: {error}"
        ) from None
