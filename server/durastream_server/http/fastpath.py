"""The long-poll wake fast path: one answer, built once, written straight to many connections.

When a commit wakes a hundred long-polls parked at the same offset, their answers are byte-identical (same
data, same headers), so ``http/live.py`` builds the answer once and writes it to each connection from one
loop pass. The ordinary way out, the ASGI ``send``, costs per answer a task switch, uvicorn's header
validation in Python and two socket writes (status and headers, then the body); on this project's 2-core
VM that was ~50 us per answer, and it set the p99 wake latency (docs/decisions/0004-performance.md).

This module is the only place that knows uvicorn's internals. ``with_fast_path`` mixes one addition into
uvicorn's httptools protocol (or the server's subclass of it, ``http/guard.py``): every HTTP request's
scope carries a ``RawResponder`` under
``scope["extensions"]["durastream.raw_response"]``. ``RawResponder.send`` writes a ``Prepared`` answer in
one ``transport.write`` and updates the request cycle exactly as uvicorn's ``send`` does for a complete
response (``response_started``/``response_complete``, wake its ``receive``, ``on_response`` for keep-alive
and pipelining). It refuses (returns False), and the caller falls back to the ordinary ASGI send, whenever
uvicorn's send would have done something more than write those bytes: the response already started, the
client is gone, the connection is to close after this response (HTTP/1.0, ``Connection: close``, server
shutdown), the transport is paused for backpressure or closing, access logging is on, or the request is a
HEAD. The bytes are what uvicorn writes for the same ASGI messages: its status line, the cycle's default
headers (``date``), the response's headers lower-cased as ``name: value``, a blank line, the body
(``tests/server/http/test_fastpath.py`` compares them byte for byte).

Direct requests. The same mixin can also take a request away from ASGI altogether: an application that
offers ``DirectApp`` (``with_fast_path(base, app)``) is asked, when a request's headers are complete,
whether it wants it (``direct_candidate``: a small append or create); if so, uvicorn starts no task
for it, and once its body is complete the application gets the scope, the body, a ``RawResponder`` and
uvicorn's ``send`` (``direct``). It may still decline (then the request takes the ordinary ASGI path, with its body,
as if nothing had happened). This saves, per request, the task, the ASGI receive/send round trips,
uvicorn's header validation and a second write (docs/decisions/0007). It needs uvicorn's ``_start_asgi_task`` (0.50 and
later); without it every request takes the ordinary path.

If uvicorn's internals ever change shape (the attributes below are missing), no responder is offered and
every answer takes the ordinary path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, ClassVar, Final, Protocol

logger = logging.getLogger(__name__)

EXTENSION: Final = "durastream.raw_response"

try:
    from uvicorn.protocols.http.httptools_impl import (
        HEADER_RE,
        HEADER_VALUE_RE,
        STATUS_LINE,
        HttpToolsProtocol,
    )
except ImportError:  # pragma: no cover - httptools or uvicorn missing: no fast path
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

# Whether this uvicorn lets the direct path take requests away from ASGI (``_start_asgi_task``, uvicorn 0.50
# and later). Without it the server is correct, only slower per small append (test-compat runs uvicorn 0.30).
DIRECT_SUPPORTED: Final = HttpToolsProtocol is not None and hasattr(
    HttpToolsProtocol, "_start_asgi_task"
)

# What RawResponder touches on uvicorn's RequestResponseCycle. Checked once, on the first request.
_CYCLE_ATTRIBUTES: Final = (
    "scope",
    "transport",
    "flow",
    "default_headers",
    "access_log",
    "keep_alive",
    "disconnected",
    "waiting_for_100_continue",
    "response_started",
    "response_complete",
    "message_event",
    "on_response",
    "body",
    "more_body",
    "send",
)
_supported: bool | None = None


def _cycle_supported(cycle: Any) -> bool:
    global _supported
    if _supported is None:
        _supported = all(hasattr(cycle, name) for name in _CYCLE_ATTRIBUTES) and hasattr(
            cycle.flow, "write_paused"
        )
        if not _supported:
            logger.warning("uvicorn's request cycle has changed shape; long-poll fast path off")
    return _supported


# Header lines already checked, mostly the headers every answer carries (security, CORS, extensions):
# bounded, so the per-answer values (offsets) that fill it up cannot grow it.
_CHECKED: dict[tuple[bytes, bytes], bytes] = {}
_CHECKED_MAX: Final = 512


def _header_lines(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """``name: value\\r\\n`` lines as uvicorn writes them, or None where uvicorn would refuse a header."""
    lines = []
    checked = _CHECKED
    for pair in headers:
        line = checked.get(pair)
        if line is None:
            name, value = pair
            if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
                return None
            line = b"".join((name.lower(), b": ", value, b"\r\n"))
            if len(checked) < _CHECKED_MAX:
                checked[pair] = line
        lines.append(line)
    return b"".join(lines)


def header_value_ok(value: bytes) -> bool:
    """Whether uvicorn sends ``value`` as a header value (``_header_lines``' check of a value; only
    with the fast path, ``HttpToolsProtocol``)."""
    return HEADER_VALUE_RE.search(value) is None


def header_lines(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """``_header_lines`` for the app's pre-encoded answers (``handlers.AppendAnswers``)."""
    return _header_lines(headers)


