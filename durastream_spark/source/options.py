"""The source's options, parsed once on the driver into a frozen, picklable ``SourceOptions``.

Every key is a named constant here and validated in ``SourceOptions.parse``; errors name the option, the
value and what is accepted. Users read them in ``docs/options.md``, generated from this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from durastream_spark.errors import OptionError
from durastream_spark.figures import FIGURES_KEYS, FiguresOptions
from durastream_spark.options import CONNECTION_KEYS, MAX_BYTE_SIZE, ConnectionOptions, OptionReader
from durastream_spark.source.discovery import glob_matches, normalize_pattern
from durastream_spark.source.offsets import (
    EarliestSpec,
    LatestSpec,
    OffsetSpec,
    SpecificSpec,
    TimestampSpec,
    check_spec_paths,
    normalize_path,
    parse_offset_spec,
    parse_timestamp_spec,
    parse_timestamps_by_stream,
    with_timestamps,
)

# ---- option keys (canonical spelling; matching is case-insensitive) ----------------------------------------
STREAMS = "streams"
PATTERN = "pattern"
STARTING_OFFSETS = "startingOffsets"
ENDING_OFFSETS = "endingOffsets"
STARTING_TIMESTAMP = "startingTimestamp"
STARTING_OFFSETS_BY_TIMESTAMP = "startingOffsetsByTimestamp"
STARTING_TIMESTAMP_STRATEGY = "startingOffsetsByTimestampStrategy"
ENDING_TIMESTAMP = "endingTimestamp"
ENDING_OFFSETS_BY_TIMESTAMP = "endingOffsetsByTimestamp"
MAX_MESSAGES_PER_TRIGGER = "maxMessagesPerTrigger"
MAX_BYTES_PER_TRIGGER = "maxBytesPerTrigger"
MIN_MESSAGES_PER_TRIGGER = "minMessagesPerTrigger"
MIN_BYTES_PER_TRIGGER = "minBytesPerTrigger"
MAX_TRIGGER_DELAY = "maxTriggerDelay"
FAIL_ON_DATA_LOSS = "failOnDataLoss"
MIN_PARTITIONS = "minPartitions"
MAX_BYTES_PER_PARTITION = "maxBytesPerPartition"
MAX_MESSAGES_PER_PARTITION = "maxMessagesPerPartition"
PIN_PREFIX = "fallback.pinPrefix"
PIN_TTL = "fallback.pinTtl"

SOURCE_KEYS: frozenset[str] = frozenset(
    {
        STREAMS,
        PATTERN,
        STARTING_OFFSETS,
        ENDING_OFFSETS,
        STARTING_TIMESTAMP,
        STARTING_OFFSETS_BY_TIMESTAMP,
        STARTING_TIMESTAMP_STRATEGY,
        ENDING_TIMESTAMP,
        ENDING_OFFSETS_BY_TIMESTAMP,
        MAX_MESSAGES_PER_TRIGGER,
        MAX_BYTES_PER_TRIGGER,
        MIN_MESSAGES_PER_TRIGGER,
        MIN_BYTES_PER_TRIGGER,
        MAX_TRIGGER_DELAY,
        FAIL_ON_DATA_LOSS,
        MIN_PARTITIONS,
        MAX_BYTES_PER_PARTITION,
        MAX_MESSAGES_PER_PARTITION,
        PIN_PREFIX,
        PIN_TTL,
    }
)

# ---- defaults -----------------------------------------------------------------------------------------------
# Twice Spark's file-source default (spark.sql.files.maxPartitionBytes, 128 MiB): a Python task costs far
# more to start than a JVM one, and halving the task count of the source benchmark's 410 MB read (4 -> 2
# tasks on 2 cores) made it 8% faster. minPartitions still spreads a backlog over every core.
DEFAULT_MAX_BYTES_PER_PARTITION = 256 * 1024 * 1024
DEFAULT_PIN_PREFIX = "__durastream_pins"
DEFAULT_PIN_TTL_SECONDS = 24 * 3600
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000  # Kafka's maxTriggerDelay default
MAX_INT = MAX_BYTE_SIZE  # what the server's limit lookups accept
# startingOffsetsByTimestampStrategy, as Kafka's: what a stream with no message at or after the instant does
STRATEGY_ERROR = "error"
STRATEGY_LATEST = "latest"


@dataclass(frozen=True)
class StreamSelection:
    """Which streams a query reads: a fixed list (``streams``) or a glob (``pattern``)."""

    streams: tuple[str, ...] = ()
    pattern: str | None = None

    @property
    def is_pattern(self) -> bool:
        return self.pattern is not None

    def describe(self) -> str:
        if self.pattern is not None:
            return f"pattern {self.pattern!r}"
        return "streams " + ", ".join(repr(s) for s in self.streams)

    def includes(self, path: str) -> bool:
        if self.pattern is not None:
            return glob_matches(self.pattern, path)
        return path in self.streams


@dataclass(frozen=True)
class SourceOptions:
    """Everything the source needs from its options. Frozen and picklable (it travels to the tasks)."""

    connection: ConnectionOptions
    selection: StreamSelection
    starting: OffsetSpec = EarliestSpec()
    ending: OffsetSpec = LatestSpec()
    ending_given: bool = False
    starting_text: str | None = None  # as the user wrote them, for error messages
    ending_text: str | None = None
    starting_time_option: str | None = None  # startingTimestamp or startingOffsetsByTimestamp
    starting_time_text: str | None = None
    ending_time_option: str | None = None
    ending_time_text: str | None = None
    timestamp_strategy: str = STRATEGY_ERROR
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    min_bytes_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    max_messages_per_partition: int | None = None
    pin_prefix: str = DEFAULT_PIN_PREFIX
    pin_ttl_seconds: int = DEFAULT_PIN_TTL_SECONDS
    figures: FiguresOptions = FiguresOptions()  # batchFiguresPath (figures.py)

    @property
    def uses_timestamps(self) -> bool:
        return self.starting_time_option is not None or self.ending_time_option is not None

    @property
    def ending_option(self) -> str:
        """The option that set the end of a batch read (for messages)."""
        return self.ending_time_option or ENDING_OFFSETS

    @property
    def has_trigger_limits(self) -> bool:
        return self.max_messages_per_trigger is not None or self.max_bytes_per_trigger is not None

    @property
    def has_trigger_minimum(self) -> bool:
        return self.min_messages_per_trigger is not None or self.min_bytes_per_trigger is not None

    def trigger_limit_options(self) -> list[tuple[str, str]]:
        """``(option, value)`` of every per-trigger limit set (for messages that name them)."""
        values = (
            (MAX_MESSAGES_PER_TRIGGER, self.max_messages_per_trigger),
            (MAX_BYTES_PER_TRIGGER, self.max_bytes_per_trigger),
            (MIN_MESSAGES_PER_TRIGGER, self.min_messages_per_trigger),
            (MIN_BYTES_PER_TRIGGER, self.min_bytes_per_trigger),
        )
        return [(option, str(value)) for option, value in values if value is not None]

    @classmethod
    def parse(cls, options: Mapping[str, str] | None) -> SourceOptions:
        reader = OptionReader(options)
        reader.ensure_known(CONNECTION_KEYS | SOURCE_KEYS | FIGURES_KEYS)
        connection = ConnectionOptions.parse(reader)
        selection = _parse_selection(reader)

        raw_start = reader.raw(STARTING_OFFSETS)
        starting = parse_offset_spec(STARTING_OFFSETS, raw_start, ending=False)
        raw_end = reader.raw(ENDING_OFFSETS)
        ending = parse_offset_spec(ENDING_OFFSETS, raw_end, ending=True)
        for key, raw, spec in (
            (STARTING_OFFSETS, raw_start, starting),
            (ENDING_OFFSETS, raw_end, ending),
        ):
            _check_spec_against_selection(key, raw, spec, selection)
        starting, start_time = _with_time_options(
            reader, starting, STARTING_OFFSETS, STARTING_TIMESTAMP, STARTING_OFFSETS_BY_TIMESTAMP
        )
        ending, end_time = _with_time_options(
            reader, ending, ENDING_OFFSETS, ENDING_TIMESTAMP, ENDING_OFFSETS_BY_TIMESTAMP
        )
        for option, raw, spec in (start_time, end_time):
            if option is not None:
                _check_spec_against_selection(option, raw, spec, selection)
        if (
            isinstance(starting, TimestampSpec)
            and isinstance(ending, TimestampSpec)
            and starting.at_ms > ending.at_ms
        ):
            raise OptionError(
                ENDING_TIMESTAMP,
                reader.raw(ENDING_TIMESTAMP),
                f"an instant at or after {STARTING_TIMESTAMP} ({reader.raw(STARTING_TIMESTAMP)})",
                reason="the read would end before it starts",
            )
        strategy = reader.choice(
            STARTING_TIMESTAMP_STRATEGY, STRATEGY_ERROR, (STRATEGY_ERROR, STRATEGY_LATEST)
        )
        if reader.has(STARTING_TIMESTAMP_STRATEGY) and start_time[0] is None:
            raise OptionError(
                STARTING_TIMESTAMP_STRATEGY,
                reader.raw(STARTING_TIMESTAMP_STRATEGY),
                f"this option together with {STARTING_TIMESTAMP} or {STARTING_OFFSETS_BY_TIMESTAMP}",
                reason="no starting instant is set, so it would be ignored",
            )

        max_messages = reader.integer(MAX_MESSAGES_PER_TRIGGER, 0, minimum=1, maximum=MAX_INT)
        max_bytes = reader.byte_size(MAX_BYTES_PER_TRIGGER, None)
        min_messages, min_bytes, max_delay_ms = _parse_minimum(reader, max_messages, max_bytes)
        min_partitions = reader.integer(MIN_PARTITIONS, 0, minimum=1, maximum=100_000)
        per_partition_messages = reader.integer(
            MAX_MESSAGES_PER_PARTITION, 0, minimum=1, maximum=MAX_INT
        )
        per_partition_bytes = reader.byte_size(
            MAX_BYTES_PER_PARTITION, DEFAULT_MAX_BYTES_PER_PARTITION, minimum=1024
        )

        pin_prefix_raw = reader.string(
            PIN_PREFIX, DEFAULT_PIN_PREFIX, accepted="a stream path prefix"
        )
        try:
            pin_prefix = normalize_path(pin_prefix_raw or DEFAULT_PIN_PREFIX)
        except ValueError as exc:
            raise OptionError(
                PIN_PREFIX, pin_prefix_raw, "a stream path prefix", reason=str(exc)
            ) from None
        pin_ttl_ms = reader.duration_ms(
            PIN_TTL, DEFAULT_PIN_TTL_SECONDS * 1000, minimum=60_000, maximum=365 * 86_400_000
        )
        if pin_ttl_ms % 1000:
            raise OptionError(
                PIN_TTL, reader.raw(PIN_TTL), "a whole number of seconds (e.g. 3600s, 24h)"
            )

        return cls(
            connection=connection,
            selection=selection,
            starting=starting,
            ending=ending,
            ending_given=raw_end is not None or end_time[0] is not None,
            starting_text=raw_start,
            ending_text=raw_end,
            starting_time_option=start_time[0],
            starting_time_text=start_time[1],
            ending_time_option=end_time[0],
            ending_time_text=end_time[1],
            timestamp_strategy=strategy,
            max_messages_per_trigger=max_messages or None,
            max_bytes_per_trigger=max_bytes,
            min_messages_per_trigger=min_messages or None,
            min_bytes_per_trigger=min_bytes,
            max_trigger_delay_ms=max_delay_ms,
            fail_on_data_loss=reader.boolean(FAIL_ON_DATA_LOSS, True),
            min_partitions=min_partitions or None,
            max_bytes_per_partition=per_partition_bytes or DEFAULT_MAX_BYTES_PER_PARTITION,
            max_messages_per_partition=per_partition_messages or None,
            pin_prefix=pin_prefix,
            pin_ttl_seconds=pin_ttl_ms // 1000,
            figures=FiguresOptions.parse(reader),
        )


def _parse_minimum(
    reader: OptionReader, max_messages: int, max_bytes: int | None
) -> tuple[int, int | None, int]:
    """``minMessagesPerTrigger``, ``minBytesPerTrigger`` and ``maxTriggerDelay``, checked against each
    other and against the maxima."""
    min_messages = reader.integer(MIN_MESSAGES_PER_TRIGGER, 0, minimum=1, maximum=MAX_INT)
    min_bytes = reader.byte_size(MIN_BYTES_PER_TRIGGER, None)
    delay_ms = reader.duration_ms(
        MAX_TRIGGER_DELAY, DEFAULT_MAX_TRIGGER_DELAY_MS, minimum=1, maximum=7 * 86_400_000
    )
    if reader.has(MAX_TRIGGER_DELAY) and not min_messages and min_bytes is None:
        raise OptionError(
            MAX_TRIGGER_DELAY,
            reader.raw(MAX_TRIGGER_DELAY),
            f"this option together with {MIN_MESSAGES_PER_TRIGGER} or {MIN_BYTES_PER_TRIGGER}",
            reason="without a minimum no batch waits, so the delay would be ignored",
        )
    for minimum, maximum, low, high in (
        (
            min_messages or None,
            max_messages or None,
            MIN_MESSAGES_PER_TRIGGER,
            MAX_MESSAGES_PER_TRIGGER,
        ),
        (min_bytes, max_bytes, MIN_BYTES_PER_TRIGGER, MAX_BYTES_PER_TRIGGER),
    ):
        if minimum is not None and maximum is not None and minimum > maximum:
            raise OptionError(
                low,
                reader.raw(low),
                f"at most {high} ({reader.raw(high)})",
                reason="a batch could never hold the minimum",
            )
    return min_messages, min_bytes, delay_ms


def _with_time_options(
    reader: OptionReader, base: OffsetSpec, base_option: str, single: str, per_stream: str
) -> tuple[OffsetSpec, tuple[str | None, str | None, OffsetSpec]]:
    """``base`` with the instants of ``single`` (every stream) or ``per_stream`` (JSON) applied, and
    ``(time option, its text, the spec it made)`` for error messages (``(None, None, base)`` if neither
    is set). Combinations whose meaning would be a guess are refused."""
    single_raw, per_stream_raw = reader.raw(single), reader.raw(per_stream)
    if single_raw is not None and per_stream_raw is not None:
        raise OptionError(
            single,
            single_raw,
            f"either {single} (every stream) or {per_stream} (per stream), not both",
            reason=f"{per_stream} is set too",
        )
    if single_raw is not None:
        if reader.has(base_option):
            raise OptionError(
                single,
                single_raw,
                f"either {single} or {base_option}, not both",
                reason=(
                    f"{single} applies to every stream, so {base_option} would be ignored; use "
                    f"{per_stream} to give instants for some streams and offsets for others"
                ),
            )
        spec = parse_timestamp_spec(single, single_raw)
        assert spec is not None
        return spec, (single, single_raw, spec)
    instants = parse_timestamps_by_stream(per_stream, per_stream_raw)
    if instants is None:
        return base, (None, None, base)
    merged = with_timestamps(
        base,
        instants,
        option=per_stream,
        raw=per_stream_raw,
        base_option=base_option,
        ending=base_option == ENDING_OFFSETS,
    )
    return merged, (per_stream, per_stream_raw, merged)


def _parse_selection(reader: OptionReader) -> StreamSelection:
    streams_raw = reader.raw(STREAMS)
    pattern_raw = reader.raw(PATTERN)
    accepted = (
        f"exactly one of '{STREAMS}' (comma-separated stream paths relative to 'url') or "
        f"'{PATTERN}' (a glob: '*' one segment, '**' any number)"
    )
    if streams_raw is not None and pattern_raw is not None:
        raise OptionError(STREAMS, streams_raw, accepted, reason=f"'{PATTERN}' is set too")
    if streams_raw is None and pattern_raw is None:
        raise OptionError(STREAMS, None, accepted)
    if pattern_raw is not None:
        try:
            return StreamSelection(pattern=normalize_pattern(pattern_raw))
        except ValueError as exc:
            raise OptionError(PATTERN, pattern_raw, accepted, reason=str(exc)) from None
    assert streams_raw is not None
    paths: list[str] = []
    for item in streams_raw.split(","):
        if not item.strip():
            raise OptionError(STREAMS, streams_raw, accepted, reason="an empty entry")
        try:
            path = normalize_path(item)
        except ValueError as exc:
            raise OptionError(STREAMS, streams_raw, accepted, reason=str(exc)) from None
        if path in paths:
            raise OptionError(STREAMS, streams_raw, accepted, reason=f"{path!r} is listed twice")
        paths.append(path)
    return StreamSelection(streams=tuple(paths))


def _check_spec_against_selection(
    key: str, raw: str | None, spec: OffsetSpec, selection: StreamSelection
) -> None:
    if not isinstance(spec, SpecificSpec):
        return
    if selection.pattern is None:
        check_spec_paths(key, raw, spec, selection.streams)
        return
    outside = [path for path in spec.paths if not glob_matches(selection.pattern, path)]
    if outside:
        raise OptionError(
            key,
            raw,
            f"offsets only for streams matching the pattern {selection.pattern!r}",
            reason=f"stream(s) {', '.join(repr(p) for p in outside)} do not match it",
        )
