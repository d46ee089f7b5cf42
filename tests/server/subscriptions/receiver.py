"""A local webhook receiver for end-to-end tests: a threaded ``http.server`` on 127.0.0.1.

It records every request (raw body, parsed JSON, ``Webhook-Signature``) and answers with a configurable
status and JSON body (or raw bytes, for receivers that answer nonsense). Tests wait for requests with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    raw: bytes
    body: dict[str, Any]
    signature: str | None
    path: str


class WebhookReceiver:
    def __init__(self, *, status: int = 200, reply: dict[str, Any] | None = None) -> None:
        self.requests: list[Received] = []
        self._status = status
        self._reply: dict[str, Any] = reply if reply is not None else {}
        self._raw: bytes | None = None
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._cond:
                    status, reply, raw_reply = receiver._status, receiver._reply, receiver._raw
                    receiver.requests.append(
                        Received(
                            raw=raw,
                            body=json.loads(raw),
                            signature=self.headers.get("Webhook-Signature"),
                            path=self.path,
                        )
                    )
                    receiver._cond.notify_all()
                payload = raw_reply if raw_reply is not None else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/webhook"

    def respond(
        self, *, status: int = 200, reply: dict[str, Any] | None = None, raw: bytes | None = None
    ) -> None:
        """Answer later requests with ``status`` and ``reply`` as JSON, or ``raw`` bytes as they are."""
        with self._cond:
            self._status = status
            self._reply = reply if reply is not None else {}
            self._raw = raw

    def wait_for(self, count: int, timeout: float = 5.0) -> Received:
        """Block until at least ``count`` requests arrived; return the ``count``-th."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"expected {count} webhook requests within {timeout}s, got {len(self.requests)}"
                    )
                self._cond.wait(remaining)
            return self.requests[count - 1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
