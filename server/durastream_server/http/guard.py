"""Connection-level checks uvicorn's httptools protocol does not make: header size, slow senders, framing, Host.

Out of the box, uvicorn + httptools accepts request lines and headers of any size (they are buffered in
memory until the blank line), and arms no timer on a fresh connection, nor while a request's headers or
body trickle in. One client could therefore hold memory without bound, or many connections open forever
by sending a byte now and then (slowloris). ``GuardedHttpToolsProtocol`` adds, per connection:

- ``max_header_bytes``: the request line and headers of one request. Past it the server answers 431
  ``Request Header Fields Too Large`` and closes the connection. Counted as bytes arrive, so a header sent
  byte by byte is cut off just as early as one sent at once.
- ``header_timeout``: from connecting (or from the first byte of the next keep-alive request) to the end of
  the headers. Past it the server answers 408 (or just closes, if nothing came) and closes.
- ``body_timeout`` and ``min_body_rate``: a request body may fall silent for at most ``body_timeout``,
  and must arrive within ``body_timeout`` plus its size at ``min_body_rate`` (so a client trickling a byte
  now and then cannot hold a connection for long either). Past either the server answers 408 if the
  handler has not answered yet, and closes; the handler sees a client disconnect and commits nothing. The
  body of a request answered early (a 405 that never reads it) is timed the same way. Time the server
  itself spends not reading (flow control, a slow disk) does not count.
- ``host_policy``: which ``Host`` values are answered (``http/hosts.py``); others get 421 (or 400 for
  two ``Host`` headers), before any handler runs.

Requests whose framing the server will not trust get 400 and the connection is closed: whatever the
parser (llhttp) rejects, e.g. a bad chunk size, and every ``Transfer-Encoding`` but a single ``chunked``
(llhttp would accept ``gzip, chunked`` and hand over a body that is still gzip-coded). Every such error,
and every limit above, is answered with a status line and a JSON body whenever the request's handler has
not started its answer: the handler is cut off first (it sees a disconnect), and when earlier pipelined
requests are still being answered, the error waits for them. Only a request whose answer has already
started is closed without another status line: there is nothing left to say on that connection.

It also hands a request body to the application in one piece (``on_body``). uvicorn pauses the socket
and wakes the handler every 64 KiB, so a 1 MiB append took about sixteen pause/resume rounds and a join of
the pieces: with reading, about a sixth of the server's time on the sink's appends. Here a body up to
``BODY_BUFFER_BYTES`` is gathered and the handler is woken once, when it is complete; larger bodies still
go through flow control every ``BODY_BUFFER_BYTES``. The handler reads whole bodies anyway
(``body.py``), so this buffers nothing it would not have held. The pieces are kept as the parser hands
them over and joined once, at hand-off: growing one ``bytearray`` piece by piece reallocates and copies
what it holds again and again (that was 12% of the server's time on the sink's appends), and uvicorn's
``receive`` copies a ``bytearray`` once more into ``bytes``, where a ``bytes`` body passes as it is.

Everything else (parsing, keep-alive, pipelining, flow control) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from durastream_server.config import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MIN_BODY_BYTES_PER_SECOND,
    ServerConfig,
)
from durastream_server.http.hosts import ANY, HostPolicy
from durastream_server.timers import expired, time_left

# Body bytes gathered before the handler is woken (and, past it, the socket paused).
BODY_BUFFER_BYTES = 4 * 1024 * 1024
# uvicorn's ``on_response_complete`` as ``_response_complete`` restates it (0.50 and later: pipelined
# requests start through ``_start_asgi_task``). Other versions keep uvicorn's timer per response.
LAZY_KEEP_ALIVE = hasattr(HttpToolsProtocol, "_start_asgi_task")
_SHOWN_VALUE_CHARS = 100  # of a rejected header value, in the error message


class _Rejected(Exception):
    """Raised in a parser callback to answer with ``status`` and close; ``feed_data`` re-raises it as
    ``HttpParserCallbackError`` with this as its context."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _error_response(status: int, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"cache-control: no-store\r\n",
            b"x-content-type-options: nosniff\r\n",
            b"content-security-policy: sandbox\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def _check_transfer_coding(codings: list[bytes], http_version: str) -> None:
    """A body is framed by Content-Length or by exactly one ``chunked`` coding (HTTP/1.1): anything else
    (``codings``: the Transfer-Encoding header values) would hand the handler bytes it cannot interpret
    (RFC 9112 section 6.1: 400, then close)."""
    if len(codings) == 1 and codings[0].strip().lower() == b"chunked" and http_version == "1.1":
        return
    shown = b", ".join(codings).decode("latin-1")[:_SHOWN_VALUE_CHARS]
    raise _Rejected(
        400,
        "BAD_REQUEST",
        f"Transfer-Encoding {shown!r} (HTTP/{http_version}) is not supported: send a body with "
        "Content-Length, or with 'Transfer-Encoding: chunked' alone over HTTP/1.1",
    )


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS
    min_body_rate: int = DEFAULT_MIN_BODY_BYTES_PER_SECOND
    body_buffer_bytes: int = BODY_BUFFER_BYTES
    host_policy: HostPolicy = HostPolicy((ANY,))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_headers = True
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_activity = 0.0  # when body bytes last arrived
        self._rate_origin = 0.0  # when the body's rate clock (re)started
        self._rate_received = 0  # body bytes received since then
        self._body_pieces: list[bytes] = []  # body received, not yet handed to the cycle
        self._body_size = 0
        self._in_body = False  # ``self.cycle``'s headers are parsed and its body is not complete
        self._rejected = False  # an error answer is written or waiting: nothing more is parsed
        self._rejection: bytes | None = None  # that answer, while earlier responses are in flight
        self._in_message = False  # between a request's first byte and the end of its body
        self._idle_since: float | None = None  # when the connection last fell idle (keep-alive)

    # -- connection ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:  # the lazy one: uvicorn's call left it
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    # -- keep-alive ----------------------------------------------------------------------------------
    # uvicorn arms a keep-alive timer after every response and cancels it when the next request's
    # first bytes arrive: a timer made and cancelled per request (~1.8 us on uvloop, 2% of a small
    # append's server CPU, issue 17). Here the connection notes when it fell idle, and one timer, armed
    # only when none is, closes it once it has been idle for ``timeout_keep_alive`` (or re-arms for
    # the rest of that time): the same deadline, a timer per keep-alive period instead of per request.

    def _unset_keepalive_if_required(self) -> None:
        if LAZY_KEEP_ALIVE:
            self._idle_since = None  # busy: a request is arriving (or the connection is ending)
        else:
            super()._unset_keepalive_if_required()

    def _response_complete(self) -> None:
        """uvicorn's ``on_response_complete`` (0.50 and later), with the keep-alive timer lazy."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_deadline
            )

    def _keep_alive_deadline(self) -> None:
        self.timeout_keep_alive_task = None
        idle_since = self._idle_since
        if idle_since is None:
            return  # busy: armed again when its answer completes
        left = time_left(idle_since + self.timeout_keep_alive, self.loop.time())
        if left:  # never a re-arm for less than a clock tick (timers.py)
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_deadline)
        else:
            self.timeout_keep_alive_handler()

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return  # answered with an error and closing: the rest is not parsed
        self._unset_keepalive_if_required()
        if self._awaiting_headers:
            self._header_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            reason = exc.__context__
            if isinstance(reason, _Rejected):
                self._reject(reason.status, reason.code, reason.message)
            elif isinstance(reason, httptools.HttpParserError):  # e.g. parse_url on a bad target
                self._reject(400, "BAD_REQUEST", f"invalid HTTP request: {reason}")
            else:  # a fault of ours: logged, but the client still gets its answer
                self.logger.error("error while parsing a request", exc_info=reason)
                self._reject(400, "BAD_REQUEST", "invalid HTTP request")
            return
        except httptools.HttpParserError as exc:
            # llhttp's reasons are fixed texts ("Invalid character in chunk size"), never request bytes.
            self._reject(400, "BAD_REQUEST", f"invalid HTTP request: {exc}")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._awaiting_headers and self._header_bytes:
            if self._header_bytes > self.max_header_bytes:
                self._headers_too_large()
            elif self._header_timer is None:
                self._arm_header_timer()
        elif self._in_body and self._body_timer is None:
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_deadline)

    # -- parser callbacks ----------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True  # the parser holds bytes of a request (its first byte on)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_header_timer()
        size = len(self.url)
        hosts: list[bytes] = []
        codings: list[bytes] = []
        for name, value in self.headers:  # one pass: this runs for every request
            size += len(name) + len(value) + 4
            if name == b"host":
                hosts.append(value)
            elif name == b"transfer-encoding":
                codings.append(value)
        if size > self.max_header_bytes:
            raise _Rejected(*self._too_large())
        refusal = self.host_policy.refusal(hosts)
        if refusal is not None:
            raise _Rejected(*refusal)
        if codings:
            _check_transfer_coding(codings, self.parser.get_http_version())
        self._body_pieces = []  # a body the last handler answered without reading is not this one's
        self._body_size = 0
        previous = self.cycle
        super().on_headers_complete()
        self._in_body = self.cycle is not previous  # no new cycle for an upgrade
        now = self.loop.time()
        self._body_activity = self._rate_origin = now
        self._rate_received = 0

    def on_body(self, body: bytes) -> None:
        # uvicorn's on_body, except for when the handler is woken (see the module docstring).
        self._body_activity = self.loop.time()
        self._rate_received += len(body)
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        self._body_pieces.append(body)
        self._body_size += len(body)
        if self._body_size >= self.body_buffer_bytes:
            self._hand_over_body()
            self.flow.pause_reading()
            cycle.message_event.set()

    def _hand_over_body(self) -> None:
        """Join the gathered pieces onto what the cycle holds and has not passed to the handler yet."""
        pieces = self._body_pieces
        if pieces:
            if self.cycle is not None:
                held = self.cycle.body
                if held:
                    pieces.insert(0, held)  # joined below: bytes either way
                self.cycle.body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self._body_pieces = []
            self._body_size = 0

    def on_message_complete(self) -> None:
        self._in_message = False
        self._cancel_body_timer()
        self._in_body = False
        self._awaiting_headers = (
            True  # whatever arrives next is the next request's line and headers
        )
        self._header_bytes = 0
        self._hand_over_body()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        last = not self.pipeline  # no pipelined request waits behind the response just completed
        if LAZY_KEEP_ALIVE:
            self._response_complete()
        else:
            super().on_response_complete()
        if self._rejection is not None and last and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            self.transport.write(self._rejection)
            self.transport.close()

    # -- limits --------------------------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_deadline)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()

    def _idle(self) -> bool:
        """No response in progress on this connection, so a raw error response cannot interleave."""
        return self.cycle is None or self.cycle.response_complete

    def at_request_boundary(self) -> bool:
        """Between requests: no answer in progress or queued, and nothing of the next request received
        yet, so the bytes arriving now start a request and the connection holds no state of one
        (``shards/handoff.py`` may move the connection to another worker only here)."""
        return (
            not self._in_message
            and self._awaiting_headers
            and not self._rejected
            and not self.pipeline
            and self._idle()
            and not self.transport.is_closing()
        )

    def _reject(self, status: int, code: str, message: str) -> None:
        """Answer the request being parsed with an error and close the connection (module docstring)."""
        self._rejected = True
        self._awaiting_headers = False
        self._cancel_timers()
        if self.transport.is_closing():
            return
        failing = self.cycle if self._in_body else None  # None: the error is in a request's head
        self._in_body = False
        if failing is not None and self._dequeue(failing):
            earlier_in_flight = True  # it was waiting behind a request still being answered
        elif failing is not None:
            if failing.response_started:
                # Its answer is out or on its way: nothing more can be said on this connection.
                self.transport.close()
                return
            failing.disconnected = (
                True  # its handler sees a disconnect: commits nothing, sends nothing
            )
            failing.message_event.set()
            earlier_in_flight = False
        else:
            cycle = self.cycle
            earlier_in_flight = bool(self.pipeline) or (
                cycle is not None and not cycle.response_complete
            )
        response = _error_response(status, code, message)
        if earlier_in_flight:
            self._rejection = response  # written by on_response_complete after the last of them
            self.flow.pause_reading()
            return
        self.transport.write(response)
        self.transport.close()

    def _dequeue(self, cycle: Any) -> bool:
        """Take a pipelined request that has not started out of the queue; False if it is not queued."""
        for entry in self.pipeline:
            if entry[0] is cycle:
                self.pipeline.remove(entry)
                return True
        return False

    def _too_large(self) -> tuple[int, str, str]:
        return (
            431,
            "HEADERS_TOO_LARGE",
            f"the request line and headers exceed {self.max_header_bytes} bytes",
        )

    def _headers_too_large(self) -> None:
        self._reject(*self._too_large())

    def _header_deadline(self) -> None:
        self._header_timer = None
        if not self._awaiting_headers or self.transport.is_closing():
            return
        if self._header_bytes == 0 and self._idle():
            # Connected (or kept alive) and never started a request: nothing to answer.
            self._cancel_timers()
            self.transport.close()
            return
        self._reject(
            408,
            "REQUEST_TIMEOUT",
            f"the request line and headers did not arrive within {self.header_timeout:g} s",
        )

    def _body_deadline(self) -> None:
        self._body_timer = None
        if self.cycle is None or not self.cycle.more_body or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:
            # We are not reading: the client is not the slow one. Both clocks start again.
            self._body_activity = self._rate_origin = now
            self._rate_received = 0
        silent = now - self._body_activity
        elapsed = now - self._rate_origin
        allowed = self.body_timeout + self._rate_received / self.min_body_rate
        # Both limits to within a clock tick (timers.py): a timer that fires on its millisecond must
        # not re-arm for the float's last ulps.
        if expired(self._body_activity + self.body_timeout, now):
            self.logger.info("closing a connection whose request body stalled for %.0f s", silent)
            self._reject(
                408,
                "REQUEST_TIMEOUT",
                f"no request body bytes arrived for {silent:.0f} s (--body-timeout-seconds)",
            )
        elif expired(self._rate_origin + allowed, now):
            rate = self._rate_received / elapsed
            self.logger.info("closing a connection whose request body arrived at %.0f B/s", rate)
            self._reject(
                408,
                "REQUEST_TIMEOUT",
                f"the request body arrived at {rate:.0f} bytes/s after the first "
                f"{self.body_timeout:g} s; the minimum is {self.min_body_rate} bytes/s "
                "(--min-body-bytes-per-second)",
            )
        else:
            wake = min(self._body_activity + self.body_timeout, self._rate_origin + allowed)
            self._body_timer = self.loop.call_later(wake - now, self._body_deadline)


def protocol_class(config: ServerConfig) -> type[GuardedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, with ``config``'s limits."""
    return type(
        "DurastreamHttpProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "max_header_bytes": config.max_header_bytes,
            "header_timeout": config.header_timeout_seconds,
            "body_timeout": config.body_timeout_seconds,
            "min_body_rate": config.min_body_bytes_per_second,
            # No more than one byte past the body limit: read_body refuses a body as it crosses it.
            "body_buffer_bytes": min(BODY_BUFFER_BYTES, config.max_body_bytes + 1),
            "host_policy": HostPolicy.for_server(config.allowed_hosts, config.host),
        },
    )
