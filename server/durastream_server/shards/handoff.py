"""Handing a connection to the worker that owns its stream (decision 0009, ``--workers N``, option b).

A forward (``router.py``) costs the receiving worker a second trip through an HTTP stack for every
request (~+400 us of server CPU per small append). A steady producer keeps one connection to one
stream, so once its connection reaches the stream's owner every later request costs what a direct one
costs. So when a connection is *between requests* (no answer in progress, nothing queued or buffered,
``GuardedHttpToolsProtocol.at_request_boundary``) and the bytes just received start with a complete
request line naming a stream of another shard, the receiving worker passes the socket's file
descriptor, with those bytes (which no parser has seen), to the owner over the owner's hand-off socket
(``SCM_RIGHTS``), closes its own descriptor (no ``shutdown``: the owner's descriptor keeps the
connection open) and forgets the connection. The owner adopts it (``loop.connect_accepted_socket`` with
its own protocol factory) and feeds it those bytes before it reads anything from the socket, so the
connection is served as if the owner had accepted it: limits, timers, auth, the access log, metrics.

Why a separate socket and not a message on the forward socket: the forward socket is an HTTP server
(uvicorn reads it through a transport, which drops ancillary data), and a datagram (``SOCK_DGRAM``,
one per worker: ``<index>.handoff``) carries the descriptor and the bytes as one message, with no
connection between workers to keep or restore. The kernel queues a few datagrams per receiver
(``net.unix.max_dgram_qlen``); a full queue, an owner not bound (down, restarting) or any other send
error leaves the connection where it is, and the request is forwarded as before (and answered 503 if
the owner stays away). The send is non-blocking, so a slow owner never stalls the receiving worker.

Everything else stays with the forward: TLS connections (the TLS state lives in this process), the
worker's own Unix socket, a request arriving while an earlier one is being answered (pipelining), a
request line not complete in the bytes received, more than ``MAX_HANDOFF_BYTES`` received at once, and
anything not for a single stream (``__ds/``, ``/healthz``: answered here as before).

Ping-pong is bounded: a connection handed over ``h`` times is not handed again for the next
``COOLDOWN_REQUESTS * 2**(h-1)`` requests (at most ``MAX_COOLDOWN_REQUESTS``); its requests for other
shards are forwarded meanwhile. A client alternating between two shards on one connection thus moves
it a handful of times, not per request.

A hand-off in flight when the owner is SIGKILLed (sent, not yet adopted) loses that connection, as a
connection in a killed worker's accept queue is lost: the client sees it close before any answer and
retries (idempotent producers dedup the retry).
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Final

from durastream_server.shards.router import ShardRouter

logger = logging.getLogger(__name__)

# At most this many bytes received ride with a descriptor (a datagram, bounded by the socket buffers);
# past it the request is forwarded (a large body's first read).
MAX_HANDOFF_BYTES: Final = 64 * 1024
COOLDOWN_REQUESTS: Final = 8
MAX_COOLDOWN_REQUESTS: Final = 1024
_SEND_BUFFER_BYTES: Final = 1024 * 1024
# ``DSH1``, then the number of times the connection has been handed over (this time included).
_HEADER: Final = struct.Struct("!4sI")
_MAGIC: Final = b"DSH1"
_MAX_MESSAGE: Final = _HEADER.size + MAX_HANDOFF_BYTES
_MAX_REQUEST_LINE: Final = 8 * 1024  # a longer line is not looked at (forwarded; the owner decides)
_INT_SIZE: Final = array.array("i").itemsize


def handoff_path(directory: Path, index: int) -> Path:
    """Worker ``index``'s hand-off socket (a datagram socket beside its forward socket)."""
    return directory / f"{index}.handoff"


def cooldown(hops: int) -> int:
    """Requests a connection handed over ``hops`` times serves where it is before it may move again."""
    return min(MAX_COOLDOWN_REQUESTS, COOLDOWN_REQUESTS << min(hops - 1, 16))


