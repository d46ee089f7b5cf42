"""Which worker serves a request, and forwarding to it (decision 0009, ``--workers N``, step 3 option a).

Every worker listens on the public port (``SO_REUSEPORT``: the kernel spreads *connections*) and on its
own Unix socket (``socket_path``). A request for a stream of another shard is forwarded, bytes in and
bytes out, over a kept-open HTTP/1.1 connection to the owner's Unix socket, and the owner's answer is
relayed as it arrives (long-polls wait in the owner; SSE frames stream through). The owner does
everything else (auth, CORS, request id, metrics, the access log), so forwarding is transparent: the
receiving worker only classifies the request path to find the owner.

Option (b), handing the connection itself to the owner (``SCM_RIGHTS``, ``handoff.py``), lets a steady
producer pay the forward once: between requests, a connection whose next request names another shard's
stream moves to its owner. What cannot move (TLS, pipelined requests, a request line not yet complete,
an owner not answering, a connection moved recently) is forwarded here.

The listing (``__ds/x-durastream/streams``), the change feed (``.../changes``, ``.../selections``) and
multi-range reads (``.../reads``, ``.../lookups``) are served by the worker that receives them, which
asks every other worker for its shard's part (``fetch``) and merges them (``fanout.py``,
``changefeed.py``, ``multirange.py``), and so are ``bulk-write``'s ``ensure`` and ``commits`` (split
by shard: ``bulkwrite.py``, ``stages`` included). Staged appends need nothing more: a handle belongs
to the one stream it was staged into, so a stage, a commit and an abort are requests of that stream,
forwarded (or handed off) to its owner like any other. A subscription's requests are forwarded to the
worker owning it, ``shard_of(id)``, which follows the other shards' streams (``subscriptions.py``).
Any other ``__ds/`` resource across streams is answered 501 by every worker. A fork lives in its
source's shard: its home (the shard its path hashes to) records where and forwards there
(``forks.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from durastream_server.errors import (
    NotWithWorkers,
    ProtocolError,
    ShardUnavailable,
)
from durastream_server.http import discovery, paths, responses
from durastream_server.shards import forks, internal
from durastream_server.shards.layout import shard_of
from durastream_server.shards.subscriptions import subscription_owner

if TYPE_CHECKING:
    from durastream_server.auth import AuthToken
    from durastream_server.shards.forks import ForkPlacements, PlacementFiles
    from durastream_server.shards.handoff import HandOff
    from durastream_server.shards.internal import InternalCredential

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

FLAG: Final = "--workers"
# How long a forward waits for the owner's socket to accept (a restarted worker binds it before it
# recovers its shard); past it the client gets 503 with Retry-After.
OWNER_WAIT_SECONDS: Final = 10.0
_RETRY_PAUSE_SECONDS: Final = 0.05
# Headers of one hop, not forwarded either way (RFC 9110 section 7.6.1): the relaying worker's own HTTP
# stack frames the answer to its client.
_HOP_BY_HOP: Final = frozenset(
    (b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"proxy-connection")
)
_FORKED_FROM: Final = b"stream-forked-from"
# Never relayed from a client: the workers' credential and marks count only from a worker.
_NOT_RELAYED: Final = _HOP_BY_HOP | {
    internal.HEADER.encode(),
    forks.PLACED_HEADER.encode(),
    forks.PLACEMENT_HEADER.encode(),
}
_PLACED: Final = forks.PLACED_HEADER.encode()
_PLACEMENT: Final = forks.PLACEMENT_HEADER.encode()
_STREAM_PREFIX: Final = paths.STREAM_PREFIX.encode()
# ``__ds/`` resources served with N > 1: the extension document (this worker's, which every worker
# shares), the listing (every shard's page, merged: fanout.py) and the change feed and its selections
# (every shard's part: changefeed.py).
_SERVED_ACROSS: Final = frozenset(
    (
        "x-durastream/extensions",
        "x-durastream/streams",
        "x-durastream/changes",
        "x-durastream/selections",
        "x-durastream/ensure",  # bulk-write, split by shard (bulkwrite.py)
        "x-durastream/stages",
        "x-durastream/commits",
        "x-durastream/reads",
        "x-durastream/lookups",
    )
)
_READ_BYTES: Final = 64 * 1024
# Idle connections kept open to each other shard (one is opened per concurrently forwarded request).
_POOL_SIZE: Final = 32
# Pooled connections idle longer are dropped: well under uvicorn's keep-alive timeout (5 s by default).
_IDLE_SECONDS: Final = 2.0


def socket_path(directory: Path, index: int) -> Path:
    """Worker ``index``'s Unix socket, where the other workers forward its streams' requests."""
    return directory / f"{index}.sock"


class _Upstream:
    """One kept-open HTTP/1.1 connection to another worker's Unix socket."""

    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def close(self) -> None:
        self.writer.close()

    def alive(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def fresh(self) -> bool:
        """Alive and idle for less than ``_IDLE_SECONDS``: the owner (uvicorn) closes a connection
        idle for its keep-alive timeout, and a request written as it does so would fail unanswered."""
        return self.alive() and time.monotonic() - self.idle_since < _IDLE_SECONDS


class ShardRouter:
    """Per request: served here, refused under the flag, or forwarded to the owning worker."""

    def __init__(self, index: int, count: int, socket_dir: Path, *, tls: bool = False) -> None:
        self.index = index
        self.count = count
        self.socket_dir = socket_dir
        self._public_scheme = "https" if tls else "http"
        self._idle: dict[int, list[_Upstream]] = {k: [] for k in range(count)}
        self.forwarded = 0  # requests relayed to another worker (/healthz "shard")
        self.handoff: HandOff | None = None  # set by HandOff (connection hand-off, handoff.py)
        # The workers' own credential (``internal.py``), with --auth-token: presented by this worker's
        # own requests to the others, accepted only over its Unix socket. None without tokens.
        self.internal: InternalCredential | None = None
        # Forks whose path hashes to this shard but which live in their source's (forks.py), and
        # whether this worker's engine holds a path (set by the backend once its engine is open).
        self.placements: ForkPlacements | None = None
        self.hosts: Callable[[str], bool] | None = None
        # The engine's per-path create lock (``Engine.creating``), held by a fork's placement so that
        # a plain create of the same path at its home is serialised with it (set with ``hosts``).
        self.creating: Callable[[str], AbstractAsyncContextManager[None]] | None = None
        self.placement_files: PlacementFiles | None = None  # every shard's table (forks.py)

    # -- placement ------------------------------------------------------------------------------------

    def owner_for(self, scope: Scope) -> int | None:
        """``owner_elsewhere`` of ``scope``'s path, unless another worker placed it here (a fork's
        home forwarding to the shard holding it, ``forks.py``): served here then."""
        if self.from_worker(scope.get("server")) and any(
            name == _PLACED for name, _ in scope["headers"]
        ):
            return None
        return self.owner_elsewhere(scope["raw_path"])

    def owner_elsewhere(self, raw_path: bytes, *, placed: bool = True) -> int | None:
        """The other shard owning the stream at ``raw_path``; None when this worker serves it (its own
        stream, or anything not a stream: those answer here, e.g. 400 for a bad path). A fork held
        here although its path hashes elsewhere is served here; one whose path hashes here but which
        lives in another shard goes there (``forks.py``), unless not ``placed`` (the hand-off: the
        connection stays with the fork's home, which forwards)."""
        if not raw_path.startswith(_STREAM_PREFIX):
            return None
        try:
            target = paths.route(raw_path)
        except paths.InvalidPath:
            return None
        if target.kind is paths.RouteKind.SUBSCRIPTIONS:
            # A subscription's requests go to its owner (shards/subscriptions.py).
            shard = subscription_owner(target.target, self.count)
        elif target.kind is paths.RouteKind.STREAM:
            shard = shard_of(target.target, self.count)
            if shard != self.index:
                return None if self.hosts is not None and self.hosts(target.target) else shard
            where = self.placements.get(target.target) if placed and self.placements else None
            return None if where is None or where == self.index else where
        else:
            return None
        return None if shard == self.index else shard

    def as_received(self, scope: Scope) -> None:
        """Give a request forwarded by another worker the scheme its client used. It came over this
        worker's Unix socket (uvicorn gives such a request no server port, ``(path, None)``, or no
        server address at all, depending on its version), as plain HTTP, but its client reached the public listener, which
        speaks TLS when the server does: answers that name URLs (a create's ``Location``) must say
        https then."""
        if self.from_worker(scope.get("server")):
            scope["scheme"] = self._public_scheme

    def direct_allowed(self, method: str, scope: Scope) -> bool:
        """Whether the direct path (``http/fastpath.py``) may serve ``scope`` here: not another shard's
        stream (forwarded by ``__call__``), not a fork create (placed by ``__call__``: forks.py)."""
        if self.owner_for(scope) is not None:
            return False
        return method != "PUT" or all(name != _FORKED_FROM for name, _ in scope["headers"])

    def refuse_unsupported(
        self, method: str, target: paths.Route, headers: Mapping[str, str]
    ) -> None:
        """Raise for what a server with ``--workers`` > 1 does not serve yet (each worker sees only its
        own shard's streams): a 501 naming the flag."""
        if target.kind is paths.RouteKind.SUBSCRIPTIONS and target.target not in _SERVED_ACROSS:
            if not discovery.owns(target.target):  # subscriptions, jwks.json: their owner serves
                return
            raise NotWithWorkers(
                "this resource spans many streams, which a "
                f"server started with {FLAG} {self.count} does not serve yet; start the server with "
                f"{FLAG} 1 for it"
            )

    # -- forks across shards (forks.py) ---------------------------------------------------------------

    def fork_source(self, scope: Scope) -> tuple[str, str] | None:
        """``(fork path, source path)`` of a fork create this worker is the home of and does not
        hold: where it goes is decided here (``fork_destination``). None for anything else (a bad
        header is answered 400 by the ordinary path)."""
        if scope["method"] != "PUT" or self.placements is None:
            return None
        value = next((v for name, v in scope["headers"] if name == _FORKED_FROM), None)
        if value is None:
            return None
        try:
            target = paths.route(scope["raw_path"])
            source = paths.forked_from_path(value.decode("latin-1"))
        except paths.InvalidPath:
            return None
        if target.kind is not paths.RouteKind.STREAM:
            return None
        path = target.target
        if shard_of(path, self.count) != self.index or (self.hosts and self.hosts(path)):
            return None  # not its home, or the path exists here: its engine compares (409 or 200)
        return path, source

    async def fork_destination(self, path: str, source: str) -> int | None:
        """The shard a fork of ``source`` at ``path`` is created in (its source's), recorded in the
        placement table before it is returned; None: here. ``ShardUnavailable`` (503) when a worker
        that must be asked does not answer."""
        assert self.placements is not None
        where = await self.location(source)
        # Under the path's create lock, as every create of it here: a plain PUT of the path either
        # made it here first (then this engine answers the fork, 409 or 200, as one process) or
        # finds the placement once it gets the lock (``Engine.placed_elsewhere``) and is forwarded.
        async with self.creating(path) if self.creating else contextlib.nullcontext():
            if self.hosts is not None and self.hosts(path):
                return None
            placed = self.placements.get(path)
            if placed is not None and placed != where and await self._holds(placed, path):
                return placed  # the path exists there: that engine answers the create
            if where == self.index:
                if placed is None or placed == self.index:
                    return None
                return await self._placed(path, where)
            return await self._placed(path, where)

    def placed_elsewhere(self, path: str) -> int | None:
        """The other shard this home placed ``path`` in (``Engine.placed_elsewhere``), else None."""
        where = self.placements.get(path) if self.placements is not None else None
        return None if where is None or where == self.index else where

    async def _placed(self, path: str, shard: int) -> int | None:
        assert self.placements is not None
        await self.placements.place(path, shard)
        return None if shard == self.index else shard

    def shard_holding(self, path: str) -> int:
        """The shard holding ``path``, read from its home's table file (a subscription's link, a
        wake stream)."""
        return self.holders()(path)

    def holders(self) -> Callable[[str], int]:
        """Path -> the shard holding it, from every shard's table as it is now (its file ``stat``ed
        once here): how a request naming many streams is split (``bulkwrite.py``,
        ``multirange.py``, ``changefeed.py``)."""
        count = self.count
        files = self.placement_files
        if files is None:
            return lambda path: shard_of(path, count)
        tables = [
            self.placements.where if k == self.index and self.placements else files.table(k)
            for k in range(count)
        ]

        def holder(path: str) -> int:
            home = shard_of(path, count)
            return tables[home].get(path, home)

        return holder

    async def location(self, path: str) -> int:
        """The shard holding (or to hold) the stream at ``path``: its home's placement table."""
        home = shard_of(path, self.count)
        if home == self.index:
            placed = self.placements.get(path) if self.placements is not None else None
            return home if placed is None else placed
        status, body = await self.fetch(home, _stream_request(b"GET", path, _PLACEMENT))
        if status != 200 or not body.isdigit():
            raise _unavailable(home)
        return int(body)

    async def _holds(self, shard: int, path: str) -> bool:
        """Whether ``shard``'s worker has a stream at ``path`` (a HEAD there, placed)."""
        if shard == self.index:
            return bool(self.hosts and self.hosts(path))
        head = _stream_request(b"HEAD", path, _PLACED)[:-2] + self.credential_line() + b"\r\n"
        status, _ = await self.fetch(shard, head, method_head=True)
        if status >= 500:
            raise _unavailable(shard)
        return status != 404

    def placement_query(self, scope: Scope) -> bool:
        """Whether ``scope`` is another worker asking where a path homed here lives."""
        return self.from_worker(scope.get("server")) and any(
            name == _PLACEMENT for name, _ in scope["headers"]
        )

    async def answer_placement(self, scope: Scope, send: Send) -> None:
        try:
            target = paths.route(scope["raw_path"])
        except paths.InvalidPath:
            target = None
        if target is None or target.kind is not paths.RouteKind.STREAM:
            await responses.send_response(send, 400, [], b"")
            return
        body = str(await self.location(target.target)).encode()
        await responses.send_response(send, 200, [("content-type", "text/plain")], body)

    async def refuse(self, scope: Scope, send: Send, exc: ProtocolError) -> None:
        await _refuse(scope, send, exc)

    def from_worker(self, server: tuple[str, int | None] | None) -> bool:
        """Whether a request with this ASGI ``server`` came over this worker's Unix socket (from
        another worker), not from the public port: uvicorn gives such a request no server port, or no
        server address at all, depending on its version."""
        return server is None or server[1] is None

    def internal_token(self, headers: Mapping[str, str], server: Any) -> AuthToken | None:
        """What a request presenting the workers' credential (``internal.HEADER``) is authorized as,
        when it came over this worker's Unix socket from another worker; None otherwise (over TCP it
        is nothing: the request needs a configured token like any other)."""
        presented = headers.get(internal.HEADER)
        if presented is None or self.internal is None or not self.from_worker(server):
            return None
        return internal.TOKEN if self.internal.matches(presented) else None

    def credential_line(self) -> bytes:
        """The header line presenting the workers' credential on a request of this worker's own to
        another (no client's token to carry); empty without ``--auth-token``."""
        return b"" if self.internal is None else self.internal.header_line()

    def describe(self) -> dict[str, int]:
        described = {"index": self.index, "count": self.count, "forwarded": self.forwarded}
        if self.handoff is not None:
            described.update(self.handoff.describe())
        return described

    # -- forwarding -----------------------------------------------------------------------------------

    async def forward(self, owner: int, scope: Scope, receive: Receive, send: Send) -> None:
        """Relay ``scope``'s request to ``owner``'s worker and its answer back, as it arrives."""
        try:
            upstream = await self._take(owner)
        except OSError as exc:
            logger.warning("the worker of shard %d is not answering (%s): 503", owner, exc)
            await _refuse(scope, send, _unavailable(owner))
            return
        self.forwarded += 1
        watcher: asyncio.Task[None] | None = None
        placed = self._placed_elsewhere(scope["raw_path"], owner)
        answer = _Answer(upstream.reader, send, head=scope["method"] == "HEAD")
        try:
            await _send_request(upstream, scope, receive, placed=placed)
            if scope["method"] == "GET":  # a long-poll or SSE may wait: stop it if the client goes
                watcher = asyncio.get_running_loop().create_task(
                    _close_on_disconnect(receive, upstream)
                )
            keep = await answer.relay()
        except _RELAY_ERRORS as exc:
            upstream.close()
            if not answer.started:
                logger.warning(
                    "the worker of shard %d dropped a forwarded request (%s)", owner, exc
                )
                await _refuse(scope, send, _unavailable(owner))
            return
        except BaseException:
            upstream.close()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        self._release(owner, upstream, keep)

    def _placed_elsewhere(self, raw_path: bytes, owner: int) -> bool:
        """Whether a request for ``raw_path`` goes to ``owner`` as a placed fork's (``forks.py``):
        ``owner`` is not its home."""
        try:
            target = paths.route(raw_path)
        except paths.InvalidPath:
            return False
        return (
            target.kind is paths.RouteKind.STREAM and shard_of(target.target, self.count) != owner
        )

    async def fetch(
        self, owner: int, head: bytes, *, once: bool = False, method_head: bool = False
    ) -> tuple[int, bytes]:
        """Send ``head`` (a complete request, its body included) to ``owner``'s worker: its answer's status and
        whole body (a fan-out's part, ``fanout.py``). A kept-open connection that fails (the owner
        restarted since it was pooled) is retried once on a new one; ``ShardUnavailable`` (503) when
        the owner does not answer. ``once``: one attempt, no retry, so a failure is reported at
        once (a follower of the owner's change feed, ``subscriptions.py``, whose pooled connection
        was in use a moment ago: one that fails means the owner went away)."""
        for pooled in (True,) if once else (True, False):
            try:
                upstream = await self._take(owner, pooled=pooled)
            except OSError as exc:
                logger.warning("the worker of shard %d is not answering (%s): 503", owner, exc)
                raise _unavailable(owner) from None
            collected = _Collected()
            try:
                upstream.writer.write(head)
                await upstream.writer.drain()
                keep = await _Answer(upstream.reader, collected.send, head=method_head).relay()
            except _RELAY_ERRORS as exc:
                upstream.close()
                if pooled and not once:
                    continue
                logger.warning("the worker of shard %d dropped a fan-out request (%s)", owner, exc)
                raise _unavailable(owner) from None
            except BaseException:
                upstream.close()
                raise
            self._release(owner, upstream, keep)
            return collected.status, b"".join(collected.body)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _release(self, owner: int, upstream: _Upstream, keep: bool) -> None:
        """Pool ``upstream`` for the next request to ``owner`` if it may carry one, else close it."""
        if keep and upstream.alive() and len(self._idle[owner]) < _POOL_SIZE:
            upstream.idle_since = time.monotonic()
            self._idle[owner].append(upstream)
        else:
            upstream.close()

    async def _take(self, owner: int, *, pooled: bool = True) -> _Upstream:
        """A kept-open connection to ``owner`` (unless not ``pooled``), else a new one (waiting up to
        ``OWNER_WAIT_SECONDS`` for a restarting worker's socket)."""
        idle = self._idle[owner]
        while pooled and idle:
            upstream = idle.pop()
            if upstream.fresh():
                return upstream
            upstream.close()
        path = str(socket_path(self.socket_dir, owner))
        deadline = time.monotonic() + OWNER_WAIT_SECONDS
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(path)
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(_RETRY_PAUSE_SECONDS)
                continue
            return _Upstream(reader, writer)

    async def close(self) -> None:
        for idle in self._idle.values():
            for upstream in idle:
                upstream.close()
            idle.clear()


def _stream_request(method: bytes, path: str, mark: bytes) -> bytes:
    """A bodiless request for the stream at ``path``, marked with ``mark`` (a worker's own)."""
    target = (paths.STREAM_PREFIX + quote(path, safe="/")).encode()
    return method + b" " + target + b" HTTP/1.1\r\nhost: localhost\r\n" + mark + b": 1\r\n\r\n"


async def _send_request(
    upstream: _Upstream, scope: Scope, receive: Receive, *, placed: bool = False
) -> None:
    """Write the request as the client sent it, less hop-by-hop headers; a chunked body is re-chunked.
    (httptools already refused malformed names and values, so the lines need no checking here.)"""
    target = scope["raw_path"]
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    parts = [scope["method"].encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    chunked = has_host = False
    for name, value in scope["headers"]:
        if name in _NOT_RELAYED:
            chunked = chunked or name == b"transfer-encoding"
            continue
        has_host = has_host or name == b"host"
        parts += (name, b": ", value, b"\r\n")
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    if not has_host:
        parts.append(b"host: localhost\r\n")  # HTTP/1.1 needs one; an HTTP/1.0 client may omit it
    if placed:
        parts.append(_PLACED + b": 1\r\n")
    parts.append(b"\r\n")
    writer = upstream.writer
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("the client left before its request was forwarded")
        body = message.get("body", b"")
        if body:
            parts.append(b"%x\r\n%b\r\n" % (len(body), body) if chunked else body)
        if not message.get("more_body", False):
            break
        writer.write(b"".join(parts))  # a large body goes on as it arrives
        parts = []
        await writer.drain()
    if chunked:
        parts.append(b"0\r\n\r\n")
    writer.write(b"".join(parts))  # a small request: one write
    await writer.drain()


# A worker that dies or closes mid-exchange, or answers something unparseable.
_RELAY_ERRORS = (OSError, EOFError, asyncio.LimitOverrunError, ValueError)


class _Answer:
    """Relays the owner's HTTP/1.1 answer from ``reader`` to the client's ``send``: its head (less
    hop-by-hop headers: the client's connection frames the body itself), then its body as it arrives
    (Content-Length, chunked, or until the owner closes). Our own server is the only peer, so only the
    framings it sends are handled."""

    __slots__ = ("_reader", "_send", "_head", "started")

    def __init__(self, reader: asyncio.StreamReader, send: Send, *, head: bool) -> None:
        self._reader = reader
        self._send = send
        self._head = head  # the request was HEAD: no body follows whatever the headers say
        self.started = False

    async def relay(self) -> bool:
        """Relay one answer; whether the upstream connection may carry another request."""
        reader = self._reader
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head[:-4].split(b"\r\n")
            status = int(status_line.split(b" ", 2)[1])
            if status >= 200:
                break  # 1xx (100 Continue) is for the client's stack, which has its own
        headers: list[tuple[bytes, bytes]] = []
        length: int | None = None
        chunked = close = False
        for line in lines:
            raw_name, _, raw_value = line.partition(b":")
            name, value = raw_name.strip().lower(), raw_value.strip()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
            if name not in _HOP_BY_HOP:
                headers.append((name, value))
        if close:
            headers.append((b"connection", b"close"))  # the owner asked the client to go
        send = self._send
        await send({"type": "http.response.start", "status": status, "headers": headers})
        self.started = True
        if self._head or status in (204, 304):
            await send({"type": "http.response.body", "body": b""})
        elif chunked:
            await self._chunks()
        elif length is not None and length <= _READ_BYTES:
            await send({"type": "http.response.body", "body": await reader.readexactly(length)})
        elif length is not None:
            await self._counted(length)
        else:
            await self._until_closed()
            return False
        return not close

    async def _chunks(self) -> None:
        reader, send = self._reader, self._send
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers: our server sends none
                break
            chunk = await reader.readexactly(size + 2)
            await send({"type": "http.response.body", "body": chunk[:-2], "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _counted(self, remaining: int) -> None:
        reader, send = self._reader, self._send
        while remaining:
            chunk = await reader.read(min(remaining, _READ_BYTES))
            if not chunk:
                raise ConnectionResetError("the owning worker closed the connection mid-answer")
            remaining -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": remaining > 0})

    async def _until_closed(self) -> None:
        reader, send = self._reader, self._send
        while chunk := await reader.read(_READ_BYTES):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


class _Collected:
    """An ASGI ``send`` that keeps an answer instead of sending it (``ShardRouter.fetch``)."""

    __slots__ = ("status", "body")

    def __init__(self) -> None:
        self.status = 0
        self.body: list[bytes] = []

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message.get("body"):
            self.body.append(message["body"])


async def _close_on_disconnect(receive: Receive, upstream: _Upstream) -> None:
    """When the client leaves while the owner still answers (a long-poll, SSE), drop the upstream
    connection so the owner stops too."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            upstream.close()
            return


async def _refuse(scope: Scope, send: Send, exc: ProtocolError) -> None:
    status, headers, body = responses.protocol_error_parts(exc)
    await responses.send_response(send, status, headers, body, head=scope["method"] == "HEAD")


def _unavailable(shard: int) -> ShardUnavailable:
    return ShardUnavailable(
        f"the worker of shard {shard} is not answering (restarting?); retry shortly",
        headers={"Retry-After": "1"},
    )
