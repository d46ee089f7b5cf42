"""Multi-range reads and lookups of a server with ``--workers N`` (decision 0009, "What is left" 2).

A packed Spark task reads thousands of small streams in one ``__ds/x-durastream/reads`` request
(extension ``multi-range``, docs/extensions.md section 10, ``http/multirange.py``); with N workers those
streams live in N shards. The worker that receives the request splits its ranges by the shard holding each stream (``shard_of``, or a fork's placement), reads
its own and asks every other worker for theirs at once (the same headers and token, marked as a shard's
part, over the Unix sockets the router keeps open: ``fanout.request_head``, ``router.ShardRouter.fetch``;
the mark is honoured only from that socket, ``fanout.is_shard_page``), and answers ONE body, every range
in the request's order, byte for byte what one process holding every stream answers.

Lookups are independent of each other: each shard's results go back to their places.

Reads share one byte budget (the chunk size) in request order, and one process stops at the first range
the budget cuts short. Each shard reads its ranges under the whole budget, which is never less than what
one process would have left at any of them, so a range a shard answers whole and within what is left
after the ranges before it (in request order, every shard's) is exactly one process's answer. The first
range that is not (cut short by the shard, or costing more than is left) is asked again, alone, with
what is left (``PART_BUDGET_HEADER``): one more round trip, only where the answer ends. Errors (a stream
missing, an end past the tail) are the owning shard's, at their range's place, costing nothing.

Memory: every shard's part is bounded by the chunk size, so the receiving worker holds at most N chunks
and the answer (one chunk) while it assembles. A worker that does not answer is 503 SHARD_UNAVAILABLE
with ``Retry-After``, never a partial answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
from array import array
from collections.abc import Awaitable, Callable, Sequence
from itertools import accumulate
from operator import sub
from typing import TYPE_CHECKING, Any, Final

from durastream_server.engine import multiread
from durastream_server.http import frames
from durastream_server.shards.fanout import fetch_part, is_shard_page, request_head

if TYPE_CHECKING:
    from durastream_server.http.handlers import Request
    from durastream_server.shards.router import ShardRouter

# The budget a shard's part is read under, when it is not the whole chunk (a range asked again with
# what is left of the answer's budget). Honoured only with the shard-part mark, from a worker's socket.
PART_BUDGET_HEADER: Final = "x-durastream-shard-budget"
_MAGIC: Final = b"DSM1"
_LITTLE: Final = sys.byteorder == "little"
_ENTRY: Final = '{{"messages":{},"next_offset":"{}","end_reached":{}}}'
_JSON_BOOL: Final = ("false", "true")

Range = tuple[str, str, str]
# This worker's own answer to reads of some ranges under a budget: header entries and frames body.
LocalReads = Callable[[list[Range], str, int], Awaitable[tuple[str, bytes]]]
LocalLookups = Callable[[list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]]


class _Part:
    """One shard's answer to its ranges, decoded: the entries in order and the frames columns,
    taken a range at a time (``take``)."""

    __slots__ = ("entries", "positions", "times", "bounds", "values", "_entry", "_message")

    def __init__(self, entries: list[dict[str, Any]], body: bytes) -> None:
        _, n, _, _ = frames.HEADER.unpack_from(body)
        at = frames.HEADER.size
        self.entries = entries
        self.positions = body[at : at + 8 * n]
        self.times = body[at + 8 * n : at + 16 * n]
        self.bounds = array("Q", body[at + 16 * n : at + 24 * n + 8])
        if not _LITTLE:
            self.bounds.byteswap()
        self.values = memoryview(body)[at + 24 * n + 8 :]
        self._entry = 0
        self._message = 0

    @classmethod
    def of_answer(cls, body: bytes) -> _Part:
        """A whole reads answer (``http/multirange._send``): magic, header length, header, body."""
        if body[:4] != _MAGIC:
            raise ValueError("not a multi-range answer")
        size = int.from_bytes(body[4:8], "little")
        entries = json.loads(body[8 : 8 + size])["ranges"]
        return cls(entries, body[8 + size :])

    @classmethod
    def of_local(cls, entries: str, body: bytes) -> _Part:
        return cls(json.loads("[" + entries + "]"), body)

    def take(self) -> tuple[dict[str, Any] | None, int]:
        """The next range's entry (None past the last answered) and its first message's index."""
        if self._entry == len(self.entries):
            return None, self._message
        entry = self.entries[self._entry]
        first = self._message
        self._entry += 1
        self._message += entry.get("messages", 0)
        return entry, first


class _Answer:
    """The assembled answer: entries and columns appended a range at a time, in request order."""

    def __init__(self, lines: bool) -> None:
        self.lines = lines
        self.entries: list[str] = []
        self.positions: list[bytes] = []
        self.times: list[bytes] = []
        self.lengths: list[int] = []
        self.values: list[bytes | memoryview] = []
        self.count = 0

    def add(self, entry: dict[str, Any], part: _Part, first: int) -> int:
        """Append ``entry`` and its messages from ``part``; what the range takes of the budget (as
        ``multiread.spent`` counts it: ``multiread.cost``)."""
        if "error" in entry:
            self.entries.append(json.dumps(entry, separators=(",", ":")))
            return 0
        count = entry["messages"]
        # The text ``http/multirange`` writes (an offset is the server's token: digits and '_'),
        # without the encoder's walk of a dict a range.
        self.entries.append(
            _ENTRY.format(count, entry["next_offset"], _JSON_BOOL[entry["end_reached"]])
        )
        last = first + count
        bounds = part.bounds
        self.positions.append(part.positions[8 * first : 8 * last])
        self.times.append(part.times[8 * first : 8 * last])
        self.lengths.extend(map(sub, bounds[first + 1 : last + 1], bounds[first:last]))
        self.values.append(part.values[bounds[first] : bounds[last]])
        self.count += count
        size = bounds[last] - bounds[first]
        if self.lines:
            size -= count  # each value's LF is the body's, not the stream's
            return multiread.cost(size, count, frames.PER_LINE_OVERHEAD)
        return multiread.cost(size, count, frames.PER_MESSAGE_OVERHEAD)

    def undo(self, count: int) -> None:
        """Drop the last range added (its cost was more than was left: asked again)."""
        self.entries.pop()
        self.positions.pop()
        self.times.pop()
        self.values.pop()
        if count:
            del self.lengths[-count:]
        self.count -= count

    def body(self) -> tuple[str, bytes]:
        bounds = array("Q", accumulate(self.lengths, initial=0))
        if not _LITTLE:
            bounds.byteswap()
        flags = frames.FLAG_LINES if self.lines else 0
        head = frames.HEADER.pack(frames.MAGIC, self.count, flags, 0)
        parts = [head, *self.positions, *self.times, bounds.tobytes(), *self.values]
        return ",".join(self.entries), b"".join(parts)


class MultiRangeFanOut:
    """Serves a multi-range request across every shard (module docstring)."""

    def __init__(self, router: ShardRouter) -> None:
        self._router = router

    def is_shard_part(self, request: Request) -> bool:
        return is_shard_page(self._router, request)

    def part_budget(self, request: Request, budget: int) -> int:
        """The budget of a shard's part: the asking worker's (what is left of the answer's) when it
        says one, never more than the whole chunk's."""
        value = request.headers.get(PART_BUDGET_HEADER)
        if value is None or not value.isdigit():
            return budget
        return max(1, min(int(value), budget))

    def _split(self, paths: Sequence[str]) -> tuple[list[int], dict[int, list[int]]]:
        """Each path's shard, and each shard's indexes in request order."""
        holder = self._router.holders()  # a fork lives in its source's shard (forks.py)
        owners = [holder(path) for path in paths]
        indexes: dict[int, list[int]] = {}
        for index, owner in enumerate(owners):
            indexes.setdefault(owner, []).append(index)
        return owners, indexes

    async def _ask(
        self, request: Request, shard: int, document: dict[str, Any], budget: int | None
    ) -> bytes:
        """A shard's answer to ``document`` POSTed to this request's resource, as its part."""
        body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
        head = request_head(request, method=b"POST", body=body)
        if budget is not None:
            head = head.replace(
                b"\r\n\r\n", f"\r\n{PART_BUDGET_HEADER}: {budget}\r\n\r\n".encode(), 1
            )
        return await fetch_part(self._router, shard, head, "the multi-range request")

    async def lookups(
        self,
        request: Request,
        items: list[dict[str, Any]],
        paths: Sequence[str],
        local: LocalLookups,
    ) -> dict[str, Any]:
        """Every lookup answered by its shard, in request order."""
        _, indexes = self._split(paths)
        own = self._router.index

        async def part(shard: int, at: list[int]) -> list[dict[str, Any]]:
            chosen = [items[index] for index in at]
            if shard == own:
                return await local(chosen)
            return json.loads(await self._ask(request, shard, {"lookups": chosen}, None))["results"]

        shards = list(indexes)
        answers = await asyncio.gather(*(part(shard, indexes[shard]) for shard in shards))
        results: list[dict[str, Any]] = [{}] * len(items)
        for shard, answer in zip(shards, answers, strict=True):
            for index, result in zip(indexes[shard], answer, strict=True):
                results[index] = result
        return {"results": results}

    async def reads(
        self, request: Request, ranges: list[Range], fmt: str, budget: int, local: LocalReads
    ) -> tuple[str, bytes]:
        """The answer's entries and frames body, as one process holding every stream gives them."""
        owners, indexes = self._split([path for path, _, _ in ranges])
        own = self._router.index

        async def part(shard: int, at: list[int], limit: int | None) -> _Part:
            chosen = [ranges[index] for index in at]
            if shard == own:
                return _Part.of_local(*await local(chosen, fmt, budget if limit is None else limit))
            document = {
                "ranges": [{"path": p, "offset": o, "end": e} for p, o, e in chosen],
                "format": fmt,
            }
            return _Part.of_answer(await self._ask(request, shard, document, limit))

        if list(indexes) == [own]:  # every range this shard's: its answer is the answer
            return await local(ranges, fmt, budget)
        shards = list(indexes)
        got = await asyncio.gather(*(part(shard, indexes[shard], None) for shard in shards))
        parts = dict(zip(shards, got, strict=True))
        answer = _Answer(fmt == "frames-lines")
        left = budget
        for index, owner in enumerate(owners):
            if left <= 0:
                break
            shard_part = parts[owner]
            entry, first = shard_part.take()
            if entry is not None:
                cost = answer.add(entry, shard_part, first)
                if "error" in entry:
                    continue
                if entry["end_reached"] and cost <= left:
                    left -= cost
                    continue
                answer.undo(entry["messages"])
            # Cut short by the shard, or more than is left: what one process reads with what is left.
            again = await part(owner, [index], left)
            entry, first = again.take()
            if entry is None:  # cannot be: a range is answered whenever the budget is positive
                break
            left -= answer.add(entry, again, first)
            if "error" not in entry and not entry["end_reached"]:
                break
        return answer.body()
