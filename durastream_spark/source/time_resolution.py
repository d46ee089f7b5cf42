"""Starting and ending a read at an instant: symbolic ``"timestamp <ms>"`` values become offsets.

The server's time lookup (docs/extensions.md section 7) finds the first message whose append time is at
or after an instant, in O(log n) and without reading data. Append times never go backwards along a stream,
so everything from that message on is at or after the instant.

- **Streaming** (``startingTimestamp``, ``startingOffsetsByTimestamp``): the initial offset stays
  symbolic (``offsets.py``). When the first batch is planned, each such stream starts at the message the
  lookup finds before its tail; with none, ``startingOffsetsByTimestampStrategy`` decides: ``error``
  (default) fails the query naming the stream, ``latest`` starts at the tail. Tasks are planned from
  Spark's two offsets, so ``partitions(start, end)`` looks the start up again, *bounded by the batch's
  end*: the data before the end never changes, so a replay of the batch (Spark asks ``initialOffset()``
  again after a restart) starts at the same message.
- **Batch reads** also resolve ``endingTimestamp`` / ``endingOffsetsByTimestamp``: the read ends before the
  first message at or after that instant (every stream's tail when there is none, like Kafka).

Servers without the time lookup (the Node reference server) cannot do this: the options fail when the
first batch is planned, naming the server and the missing extension, never silently read from elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from durastream_spark.errors import (
    EndBeyondTail,
    ExtensionNotSupported,
    OptionError,
    StreamGone,
    StreamNotFound,
)
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.extensions import TIME_LOOKUP
from durastream_spark.source.offsets import (
    EARLIEST,
    OffsetSpec,
    SourceOffset,
    SpecificSpec,
    TimestampSpec,
    is_token,
)
from durastream_spark.source.options import (
    STARTING_TIMESTAMP_STRATEGY,
    STRATEGY_ERROR,
    STRATEGY_LATEST,
    SourceOptions,
)
from durastream_spark.source.timestamps import describe, timestamp_of

log = logging.getLogger(__name__)

LossCallback = Callable[[str, str, str | None, str], None]
"""``(stream, start, end, reason)``: a stream that could not be looked up is gone (data loss)."""


class TimeResolver:
    """Resolves instants of one query's options with one client (driver only)."""

    def __init__(self, options: SourceOptions, client: StreamClient) -> None:
        self.options = options
        self.client = client

    def check_supported(self) -> None:
        """Refuse instants on a server without the time lookup, naming the option and the server."""
        option = self.options.starting_time_option or self.options.ending_time_option
        if option is None or self.client.extensions().time_lookup:
            return
        raise ExtensionNotSupported(
            TIME_LOOKUP,
            self.options.connection.url,
            f"find the first message at or after the instant of option '{option}' (the base protocol "
            "has no per-message times); start from offsets instead ('startingOffsets' with offsets a "
            "previous query or read returned, or 'earliest'/'latest')",
        )

    @property
    def resolves_starts(self) -> bool:
        """Whether a start can be an instant at all (only the starting-time options make one): without
        them ``resolve_starts`` has nothing to do, and its pass over every stream is skipped."""
        return self.options.starting_time_option is not None

    # ---- streaming ----------------------------------------------------------------------------------

    def resolve_starts(
        self,
        start: SourceOffset,
        ends: Mapping[str, str],
        *,
        apply_strategy: bool,
        on_loss: LossCallback,
    ) -> tuple[SourceOffset, set[str]]:
        """``start`` with each stream of ``ends`` that starts at an instant resolved to an offset at or
        before its end (the end itself when no message in between is late enough). Returns the
        resolved offset and the streams that could not be looked up (gone: reported through
        ``on_loss``). ``apply_strategy``: with no such message, ``error`` fails the query."""
        positions = start.as_dict()
        gone: set[str] = set()
        for path, end in ends.items():
            value = start.start_of(path)
            at_ms = timestamp_of(value)
            if at_ms is None or not is_token(end):
                continue
            try:
                found = self.client.lookup_time(path, at_ms, end=end)
            except (StreamNotFound, StreamGone, EndBeyondTail) as error:
                on_loss(path, value, end, f"the stream cannot be looked up: {error}")
                gone.add(path)
                continue
            if not found.found and apply_strategy:
                self._no_message(path, at_ms)
            positions[path] = found.offset
        default = EARLIEST if timestamp_of(start.default) is not None else start.default
        return SourceOffset.of(positions, default), gone

    # ---- batch reads --------------------------------------------------------------------------------

    def concrete(self, spec: OffsetSpec, tails: Mapping[str, str], *, ending: bool) -> OffsetSpec:
        """``spec`` with every instant replaced by the offset it names in each stream of ``tails``."""
        if isinstance(spec, TimestampSpec):
            values = dict.fromkeys(tails, spec.value)
            unlisted = spec.value
        elif isinstance(spec, SpecificSpec):
            values = {path: spec.value_for(path) for path in tails}
            unlisted = spec.unlisted
        else:
            return spec
        resolved: dict[str, str] = {}
        for path, value in values.items():
            at_ms = timestamp_of(value)
            if at_ms is None:
                resolved[path] = value
                continue
            found = self.client.lookup_time(path, at_ms)
            if not found.found and not ending:
                self._no_message(path, at_ms)
            resolved[path] = found.offset  # the tail when there is none (ending, or "latest")
        if timestamp_of(unlisted) is not None:
            unlisted = EARLIEST
        return SpecificSpec(tuple(sorted(resolved.items())), unlisted=unlisted)

    def _no_message(self, path: str, at_ms: int) -> None:
        if self.options.timestamp_strategy == STRATEGY_LATEST:
            log.info(
                "stream %r has no message at or after %s: starting at its tail (%s=%s)",
                path,
                describe(at_ms),
                STARTING_TIMESTAMP_STRATEGY,
                STRATEGY_LATEST,
            )
            return
        assert self.options.timestamp_strategy == STRATEGY_ERROR
        raise OptionError(
            self.options.starting_time_option or STARTING_TIMESTAMP_STRATEGY,
            self.options.starting_time_text,
            "an instant at or before the last message of every stream read",
            reason=(
                f"stream {path!r} has no message at or after {describe(at_ms)}; set "
                f"{STARTING_TIMESTAMP_STRATEGY}=latest to start such a stream at its tail instead"
            ),
        )
