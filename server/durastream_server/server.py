"""Wiring and running: DataDir -> Engine -> SubscriptionService -> ASGI app, served by uvicorn.

The data directory is opened in the ASGI lifespan startup, which uvicorn runs *before* it accepts
connections, and closed in the lifespan shutdown, which it runs *after* in-flight requests have finished.
So no request ever meets a half-open or already-closed store.

Shutdown (SIGTERM or SIGINT): uvicorn stops accepting; our ``Server.shutdown`` override first releases
parked long-polls (they answer 204 as at a timeout) and ends SSE streams, in-flight appends finish, then
the lifespan shutdown closes subscriptions, engine and storage, in that order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import importlib.util
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from durastream_server import extensions
from durastream_server.config import ServerConfig
from durastream_server.engine.engine import Engine
from durastream_server.engine.txnapi import TxnLimits
from durastream_server.http import fastpath, responses
from durastream_server.http.app import DurastreamApp
from durastream_server.http.collections_hold import start_serving
from durastream_server.http.guard import protocol_class
from durastream_server.http.hosts import is_loopback
from durastream_server.http.paths import STREAM_ROOT
from durastream_server.metrics.counters import ServerMetrics
from durastream_server.shards import forks
from durastream_server.shards.forks import ForkPlacements, PlacementFiles
from durastream_server.shards.handoff import HandOff, with_handoff
from durastream_server.shards.internal import InternalCredential
from durastream_server.shards.layout import shard_dir
from durastream_server.shards.router import ShardRouter, socket_path
from durastream_server.shards.subscriptions import PeerFeeds, keys_dir
from durastream_server.storage.datadir import DataDir, StorageConfig
from durastream_server.storage.metrics import NO_METRICS, WriteMetrics
from durastream_server.subscriptions.service import SubscriptionService

logger = logging.getLogger(__name__)

# A worker waits for its shard's lock for the grace period plus this (``StorageConfig.lock_wait_seconds``):
# closing the data directory after the last request (a final flush and checkpoint) takes well under it.
WORKER_LOCK_MARGIN_SECONDS = 10.0


class Backend:
    """Everything the HTTP layer serves, opened and closed as one unit."""

    def __init__(self, data: DataDir, engine: Engine, subscriptions: SubscriptionService) -> None:
        self.data = data
        self.engine = engine
        self.subscriptions = subscriptions

    @classmethod
    async def open(
        cls,
        config: ServerConfig,
        metrics: WriteMetrics = NO_METRICS,
        router: ShardRouter | None = None,
    ) -> Backend:
        # Recovery allocates dozens of objects per stream, all of them long-lived: the cyclic GC's
        # collections during it only re-scan them (with 100,000 streams they took half of start-up).
        # The server freezes what exists once it listens (_Server.startup).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return await cls._open(config, metrics, router)
        finally:
            if was_enabled:
                gc.enable()

    @classmethod
    async def _open(
        cls, config: ServerConfig, metrics: WriteMetrics, router: ShardRouter | None
    ) -> Backend:
        data = await DataDir.open(
            StorageConfig(
                root=config.data_dir,
                durability=config.durability,
                max_open_files=config.max_open_files,
                packed_appends=config.packed_appends,
                packed_threshold=config.packed_threshold,
                # A worker: the previous generation's worker of this shard may still be shutting
                # down (its parent died); it is done within its grace period and a final flush.
                lock_wait_seconds=(
                    0.0
                    if config.shard_index is None
                    else config.shutdown_grace_seconds + WORKER_LOCK_MARGIN_SECONDS
                ),
            ),
            metrics,
            lazy=True,  # streams recover after the server listens (engine/recovery.py)
        )
        try:
            engine = Engine(
                data,
                txn_limits=TxnLimits(max_handle_bytes=config.max_staged_bytes),
                producer_policy=config.producer_policy,
                max_messages_per_request=config.max_messages_per_request,
            )
            await engine.start()
            if router is not None:  # a fork held here is served here (shards/forks.py)
                router.hosts = engine.holds
                router.creating = engine.creating  # a fork's placement vs a create (forks.py)
                engine.placed_elsewhere = router.placed_elsewhere
            state_dir = data.meta_path("subscriptions")
            state_dir.mkdir(parents=True, exist_ok=True)
            subscriptions = SubscriptionService(
                engine,
                state_dir,
                stream_root_url=config.public_base_url + STREAM_ROOT,
                allow_local_webhooks=local_webhooks_allowed(config),
                **worker_subscriptions(config, router),
            )
            # Its start lists every stream: once they are all recovered (requests wait until then).
            await engine.after_recovery(subscriptions.start)
        except BaseException:
            await data.close()
            raise
        return cls(data, engine, subscriptions)

    async def close(self) -> None:
        try:
            await self.subscriptions.close()
        finally:
            try:
                await self.engine.close()
            finally:
                await self.data.close()


class _Server(uvicorn.Server):
    """uvicorn's server, with four changes: it listens with a bounded TLS handshake, releases live
    readers first on shutdown, reports the bound URL, and (a worker of ``--workers N``) adopts the
    connections other workers hand over (``shards/handoff.py``)."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: DurastreamApp,
        on_started: Callable[[str], None],
        handshake_timeout: float,
        handoff: HandOff | None = None,
    ) -> None:
        super().__init__(config)
        self._app = app
        self._on_started = on_started
        self._handshake_timeout = handshake_timeout
        self._handoff = handoff

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn would listen with asyncio's default TLS handshake timeout of 60 s, and the protocol (so
        # its header timer, http/guard.py) only sees a connection once the handshake is done: a client
        # could hold a connection for a minute by never finishing it. So uvicorn runs the lifespan
        # startup and listens on nothing; the sockets are served here.
        await super().startup(sockets=[])
        if self.started and sockets:
            await self._listen(sockets)
        if self.started:
            start_serving()  # gc.freeze() and the serving young threshold (collections_hold.py)
        if self.started and sockets:
            self._on_started(bound_url(sockets[0], tls=self.config.is_ssl))

    async def _listen(self, sockets: list[socket.socket]) -> None:
        """Serve ``sockets`` as uvicorn does, with the TLS handshake bounded by the header timeout."""
        config = self.config
        loop = asyncio.get_running_loop()

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=_loop,
            )

        tls = {"ssl": config.ssl, "ssl_handshake_timeout": self._handshake_timeout}
        for sock in sockets:
            server = await loop.create_server(
                create_protocol,
                sock=sock,
                backlog=config.backlog,
                # a worker's Unix socket (forwarded requests, shards/router.py) is plain HTTP
                **(tls if config.ssl and sock.family != socket.AF_UNIX else {}),
            )
            self.servers.append(server)
        if self._handoff is not None:

            def adopted(data: bytes, hops: int) -> asyncio.Protocol:
                protocol = create_protocol(loop)
                protocol.adopt(data, hops)  # type: ignore[attr-defined]  # HandOffMixin
                return protocol

            self._handoff.listen(loop, adopted)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._handoff is not None:
            self._handoff.close()  # adopted later, a connection would miss uvicorn's shutdown
        self._app.begin_drain()
        await super().shutdown(sockets=sockets)


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """Bind before serving so a busy port is reported clearly, and so port 0 yields a real port.
    ``reuse_port``: every worker of ``--workers N`` binds the same port (the kernel spreads connections)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bound_url(sock: socket.socket, *, tls: bool) -> str:
    """``http(s)://HOST:PORT`` of the address ``sock`` is bound to (a real port, also for port 0)."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def with_public_url(config: ServerConfig, sock: socket.socket) -> ServerConfig:
    """``config`` with ``public_url`` set: ``--public-url``, else the URL of the bound address."""
    if config.public_url is not None:
        return config
    url = bound_url(sock, tls=config.tls)
    if ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_unspecified:
        logger.warning(
            "listening on all addresses without --public-url: subscription callback and JWKS URLs "
            "will name %s, which webhook receivers cannot reach; set --public-url to the URL they use",
            url,
        )
    return dataclasses.replace(config, public_url=url)


