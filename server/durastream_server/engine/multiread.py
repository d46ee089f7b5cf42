"""Many small whole-message reads in few worker-thread trips (multi-range reads, docs/extensions.md
section 10).

A packed Spark task reads thousands of small ranges of idle streams in one request. Read one after the
other, each range cost its own trip to the read executor (a thread hand-off and two loop wake-ups,
about 0.25 ms of server CPU, far more than reading a few hundred bytes from a file the kernel has
cached). Here the loop plans up to ``GROUP`` ranges at a time (the stream, the start, the end, the
segments and the record to scan from: what ``Engine.read_messages`` decides before it reads) and one
worker-thread trip reads them in order under the answer's byte budget. The loop's work per turn stays
bounded by ``GROUP`` ranges, whatever the request holds, and the bytes of a trip by the budget.

The trip is one batch job, not a loop of single reads: the one-record ranges the budget can reach
(an idle small stream written in one append: nearly every range of a packed Spark task) are read
first, together, a file at a time (``reader.preread_records``: a pack holding thousands of packed
streams is acquired once, and records side by side in it are read with one ``pread``, each then
parsed where it lies in that buffer, not from a copy; a directory stream's file is opened for its one
``pread`` unless cached), then each range is answered in order from those bytes with the checks (each
record's checksum) and the budget of a single read.

A range the loop cannot plan alone (a fork chain, an ``end`` whose boundary check needs a header scan,
data still in the hot tail) or whose read failed in the thread is read by ``Engine.read_messages``
itself, in order, so every answer and every error is the one a single read gives.

The HTTP answer needs only each range's messages and next offset: ``read_answers`` gives those as an
``Answer`` tuple, without the ``MessagesResult`` (and stream info) that ``read_ranges`` builds. A
``format=frames`` answer (what the connector asks for) goes further, ``read_frames``: each one-record
range's messages are parsed straight into the columns of the frames body (``storage/columns.py``:
the payloads side by side, the lengths, a count, a time and a shift a record), and its next offset is
the range's own end token when it stops there, so a range costs two integers in the answer, not a
list, a run, a payload copy, an answer tuple and a minted token (docs/benchmarks.md, Run 20). The
thread's reads do not evict cached files (``FdCache.acquire(evict=False)``): 10,000 streams read once
each would otherwise push the files of busy streams out of the cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Final, NamedTuple

from durastream_server.engine.api import MessagesResult, ReadRequest
from durastream_server.errors import ProtocolError
from durastream_server.offsets import format_offset, parse_position
from durastream_server.storage.columns import MessageColumns
from durastream_server.storage.log import DiskRead, ReadChunk
from durastream_server.storage.reader import (
    Preread,
    parse_one_record,
    parse_record_into,
    preread_records,
)
from durastream_server.storage.records import MessageRun, MessageSlice

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.engine.registry import Incarnation
    from durastream_server.storage.segments import ReadView

GROUP: Final = 512  # ranges planned per loop turn and read per worker-thread trip

Range = tuple[str, str, str]  # path, offset, end
Slices = list[MessageSlice | MessageRun]


class Planned(NamedTuple):
    """A range's read as ``Engine.read_messages`` would do it, decided on the loop. A tuple: one is
    made per range (10,000 for a packed Spark task), and a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__`` in Python."""

    inc: Incarnation
    start: int
    end: str  # the end token: a range is read to its end when the read stops at it
    read: DiskRead | ReadChunk
    # The end token's position when the token is the one ``format_offset`` mints for it (checked
    # when planned): a read that stops there is answered with ``end`` itself, not a new token. -1:
    # not known, the stop is formatted.
    end_at: int = -1


class Answer(NamedTuple):
    """What a multi-range answer says of one range read (``Engine.read_range_answers``): a tuple,
    not a ``MessagesResult`` with its stream info, which costs ~5 us of the loop a range to build
    and which the HTTP answer never looks at."""

    slices: Slices
    count: int
    next_offset: str  # minted once, in the thread: both the stop test and the answer's offset
    next_position: int


_new_tuple = tuple.__new__  # a NamedTuple's own ``__new__`` is Python: ~0.3 us more a range


def new_planned(
    inc: Incarnation, start: int, end: str, read: DiskRead | ReadChunk, end_at: int
) -> Planned:
    """``Planned(inc, start, end, read, end_at)``, built without the NamedTuple's Python
    ``__new__`` (``Engine.plan_group`` makes one a range)."""
    return _new_tuple(Planned, (inc, start, end, read, end_at))


# What the thread does with one planned entry: its answer, or the ProtocolError the loop found.
_Raw = Answer | ProtocolError
_Entry = tuple[Range, Planned | ProtocolError]
Entry = _Entry  # a planned range, as ``Engine.plan_group`` gives it


class FramesRead:
    """What a multi-range ``format=frames`` answer is built from (``read_frames``): per answered
    range, in order, its message count (-1 for a failed range) and its next offset (or the
    ProtocolError that failed it), and all their messages as columns (``storage/columns.py``):
    two integers' worth a range, not an answer object, a list and a run."""

    __slots__ = ("counts", "offsets", "columns")

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.offsets: list[str | ProtocolError] = []
        self.columns = MessageColumns()

    def add(self, result: MessagesResult | ProtocolError) -> None:
        """A range read alone (``Engine.read_messages``) or failed."""
        if isinstance(result, ProtocolError):
            self.counts.append(-1)
            self.offsets.append(result)
            return
        self.columns.add(result.slices)
        self.counts.append(result.count)
        self.offsets.append(result.next_offset)


