"""Small helpers shared by tests that talk to a real server over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def poll_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def sse_events(text: str) -> list[tuple[str, str]]:
    """Spec-following SSE parse: every CR, LF or CRLF ends a line; one optional space after 'data:'."""
    events, kind, data = [], "", []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if kind:
                events.append((kind, "\n".join(data)))
            kind, data = "", []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if kind:
        events.append((kind, "\n".join(data)))
    return events


class BackgroundHTTPServer:
    """A ``ThreadingHTTPServer`` on ``127.0.0.1:<port>`` serving ``handler`` from a daemon thread, for
    test doubles that speak HTTP (the scripted fault server, the extension-hiding proxy)."""

    def __init__(self, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
