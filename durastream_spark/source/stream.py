"""``spark.readStream.format("durastream")``: micro-batches over exact, replayable offset ranges.

One reader instance lives in the driver's Python source process for the whole query run; Spark calls it as
follows (Spark >= 4.2):

1. ``initialOffset()``: a pure function of the options (see ``offsets.py`` for why ``latest`` stays
   symbolic here).
2. ``latestOffset(start, limit)``: one snapshot of the streams (tails, closure), then the end of the next
   batch: every stream up to its tail, or, under ``maxMessagesPerTrigger``/``maxBytesPerTrigger``, up to the
   message boundary the server's limit lookup finds for the stream's share of the budget. Under
   ``minMessagesPerTrigger``/``minBytesPerTrigger`` it returns the start unchanged (no batch) until a
   minimum waits or ``maxTriggerDelay`` has passed since the last batch (whose time the end offset
   carries). Streams that start at an instant are looked up first (``time_resolution.py``). Gone streams
   are reported through the data-loss choke point here, before Spark writes the end to its offset log.
3. ``partitions(start, end)``: a pure plan of ``[start, end)`` per stream (``planner.ranges_between``), cut
   into tasks (``partitions.py``). It does not look at the current tails at all, so a replay after a
   failure or restart reads exactly the same messages, whatever was appended since.
4. ``read(partition)`` on the executors (``scan.py``); ``commit(end)`` drops fallback pins.

``Trigger.AvailableNow``: ``prepareForTriggerAvailableNow`` records every stream's tail; later batches never
go past it, and streams created afterwards wait for the next run. Closed streams simply stop advancing (their
tail is final), so an AvailableNow run ends once every stream reached its target.

On Spark 4.0/4.1 (no admission control), ``latestOffset()`` has no arguments: it returns every stream's tail;
the per-trigger limits are refused when the query starts, and deleted streams are reported in
``partitions``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from durastream_spark import compat
from durastream_spark.boundary import spark_entry_points
from durastream_spark.errors import (
    DurastreamError,
    ExtensionNotSupported,
    OptionError,
    stream_root_hint,
)
from durastream_spark.figures import record_source
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.extensions import LIMIT_LOOKUP
from durastream_spark.source.arrow import OutputLayout
from durastream_spark.source.data_loss import DataLossReporter
from durastream_spark.source.discovery import StreamCatalog, StreamState, check_pattern_supported
from durastream_spark.source.fallback import delete_pin, pin_path
from durastream_spark.source.measure import lookups, measure
from durastream_spark.source.offset_codec import Value, encode_value
from durastream_spark.source.offsets import (
    DEFAULT_KEY,
    EARLIEST,
    LATEST,
    EarliestSpec,
    LatestSpec,
    SourceOffset,
    SpecificSpec,
    TimestampSpec,
    is_token,
    offset_after,
)
from durastream_spark.source.options import (
    STARTING_OFFSETS,
    SourceOptions,
)
from durastream_spark.source.partitions import Partitioner
from durastream_spark.source.planner import (
    LossNotice,
    RangeSize,
    StreamRange,
    TriggerMinimum,
    allocate,
    batch_due,
    plan_next_end,
    ranges_between,
)
from durastream_spark.source.progress import BatchSummary, Lag
from durastream_spark.source.scan import RangeScanner
from durastream_spark.source.time_resolution import TimeResolver
from durastream_spark.source.tracker import Refresh, Tracker, tracker_for
from durastream_spark.worker_heap import collections_held

log = logging.getLogger(__name__)

_SIZE_CACHE_LIMIT = 200_000  # range sizes kept (a batch over 10,000 streams measures 10,000)
IDLE_WAIT_SECONDS = 1.0  # see _DriverState.idle_wait: Spark waits this long for latestOffset
_PLANNED_LAG_KEPT = 16  # Spark plans the next batch before committing the last: a few ends suffice
_MISSING_NAMED = 10  # missing streams named in the start-up warning; the rest are counted


def initial_offset(options: SourceOptions) -> SourceOffset:
    """The query's first start offset: a pure function of the options (no request, no clock)."""
    spec = options.starting
    selection = options.selection
    if selection.pattern is not None:
        if isinstance(spec, LatestSpec):
            return SourceOffset((), LATEST)
        if isinstance(spec, TimestampSpec):
            return SourceOffset((), spec.value)
        if isinstance(spec, SpecificSpec):
            return SourceOffset.of(dict(spec.offsets), spec.unlisted)
        return SourceOffset()
    if isinstance(spec, EarliestSpec):
        return SourceOffset.of(dict.fromkeys(selection.streams, EARLIEST))
    if isinstance(spec, LatestSpec):
        return SourceOffset.of(dict.fromkeys(selection.streams, LATEST))
    if isinstance(spec, TimestampSpec):
        return SourceOffset.of(dict.fromkeys(selection.streams, spec.value))
    assert isinstance(spec, SpecificSpec)
    return SourceOffset.of({path: spec.value_for(path) for path in selection.streams})


