"""Parking live readers (long-poll and SSE) in ``engine.wait``, without a thread or task pool per reader.

A parked reader must be released by whichever comes first: new data or closure (the engine's wait returns
True), its timeout (False), the client hanging up, or server shutdown. The last two are why the engine's wait
is raced against two futures here: uvicorn waits for running requests before the ASGI lifespan shutdown runs,
so waiting readers must be let go *before* that, or a SIGTERM would stall for a whole long-poll timeout.
Released-by-shutdown readers answer as at a timeout (hazard 33's "defined code" for shutdown).

Long-polls park in wake groups (``LiveReaders.wait_read``): all long-polls waiting at the same offset of the
same stream share one engine wait and one read, and when data comes the group answers every member in one
loop pass. A member whose request allows it (``WakeAnswer`` with a responder) gets bytes written straight
to its connection (``http/fastpath.py``), built once per distinct request shape; any other member gets the
shared read and sends its answer the ordinary way. This took the server's cost per woken reader from
~50 us to ~13 us (docs/decisions/0004-performance.md). If the group's wait or read raises a protocol error
(the stream was deleted: NotFound/Gone), every member raises its own copy of it; anything else unusual
(engine shutdown, an unexpected failure) sends every member back to its own wait and read.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from durastream_server.errors import ProtocolError
from durastream_server.http import fastpath, responses
from durastream_server.metrics.counters import ServerMetrics
from durastream_server.timers import time_left

if TYPE_CHECKING:
    from durastream_server.engine.api import ReadResult

logger = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Read = Callable[[str, str], Awaitable["ReadResult"]]
Render = Callable[["ReadResult"], tuple[int, responses.Headers, bytes]]

# A group's engine wait is bounded only so that a leader can never outlive every use; its members have
# their own timeouts and leave (which cancels the leader) long before.
_LEADER_TIMEOUT: Final = 24 * 3600.0


class _Outcome:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ANSWERED: Final = _Outcome("ANSWERED")  # the wake group wrote the response: send nothing more
_ON_YOUR_OWN: Final = _Outcome("ON_YOUR_OWN")  # the group gave up: wait and read individually


class _Failed:
    """The group's wait or read raised a protocol error (e.g. the stream was deleted): every member
    raises its own copy, as its own wait would have."""

    __slots__ = ("error",)

    def __init__(self, error: ProtocolError) -> None:
        self.error = error


class Waitable(Protocol):
    async def wait(
        self,
        path: str,
        offset: str,
        timeout: float,
        release: Iterable[asyncio.Future[Any]] = (),
    ) -> bool: ...


class Disconnect:
    """Watches ``receive`` for ``http.disconnect`` once the request body has been consumed."""

    def __init__(self, receive: Receive) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.future.done():
                    self.future.set_result(None)
                return

    @property
    def happened(self) -> bool:
        return self.future.done()

    async def close(self) -> None:
        """Stop watching. Not awaited to completion: the watcher only ever waits in ``receive``, and
        a long-poll's answer should not wait a loop iteration for it (docs/decisions/0004)."""
        if not self._task.done():
            self._task.cancel()


