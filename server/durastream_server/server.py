"""Wiring and running: DataDir -> Engine -> SubscriptionService -> ASGI app, served by uvicorn.

The data directory is opened in the ASGI lifespan startup, which uvicorn runs *before* it accepts
connections, and closed in the lifespan shutdown, which it runs *after* in-flight requests have finished.
So no request ever meets a half-open or already-closed store.

Shutdown (SIGTERM or SIGINT): uvicorn stops accepting; our ``Server.shutdown`` override first releases
parked long-polls (they answer 204 as at a timeout) and ends SSE streams, in-flight appends finish, then
the lifespan shutdown closes subscriptions, engine and storage, in that order.
"""

from __future__ import annotations

import gc
import importlib.util
import ipaddress
import logging
import socket
from collections.abc import Callable

import uvicorn

from durastream_server.config import ServerConfig
from durastream_server.engine.engine import Engine
from durastream_server.engine.txnapi import TxnLimits
from durastream_server.http import fastpath
from durastream_server.http.app import DurastreamApp
from durastream_server.http.guard import protocol_class
from durastream_server.storage.datadir import DataDir, StorageConfig
from durastream_server.subscriptions.service import SubscriptionService

logger = logging.getLogger(__name__)


class Backend:
    """Everything the HTTP layer serves, opened and closed as one unit."""

    def __init__(self, data: DataDir, engine: Engine, subscriptions: SubscriptionService) -> None:
        self.data = data
        self.engine = engine
        self.subscriptions = subscriptions

    @classmethod
    async def open(cls, config: ServerConfig) -> Backend:
        data = await DataDir.open(StorageConfig(root=config.data_dir, durability=config.durability))
        try:
            engine = Engine(
                data,
                txn_limits=TxnLimits(max_handle_bytes=config.max_staged_bytes),
                producer_policy=config.producer_policy,
            )
            await engine.start()
            state_dir = data.meta_path("subscriptions")
            state_dir.mkdir(parents=True, exist_ok=True)
            subscriptions = SubscriptionService(
                engine, state_dir, allow_local_webhooks=local_webhooks_allowed(config)
            )
            await subscriptions.start()
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
    """uvicorn's server, with two hooks: release live readers first on shutdown, report the bound URL."""

    def __init__(
        self, config: uvicorn.Config, app: DurastreamApp, on_started: Callable[[str], None]
    ) -> None:
        super().__init__(config)
        self._app = app
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            # What exists now (modules, the app, recovered streams) lives as long as the server. Move
            # it out of the cyclic GC's reach, so a full collection scans only what requests created:
            # unfrozen, one took ~20 ms in the middle of a commit that woke 100 long-polls
            # (docs/decisions/0004-performance.md).
            gc.collect()
            gc.freeze()
        if self.started and sockets:
            host, port = sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            scheme = "https" if self.config.is_ssl else "http"
            self._on_started(f"{scheme}://{shown}:{port}")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._app.begin_drain()
        await super().shutdown(sockets=sockets)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before serving so a busy port is reported clearly, and so port 0 yields a real port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


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


def build_app(config: ServerConfig) -> DurastreamApp:
    async def open_backend() -> Backend:
        return await Backend.open(config)

    return DurastreamApp(config, open_backend)


def _loop_setting() -> str:
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def run(
    config: ServerConfig, sock: socket.socket, on_started: Callable[[str], None]
) -> DurastreamApp:
    """Serve until a shutdown signal. Returns the app so the caller can inspect ``startup_error``."""
    app = build_app(config)
    uv_config = uvicorn.Config(
        app,
        loop=_loop_setting(),
        # httptools plus header-size and slow-sender limits, plus the long-poll wake fast path
        http=fastpath.with_fast_path(protocol_class(config)),
        ws="none",
        lifespan="on",
        log_config=None,  # the CLI configures logging; uvicorn's loggers propagate to it
        access_log=False,  # the app logs one line per request at DEBUG
        server_header=False,
        timeout_graceful_shutdown=config.shutdown_grace_seconds,
        ssl_certfile=None if config.tls_certfile is None else str(config.tls_certfile),
        ssl_keyfile=None if config.tls_keyfile is None else str(config.tls_keyfile),
    )
    server = _Server(uv_config, app, on_started)
    try:
        server.run(sockets=[sock])
    except SystemExit:
        # uvicorn exits this way when the lifespan startup failed; the app kept the reason.
        if app.startup_error is None:
            raise
    return app
