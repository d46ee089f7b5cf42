"""A local TCP proxy that can stall or cut connections on command (network faults for the chaos soak).

Clients (Spark jobs, producers) connect to the proxy's port; it forwards every connection to the target
(the server's port, which survives server restarts). Faults, callable from any thread:

- ``stall(seconds)``: stop forwarding bytes in both directions on every connection, existing and new, for
  that long (new connections are accepted but not forwarded: a black hole). Then everything resumes,
  nothing is dropped.
- ``cut(seconds)``: abort every open connection at once (both sides see a reset), and abort new ones as
  soon as they are accepted for that long.

The proxy runs its own asyncio loop in a daemon thread. ``stats`` counts connections and faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from dataclasses import dataclass

CHUNK = 64 * 1024


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0  # accepted while cut, or the target was unreachable
    aborted: int = 0  # connections cut
    stalls: int = 0
    cuts: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class ChaosProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = "127.0.0.1"
        self.port = port
        self.stats = ProxyStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._stalled_until = 0.0  # time.monotonic()
        self._cut_until = 0.0
        self._ready = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> ChaosProxy:
        self._thread = threading.Thread(target=self._run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = loop.run_until_complete(
            asyncio.start_server(self._handle, sock=sock, backlog=256)
        )
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- faults (thread-safe) -------------------------------------------------------------------------

    def stall(self, seconds: float) -> None:
        """Hold every byte in both directions for ``seconds`` (existing and new connections)."""
        self.stats.stalls += 1
        self._stalled_until = max(self._stalled_until, time.monotonic() + seconds)

    def cut(self, seconds: float = 0.0) -> int:
        """Abort every open connection now, and new ones for ``seconds``. Returns how many were cut."""
        self.stats.cuts += 1
        self._cut_until = max(self._cut_until, time.monotonic() + seconds)
        loop = self._loop
        if loop is None:
            return 0
        done = threading.Event()
        count = [0]

        def abort_all() -> None:
            for writer in list(self._writers):
                writer.transport.abort()
                count[0] += 1
            self.stats.aborted += count[0]
            done.set()

        loop.call_soon_threadsafe(abort_all)
        done.wait(5)
        return count[0]

    def heal(self) -> None:
        """End any stall or cut window now."""
        self._stalled_until = 0.0
        self._cut_until = 0.0

    @property
    def faulty(self) -> bool:
        now = time.monotonic()
        return now < self._stalled_until or now < self._cut_until

    # -- forwarding -----------------------------------------------------------------------------------

    async def _wait_unstalled(self) -> None:
        while True:
            left = self._stalled_until - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.05))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        if time.monotonic() < self._cut_until:
            self.stats.refused += 1
            writer.transport.abort()
            return
        self._writers.add(writer)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            await self._wait_unstalled()
            if time.monotonic() < self._cut_until:
                self.stats.refused += 1
                return
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                self.stats.refused += 1  # the server is down: the client sees a reset
                return
            self._writers.add(upstream_writer)
            up = asyncio.ensure_future(self._pump(reader, upstream_writer, upstream=True))
            down = asyncio.ensure_future(self._pump(upstream_reader, writer, upstream=False))
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
        finally:
            for w in (writer, upstream_writer):
                if w is None:
                    continue
                self._writers.discard(w)
                if time.monotonic() < self._cut_until:
                    w.transport.abort()
                else:
                    w.close()  # graceful: buffered bytes still go out

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(CHUNK)
                if not data:  # one side closed: flush what is buffered, then close the other
                    await self._wait_unstalled()
                    await writer.drain()
                    return
                await self._wait_unstalled()
                writer.write(data)
                await writer.drain()
                if upstream:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
