"""What one micro-batch reads, and how far the query is behind the streams' tails, in messages and bytes.

Spark's Python data source API (through 4.3) has no custom source metrics, so the query progress cannot
carry Kafka's ``offsetsBehindLatest``; it shows only offsets (``endOffset`` and, via ``reportLatestOffset``,
``latestOffset``). The driver already measures what it needs while planning: ``latestOffset`` takes the
streams' tails, and under a per-trigger limit the server's limit lookups count the messages and bytes from
each stream's position to its tail; task splitting counts each range of the batch (on durastream-server
it sizes ranges by their offsets' byte positions: bytes only, messages not counted). ``BatchSummary`` puts
those figures together for one batch, and the source logs it as one INFO line from the driver.

To ask at any time, from the driver, a notebook or a ``StreamingQueryListener``: ``behind_latest`` takes a
source's progress (``query.lastProgress["sources"][0]``) and measures, with one limit lookup per stream
that is behind, the messages and bytes between the last batch's ``endOffset`` and its ``latestOffset``.

"Behind" in the log line means what Kafka's metric means: measured when the batch was planned, between the batch's end and
the tails seen then (under ``Trigger.AvailableNow``, the run's target). Without a per-trigger limit every
stream is read to its tail, so it is 0 by construction. Figures the planner did not measure (a replayed
batch after a restart, a server without limit lookups) are ``None``, never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.source.measure import position_bytes
from durastream_spark.source.offsets import EARLIEST, SourceOffset, is_token, offset_after
from durastream_spark.source.planner import RangeSize, StreamRange


@dataclass(frozen=True)
class Lag:
    """Messages and payload bytes between a batch's end and the tails, and how many streams have any."""

    messages: int
    bytes: int
    streams: int

    @classmethod
    def of(cls, behind: Mapping[str, RangeSize]) -> Lag:
        lagging = [size for size in behind.values() if size.messages > 0]
        return cls(
            sum(size.messages for size in lagging),
            sum(size.bytes for size in lagging),
            len(lagging),
        )


@dataclass(frozen=True)
class BatchSummary:
    """One micro-batch as the driver planned it. ``messages``/``bytes``: ``None`` when not measured."""

    streams: int
    tasks: int
    messages: int | None
    bytes: int | None
    behind: Lag | None
    planning_ms: float | None = None  # the driver's planning of the batch's ranges and tasks

    @classmethod
    def of(
        cls,
        ranges: Iterable[StreamRange],
        tasks: int,
        sizes: Mapping[tuple[str, str, str], RangeSize],
        behind: Lag | None,
        *,
        planning_ms: float | None = None,
        byte_positions: bool = False,
    ) -> BatchSummary:
        """``byte_positions``: the server advertises it, so bytes not measured come from the offsets
        (``measure.position_bytes``); messages are then counted only where a lookup measured them."""
        listed = list(ranges)
        measured = [sizes.get((r.stream, r.start, r.end)) for r in listed]
        known = all(size is not None for size in measured)
        messages = sum(s.messages for s in measured if s is not None) if known else None
        size_bytes = sum(s.bytes for s in measured if s is not None) if known else None
        if not known and byte_positions:
            found, unknown = position_bytes(listed)
            size_bytes = None if unknown else sum(found.values())
        return cls(
            streams=len(listed),
            tasks=tasks,
            messages=messages,
            bytes=size_bytes,
            behind=behind,
            planning_ms=None if planning_ms is None else round(planning_ms, 3),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.messages is not None:
            read = f"{self.messages} messages, {self.bytes} bytes"
        elif self.bytes is not None:
            read = f"{self.bytes} bytes (messages not counted: sized by byte positions)"
        else:
            read = "sizes not measured (no limit lookups)"
        if self.behind is None:
            lag = "lag not measured (a replayed batch)"
        else:
            lag = (
                f"behind the tails after it: {self.behind.messages} messages, "
                f"{self.behind.bytes} bytes in {self.behind.streams} stream(s)"
            )
        planned = "" if self.planning_ms is None else f", planned in {self.planning_ms:.1f} ms"
        return (
            f"batch reads {self.streams} stream(s), {read}, in {self.tasks} task(s){planned}; {lag}"
        )


def behind_latest(source_progress: Any, options: Mapping[str, str]) -> Lag:
    """Messages and bytes from a query's last batch end (``endOffset``) to the tails Spark last asked for
    (``latestOffset``, reported by the source on Spark >= 4.2), per the server's limit lookups.

    ``source_progress``: one entry of a progress's ``sources`` (``query.lastProgress["sources"][0]``, or
    ``event.progress.sources[0]`` in a ``StreamingQueryListener``). ``options``: the connection options of
    the query (``url``, and ``tokenFile``/``header.*`` where the server needs them). Costs one request per
    stream that is behind.
    """
    end = SourceOffset.from_dict(_offset_document(source_progress, "endOffset"))
    latest = SourceOffset.from_dict(_offset_document(source_progress, "latestOffset"))
    client = StreamClient(ConnectionOptions.parse(options))
    behind: dict[str, RangeSize] = {}
    for path, tail in latest.positions:
        start = end.start_of(path)
        if not is_token(tail) or not (start == EARLIEST or offset_after(tail, start)):
            continue
        found = client.lookup_limit(path, start, end=tail)
        behind[path] = RangeSize(found.messages, found.bytes)
    return Lag.of(behind)


def _offset_document(source_progress: Any, field: str) -> Any:
    value = (
        source_progress.get(field)
        if isinstance(source_progress, Mapping)
        else getattr(source_progress, field, None)
    )
    if value is None:
        raise ValueError(
            f"the source progress has no {field}: lag needs Spark >= 4.2 (latestOffset) and a query "
            "that ran at least one batch"
        )
    return json.loads(value) if isinstance(value, str) else value
