"""Connection-level limits uvicorn's httptools protocol does not enforce: header size and slow senders.

Out of the box, uvicorn + httptools accepts request lines and headers of any size (they are buffered in
memory until the blank line), and arms no timer on a fresh connection, nor while a request's headers or
body trickle in. One client could therefore hold memory without bound, or many connections open forever
by sending a byte now and then (slowloris). ``GuardedHttpToolsProtocol`` adds, per connection:

- ``max_header_bytes``: the request line and headers of one request. Past it the server answers 431
  ``Request Header Fields Too Large`` and closes the connection. Counted as bytes arrive, so a header sent
  byte by byte is cut off just as early as one sent at once.
- ``header_timeout``: from connecting (or from the first byte of the next keep-alive request) to the end of
  the headers. Past it the server answers 408 (or just closes, if nothing came) and closes.
- ``body_timeout``: the longest silence while a request body is still arriving. Past it the connection is
  closed; the handler sees a client disconnect and commits nothing. Time the server itself spends not
  reading (flow control, a slow disk) does not count.

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
    ServerConfig,
)

# Body bytes gathered before the handler is woken (and, past it, the socket paused).
BODY_BUFFER_BYTES = 4 * 1024 * 1024


class _HeadersTooLarge(Exception):
    pass


def _error_response(status: int, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"cache-control: no-store\r\n",
            b"x-content-type-options: nosniff\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS
    body_buffer_bytes: int = BODY_BUFFER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_headers = True
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_activity = 0.0
        self._body_pieces: list[bytes] = []  # body received, not yet handed to the cycle
        self._body_size = 0

    # -- connection ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._awaiting_headers:
            self._header_bytes += len(data)
            if self._header_timer is None:
                self._arm_header_timer()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadersTooLarge):
                self._headers_too_large()
            else:
                self._invalid()
            return
        except httptools.HttpParserError:
            self._invalid()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._awaiting_headers and self._header_bytes > self.max_header_bytes:
            self._headers_too_large()

    # -- parser callbacks ----------------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_header_timer()
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            raise _HeadersTooLarge  # surfaces from feed_data as HttpParserCallbackError
        self._body_pieces = []  # a body the last handler answered without reading is not this one's
        self._body_size = 0
        super().on_headers_complete()
        self._body_activity = self.loop.time()
        self._body_timer = self.loop.call_later(self.body_timeout, self._body_deadline)

    def on_body(self, body: bytes) -> None:
        # uvicorn's on_body, except for when the handler is woken (see the module docstring).
        self._body_activity = self.loop.time()
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
        self._cancel_body_timer()
        self._awaiting_headers = (
            True  # whatever arrives next is the next request's line and headers
        )
        self._header_bytes = 0
        self._hand_over_body()
        super().on_message_complete()

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

    def _close_with(self, status: int, code: str, message: str) -> None:
        self._awaiting_headers = False
        self._cancel_timers()
        if self.transport.is_closing():
            return
        if self._idle():
            self.transport.write(_error_response(status, code, message))
        self.transport.close()

    def _headers_too_large(self) -> None:
        self._close_with(
            431,
            "HEADERS_TOO_LARGE",
            f"the request line and headers exceed {self.max_header_bytes} bytes",
        )

    def _invalid(self) -> None:
        self._close_with(400, "BAD_REQUEST", "invalid HTTP request")

    def _header_deadline(self) -> None:
        self._header_timer = None
        if not self._awaiting_headers or self.transport.is_closing():
            return
        if self._header_bytes == 0 and self._idle():
            # Connected (or kept alive) and never started a request: nothing to answer.
            self._cancel_timers()
            self.transport.close()
            return
        self._close_with(
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
            self._body_activity = now  # we are not reading: the client is not the slow one
        idle = now - self._body_activity
        if idle < self.body_timeout:
            self._body_timer = self.loop.call_later(self.body_timeout - idle, self._body_deadline)
            return
        self.logger.info("closing a connection whose request body stalled for %.0f s", idle)
        self.transport.close()


def protocol_class(config: ServerConfig) -> type[GuardedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, with ``config``'s limits."""
    return type(
        "DurastreamHttpProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "max_header_bytes": config.max_header_bytes,
            "header_timeout": config.header_timeout_seconds,
            "body_timeout": config.body_timeout_seconds,
            # No more than one byte past the body limit: read_body refuses a body as it crosses it.
            "body_buffer_bytes": min(BODY_BUFFER_BYTES, config.max_body_bytes + 1),
        },
    )