# The wire lines of the server's default headers (uvicorn's ``server``/``date``), for the list uvicorn
# is handing out now: it replaces the list once a second (the date), and every answer of that second
# shares these bytes instead of checking and joining them again (``Prepared.head``).
_defaults_lines: tuple[list[tuple[bytes, bytes]], bytes | None] | None = None


def _default_lines(defaults: list[tuple[bytes, bytes]]) -> bytes | None:
    global _defaults_lines
    cached = _defaults_lines
    if cached is not None and cached[0] is defaults:
        return cached[1]
    lines = _header_lines(defaults)
    _defaults_lines = (defaults, lines)  # holding the list keeps its identity unique
    return lines


class Prepared:
    """One complete response, encoded once, for any number of connections.

    The status line and the server's default headers come first on the wire; uvicorn keeps those per
    request (its ``date`` value as of the request's arrival), so the head (status line and every header
    line) is cached per distinct default-header list, of which a burst typically sees one or two. Each
    connection's own request id header (``RawResponder.request_id_line``) goes between the head and the
    blank line that ends the headers, where the ordinary path's send wrapper puts it (``app.py``).
    """

    __slots__ = ("status", "body_bytes", "_lines", "_tail", "_heads")

    def __init__(self, status: int, lines: bytes, body: bytes) -> None:
        self.status = status
        self.body_bytes = len(body)
        self._lines = lines
        self._tail = b"\r\n" + body
        self._heads: dict[int, tuple[list[tuple[bytes, bytes]], bytes | None]] = {}

    def head(self, defaults: list[tuple[bytes, bytes]]) -> bytes | None:
        """Status line and header lines (without the request id and the blank line)."""
        cached = self._heads.get(id(defaults))
        if cached is not None and cached[0] is defaults:
            return cached[1]
        lines = _default_lines(defaults)
        head = None if lines is None else STATUS_LINE[self.status] + lines + self._lines
        self._heads[id(defaults)] = (defaults, head)  # holding the list keeps its id unique
        return head

    @property
    def tail(self) -> bytes:
        """The blank line ending the headers, and the body."""
        return self._tail