def request_path(data: bytes) -> bytes | None:
    """The raw path (no query) of the origin-form request line ``data`` starts with, as uvicorn puts
    it in ``scope["raw_path"]``; None when the line is not complete or not of that simple form (the
    parser then sees the bytes as usual)."""
    end = data.find(b"\r\n", 0, _MAX_REQUEST_LINE)
    if end <= 0:
        return None
    method_end = data.find(b" ", 0, end)
    if method_end <= 0:
        return None
    target_end = data.find(b" ", method_end + 1, end)
    if target_end < 0 or data[method_end + 1 : method_end + 2] != b"/":
        return None
    target = data[method_end + 1 : target_end]
    query = target.find(b"?")
    path = target if query < 0 else target[:query]
    return None if b"#" in path else path


Factory = Callable[[bytes, int], asyncio.Protocol]


class HandOff:
    """One worker's side of connection hand-off: sends connections to their owners, adopts its own."""

    def __init__(self, router: ShardRouter) -> None:
        self.router = router
        self._directory = router.socket_dir
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender.setblocking(False)
        self._sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER_BYTES)
        self._receiver: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._factory: Factory | None = None
        self._adopting: set[asyncio.Task[None]] = set()
        # /healthz "shard": connections handed to another worker, adopted from one, and hand-offs
        # that could not be sent (the request was forwarded instead).
        self.handed_off = 0
        self.adopted = 0
        self.refused = 0
        router.handoff = self

    # -- sending --------------------------------------------------------------------------------------

    def owner_of(self, raw_path: bytes) -> int | None:
        # A fork placed in another shard stays with its home, which forwards it (forks.py).
        return self.router.owner_elsewhere(raw_path, placed=False)

    def send(self, owner: int, fd: int, data: bytes, hops: int) -> bool:
        """Pass connection ``fd`` and the bytes received on it to ``owner``; False: not sent (the
        connection stays here, untouched)."""
        address = str(handoff_path(self._directory, owner))
        try:
            self._sender.sendmsg(
                [_HEADER.pack(_MAGIC, hops), data],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
                0,
                address,
            )
        except OSError as exc:  # not bound (down), queue full, too large: forward instead
            self.refused += 1
            logger.debug("connection hand-off to shard %d not sent (%s): forwarding", owner, exc)
            return False
        self.handed_off += 1
        return True

    # -- adopting -------------------------------------------------------------------------------------

    def listen(self, loop: asyncio.AbstractEventLoop, factory: Factory) -> None:
        """Bind this worker's hand-off socket and adopt what arrives on it with ``factory(data, hops)``
        (a protocol that is fed ``data`` before it reads the socket)."""
        path = handoff_path(self._directory, self.router.index)
        path.unlink(missing_ok=True)  # left by a predecessor that was killed
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            receiver.bind(str(path))
            receiver.setblocking(False)
        except BaseException:
            receiver.close()
            raise
        self._receiver, self._loop, self._factory = receiver, loop, factory
        loop.add_reader(receiver.fileno(), self._readable)

    def _readable(self) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        while True:
            try:
                message, ancillary, flags, _ = receiver.recvmsg(
                    _MAX_MESSAGE, socket.CMSG_SPACE(_INT_SIZE)
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                logger.exception("the connection hand-off socket failed")
                return
            fds = _descriptors(ancillary)
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                logger.error("dropped a malformed connection hand-off (flags %#x)", flags)
                continue
            header, data = message[: _HEADER.size], message[_HEADER.size :]
            if len(header) != _HEADER.size or header[:4] != _MAGIC:
                os.close(fds[0])
                logger.error("dropped a connection hand-off of another format")
                continue
            hops = _HEADER.unpack(header)[1]
            assert self._loop is not None
            task = self._loop.create_task(self._adopt(fds[0], data, hops))
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def _adopt(self, fd: int, data: bytes, hops: int) -> None:
        assert self._loop is not None and self._factory is not None
        try:
            conn = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            logger.exception("could not adopt a handed-over connection")
            return
        factory = self._factory
        try:
            conn.setblocking(False)
            await self._loop.connect_accepted_socket(lambda: factory(data, hops), conn)
        except Exception:
            conn.close()
            logger.exception("could not adopt a handed-over connection")
            return
        self.adopted += 1

    def close(self) -> None:
        """Stop adopting (server shutdown: uvicorn is about to close the connections it knows)."""
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            if self._loop is not None:
                self._loop.remove_reader(receiver.fileno())
            receiver.close()
        self._sender.close()

    def describe(self) -> dict[str, int]:
        return {
            "handed_off": self.handed_off,
            "adopted": self.adopted,
            "handoff_refused": self.refused,
        }


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _INT_SIZE
            fds.extend(array.array("i", payload[:usable]))
    return fds


class HandOffMixin:
    """Mixed in before the server's protocol (``http/guard.py`` with ``http/fastpath.py``): hands the
    connection over at a request boundary (module docstring), and serves an adopted one."""

    handoff: ClassVar[HandOff | None] = None
    transport: Any
    scheme: Any
    _handoff_able = False  # a plain TCP connection (not TLS, not a worker's Unix socket)
    _handoff_hops = 0  # times this connection was handed over
    _handoff_wait = 0  # requests to serve here before it may move again
    _handoff_prefix: bytes | None = None  # bytes received by the worker that handed it over
    _last_path: bytes | None = None  # the last request path looked up, and its owner elsewhere
    _last_owner: int | None = None

    def adopt(self, data: bytes, hops: int) -> None:
        """This protocol is for a connection handed over ``hops`` times; ``data`` is what the worker
        that handed it over had received (fed in ``connection_made``, before the socket is read)."""
        self._handoff_prefix = data
        self._handoff_hops = hops
        self._handoff_wait = cooldown(hops)

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        sock = transport.get_extra_info("socket")
        self._handoff_able = (
            self.handoff is not None
            and self.scheme == "http"
            and sock is not None
            and sock.family in (socket.AF_INET, socket.AF_INET6)
        )
        prefix = self._handoff_prefix
        if prefix is not None:
            self._handoff_prefix = None
            if prefix:
                self.data_received(prefix)

    def data_received(self, data: bytes) -> None:
        if self._handoff_able and self.at_request_boundary():  # type: ignore[attr-defined]
            if self._handoff_wait:
                self._handoff_wait -= 1
            elif self._hand_off(data):
                return
        super().data_received(data)  # type: ignore[misc]

    def _hand_off(self, data: bytes) -> bool:
        """Pass the connection to the owner of the stream ``data``'s request names; False: it stays."""
        path = request_path(data)
        if path is None:
            return False
        if path == self._last_path:
            owner = self._last_owner
        else:
            assert self.handoff is not None
            owner = self.handoff.owner_of(path)
            self._last_path, self._last_owner = path, owner
        if owner is None or len(data) > MAX_HANDOFF_BYTES:
            return False
        transport = self.transport
        if transport.get_write_buffer_size() or transport.is_closing():
            return False
        assert self.handoff is not None
        fd = transport.get_extra_info("socket").fileno()
        if not self.handoff.send(owner, fd, data, self._handoff_hops + 1):
            return False
        # The owner holds the connection now: close this descriptor only (nothing written, no
        # shutdown), so the client sees nothing.
        transport.close()
        return True


def with_handoff(base: type[asyncio.Protocol] | str, handoff: HandOff | None) -> Any:
    """uvicorn's ``http`` setting with hand-off mixed in (``base`` must be the server's protocol class:
    ``http/guard.py``'s, with its ``at_request_boundary``); ``base`` itself when ``handoff`` is None."""
    if handoff is None or not isinstance(base, type) or not hasattr(base, "at_request_boundary"):
        return base
    return type(base.__name__, (HandOffMixin, base), {"__doc__": base.__doc__, "handoff": handoff})