async def read_ranges(
    engine: Engine, ranges: Iterable[Range | ProtocolError], max_bytes: int, overhead: int
) -> list[MessagesResult | ProtocolError]:
    """``Engine.read_messages`` of each range in order, ``max_bytes`` shared by all (each message also
    costing ``overhead``), stopping when it is spent or a range is cut short: results for a prefix of
    ``ranges``. An entry of ``ranges`` that is already a ProtocolError is answered with it."""
    sink = _Results(engine, lean=False)
    await _read_ranges(engine, ranges, max_bytes, overhead, sink)
    return sink.results  # type: ignore[return-value]


async def read_answers(
    engine: Engine, ranges: Iterable[Range | ProtocolError], max_bytes: int, overhead: int
) -> list[Answer | ProtocolError]:
    """``read_ranges``, each read answered by its ``Answer`` alone."""
    sink = _Results(engine, lean=True)
    await _read_ranges(engine, ranges, max_bytes, overhead, sink)
    return sink.results  # type: ignore[return-value]


async def read_frames(
    engine: Engine, ranges: Iterable[Range | ProtocolError], max_bytes: int, overhead: int
) -> FramesRead:
    """``read_answers`` gathered as a ``FramesRead``: the same ranges answered, the same messages
    in the same order, the same offsets and errors, with each one-record range's messages parsed
    straight into the columns of the frames body."""
    sink = _Frames()
    await _read_ranges(engine, ranges, max_bytes, overhead, sink)
    return sink.out


class _Sink:
    """Where ``_read_ranges`` puts what it reads: ``read`` reads a planned group (in a worker
    thread, or on the loop when no range touches a file), ``settle`` takes its answers on the
    loop, ``alone`` takes a range read alone."""

    def read(self, group: Sequence[_Entry], budget: int, overhead: int) -> tuple[int, int, bool]:
        """The reads of a prefix of ``group`` under ``budget`` (``_read_planned``): how many, the
        budget left and whether reading must stop."""
        raise NotImplementedError

    def settle(self, group: Sequence[_Entry], done: int) -> None:
        """On the loop, after ``read``."""

    def alone(self, result: MessagesResult | ProtocolError) -> None:
        raise NotImplementedError


class _Results(_Sink):
    """A result a range: ``MessagesResult`` (or its ``Answer`` alone, ``lean``) or the error."""

    def __init__(self, engine: Engine, *, lean: bool) -> None:
        self.engine = engine
        self.lean = lean
        self.results: list[MessagesResult | Answer | ProtocolError] = []
        self._raws: list[_Raw] = []

    def read(self, group: Sequence[_Entry], budget: int, overhead: int) -> tuple[int, int, bool]:
        raws, budget, stopped = _read_planned(group, budget, overhead)
        self._raws = raws
        return len(raws), budget, stopped

    def settle(self, group: Sequence[_Entry], done: int) -> None:
        raws, self._raws = self._raws, []
        if self.lean:
            self.results.extend(raws)
        else:
            engine = self.engine
            self.results.extend(
                _result(engine, entry, raw) for entry, raw in zip(group, raws, strict=False)
            )

    def alone(self, result: MessagesResult | ProtocolError) -> None:
        self.results.append(_lean(result) if self.lean else result)


class _Frames(_Sink):
    def __init__(self) -> None:
        self.out = FramesRead()

    def read(self, group: Sequence[_Entry], budget: int, overhead: int) -> tuple[int, int, bool]:
        return _read_planned_frames(group, budget, overhead, self.out)

    def alone(self, result: MessagesResult | ProtocolError) -> None:
        self.out.add(result)