class LiveReaders:
    """The server's parked readers: counts them (``/healthz`` reports it) and releases them on drain."""

    def __init__(self, engine: Waitable, metrics: ServerMetrics | None = None) -> None:
        self._engine = engine
        # Wake latency per woken long-poll, and the messages of fast-path answers (``/metrics``).
        self.metrics = metrics
        # What drain() settles: one future per parked wait (a long-poll, a wake group's leader, an SSE
        # wait), held in a set, so that parking and leaving cost O(1). A callback on one shared drain
        # future would not: asyncio's remove_done_callback scans the whole callback list, which at
        # 10,000 parked readers on as many streams made every wake-up and timeout O(parked readers) and
        # the server spent its core on it (issue 17, bench/scale_bench.py readers).
        self._draining = False
        self._on_drain: set[asyncio.Future[Any]] = set()
        self._groups: dict[tuple[str, str], _WakeGroup] = {}
        self.parked = 0
        self.fast_answers = 0  # long-polls answered by the fast path (observability and tests)

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self) -> None:
        """Release every parked reader now, and every later one immediately."""
        if self._draining:
            return
        self._draining = True
        parked, self._on_drain = self._on_drain, set()
        for future in parked:
            _settle(future)

    def _hold(self, future: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Have ``drain`` settle ``future`` (at once if it has begun); ``_let_go`` it when done."""
        if self._draining:
            _settle(future)
        else:
            self._on_drain.add(future)
        return future

    def _let_go(self, future: asyncio.Future[Any]) -> None:
        self._on_drain.discard(future)

    async def wait(
        self, path: str, offset: str, timeout: float, disconnect: Disconnect
    ) -> bool | None:
        """True: data past ``offset`` (or closure). False: timeout. None: client gone or server draining.

        Errors of the engine's wait (the stream was deleted while waiting: NotFound/Gone) propagate.
        """
        return await self.park(
            lambda release: self._engine.wait(path, offset, timeout, release=release), disconnect
        )

    async def park(
        self,
        wait: Callable[[tuple[asyncio.Future[Any], ...]], Awaitable[bool]],
        disconnect: Disconnect,
        *,
        counted: bool = True,
    ) -> bool | None:
        """Run ``wait(release)`` as a parked reader (counted for ``/healthz``): True when it saw what
        it waits for, False on its timeout, None when the client hung up or the server is draining.

        The engine's waits return early when a ``release`` future (drain, hang-up) completes, so a
        parked reader costs one future, not a task plus an ``asyncio.wait`` (docs/decisions/0004).
        Not ``counted``: the server's own reader (a worker following another's change feed for its
        subscriptions, ``shards/subscriptions.py``), no client's.
        """
        if self.draining or disconnect.happened:
            return None
        drained = self._hold(asyncio.get_running_loop().create_future())
        step = 1 if counted else 0
        self.parked += step
        try:
            woke = await wait((drained, disconnect.future))
        finally:
            self.parked -= step
            self._let_go(drained)
        if not woke and (self.draining or disconnect.happened):
            return None
        return woke

    async def wait_read(
        self,
        path: str,
        offset: str,
        timeout: float,
        disconnect: Disconnect,
        read: Read,
        answer: WakeAnswer | None = None,
    ) -> ReadResult | _Outcome | None:
        """Park a long-poll at ``offset`` until data past it is durable (or the stream is closed).

        Returns the read from ``offset`` (it may be empty if the wake-up was spurious: wait again), or
        ``ANSWERED`` when the response has already been written (``answer``'s responder), or None on
        timeout, hang-up or drain (answer as at a timeout). Protocol errors of the wait or the read (the
        stream was deleted meanwhile) are raised, a copy for each member.
        """
        if self.draining or disconnect.happened:
            return None
        loop = asyncio.get_running_loop()
        started = loop.time()
        key = (path, offset)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _WakeGroup(self, key, read)
        future: asyncio.Future[Any] = loop.create_future()
        group.join(future, answer)
        timer = loop.call_later(max(timeout, 0.0), _settle, future)
        release = functools.partial(_settle_on, future)
        gone = disconnect.future
        gone.add_done_callback(release)
        self._hold(future)
        self.parked += 1
        try:
            outcome = await future
        finally:
            self.parked -= 1
            timer.cancel()
            self._let_go(future)
            gone.remove_done_callback(release)
            group.leave(future)
        if type(outcome) is _Failed:
            raise copy.copy(outcome.error)
        if outcome is not _ON_YOUR_OWN:
            return outcome  # type: ignore[no-any-return]
        woke = await self.wait(path, offset, time_left(started + timeout, loop.time()), disconnect)
        if not woke:
            return None
        return await read(path, offset)

    def _unregister(self, group: _WakeGroup) -> None:
        if self._groups.get(group.key) is group:
            del self._groups[group.key]


class WakeAnswer:
    """How a parked long-poll wants its answer.

    ``render`` builds status, headers and body from the read (the handler's own rendering, so both
    paths answer alike). Members whose ``key`` is equal get byte-identical answers: the key must cover
    everything of the request that the answer depends on. ``responder`` is None when the answer must
    go through the ordinary send (e.g. a conditional request, or no fast path in this server).
    """

    __slots__ = ("key", "render", "responder")

    def __init__(
        self, key: Hashable, render: Render, responder: fastpath.RawResponder | None
    ) -> None:
        self.key = key
        self.render = render
        self.responder = responder


def _settle(future: asyncio.Future[Any], outcome: Any = None) -> None:
    if not future.done():
        future.set_result(outcome)


def _settle_on(future: asyncio.Future[Any], _source: asyncio.Future[Any]) -> None:
    _settle(future)


class _WakeGroup:
    """The long-polls parked at one offset of one stream, and the one task that waits and reads for them.

    The leader task exists while the group has members: the last member to leave cancels it. Once it
    has data it leaves the registry (later arrivals start a new group) and answers every member in one
    synchronous pass, so no member can leave or join halfway.
    """

    __slots__ = ("live", "key", "read", "members", "shapes", "task")

    def __init__(self, live: LiveReaders, key: tuple[str, str], read: Read) -> None:
        self.live = live
        self.key = key
        self.read = read
        # Each member's answer and its shape: members of one shape get byte-identical answers. The
        # shape is found on joining, so the wake-up pass compares small integers, not request keys.
        self.members: dict[asyncio.Future[Any], tuple[WakeAnswer | None, int]] = {}
        self.shapes: dict[Hashable, int] = {}
        self.task = asyncio.get_running_loop().create_task(self._lead())

    def join(self, future: asyncio.Future[Any], answer: WakeAnswer | None) -> None:
        shape = -1
        if answer is not None and answer.responder is not None:
            key = (answer.key, *answer.responder.extra_headers)
            shape = self.shapes.setdefault(key, len(self.shapes))
        self.members[future] = (answer, shape)

    def leave(self, future: asyncio.Future[Any]) -> None:
        self.members.pop(future, None)
        if not self.members and not self.task.done():
            self.task.cancel()
            self.live._unregister(self)

    async def _lead(self) -> None:
        path, offset = self.key
        live = self.live
        result: ReadResult | None = None
        outcome: Any = _ON_YOUR_OWN
        loop = asyncio.get_running_loop()
        woke_at = 0.0
        drained = live._hold(loop.create_future())
        try:
            while result is None:
                woke = await live._engine.wait(path, offset, _LEADER_TIMEOUT, release=(drained,))
                if not woke:
                    break
                woke_at = loop.time()
                read = await self.read(path, offset)
                if read.count or read.closed:
                    result = read
        except asyncio.CancelledError:
            live._unregister(self)
            raise
        except ProtocolError as exc:  # NotFound/Gone: deleted while parked (hazard 33)
            outcome = _Failed(exc)
        except Exception:  # not a protocol error: each member meets it (or not) on its own
            logger.debug("wake group %r: members wait on their own", self.key, exc_info=True)
        finally:
            live._let_go(drained)
        live._unregister(self)
        if result is None:
            for future in self.members:
                _settle(future, outcome)
        else:
            fast, answered = self._answer(result)
            metrics = live.metrics
            if metrics is not None and answered:
                metrics.long_poll_wake.observe_many(loop.time() - woke_at, answered)
                metrics.messages_read += result.count * fast

    def _answer(self, result: ReadResult) -> tuple[int, int]:
        """Two passes, no await: first every fast-path answer goes on the wire (the latency that is
        measured), then the request cycles are completed and every member's task is woken. Returns
        how many members were answered on the fast path, and in all (written, or handed the read)."""
        prepared: list[fastpath.Prepared | None | _Outcome] = [_MISSING] * len(self.shapes)
        written: list[fastpath.RawResponder] = []
        others: list[asyncio.Future[Any]] = []
        answered: list[asyncio.Future[Any]] = []
        try:
            for future, (answer, shape) in self.members.items():
                if future.done():
                    continue  # timed out, hung up or drained in this same loop iteration
                if shape >= 0:
                    wire = prepared[shape]
                    if wire is _MISSING:
                        wire = prepared[shape] = _prepare(answer, result)  # type: ignore[arg-type]
                    responder: fastpath.RawResponder = answer.responder  # type: ignore[union-attr,assignment]
                    if wire is not None and responder.write(wire):  # type: ignore[arg-type]
                        written.append(responder)
                        answered.append(future)
                        continue
                others.append(future)
        finally:
            for responder in written:
                responder.finish()
            for future in answered:
                future.set_result(ANSWERED)
            for future in others:
                future.set_result(result)
            self.live.fast_answers += len(answered)
            for (
                future
            ) in self.members:  # only if the pass failed halfway: the rest read on their own
                _settle(future, _ON_YOUR_OWN)
        return len(answered), len(answered) + len(others)


_MISSING: Final = _Outcome("MISSING")


def _prepare(answer: WakeAnswer, result: ReadResult) -> fastpath.Prepared | None:
    """The bytes the ordinary path would send: ``send_response``'s header list, then the app's extra
    headers (appended by its send wrapper), then the body."""
    try:
        status, headers, body = answer.render(result)
        encoded = responses.response_headers(status, headers, body)
        extra = answer.responder.extra_headers  # type: ignore[union-attr]
        return fastpath.prepare(status, [*encoded, *extra], body)
    except Exception:  # the ordinary path renders again and reports it
        logger.debug("fast-path render failed", exc_info=True)
        return None