def local_webhooks_allowed(config: ServerConfig) -> bool:
    """Section 12.8's development exception (http://localhost webhooks), per ``--webhook-localhost``."""
    if config.webhook_localhost == "auto":
        return is_loopback(config.host)
    return config.webhook_localhost == "allow"


def exposure_warnings(config: ServerConfig, bound_host: str) -> list[str]:
    """What is risky about serving ``config`` on ``bound_host`` (the address the socket is bound to)."""
    if is_loopback(bound_host):
        return []
    if not config.auth_tokens:
        return [
            f"listening on {bound_host}, which is not a loopback address, WITHOUT authentication: anyone "
            "who can reach it can create, read, append to and delete every stream. Configure tokens "
            "(--auth-token-file, see docs/security.md) or listen on 127.0.0.1."
        ]
    if not config.tls:
        return [
            f"listening on {bound_host} over plain HTTP: bearer tokens cross the network in clear text. "
            "Use --tls-cert/--tls-key or a TLS-terminating reverse proxy (docs/security.md)."
        ]
    return []


def worker_subscriptions(config: ServerConfig, router: ShardRouter | None) -> dict[str, Any]:
    """A worker's subscription wiring (``shards/subscriptions.py``): the server's one keyring and the
    followers of the other shards' streams; nothing for the one-process server."""
    if router is None:
        return {}
    return {"keys_dir": keys_dir(config.data_dir), "peers": PeerFeeds(router)}