async def _read_ranges(
    engine: Engine,
    ranges: Iterable[Range | ProtocolError],
    max_bytes: int,
    overhead: int,
    sink: _Sink,
) -> None:
    budget = max_bytes
    items = iter(ranges)
    while budget > 0:
        group, alone, more = _plan(engine, items)
        while group and budget > 0:
            done, budget, stopped = await _read_group(engine, sink, group, budget, overhead)
            sink.settle(group, done)
            if stopped:
                return
            if done == len(group):
                break
            # The thread's read of this one failed: read it alone for the answer a single read gets.
            result, budget, stopped = await _read_alone(engine, group[done][0], budget, overhead)
            sink.alone(result)
            if stopped:
                return
            group = group[done + 1 :]
        if alone is not None and budget > 0:
            result, budget, stopped = await _read_alone(engine, alone, budget, overhead)
            sink.alone(result)
            if stopped:
                return
        if not more:
            break


def _plan(
    engine: Engine, items: Iterator[Range | ProtocolError]
) -> tuple[list[_Entry], Range | None, bool]:
    """Plan the next ranges, at most ``GROUP``, in one pass (``Engine.plan_group``): the planned
    ones, the range after them that must be read alone (or None), and whether ``items`` may hold
    more."""
    return engine.plan_group(items, GROUP)


async def _read_group(
    engine: Engine, sink: _Sink, group: Sequence[_Entry], budget: int, overhead: int
) -> tuple[int, int, bool]:
    """``sink.read`` of ``group`` in one worker-thread trip (on the loop if none touches a file)."""
    if any(type(planned) is Planned and type(planned.read) is DiskRead for _, planned in group):
        return await asyncio.get_running_loop().run_in_executor(
            engine.read_executor, sink.read, group, budget, overhead
        )
    read = sink.read(group, budget, overhead)
    await asyncio.sleep(0)  # one group per loop turn, even when nothing needs a thread
    return read


def _read_planned(
    group: Sequence[_Entry], budget: int, overhead: int
) -> tuple[list[_Raw], int, bool]:
    """Read ``group`` in order under ``budget`` (blocking). Returns the raw results of a prefix, the
    budget left and whether reading must stop (spent, or a range cut short). A prefix shorter than
    ``group`` without a stop means the next entry's read raised: the caller reads it alone.

    One job for the whole group: the one-record reads the budget can reach (an idle small stream's
    range, nearly every range of a packed Spark task) are read first, together, a file at a time
    and neighbours in one ``pread`` (``reader.preread_records``); then each range is answered in
    order from those bytes, exactly as ``DiskRead.run`` answers it (the same checks, the same
    fallback to ``read_range``, the same budget)."""
    prefetched = _preread(group, budget)
    raws: list[_Raw] = []
    append = raws.append
    for (_, planned), buf in zip(group, prefetched, strict=True):
        if budget <= 0:
            return raws, budget, True
        if type(planned) is not Planned:
            append(planned)  # type: ignore[arg-type]
            continue
        read = planned.read
        if type(read) is ReadChunk:
            slices: Slices = []
            next_position = read.next_position
            count = 0
            cost = 1
        else:
            try:
                lean = (
                    None
                    if buf is None
                    else parse_one_record(
                        buf[0],
                        read.scan_from,
                        read.start,
                        read.cap,
                        budget,
                        overhead,
                        buf[1],
                        buf[2],
                    )
                )
                if lean is None:
                    # Many files, each read once: they do not evict the cached files of busy streams.
                    slices, next_position, count = read.run(
                        budget, True, True, overhead, evict=False
                    )
                    cost = spent(slices, count, overhead)
                else:
                    slices, next_position, count = lean
                    cost = next_position - read.start + overhead * count
            except Exception:  # noqa: BLE001 - the single read raises the right error
                return raws, budget, False
        next_offset = format_offset(next_position)
        append(_new_tuple(Answer, (slices, count, next_offset, next_position)))
        budget -= cost
        if next_offset != planned.end:
            return raws, budget, True
    return raws, budget, False


