"""The change feed of a server with ``--workers N`` (decision 0009, "Fan-out"): every shard's changes.

Each worker numbers the changes of its own shard's streams (``engine/changes.py``: one sequence and one
epoch per process), so a reader of the whole server holds one cursor per shard. The worker that
receives a change query asks every shard for its part (its own engine directly, the others over the
Unix sockets the router keeps open, ``router.ShardRouter.fetch``, marked as in ``fanout.py``) and
answers one page:

- **Cursor.** ``w1.<N>.`` + URL-safe base64 of ``<turn>;<c0>,<c1>,...``: every shard's own cursor in
  shard order (empty: that shard's snapshot is still to be read), and whose part comes first. Opaque to
  clients; one of another version or N, garbage, or a plain one-worker ``<epoch>:<seq>`` (it cannot
  say which shard it belongs to) is 400 naming ``since``.
- **Limit.** Split over the shards (``limit // N`` each, the remainder to the first in turn). Below
  N, every shard is asked for 1 and parts are taken in turn order while they fit; a part that does
  not fit is dropped whole and its shard keeps its cursor (``more``), so the page never holds more
  than ``limit`` and each shard's cursor moves exactly to the end of the part answered. The turn
  moves by one every page, so no shard waits behind another forever.
- **Refill.** When the parts taken leave room (a shard had fewer changes than its share) and some of
  them said ``more``, those shards are asked once more, from the cursor their part answered and
  without a wait, for the room split over them (``refill``); their second parts follow the first
  ones in the page and move their cursors on. So a page holds ``limit`` entries whenever the server
  has that many, at one more round trip only for a page that would have been short; one extra round
  at most (a second part that comes back short leaves the page short, ``more`` says so).
- **more** is any part's (or a dropped part); **reset**: a shard asked from a cursor that answers a
  reset (it restarted: new epoch) resets the whole feed: the other shards are asked again from no
  cursor, and the page is the first of a snapshot of all of them.
- **Waiting** (``wait=MS``): every shard is asked with the wait; the first part that is not empty
  answers, the shards still waiting are cancelled (their forwarded connections closed, not pooled:
  the owner sees the client go and stops waiting) and asked once more without a wait, so the page
  holds what every shard has by then. A shard's cursor only moves with a part that is in the page:
  nothing is skipped or repeated. A client that leaves stops the waits. The wait is each shard's own
  (at most ``MS``); a worker that does not answer within it plus the router's owner wait is 503.
- **Selections** (``POST selections``) are registered in every shard, each holding only its own
  shard's paths under the id of the whole list (``engine/selections.py: prepare``), so the id works
  from any worker and memory does not grow with N. A shard that forgot it answers 404
  ``SELECTION_NOT_FOUND``, which is the answer: the client registers again.
- A worker that does not answer is **503** ``SHARD_UNAVAILABLE``, never a partial page.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import urlencode

from durastream_server.engine.changes import Cursor, InvalidCursor
from durastream_server.errors import InvalidParameter, SelectionNotFound, ShardUnavailable
from durastream_server.http import changes
from durastream_server.http.live import Disconnect
from durastream_server.http.query import bounded_int
from durastream_server.shards.fanout import is_shard_page, peer_failed, request_head
from durastream_server.shards.router import FLAG, OWNER_WAIT_SECONDS
from durastream_server.timers import time_left

if TYPE_CHECKING:
    from durastream_server.engine.engine import Engine
    from durastream_server.http.handlers import Request
    from durastream_server.http.live import LiveReaders
    from durastream_server.shards.router import ShardRouter

VERSION: Final = "w1"
_MAX_CURSOR_CHARS: Final = 8192
# Past a part's own wait, how long a worker may take to answer before the page is 503.
_ANSWER_GRACE_SECONDS: Final = OWNER_WAIT_SECONDS + 5.0

Part = dict[str, Any]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class CompositeCursor:
    """Every shard's own cursor (``""``: from its beginning) and whose part comes first."""

    cursors: tuple[str, ...]
    turn: int

    @classmethod
    def start(cls, count: int) -> CompositeCursor:
        return cls(("",) * count, 0)

    def encode(self) -> str:
        payload = f"{self.turn};{','.join(self.cursors)}".encode("ascii")
        token = base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")
        return f"{VERSION}.{len(self.cursors)}.{token}"

    @classmethod
    def decode(cls, text: str, count: int) -> CompositeCursor:
        """The cursor a page of this server answered; 400 naming ``since`` for anything else."""
        version, _, rest = text.partition(".")
        workers, _, token = rest.partition(".")
        if version != VERSION or not token or len(text) > _MAX_CURSOR_CHARS:
            raise _bad_since(text, count)
        if workers != str(count):
            raise InvalidParameter(
                f"since: {text[:100]!r} is a cursor of a server with {FLAG} {workers}, this one "
                f"runs {FLAG} {count}: start again without since (a snapshot)"
            )
        try:
            payload = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
            turn_text, _, listed = payload.partition(";")
            turn, cursors = int(turn_text), tuple(listed.split(","))
            for cursor in cursors:
                if cursor:
                    Cursor.parse(cursor)
        except (binascii.Error, UnicodeDecodeError, ValueError, InvalidCursor):
            raise _bad_since(text, count) from None
        if not 0 <= turn < count or len(cursors) != count:
            raise _bad_since(text, count)
        return cls(cursors, turn)