def prepare(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Prepared | None:
    """Encode a complete response (``headers`` as ``responses.response_headers`` builds them, so with its
    Content-Length). None if the fast path is unavailable or uvicorn would refuse a header."""
    if HttpToolsProtocol is None or not 100 <= status < 600:
        return None
    lines = _header_lines(headers)
    if lines is None:
        return None
    return Prepared(status, lines, body)


def prepare_lines(status: int, lines: bytes, extra: list[tuple[bytes, bytes]]) -> Prepared | None:
    """``prepare`` of a bodiless answer whose header lines are already encoded and checked (``lines``:
    what ``_header_lines`` makes of ``responses.response_headers``), then ``extra`` (the request's own
    headers, CORS). None where ``prepare`` would be."""
    if HttpToolsProtocol is None or not 100 <= status < 600:
        return None
    if extra:
        more = _header_lines(extra)
        if more is None:
            return None
        lines += more
    return Prepared(status, lines, b"")


# What ``RawResponder.sent`` reports for a bodiless answer written by ``send_lines`` (its status and
# no body bytes, for the app's metrics and access log): one per status, shared.
_BODILESS: dict[int, Prepared] = {}


def _bodiless(status: int) -> Prepared:
    sent = _BODILESS.get(status)
    if sent is None:
        sent = _BODILESS[status] = Prepared(status, b"", b"")
    return sent


class RawResponder:
    """Answers one request by writing prepared bytes to its connection (see the module docstring)."""

    __slots__ = ("_cycle", "extra_headers", "request_id_line", "sent")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        # Encoded headers the app adds to every response of this request (CORS, ``app._TrackedSend``);
        # set by ``responder``.
        self.extra_headers: list[tuple[bytes, bytes]] = []
        # ``x-request-id: <id>\r\n``, the header the app adds last to every response (set by
        # ``responder``); per request, so it is not part of a shared answer's bytes.
        self.request_id_line = b""
        self.sent: Prepared | None = None  # what was written (the app's access log and metrics)

    def send(self, prepared: Prepared) -> bool:
        """Write the whole response and complete the request cycle. False: nothing was written; send it
        the ordinary way."""
        if not self.write(prepared):
            return False
        self.finish()
        return True

    def write(self, prepared: Prepared) -> bool:
        """The first half of ``send``: put the response on the wire and mark it sent. ``finish`` must
        follow before control returns to the event loop (a burst writes all answers first)."""
        if not self._writable():
            return False
        head = prepared.head(self._cycle.default_headers)
        if head is None:
            return False
        return self._put((head, self.request_id_line, prepared.tail), prepared)

    def send_lines(self, status: int, lines: bytes) -> bool:
        """``send`` of a bodiless answer for this request alone (a direct append's or create's):
        ``lines`` are its header lines, checked as ``prepare_lines`` checks them (the request's own
        extra headers are added here). The same bytes as ``send(prepare_lines(...))``, without a
        ``Prepared`` and its cache of heads, which only an answer written to many connections
        uses. False: nothing was written; send it the ordinary way."""
        if not 100 <= status < 600 or not self._writable():
            return False
        defaults = _default_lines(self._cycle.default_headers)
        if defaults is None:
            return False
        if self.extra_headers:
            more = _header_lines(self.extra_headers)
            if more is None:
                return False
            lines += more
        head = STATUS_LINE[status] + defaults + lines
        if not self._put((head, self.request_id_line, b"\r\n"), _bodiless(status)):
            return False
        self.finish()
        return True

    def _writable(self) -> bool:
        """Whether uvicorn's send would do no more than write the bytes (the module docstring)."""
        cycle = self._cycle
        return not (
            cycle.response_started
            or cycle.disconnected
            or not cycle.keep_alive
            or cycle.access_log
            or cycle.flow.write_paused
            or cycle.scope["method"] == "HEAD"
            or cycle.transport.is_closing()
        )

    def _put(self, pieces: tuple[bytes, bytes, bytes], sent: Prepared) -> bool:
        cycle = self._cycle
        try:
            cycle.transport.writelines(pieces)
        except Exception:  # nothing was written; the ordinary send decides what to do
            logger.debug("fast-path write refused", exc_info=True)
            return False
        self.sent = sent
        # As uvicorn's send does for http.response.start and a final http.response.body (keep-alive).
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.response_complete = True
        return True

    def finish(self) -> None:
        """The second half of ``send``: wake the request's ``receive`` and let the connection go on
        (keep-alive timer, or the next pipelined request), as uvicorn's send does after the body."""
        cycle = self._cycle
        cycle.message_event.set()
        cycle.on_response()


def responder(
    scope: Any, extra_headers: list[tuple[bytes, bytes]], request_id_line: bytes = b""
) -> RawResponder | None:
    """The request's responder, if the server offers one (``with_fast_path``). ``extra_headers``: what
    the app's send wrapper appends to every response header list of this request; then
    ``request_id_line``, its ``x-request-id`` header as a wire line.

    Taken out of the scope (asked once per request): the responder holds the request cycle, which
    holds the scope, so left there it would make every request's cycle, scope, headers and answer a
    reference cycle that only the cyclic GC frees (~13 objects per request, ~10% of a create's loop
    CPU in collections); taken out, they are freed as soon as the request is done."""
    extensions = scope.get("extensions")
    found: RawResponder | None = extensions.pop(EXTENSION, None) if extensions else None
    if found is not None:
        found.extra_headers = extra_headers
        found.request_id_line = request_id_line
    return found


Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class DirectApp(Protocol):
    """An application that serves some requests without ASGI (the module docstring)."""

    def direct_candidate(self, scope: Any) -> bool:
        """Cheap, from the request line and headers: might ``direct`` take this request?"""
        ...

    def direct(self, scope: Any, body: bytes, responder: RawResponder, send: Send) -> bool:
        """Serve the request whose body is complete, answering through ``responder`` (or ``send``, the
        ordinary way, for what it refuses). False: declined, nothing done; the ASGI path takes it."""
        ...


class FastPathMixin:
    """Mixed in before uvicorn's httptools protocol (or a subclass of it): every HTTP request's scope also
    offers a ``RawResponder``, and ``direct_app`` (if set) may serve requests without ASGI."""

    cycle: Any
    scope: Any
    app: Any
    loop: asyncio.AbstractEventLoop
    direct_app: ClassVar[DirectApp | None] = None
    _direct_waiting: tuple[Any, Any] | None = None  # (cycle, app) whose body is still arriving
    _direct_ready: tuple[Any, Any] | None = None  # (cycle, app) whose body is complete: serve now

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # uvicorn calls this for every request that is to run now (at the end of its headers, or when
        # the request before it on a keep-alive connection is answered).
        direct = self.direct_app
        if (
            direct is not None
            # not uvicorn's 503 for --limit-concurrency, or anything else it swapped in
            and app is self.app
            and cycle.keep_alive
            and not cycle.access_log
            and _cycle_supported(cycle)
            and direct.direct_candidate(cycle.scope)
        ):
            if cycle.more_body:
                self._direct_waiting = (cycle, app)  # served in on_message_complete
            else:
                self.loop.call_soon(self._direct_serve, cycle, app)
            return
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        waiting = self._direct_waiting
        if waiting is not None and waiting[0] is self.cycle and not self.cycle.more_body:
            self._direct_waiting = None
            # Not from inside the parser's callback (the answer may complete the cycle at once):
            # once ``feed_data`` returns, in ``data_received``, rather than a loop turn later (a
            # handle per request, and the request waited behind everything else in the loop).
            self._direct_ready = waiting

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        ready = self._direct_ready
        if ready is not None:
            # At most one per call: a request parsed behind one still unanswered is queued
            # (uvicorn's pipeline), not started, so it never becomes ready here.
            self._direct_ready = None
            self._direct_serve(*ready)

    def _direct_serve(self, cycle: Any, app: Any) -> None:
        if cycle.disconnected or cycle.response_started:
            return  # gone (or refused by the connection guard, which answered it)
        direct = self.direct_app
        assert direct is not None
        body = cycle.body
        # The responder ``on_headers_complete`` offered in the scope (this cycle's), else a new one.
        extensions = cycle.scope.get("extensions")
        responder = extensions.get(EXTENSION) if extensions else None
        if responder is None or responder._cycle is not cycle:
            responder = RawResponder(cycle)
        try:
            taken = direct.direct(cycle.scope, bytes(body), responder, cycle.send)
        except Exception:  # a bug: the ordinary path answers, and reports its own failure
            logger.exception("direct request failed; answering it the ordinary way")
            taken = False
        if taken:
            if extensions:  # no reference cycle through the scope (``responder``)
                extensions.pop(EXTENSION, None)
        else:
            super()._start_asgi_task(cycle, app)  # type: ignore[misc]  # its receive gets the body

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # type: ignore[misc]
        cycle = self.cycle
        # A new cycle is made for every request that is not an upgrade (an upgrade returns early).
        # A request whose connection closes after it (HTTP/1.0, ``Connection: close``) is answered the
        # ordinary way. Asked of the parser, not ``cycle.keep_alive``: in older uvicorn versions (0.30 to
        # 0.45 at least) that flag only reflects the HTTP version.
        parser = getattr(self, "parser", None)
        if parser is None or not parser.should_keep_alive():
            return
        if cycle is not None and cycle.scope is self.scope and _cycle_supported(cycle):
            self.scope.setdefault("extensions", {})[EXTENSION] = RawResponder(cycle)


def with_fast_path(
    base: type[asyncio.Protocol] | str, app: DirectApp | None = None
) -> type[asyncio.Protocol] | str:
    """uvicorn's ``http`` setting with the fast path added: ``base`` must be uvicorn's httptools protocol
    or a subclass of it; anything else is returned unchanged (no fast path). ``app``: serve its direct
    requests (needs uvicorn's ``_start_asgi_task``; without it, none)."""
    if (
        HttpToolsProtocol is None
        or not isinstance(base, type)
        or not issubclass(base, HttpToolsProtocol)
    ):
        return base
    direct = app if DIRECT_SUPPORTED else None
    return type(
        base.__name__, (FastPathMixin, base), {"__doc__": base.__doc__, "direct_app": direct}
    )