def shard_router(config: ServerConfig) -> ShardRouter | None:
    """A worker's router (``--workers N``, ``shards/router.py``); None for the one-process server."""
    if config.shard_index is None or config.shard_sockets is None:
        return None
    # Every worker answers these 501 (shards/router.py): advertising them would keep clients
    # from falling back (docs/extensions.md, "Advertisement").
    responses.withhold_extensions(extensions.NOT_WITH_WORKERS)
    router = ShardRouter(config.shard_index, config.workers, config.shard_sockets, tls=config.tls)
    router.placements = ForkPlacements(config.data_dir / "meta" / forks.FILE)
    root = config.data_dir.parent.parent  # <root>/shards/<k>
    router.placement_files = PlacementFiles(
        {k: shard_dir(root, k) / "meta" / forks.FILE for k in range(config.workers)}
    )
    if config.auth_tokens:  # the workers' own requests to each other present it (internal.py)
        router.internal = InternalCredential.load(config.shard_sockets)
    return router


def build_app(config: ServerConfig, router: ShardRouter | None = None) -> DurastreamApp:
    metrics = ServerMetrics()  # the app counts requests, the storage writer its group commits

    async def open_backend() -> Backend:
        return await Backend.open(config, metrics, router)

    return DurastreamApp(config, open_backend, metrics, router)


def connection_handoff(config: ServerConfig, router: ShardRouter | None) -> HandOff | None:
    """A worker's connection hand-off (``shards/handoff.py``): not over TLS (the TLS state cannot
    move), not with ``--no-connection-handoff`` (every request for another shard is forwarded)."""
    if router is None or config.tls or not config.connection_handoff:
        return None
    return HandOff(router)


def bind_shard_socket(config: ServerConfig) -> socket.socket | None:
    """A worker's Unix socket for requests forwarded by the other workers (``shards/router.py``)."""
    if config.shard_index is None or config.shard_sockets is None:
        return None
    path = socket_path(config.shard_sockets, config.shard_index)
    path.unlink(missing_ok=True)  # left by a predecessor that was killed
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    return sock


def _loop_setting() -> str:
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def run(
    config: ServerConfig,
    sock: socket.socket,
    on_started: Callable[[str], None],
    extra_sockets: tuple[socket.socket, ...] = (),
) -> DurastreamApp:
    """Serve until a shutdown signal. Returns the app so the caller can inspect ``startup_error``.
    ``extra_sockets`` are served too (a worker's Unix socket); ``sock`` is the one announced."""
    config = with_public_url(config, sock)
    router = shard_router(config)
    app = build_app(config, router)
    handoff = connection_handoff(config, router)
    uv_config = uvicorn.Config(
        app,
        loop=_loop_setting(),
        # httptools plus header-size and slow-sender limits, plus the long-poll wake fast path and
        # small appends served without the ASGI round trips (http/fastpath.py)
        # (and, in a worker of --workers N, connection hand-off: shards/handoff.py)
        http=with_handoff(fastpath.with_fast_path(protocol_class(config), app), handoff),
        ws="none",
        lifespan="on",
        log_config=None,  # the CLI configures logging; uvicorn's loggers propagate to it
        access_log=False,  # the app writes its own access log (--access-log, http/access.py)
        server_header=False,
        timeout_graceful_shutdown=config.shutdown_grace_seconds,
        ssl_certfile=None if config.tls_certfile is None else str(config.tls_certfile),
        ssl_keyfile=None if config.tls_keyfile is None else str(config.tls_keyfile),
    )
    server = _Server(uv_config, app, on_started, config.header_timeout_seconds, handoff)
    try:
        server.run(sockets=[sock, *extra_sockets])
    except SystemExit:
        # uvicorn exits this way when the lifespan startup failed; the app kept the reason.
        if app.startup_error is None:
            raise
    finally:
        if handoff is not None:
            handoff.close()
    return app