def _bad_since(text: str, count: int) -> InvalidParameter:
    try:
        Cursor.parse(text)
    except InvalidCursor:
        what = "not a cursor this server answered"
    else:
        what = "a cursor of a one-process server, which cannot say which shard it belongs to"
    return InvalidParameter(
        f"since: {text[:100]!r} is {what}; a server with {FLAG} {count} takes the 'cursor' of its "
        "previous change page ('w1.<N>.<token>'), or no since for a snapshot"
    )


def shares(limit: int, count: int) -> list[int]:
    """Entries asked of each shard, by place in the turn order: ``limit`` split, at least 1 each."""
    if limit < count:
        return [1] * count
    base, extra = divmod(limit, count)
    return [base + (place < extra) for place in range(count)]


def refill(parts: Mapping[int, Part], order: Sequence[int], limit: int) -> dict[int, int]:
    """The second round (module docstring): entries to ask again of each shard whose part fits in
    the page and said ``more``, the room the parts leave split over them in turn order; {} when the
    page is full or no shard has more."""
    room, wanting = limit, []
    for shard in order:
        size = len(parts[shard]["changes"])
        if size > room:  # dropped whole by merge_parts (limit below N): no room from it
            continue
        room -= size
        if parts[shard]["more"]:
            wanting.append(shard)
    wanting = wanting[:room]  # below one entry each, the first in turn order
    if not wanting:
        return {}
    return dict(zip(wanting, shares(room, len(wanting)), strict=True))


def merge_parts(
    parts: Mapping[int, Part],
    state: CompositeCursor,
    limit: int,
    *,
    reset: bool,
    again: Mapping[int, Part] | None = None,
) -> dict[str, Any]:
    """One page from every shard's part (module docstring): taken in turn order while they fit,
    then the second round's parts (``again``) the same way; a dropped part leaves its shard's
    cursor where it was (in a reset: at its beginning; a dropped second part: at its first's end)."""
    count = len(state.cursors)
    found: list[dict[str, Any]] = []
    cursors = list(state.cursors)
    more: dict[int, bool] = {}
    for shard in _turns(state):
        part = parts[shard]
        if part["changes"] and len(found) + len(part["changes"]) > limit:
            more[shard] = True
            if reset:
                cursors[shard] = ""
            continue
        found += part["changes"]
        cursors[shard] = part["cursor"]
        more[shard] = part["more"]
    for shard in _turns(state):
        part = (again or {}).get(shard)
        # a reset here: the shard restarted between the rounds; its next page tells the reader
        if part is None or part["reset"] or len(found) + len(part["changes"]) > limit:
            continue
        found += part["changes"]
        cursors[shard] = part["cursor"]
        more[shard] = part["more"]
    cursor = CompositeCursor(tuple(cursors), (state.turn + 1) % count)
    return {"changes": found, "cursor": cursor.encode(), "more": any(more.values()), "reset": reset}


def _turns(state: CompositeCursor) -> list[int]:
    """The shards in the order their parts go in the page: from ``state.turn`` on."""
    count = len(state.cursors)
    return [(state.turn + place) % count for place in range(count)]


def _found(part: Part) -> bool:
    return bool(part["changes"]) or part["more"] or part["reset"]


