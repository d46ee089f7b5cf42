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
import logging
import socket
from collections.abc import Callable

import uvicorn

from durastream_server.config import ServerConfig
from durastream_server.engine.engine import Engine
from durastream_server.engine.txnapi import TxnLimits
from durastream_server.http.app import DurastreamApp
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
            engine = Engine(data, txn_limits=TxnLimits(max_handle_bytes=config.max_staged_bytes))
            await engine.start()
            state_dir = data.meta_path("subscriptions")
            state_dir.mkdir(parents=True, exist_ok=True)
            subscriptions = SubscriptionService(engine, state_dir)
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
            self._on_started(f"http://{shown}:{port}")

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
        http="httptools",
        ws="none",
        lifespan="on",
        log_config=None,  # the CLI configures logging; uvicorn's loggers propagate to it
        access_log=False,  # the app logs one line per request at DEBUG
        server_header=False,
        timeout_graceful_shutdown=config.shutdown_grace_seconds,
    )
    server = _Server(uv_config, app, on_started)
    try:
        server.run(sockets=[sock])
    except SystemExit:
        # uvicorn exits this way when the lifespan startup failed; the app kept the reason.
        if app.startup_error is None:
            raise
    return app
