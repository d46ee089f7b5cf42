"""Producer state over time: quiet producers are compacted, idle ones forgotten, and what a stream keeps
of forgotten ones (one epoch per group) is dropped in the end too. docs/decisions/0005-producer-state.md
has the reasoning; the wire contract is docs/extensions.md, sections 6 and 7.

Every decision is a function of the log and the clock: a producer's ``last_ms`` is the timestamp of the
last entry it wrote, which recovery folds back exactly. So whenever the sweep runs, and whatever a restart
brings back (a state rebuilt from a snapshot older than a forgetting, or from the whole log), the next
pass reaches the same state; until it does, the stream only remembers more, and what it remembers is
true, so every answer is still right (a remembered producer is judged by its real state).

The sweep runs on the event loop, because the fold mutates the same tables, but in slices: at most
``SLICE`` producers or streams between two yields to the loop. A stream is only looked at when something
in it is due (``StreamState.producers_due_ms``), and at least once per ``ProducerPolicy.revisit_seconds``
(a producer that appeared since its last look).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durastream_server.storage.state import ProducerState, compact_producer, forget_producer
from durastream_server.storage.table import CowTable

if TYPE_CHECKING:  # only for annotations: the CLI imports ProducerPolicy without the storage stack
    from durastream_server.storage.log import StreamLog

SLICE = 200  # producers (or streams) handled between two yields to the event loop (about 1 ms)
DAY = 86400  # an int, so --help and the docs show 604800, not 604800.0
# Defaults, with Kafka's as the yardstick: its idempotent producer ids (one per producer session) expire
# after a day of silence (producer.id.expiration.ms), its transactional ids (stable across restarts, like
# ours) after 7 days (transactional.id.expiration.ms). A producer here is keyed by a stable id, so it gets
# the 7 days; its digests are shortened after the day. What a stream keeps of forgotten producers (a
# few dozen bytes per group) stays 30 days.
DEFAULT_QUIET_SECONDS = DAY
DEFAULT_EXPIRY_SECONDS = 7 * DAY
DEFAULT_GROUP_EXPIRY_SECONDS = 30 * DAY


@dataclass(frozen=True, slots=True)
class ProducerPolicy:
    """How long producer state is kept in memory, in seconds (0: forever)."""

    quiet_seconds: float = DEFAULT_QUIET_SECONDS  # then digests are shortened (compact_producer)
    expiry_seconds: float = DEFAULT_EXPIRY_SECONDS  # then the producer is forgotten
    group_expiry_seconds: float = DEFAULT_GROUP_EXPIRY_SECONDS  # then its group's epoch is dropped

    def __post_init__(self) -> None:
        for name in ("quiet_seconds", "expiry_seconds", "group_expiry_seconds"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"producer {name.replace('_', ' ')} must be >= 0, got {value}")
        if self.expiry_seconds and self.quiet_seconds and self.quiet_seconds > self.expiry_seconds:
            raise ValueError(
                f"producer quiet time ({self.quiet_seconds:g} s) must not exceed the producer "
                f"expiry ({self.expiry_seconds:g} s)"
            )
        if (
            self.expiry_seconds
            and self.group_expiry_seconds
            and self.group_expiry_seconds < self.expiry_seconds
        ):
            raise ValueError(
                f"the forgotten-group expiry ({self.group_expiry_seconds:g} s) must be at least "
                f"the producer expiry ({self.expiry_seconds:g} s)"
            )

    @property
    def periods(self) -> tuple[float, ...]:
        return tuple(p for p in (self.quiet_seconds, self.expiry_seconds) if p) + (
            (self.group_expiry_seconds,)
            if self.expiry_seconds and self.group_expiry_seconds
            else ()
        )

    @property
    def revisit_seconds(self) -> float:
        """The longest a stream goes unvisited (a producer that appeared since is due no sooner)."""
        return min(self.periods, default=DAY)

    @property
    def tick_seconds(self) -> float:
        """Between two passes over the streams: a sixteenth of the shortest period, 50 ms to 60 s."""
        return min(60.0, max(0.05, self.revisit_seconds / 16))


@dataclass(slots=True)
class SweepCounts:
    compacted: int = 0
    forgotten: int = 0
    groups_dropped: int = 0
    streams: int = 0  # streams looked at

    def __bool__(self) -> bool:
        return bool(self.compacted or self.forgotten or self.groups_dropped)

    def describe(self, policy: ProducerPolicy) -> str:
        return (
            f"{self.compacted} compacted (quiet {policy.quiet_seconds:g} s), {self.forgotten} "
            f"forgotten (idle {policy.expiry_seconds:g} s), {self.groups_dropped} forgotten groups "
            f"dropped, in {self.streams} streams"
        )


class _Slices:
    """Counts work (a stream looked at, a producer or group handled) and yields to the loop every
    ``SLICE`` of it, across streams."""

    __slots__ = ("work",)

    def __init__(self) -> None:
        self.work = 0

    async def step(self) -> bool:
        """Count one unit; True if it yielded to the loop."""
        self.work += 1
        if self.work % SLICE:
            return False
        await asyncio.sleep(0)
        return True


async def sweep(logs: Iterable[StreamLog], now_ms: int, policy: ProducerPolicy) -> SweepCounts:
    """One pass over ``logs`` (consumed lazily): compact, forget and drop what is due at ``now_ms``,
    yielding to the loop every ``SLICE`` streams or producers."""
    counts = SweepCounts()
    slices = _Slices()
    # One int for the pass: every stream with nothing sooner shares it (a new one per stream was 32
    # bytes of each idle stream's memory; issue 17).
    revisit = now_ms + int(policy.revisit_seconds * 1000)
    for log in logs:
        await slices.step()
        if log.state.producers_due_ms <= now_ms:
            counts.streams += 1
            before = counts.forgotten + counts.groups_dropped
            await _sweep_stream(log, now_ms, policy, counts, slices, revisit)
            if counts.forgotten + counts.groups_dropped != before:
                log.note_pruned()
    return counts


async def _sweep_stream(
    log: StreamLog,
    now_ms: int,
    policy: ProducerPolicy,
    counts: SweepCounts,
    slices: _Slices,
    revisit: int,
) -> None:
    state = log.state
    quiet_ms = int(policy.quiet_seconds * 1000)
    expiry_ms = int(policy.expiry_seconds * 1000)
    group_ms = int(policy.group_expiry_seconds * 1000) if expiry_ms else 0
    due = revisit
    producers = state.producers
    for pid in _keys_in_slices(producers):
        if await slices.step() and log.state is not state:
            return  # rebuilt from disk meanwhile (log healing): its due time is 0, look again soon
        current = producers.get(pid)
        if current is None:
            continue
        idle = now_ms - current.last_ms
        if expiry_ms and idle >= expiry_ms:
            forget_producer(state, pid)
            counts.forgotten += 1
            continue
        if quiet_ms and not current.quiet:
            if idle >= quiet_ms:
                compact_producer(state, pid)
                counts.compacted += 1
            else:
                due = min(due, current.last_ms + quiet_ms)
                continue
        if expiry_ms:
            due = min(due, current.last_ms + expiry_ms)
    if group_ms:
        for group, forgotten in list(state.forgotten.items()):  # at most one per group
            if now_ms - forgotten.last_ms >= group_ms:
                del state.forgotten[group]
                counts.groups_dropped += 1
            else:
                due = min(due, forgotten.last_ms + group_ms)
    state.producers_due_ms = due


def _keys_in_slices(table: CowTable[ProducerState]) -> Iterator[str]:
    """The table's keys, copied one part at a time (``list`` of a part is a C-level copy of at most
    ``SPLIT_AT`` or ``1/PARTS`` of the table), so the loop is never held by a copy of the whole."""
    for part in table.parts():
        yield from list(part)