class ChangesFanOut:
    """Answers change queries and selection registrations for every shard (module docstring)."""

    def __init__(self, router: ShardRouter, engine: Engine, live: LiveReaders) -> None:
        self._router = router
        self._engine = engine
        self._live = live

    def is_shard_part(self, request: Request) -> bool:
        return is_shard_page(self._router, request)

    @property
    def keep(self) -> Callable[[str], bool]:
        """Whether this worker's shard holds a path (its part of a selection), as the placement
        tables are now (a fork lives in its source's shard: forks.py)."""
        holder, index = self._router.holders(), self._router.index
        return lambda path: holder(path) == index

    # -- selections -----------------------------------------------------------------------------------

    async def register_elsewhere(self, request: Request, body: bytes) -> int:
        """Register the selection ``body`` with every other worker; the paths they hold."""
        head = request_head(request, method=b"POST", body=body)
        router = self._router
        others = [shard for shard in range(router.count) if shard != router.index]
        answers = await _all(self._ask(shard, head, "selection") for shard in others)
        return sum(int(answer["streams"]) for answer in answers)

    # -- change pages ---------------------------------------------------------------------------------

    async def page(self, request: Request, values: dict[str, str]) -> dict[str, Any]:
        """The whole server's change page for the query ``values``."""
        count = self._router.count
        limit = bounded_int(values, "limit", changes.DEFAULT_LIMIT, 1, changes.MAX_LIMIT)
        wait_ms = bounded_int(values, "wait", 0, 0, changes.MAX_WAIT_MS)
        changes.matcher(self._engine, values)  # a bad selection or pattern: 400/404 here, once
        since = values.get("since") or None
        state = (
            CompositeCursor.start(count) if since is None else CompositeCursor.decode(since, count)
        )
        asked = dict(enumerate(state.cursors))
        wanted = dict(zip(_turns(state), shares(limit, count), strict=True))
        if since is not None and wait_ms:
            parts = await self._waited(request, values, asked, wanted, wait_ms)
        else:
            parts = await self._parts(request, values, asked, wanted, asked)
        restarted = [shard for shard, part in parts.items() if part["reset"] and asked[shard]]
        if restarted:  # one shard cannot continue: every shard starts over, one snapshot
            again = [shard for shard in parts if asked[shard] and not parts[shard]["reset"]]
            parts.update(
                await self._parts(request, values, dict.fromkeys(asked, ""), wanted, again)
            )
            state = CompositeCursor(("",) * count, state.turn)
        wanted = refill(parts, _turns(state), limit)
        again: dict[int, Part] = {}
        if wanted:
            moved = {shard: parts[shard]["cursor"] for shard in wanted}
            again = await self._parts(request, values, moved, wanted, wanted)
        reset = since is None or bool(restarted)
        return merge_parts(parts, state, limit, reset=reset, again=again)

    async def _parts(
        self,
        request: Request,
        values: dict[str, str],
        asked: dict[int, str],
        wanted: dict[int, int],
        shards: Iterable[int],
    ) -> dict[int, Part]:
        """The parts of ``shards``, without a wait."""
        shards = list(shards)
        found = await _all(
            self._part(request, values, shard, asked[shard], wanted[shard], 0) for shard in shards
        )
        return dict(zip(shards, found, strict=True))

    async def _waited(
        self,
        request: Request,
        values: dict[str, str],
        asked: dict[int, str],
        wanted: dict[int, int],
        wait_ms: int,
    ) -> dict[int, Part]:
        """Every shard's part, asked with the wait: answered once one is not empty (or all came back
        empty at their bound, or the client left); those still waiting are cancelled and asked again
        without the wait."""
        loop = asyncio.get_running_loop()
        tasks = {
            shard: loop.create_task(
                self._part(request, values, shard, asked[shard], wanted[shard], wait_ms)
            )
            for shard in asked
        }
        disconnect = Disconnect(request.receive)
        deadline = loop.time() + wait_ms / 1000 + _ANSWER_GRACE_SECONDS
        waiting = set(tasks.values())
        try:
            while waiting and not disconnect.happened:
                remaining = time_left(deadline, loop.time())  # < 1 ms left is expired (timers.py)
                if not remaining:
                    raise ShardUnavailable(
                        "a worker did not answer its part of the change query in time; retry shortly",
                        headers={"Retry-After": "1"},
                    )
                done, _ = await asyncio.wait(
                    [*waiting, disconnect.future],
                    timeout=remaining,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waiting -= done
                if any(_found(task.result()) for task in done if task is not disconnect.future):
                    break
        finally:
            for task in waiting:
                task.cancel()
            await disconnect.close()
        parts = {shard: task.result() for shard, task in tasks.items() if task not in waiting}
        if waiting:
            unanswered = [shard for shard, task in tasks.items() if task in waiting]
            parts.update(await self._parts(request, values, asked, wanted, unanswered))
        return parts

    async def _part(
        self,
        request: Request,
        values: dict[str, str],
        shard: int,
        since: str,
        limit: int,
        wait_ms: int,
    ) -> Part:
        """One shard's page of the query: this worker's from its engine, another's over its socket."""
        query = {name: value for name, value in values.items() if name not in ("since", "wait")}
        query["limit"] = str(limit)
        if since:
            query["since"] = since
        if wait_ms:
            query["wait"] = str(wait_ms)
        if shard == self._router.index:
            return await changes.serve_changes(self._engine, self._live, request, query)
        head = request_head(request, urlencode(query).encode("ascii"))
        return await self._ask(shard, head, "change query")

    async def _ask(self, shard: int, head: bytes, what: str) -> dict[str, Any]:
        """Another worker's answer to ``head``. Its 404 for a selection it forgot is the client's
        answer (register again); anything else but 200 is that worker's failure: 503."""
        status, body = await self._router.fetch(shard, head)
        if status == 200:
            return json.loads(body)
        if status == 404:
            error = json.loads(body).get("error", {})
            if error.get("code") == SelectionNotFound.code:
                raise SelectionNotFound(error.get("message", "selection not found"))
        raise peer_failed(shard, status, f"the {what}")


async def _all(awaitables: Iterable[Awaitable[_T]]) -> list[_T]:
    """Every result, concurrently; when one fails the others are cancelled (their forwarded
    connections closed), so a failed page leaves nothing running behind it."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
