"""A stream as readers see it: its own log stitched onto its fork chain (section 4.2, 8).

Forks share their source's offset space. A fork stores only positions ``>= fork_position`` (its
``base``); everything below comes from the source incarnation, found by storage id, so a soft-deleted
source keeps serving its forks. Chains compose: the stream itself serves ``[base_0, durable_tail]`` and
level ``i`` of the chain serves ``[base_i, min(base_0 .. base_{i-1}))``. The minimum matters: a fork
of a fork may branch inside the inherited range (below its source's own base), and then nothing of
the levels above that point is visible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from durastream_server.errors import BadRequest, CorruptStream, InvalidReadOffset
from durastream_server.storage.log import InvalidPosition, StreamLog
from durastream_server.storage.records import MessageRun, MessageSlice


@dataclass(frozen=True, slots=True)
class Level:
    log: StreamLog
    limit: int | None  # exclusive upper bound inside this view; None for the stream's own log


class _MissingSource:
    """Stands in for a fork source that is not on disk: any read of its range is CorruptStream,
    never an empty or shortened answer. The fork's own range stays readable."""

    def __init__(self, storage_id: str, path: str) -> None:
        self.base = 0
        self._what = f"fork source {storage_id} of {path!r} is missing"

    def __getattr__(self, name: str) -> object:
        raise CorruptStream(self._what)


class StreamView:
    def __init__(self, levels: list[Level], *, json: bool) -> None:
        self.levels = levels
        self.json = json

    @classmethod
    def of(
        cls, log: StreamLog, source_log: Callable[[str], StreamLog | None], *, json: bool
    ) -> StreamView:
        """Build the chain for ``log``; ``source_log`` resolves a storage id (None if missing)."""
        levels = [Level(log, None)]
        current = log
        limit = log.base
        while current.header.fork_source_id is not None:
            source = source_log(current.header.fork_source_id)
            if source is None:
                if limit > 0:
                    missing = _MissingSource(current.header.fork_source_id, log.header.path)
                    levels.append(Level(missing, limit))  # type: ignore[arg-type]
                break
            if source.base < limit:  # otherwise this level contributes nothing to the view
                levels.append(Level(source, limit))
            limit = min(limit, source.base)
            current = source
        return cls(levels, json=json)

    @property
    def own(self) -> StreamLog:
        return self.levels[0].log

    @property
    def tail(self) -> int:
        return self.own.durable_tail

    def locate(self, position: int) -> Level:
        """The level that stores ``position`` (the tail belongs to the stream's own log)."""
        for level in self.levels:
            if position >= level.log.base and (level.limit is None or position < level.limit):
                return level
        return self.levels[-1]

    async def is_boundary(self, position: int) -> bool:
        """True if ``position`` is a message boundary of this view (fork points and the tail are)."""
        if position == self.tail:
            return True
        if any(level.limit == position for level in self.levels):
            return True
        return await self.locate(position).log.is_boundary(position)

    async def boundary_after(self, anchor: int, count: int) -> int:
        """Resolve a fork sub-offset: ``count`` messages (JSON) or bytes past ``anchor``.

        The result may not pass the end of the message that starts at ``anchor`` *as this view sees
        it*: a message a fork cut short ends at the fork point.
        """
        if count == 0:
            return anchor
        level = self.locate(anchor)
        limit = self.tail if level.limit is None else level.limit
        if anchor >= limit:
            raise BadRequest("Stream-Fork-Sub-Offset points past the end of the stream")
        try:
            result = await level.log.boundary_after(anchor, count, messages=self.json)
        except InvalidPosition as exc:
            raise BadRequest(f"invalid Stream-Fork-Sub-Offset: {exc}") from None
        if result > limit:
            raise BadRequest("Stream-Fork-Sub-Offset points past the next data boundary")
        return result

    async def read(
        self,
        start: int,
        max_bytes: int,
        end: int,
        *,
        whole_messages: bool | None = None,
        runs: bool = False,
        overhead: int = 0,
    ) -> tuple[list[MessageSlice | MessageRun], int, int]:
        """Read ``[start, end)`` across the chain, about ``max_bytes`` (each message also costing
        ``overhead``). Returns the slices, the position after the last one and how many messages (or
        byte-stream pieces) they hold.

        Whole messages (at least one) for JSON streams, or for any stream when ``whole_messages`` is
        True (message frames). A byte-stream message that a fork cut short ends, in this view, at the
        fork point, so a whole-message read returns it as that prefix rather than stalling before it.
        """
        whole = self.json if whole_messages is None else whole_messages
        slices: list[MessageSlice | MessageRun] = []
        count = 0
        position = start
        budget = max_bytes
        while position < end and (budget > 0 or not slices):
            level = self.locate(position)
            stop = end if level.limit is None else min(end, level.limit)
            if position >= stop:
                break
            try:
                chunk = await level.log.read(
                    position,
                    max(budget, 1),
                    stop,
                    whole_messages=whole,
                    runs=runs and whole,
                    overhead=overhead,
                )
                if (
                    chunk.next_position <= position
                    and whole
                    and stop == level.limit
                    and (not slices or stop - position + overhead <= budget)
                ):
                    chunk = await level.log.read(
                        position, stop - position, stop, whole_messages=False
                    )
            except InvalidPosition as exc:
                raise InvalidReadOffset(f"invalid offset: {exc}") from None
            if chunk.next_position <= position:
                break
            slices.extend(chunk.slices)
            count += chunk.messages
            # The slices are contiguous from ``position``: their bytes are the distance moved.
            budget -= chunk.next_position - position + overhead * chunk.messages
            position = chunk.next_position
            if position < stop:
                # The budget ran out inside this level. Reading on would admit one more "first"
                # message and overshoot the chunk size.
                break
        return slices, position, count