@spark_entry_points
class _StreamReaderBase(DataSourceStreamReader):
    """Everything but the version-specific ``latestOffset`` signature."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        if options.ending_given:
            raise OptionError(
                options.ending_option,
                options.ending_time_text if options.ending_time_option else options.ending_text,
                f"{options.ending_option} only for batch reads (spark.read)",
                reason="a streaming query has no end; use Trigger.AvailableNow to stop at the current tails",
            )
        self.options = options
        self.layout = OutputLayout.for_schema(schema)
        self.data_loss = DataLossReporter(options.fail_on_data_loss)
        self.scanner = RangeScanner(options.connection, self.layout, self.data_loss)
        self._driver: _DriverState | None = None

    # Spark pickles the reader into the read function of every task: keep the driver's state out of it.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_driver"] = None
        return state

    @property
    def driver(self) -> _DriverState:
        if self._driver is None:
            self._driver = _DriverState(self.options, self.layout, self.data_loss)
        return self._driver

    # ---- offsets -----------------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        return initial_offset(self.options).to_dict()

    def _next_end(
        self,
        start: dict,
        max_messages: int | None,
        max_bytes: int | None,
        minimum: TriggerMinimum | None = None,
    ) -> dict:
        with collections_held():  # a snapshot of every stream: a tuple or more each, all kept
            return self.driver.next_end(
                SourceOffset.from_dict(start), max_messages, max_bytes, minimum
            ).to_dict()

    def _all_tails(self) -> dict:
        """Spark 4.0/4.1: no start offset given; every stream's tail (streams never seen start at 0)."""
        end = self.driver.all_tails()
        self.driver.remember_lag(end, Lag.of({}))  # the batch ends at the tails seen just now
        return end.to_dict()

    def reportLatestOffset(self) -> dict | None:
        latest = self.driver.latest_offset()
        return None if latest is None else latest.to_dict()

    # ---- planning and reading ---------------------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        driver = self.driver
        driver.last_batch = None
        with collections_held():  # tuples a range, all alive until the tasks are returned
            planned = list(
                driver.partitions(SourceOffset.from_dict(start), SourceOffset.from_dict(end))
            )
        figures = self.options.figures
        if figures.directory is not None and driver.last_batch is not None:
            # keyed by the batch's end offset, which Spark reports in the progress (figures.py)
            record_source(figures, end, driver.last_batch.as_dict())
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.scanner.read(partition)

    def commit(self, end: dict) -> None:
        self.driver.commit(SourceOffset.from_dict(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.stop()


class _DriverState:
    """The driver-side half of a stream reader: client, snapshots, AvailableNow target, caches, pins."""

    def __init__(
        self, options: SourceOptions, layout: OutputLayout, data_loss: DataLossReporter
    ) -> None:
        self.options = options
        self.data_loss = data_loss
        self.client = StreamClient(options.connection)
        selection = options.selection
        self.catalog = StreamCatalog(
            self.client,
            streams=selection.streams,
            pattern=selection.pattern,
            exclude_prefix=options.pin_prefix,
        )
        self.partitioner = Partitioner(options, self.client, layout, data_loss)
        self.times = TimeResolver(options, self.client)
        self.target: dict[str, str] | None = None
        self._tracker: Tracker | None = None
        # Every selected stream's tail, as offsets and in stored form (for reportLatestOffset), kept
        # up to date from each refresh's changes; content types of every stream seen (kept after a
        # deletion, for the batch that reports it).
        self.tails: dict[str, str] = {}
        self._tails_stored: dict[str, Value] = {}
        self._latest: tuple[int, SourceOffset] | None = None
        # Tails that changed since ``_latest`` was built (``None``: rebuild it from every tail).
        self._latest_changes: dict[str, str | None] | None = None
        self.content_types: dict[str, str] = {}
        self.finished: dict[str, str] = {}  # streams seen closed -> final offset
        # The last end this reader returned, the streams it did not take to their tails (limits), and
        # whether it found nothing new (then the next trigger waits on the server for a change).
        self.planned: SourceOffset | None = None
        self.unsettled: set[str] = set()
        self.idle = False
        self._initial: SourceOffset | None = None
        self.sizes: dict[tuple[str, str, str], RangeSize] = {}
        self.reported: set[tuple[str, str | None, str | None]] = set()
        self.pins: set[tuple[str, str, str]] = set()
        self.started_ms = int(time.time() * 1000)
        # batch end (its positions) -> the lag measured when it was planned (progress.py)
        self.planned_lag: dict[Hashable, Lag] = {}
        self.last_batch: BatchSummary | None = None
        self._checked_extensions = False
        self._checked_missing = False
        self._warned_unlimited = False

    # ---- capabilities -----------------------------------------------------------------------------------

    def check_capabilities(self) -> None:
        """Refuse, at query start, what this server cannot do (named by option)."""
        if self._checked_extensions:
            return
        if self.options.selection.pattern is not None:
            check_pattern_supported(self.client, self.options.selection.pattern)
        self.times.check_supported()
        self._checked_extensions = True

    # ---- snapshots --------------------------------------------------------------------------------------

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = tracker_for(self.catalog)
        return self._tracker

    @property
    def initial(self) -> SourceOffset:
        if self._initial is None:
            self._initial = initial_offset(self.options)
        return self._initial

    def refresh(self, wait_s: float = 0.0) -> Refresh:
        """Bring every stream's state up to date (``tracker.py``); only what changed is looked at."""
        self.check_capabilities()
        refresh = self.tracker.refresh(wait_s)
        states = self.tracker.states
        if not self._checked_missing:
            self._checked_missing = True
            self.warn_missing(states)
        if refresh.changed is None:
            self.snapshot_states(states)
            return refresh
        for path in refresh.changed:
            state = states.get(path)
            if state is None:
                self.tails.pop(path, None)
                self._tails_stored.pop(path, None)
                self.note_latest(path, None)
                continue
            self.note_latest(path, state.tail)
            self.tails[path] = state.tail
            self._tails_stored[path] = encode_value(state.tail)
            self.content_types[path] = state.content_type
            if state.closed:
                self.finished[path] = state.tail
            else:
                self.finished.pop(path, None)
        return refresh

    def snapshot_states(self, states: Mapping[str, StreamState]) -> None:
        """A full snapshot: every stream's state taken over in one pass (a first trigger over 100,000
        streams spent ~1.5 s encoding each tail three times over two passes)."""
        tails: dict[str, str] = {}
        stored: dict[str, Value] = {}
        content_types = self.content_types
        finished = self.finished
        for path, state in states.items():
            tail = state.tail
            tails[path] = tail
            stored[path] = encode_value(tail)
            content_types[path] = state.content_type
            if state.closed:
                finished[path] = tail
            elif path in finished:
                del finished[path]
        self.tails = tails
        self._tails_stored = stored
        self._latest_changes = None

    def snapshot(self) -> dict[str, StreamState]:
        self.refresh()
        return self.tracker.states

    def latest_offset(self) -> SourceOffset | None:
        """Every stream's tail as last seen (``reportLatestOffset``), rebuilt only after a change."""
        if self._tracker is None:
            return None
        version = self._tracker.version
        if self._latest is None or self._latest[0] != version:
            changes = self._latest_changes
            if self._latest is None or changes is None:
                latest = SourceOffset._stored(dict(self._tails_stored))
            else:  # only the tails that moved are encoded again for the offset's text
                latest = self._latest[1].updated(changes)
            self._latest = (version, latest)
            self._latest_changes = {}
        return self._latest[1]

    def note_latest(self, path: str, tail: str | None) -> None:
        if self._latest_changes is not None:
            self._latest_changes[path] = tail

    def all_tails(self) -> SourceOffset:
        """Spark 4.0/4.1 (``latestOffset()`` without a start): every stream's tail. When the last call
        found nothing new, the refresh waits on the server for a change first."""
        before = self._tracker.version if self._tracker is not None else -1
        self.refresh(IDLE_WAIT_SECONDS if self.idle else 0.0)
        latest = self.latest_offset()
        assert latest is not None
        self.idle = self.tracker.version == before
        return latest

    def warn_missing(self, states: dict[str, StreamState]) -> None:
        """Once per query run: name the listed streams that do not exist (yet). Not an error, as in
        Kafka: a stream created later is read from its beginning; but a typo would read nothing, forever."""
        missing = [path for path in self.options.selection.streams if path not in states]
        if not missing:
            return
        url = self.options.connection.url
        shown = ", ".join(repr(path) for path in missing[:_MISSING_NAMED])
        if len(missing) > _MISSING_NAMED:
            shown += f" and {len(missing) - _MISSING_NAMED} more"
        fix = stream_root_hint(url) or "check the names if that is not expected"
        log.warning(
            "Stream(s) %s (option 'streams') do not exist under %s: the query reads each one from its "
            "beginning once it is created; %s.",
            shown,
            url,
            fix,
        )

    def prepare_available_now(self) -> None:
        self.refresh()
        self.target = dict(self.tails)
        self.planned = None  # the target caps every stream: plan the next batch in full
        shown = (
            self.target if len(self.target) <= 20 else f"their tails ({len(self.target)} streams)"
        )
        log.info("Trigger.AvailableNow: reading %d stream(s) up to %s", len(self.target), shown)

    # ---- ends -------------------------------------------------------------------------------------------

    def next_end(
        self,
        start: SourceOffset,
        max_messages: int | None,
        max_bytes: int | None,
        minimum: TriggerMinimum | None = None,
    ) -> SourceOffset:
        """The end of the next batch, or ``start`` itself (no new data for Spark) when ``minimum`` says
        the trigger waits. ``Trigger.AvailableNow`` ignores the minimum: its run must end.

        When ``start`` is the end this reader returned last, only the streams that changed since (and
        those a limit held back) are planned; the rest keep their start, at no cost per stream. When the
        last trigger found nothing new, the refresh waits on the server (up to ``IDLE_WAIT_SECONDS``)
        for a selected stream to change, so an idle query neither polls nor answers late."""
        continuing = self.planned is not None and start.same_positions(self.planned)
        refresh = self.refresh(self.idle_wait(start, minimum) if continuing else 0.0)
        tails: Mapping[str, str] = self.tails
        resolved = start
        if self.times.resolves_starts:
            resolved, gone = self.times.resolve_starts(
                start, tails, apply_strategy=True, on_loss=self.report_loss
            )
            if gone:
                tails = {path: tail for path, tail in tails.items() if path not in gone}
        paths: set[str] | None = None
        if continuing and refresh.changed is not None and resolved is start:
            paths = set(refresh.changed) | self.unsettled
        plan = plan_next_end(resolved, tails, self.target, self.finished, paths)
        self.check_starting_offsets(start, plan.losses)
        for loss in plan.losses:
            self.report(loss)
        waits = minimum is not None and self.target is None
        limited = max_messages is not None or max_bytes is not None
        if (waits or limited) and not self.client.extensions().limit_lookup:
            waits = limited = self.without_limit_lookup()
        lags = self.measure(plan.pending) if plan.pending and (waits or limited) else None
        now_ms = int(time.time() * 1000)
        if waits and not batch_due(lags or {}, minimum, self.last_batch_ms(start), now_ms):
            log.debug("below %s: waiting for more data or maxTriggerDelay", minimum)
            self.unsettled = self.unsettled | {item.stream for item in plan.pending}
            return self.planned_end(start, start)  # Spark sees no new data and asks again
        ends = dict(plan.fixed)
        behind: dict[
            str, RangeSize
        ] = {}  # stays empty without a limit: every stream read to its tail
        pending = [item for item in plan.pending if lags is None or item.stream in lags]
        if pending and lags is not None and limited:
            ends.update(self.admit(pending, lags, max_messages, max_bytes, behind))
        else:
            ends.update({item.stream: item.end for item in pending})
        if paths is None:
            end = SourceOffset.of(ends)
        else:
            end = start.updated({path: ends.get(path) for path in paths})
        self.unsettled = {item.stream for item in pending if ends.get(item.stream) != item.end}
        self.remember_lag(end, Lag.of(behind))
        if minimum is None or end.same_positions(start):
            return self.planned_end(start, end)
        return self.planned_end(start, end.with_batch_ms(now_ms))

    def planned_end(self, start: SourceOffset, end: SourceOffset) -> SourceOffset:
        """Remember what this trigger returned: the next one continues from it, and waits if it is
        ``start`` again (nothing new)."""
        if end.same_positions(start):
            end = start
        self.planned = end
        self.idle = end is start
        return end

    def idle_wait(self, start: SourceOffset, minimum: TriggerMinimum | None) -> float:
        """How long the refresh may wait on the server for a change: nothing after a trigger that found
        data, nothing under ``Trigger.AvailableNow`` (its run must end), never past ``maxTriggerDelay``
        (a batch may be due without new data)."""
        if not self.idle or self.target is not None:
            return 0.0
        wait = IDLE_WAIT_SECONDS
        last = self.last_batch_ms(start) if minimum is not None else None
        if minimum is not None and last is not None:
            due_in = (last + minimum.max_delay_ms - time.time() * 1000) / 1000
            wait = min(wait, max(0.0, due_in))
        return wait

    def without_limit_lookup(self) -> bool:
        """The per-trigger options on a server without limit lookups (nothing can count what waits or
        find where a limited batch ends). ``Trigger.AvailableNow`` reads up to its target in one batch
        instead (it must end, and that is what Spark 4.0/4.1 do with it); any other trigger is refused.
        Returns False: no limit is applied."""
        option = self.options.trigger_limit_options()[0][0]
        if self.target is None:
            raise ExtensionNotSupported(
                LIMIT_LOOKUP,
                self.options.connection.url,
                f"honour option '{option}' (counting what waits in each stream and finding the "
                "message boundary that ends a limited batch need it); remove the option to read "
                "everything available per trigger, or use Trigger.AvailableNow",
            )
        if not self._warned_unlimited:
            log.warning(
                "%s does not advertise the '%s' extension: Trigger.AvailableNow reads everything up "
                "to its target in one batch, without option '%s'",
                self.options.connection.url,
                LIMIT_LOOKUP,
                option,
            )
            self._warned_unlimited = True
        return False

    def last_batch_ms(self, start: SourceOffset) -> int | None:
        """When the batch that ended at ``start`` was planned: from the offset (so it survives restarts);
        None for a new query; this run's start for a checkpoint written without batch times."""
        if start.batch_ms is not None:
            return start.batch_ms
        if start == self.initial:
            return None
        return self.started_ms

    def check_starting_offsets(self, start: SourceOffset, losses: list[LossNotice]) -> None:
        """Nothing was read yet: an offset the stream does not have is a wrong option, not a loss."""
        if losses and start == self.initial:
            loss = losses[0]
            raise OptionError(
                STARTING_OFFSETS,
                self.options.starting_text,
                "offsets the server returned for existing streams, at or before their tails",
                reason=f"stream {loss.stream!r} at {loss.start}: "
                + (f"its tail is {loss.end}" if loss.end else "the stream does not exist"),
            )

    def measure(self, pending: list[StreamRange]) -> dict[str, RangeSize]:
        """Each pending range's messages and bytes (``measure.py``: one request per 10,000 ranges on
        durastream-server); unreadable ranges are reported as lost and left out."""
        lags = measure(
            self.client,
            pending,
            self.sizes,
            lambda item, error: self.report(
                LossNotice(item.stream, item.start, item.end, f"not readable: {error}")
            ),
        )
        self.trim_sizes()
        return lags

    def admit(
        self,
        pending: list[StreamRange],
        lags: dict[str, RangeSize],
        max_messages: int | None,
        max_bytes: int | None,
        behind: dict[str, RangeSize] | None = None,
    ) -> dict[str, str]:
        """Ends of ``pending`` ranges within the per-trigger budget, shared in proportion to lag.
        ``behind`` receives what each stream has left after its share (the lag after the batch)."""
        behind = {} if behind is None else behind
        message_shares = allocate({p: s.messages for p, s in lags.items()}, max_messages)
        byte_shares = allocate({p: s.bytes for p, s in lags.items()}, max_bytes)
        ends: dict[str, str] = {}
        cut: list[StreamRange] = []
        limits: list[tuple[int | None, int | None]] = []
        for item in pending:
            lag = lags.get(item.stream)
            if lag is None:
                continue
            messages, size = message_shares[item.stream], byte_shares[item.stream]
            if messages >= lag.messages and size >= lag.bytes:
                ends[item.stream] = item.end
                self.remember_size(item, lag)
                continue
            if messages == 0 or size == 0:
                # No share this trigger; an EARLIEST start stays "nothing read yet".
                ends[item.stream] = item.start
                behind[item.stream] = lag
                continue
            cut.append(item)
            limits.append(
                (
                    messages if max_messages is not None else None,
                    size if max_bytes is not None else None,
                )
            )
        for item, found in zip(cut, lookups(self.client, cut, limits), strict=True):
            if isinstance(found, Exception):
                raise found
            lag = lags[item.stream]
            ends[item.stream] = found.end
            behind[item.stream] = RangeSize(lag.messages - found.messages, lag.bytes - found.bytes)
            self.remember_size(
                StreamRange(item.stream, item.start, found.end),
                RangeSize(found.messages, found.bytes),
            )
        return ends

    def remember_lag(self, end: SourceOffset, lag: Lag) -> None:
        if len(self.planned_lag) >= _PLANNED_LAG_KEPT:
            self.planned_lag.pop(next(iter(self.planned_lag)))
        self.planned_lag[end.positions_key] = lag

    def remember_size(self, item: StreamRange, size: RangeSize) -> None:
        self.trim_sizes()
        self.sizes[(item.stream, item.start, item.end)] = size

    def trim_sizes(self) -> None:
        if len(self.sizes) > _SIZE_CACHE_LIMIT:
            self.sizes.clear()

    # ---- partitions, commits ----------------------------------------------------------------------------

    def partitions(self, start: SourceOffset, end: SourceOffset) -> list:
        planning_started = time.perf_counter()
        self.check_capabilities()
        initial = start
        if self.times.resolves_starts:
            # Starts at an instant, bounded by this batch's end: a replay finds the same message. The
            # strategy was applied when the end was planned, except on Spark 4.0/4.1 (no start offset).
            start, _ = self.times.resolve_starts(
                start,
                end.as_dict(),
                apply_strategy=not compat.HAS_ADMISSION_CONTROL,
                on_loss=self.report_loss,
            )
        ranges, losses = ranges_between(start, end)
        for path in sorted(start.raw.keys() - end.raw.keys()):
            value = start.start_of(path)
            if is_token(value) and self.finished.get(path) != value:
                losses.append(
                    LossNotice(path, value, None, "the stream is gone (deleted or expired)")
                )
        # Spark 4.0/4.1 plan without a start offset (latestOffset() has none): the option is checked here.
        self.check_starting_offsets(initial, losses)
        for loss in losses:
            self.report(loss)
        if any(item.stream not in self.content_types for item in ranges):
            self.snapshot()  # after a restart: learn the content types
        planned = self.partitioner.partitions(
            ranges, self.content_types, self.sizes, on_pin=self.remember_pin
        )
        if ranges:
            behind = self.planned_lag.get(end.positions_key)
            planning_ms = (time.perf_counter() - planning_started) * 1000
            self.last_batch = BatchSummary.of(
                ranges,
                len(planned),
                self.sizes,
                behind,
                planning_ms=planning_ms,
                byte_positions=self.client.extensions().byte_positions,
            )
            log.info("%s", self.last_batch.describe())
        return planned

    def remember_pin(self, stream: str, end: str, prefix: str) -> None:
        self.pins.add((stream, end, prefix))

    def commit(self, end: SourceOffset) -> None:
        """Spark committed everything up to ``end``: pins at or before it are no longer needed."""
        done = {
            pin
            for pin in self.pins
            if (committed := end.get(pin[0])) is not None and not offset_after(pin[1], committed)
        }
        for stream, pinned_end, prefix in sorted(done):
            delete_pin(self.client, pin_path(prefix, stream, pinned_end))
        self.pins -= done
        if len(self.sizes) > _SIZE_CACHE_LIMIT // 2:
            self.sizes.clear()

    def report_loss(self, stream: str, start: str | None, end: str | None, reason: str) -> None:
        self.report(LossNotice(stream, start, end, reason))

    def report(self, loss: LossNotice) -> None:
        key = (loss.stream, loss.start, loss.end)
        if key in self.reported:
            return
        self.data_loss.report(loss.stream, loss.start, loss.end, loss.reason)
        self.reported.add(key)  # only reached when failOnDataLoss=false: warn once per range

    def stop(self) -> None:
        self.pins.clear()


if compat.HAS_ADMISSION_CONTROL:
    from durastream_spark.compat import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )

    @spark_entry_points
    class DurableStreamStreamReader(_StreamReaderBase, SupportsTriggerAvailableNow):
        """Stream reader with admission control and ``Trigger.AvailableNow`` (Spark >= 4.2)."""

        def getDefaultReadLimit(self) -> ReadLimit:
            """Spark carries one limit object and hands it back to ``latestOffset``; the source applies
            every per-trigger option itself, so any limit but ``ReadAllAvailable`` stands for all of
            them (``minBytesPerTrigger`` alone travels as ``ReadMinRows(1)``)."""
            self.driver.check_capabilities()
            options = self.options
            if options.max_messages_per_trigger is not None:
                return ReadMaxRows(options.max_messages_per_trigger)
            if options.max_bytes_per_trigger is not None:
                return ReadMaxBytes(options.max_bytes_per_trigger)
            if options.has_trigger_minimum:
                return ReadMinRows(options.min_messages_per_trigger or 1)
            return ReadAllAvailable()

        def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
            if isinstance(limit, ReadAllAvailable):  # the engine's word (Trigger.Once): no limit
                return self._next_end(start, None, None)
            options = self.options
            minimum = None
            if options.has_trigger_minimum:
                minimum = TriggerMinimum(
                    options.min_messages_per_trigger,
                    options.min_bytes_per_trigger,
                    options.max_trigger_delay_ms,
                )
            return self._next_end(
                start,
                limit.max_rows
                if isinstance(limit, ReadMaxRows)
                else options.max_messages_per_trigger,
                limit.max_bytes
                if isinstance(limit, ReadMaxBytes)
                else options.max_bytes_per_trigger,
                minimum,
            )

        def prepareForTriggerAvailableNow(self) -> None:
            self.driver.prepare_available_now()

else:  # Spark 4.0 / 4.1

    @spark_entry_points
    class DurableStreamStreamReader(_StreamReaderBase):  # type: ignore[no-redef]
        """Stream reader without admission control (Spark 4.0/4.1): every batch reads all available."""

        def __init__(self, options: SourceOptions, schema: StructType) -> None:
            limits = options.trigger_limit_options()
            if limits:
                option, value = limits[0]
                raise OptionError(
                    option,
                    value,
                    "no per-trigger limit on this Spark version",
                    reason=(
                        "admission control for Python sources needs Spark >= 4.2; remove the "
                        "option (every trigger then reads everything available) or upgrade Spark"
                    ),
                )
            super().__init__(options, schema)

        def latestOffset(self) -> dict:  # type: ignore[override]
            return self._all_tails()


@spark_entry_points
class RefusedStreamReader(DataSourceStreamReader):
    """A stream reader that could not be made: it raises the reason at Spark's first call.

    PySpark's streaming source runner calls ``reader.stop()`` in a ``finally`` around the reader's
    construction, so an error raised by ``streamReader`` (a bad option, a limit this Spark version cannot
    apply) reaches the user as ``UnboundLocalError: ... 'reader'``. Raised from ``initialOffset`` or
    ``latestOffset`` instead, it reaches them as itself.
    """

    def __init__(self, error: DurastreamError) -> None:
        self.error = error

    def initialOffset(self) -> dict:
        raise self.error

    def latestOffset(self, *args: Any) -> dict:  # (start, limit) on Spark >= 4.2, () before
        raise self.error

    def partitions(self, start: dict, end: dict) -> list:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[Any]:
        raise self.error

    def stop(self) -> None:
        pass  # nothing was opened


__all__ = ["DEFAULT_KEY", "DurableStreamStreamReader", "RefusedStreamReader", "initial_offset"]