def _read_planned_frames(
    group: Sequence[_Entry], budget: int, overhead: int, out: FramesRead
) -> tuple[int, int, bool]:
    """``_read_planned`` into ``out`` (blocking): the same reads, checks, budget and stops, with
    each one-record range's messages parsed straight into ``out.columns``
    (``reader.parse_record_into``) and its next offset the range's own end token where it stops
    there (``Planned.end_at``). Returns how many entries of ``group`` it answered, the budget left
    and whether reading must stop; fewer than ``group`` without a stop: the next one's read raised
    (the caller reads it alone)."""
    prefetched = _preread(group, budget)
    columns = out.columns
    counts = out.counts
    offsets = out.offsets
    done = 0
    for (_, planned), buf in zip(group, prefetched, strict=True):
        if budget <= 0:
            return done, budget, True
        if type(planned) is not Planned:
            counts.append(-1)
            offsets.append(planned)  # type: ignore[arg-type]
            done += 1
            continue
        read = planned.read
        if type(read) is ReadChunk:
            count = 0
            next_position = read.next_position
            cost = 1
        else:
            try:
                count = (
                    0
                    if buf is None
                    else parse_record_into(
                        columns, buf, read.scan_from, read.start, read.cap, budget, overhead
                    )
                )
                if count:
                    next_position = read.cap
                    cost = next_position - read.start + overhead * count
                else:
                    # Many files, each read once: they do not evict the cached files of busy streams.
                    slices, next_position, count = read.run(
                        budget, True, True, overhead, evict=False
                    )
                    columns.add(slices)
                    cost = spent(slices, count, overhead)
            except Exception:  # noqa: BLE001 - the single read raises the right error
                return done, budget, False
        next_offset = (
            planned.end if next_position == planned.end_at else format_offset(next_position)
        )
        counts.append(count)
        offsets.append(next_offset)
        done += 1
        budget -= cost
        if next_offset != planned.end:
            return done, budget, True
    return done, budget, False


def _preread(group: Sequence[_Entry], budget: int) -> list[Preread | None]:
    """The one-record bytes of the disk reads of ``group`` that ``budget`` can reach, aligned with
    ``group`` (None where there is none): each range costs at least its bytes, so reads past those
    that spend the budget are not read ahead."""
    indexes: list[int] = []
    reads: list[tuple[ReadView, int]] = []
    cache = None
    index = -1
    for _, planned in group:
        index += 1
        if budget <= 0:
            break
        if type(planned) is not Planned:
            continue
        read = planned.read
        if type(read) is not DiskRead:
            continue
        indexes.append(index)
        reads.append((read.segments, read.scan_from))
        cache = read.cache
        budget -= read.cap - read.start
    if cache is None:
        return [None] * len(group)
    got = preread_records(reads, cache)
    if len(indexes) == len(group):  # every range a disk read (the common group): aligned already
        return got
    out: list[Preread | None] = [None] * len(group)
    for index, buf in zip(indexes, got, strict=True):
        out[index] = buf
    return out


def _result(engine: Engine, entry: _Entry, raw: _Raw) -> MessagesResult | ProtocolError:
    if isinstance(raw, ProtocolError):
        return raw
    planned = entry[1]
    assert type(planned) is Planned
    slices, count, next_offset, next_position = raw
    return engine.messages_result(
        planned.inc, planned.start, slices, next_position, count, next_offset
    )


def _lean(result: MessagesResult | ProtocolError) -> Answer | ProtocolError:
    if isinstance(result, ProtocolError):
        return result
    next_offset = result.next_offset
    return Answer(list(result.slices), result.count, next_offset, parse_position(next_offset))


async def _read_alone(
    engine: Engine, item: Range, budget: int, overhead: int
) -> tuple[MessagesResult | ProtocolError, int, bool]:
    path, offset, end = item
    try:
        result = await engine.read_messages(
            ReadRequest(path=path, offset=offset, max_bytes=budget, end_offset=end),
            overhead=overhead,
        )
    except ProtocolError as exc:
        return exc, budget, False
    budget -= spent(result.slices, result.count, overhead)
    return result, budget, result.next_offset != end


def spent(slices: Sequence[MessageSlice | MessageRun], count: int, overhead: int) -> int:
    """What a read's answer takes of the budget (``cost`` of its bytes)."""
    return cost(sum(map(len, map(_DATA, slices))), count, overhead)


def cost(size: int, count: int, overhead: int) -> int:
    """What ``count`` messages of ``size`` bytes take of a multi-range answer's budget: their bytes,
    ``overhead`` per message, at least 1 (an empty range still costs its turn). The rule a
    ``--workers`` server's fan-out reassembles answers by (``shards/multirange.py``)."""
    return max(size + overhead * count, 1)


_DATA: Final = attrgetter("data")  # C-level iteration: ``spent`` runs once per range read
