"""A tiny scripted HTTP server on 127.0.0.1 for fault injection: answer 503s, drop connections, redirect.

It knows nothing about Durable Streams semantics (tests about the protocol run against the real server); it
only plays back a script of raw responses and records every request it received, so retry behaviour can be
asserted on what actually crossed the wire.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.support.http import BackgroundHTTPServer
from tests.support.server_process import free_port


@dataclass(frozen=True)
class Respond:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class Drop:
    """Read the whole request, then close the connection without answering (the append may have landed)."""


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer_port: int  # the client's port: equal ports mean one reused keep-alive connection


class FaultServer:
    """``with FaultServer() as server: server.script(Respond(503), Respond(200, body=b"[]"))``."""

    def __init__(self, port: int | None = None, default: Respond | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.default = default or Respond(
            200, {"Stream-Next-Offset": "0000000000000000_0000000000000000"}
        )
        self.extra_headers: dict[str, str] = {}
        self.requests: list[Recorded] = []
        self._script: deque[Respond | Drop] = deque()
        self._lock = threading.Lock()
        self._httpd: BackgroundHTTPServer | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/stream"

    def script(self, *actions: Respond | Drop) -> None:
        with self._lock:
            self._script.extend(actions)

    def _next(self) -> Respond | Drop:
        with self._lock:
            return self._script.popleft() if self._script else self.default

    def start(self) -> FaultServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with server._lock:
                    server.requests.append(
                        Recorded(
                            self.command,
                            self.path,
                            dict(self.headers.items()),
                            body,
                            self.client_address[1],
                        )
                    )
                action = server._next()
                if isinstance(action, Drop):
                    self.close_connection = True
                    return
                self.send_response(action.status)
                headers = {**server.extra_headers, **action.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(action.body)))
                self.end_headers()
                if self.command != "HEAD" and action.status not in (204, 304):
                    self.wfile.write(action.body)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _handle

        self._httpd = BackgroundHTTPServer(self.port, Handler)
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.stop()
            self._httpd = None

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
