"""An HTTP proxy that hides durastream-server's extensions from its clients.

What a gateway that forwards only the protocol's routes does: ``GET {root}/__ds/x-durastream/extensions``
answers 404 and the ``Durastream-Extensions`` header is removed from every response, so a client sees a
base-protocol server and falls back (the sink's ``exactlyOnce=auto`` picks ordered mode), while the server
behind still does everything it does (payload digests, staged appends). Issue 15: a proxy like this, put in
front of a server or taken away between two runs of a query, flipped ``auto`` in the middle of a batch.

Requests are forwarded one by one over a keep-alive connection per client connection; bodies are
``Content-Length`` framed (what ``requests`` sends). ``hidden`` counts the discovery requests it refused.

``hide={"byte-positions"}`` hides only the named extensions instead: the header and the discovery
document list the others, as an older durastream-server (or a proxy between versions) would.
``cap={"bulk-write": 1}`` advertises at most that version of an extension (an older server's).
"""

from __future__ import annotations

import http.client
import json
from http.server import BaseHTTPRequestHandler

from tests.support.http import BackgroundHTTPServer
from tests.support.server_process import free_port

DISCOVERY_SUFFIX = "/__ds/x-durastream/extensions"
HIDDEN_HEADERS = frozenset({"durastream-extensions"})
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


class ExtensionHidingProxy:
    """``with ExtensionHidingProxy(server.port) as proxy: ... proxy.base_url ...``"""

    def __init__(
        self,
        target_port: int,
        target_host: str = "127.0.0.1",
        hide: frozenset[str] | None = None,
        cap: dict[str, int] | None = None,
    ) -> None:
        self.target_host = target_host
        # None: every extension (unless ``cap`` is given: then none)
        self.hide = frozenset() if hide is None and cap else hide
        self.cap = cap or {}  # advertised versions lowered to these (an older server's)
        self.target_port = target_port
        self.port = free_port()
        self.hidden = 0
        self._httpd: BackgroundHTTPServer | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ExtensionHidingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            upstream: http.client.HTTPConnection | None = None

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                discovery = self.path.split("?", 1)[0].endswith(DISCOVERY_SUFFIX)
                if discovery and proxy.hide is None:
                    proxy.hidden += 1
                    payload = json.dumps({"error": {"code": "NOT_FOUND", "message": "no"}}).encode()
                    self._answer(404, [("Content-Type", "application/json")], payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                try:
                    response, payload = self._exchange(body, headers)
                except OSError as exc:  # the server is gone: say so, as a gateway does
                    message = f"upstream: {type(exc).__name__}: {exc}"
                    payload = json.dumps({"error": {"code": "BAD_GATEWAY", "message": message}})
                    self._answer(502, [("Content-Type", "application/json")], payload.encode())
                    return
                kept = [
                    (name, value)
                    for name, value in response.getheaders()
                    if name.lower() not in HOP_BY_HOP
                    and (proxy.hide is not None or name.lower() not in HIDDEN_HEADERS)
                ]
                if proxy.hide is not None:
                    kept = [
                        (name, proxy.filtered(value) if name.lower() in HIDDEN_HEADERS else value)
                        for name, value in kept
                    ]
                    if discovery and response.status == 200:
                        document = json.loads(payload)
                        document["extensions"] = {
                            name: min(version, proxy.cap.get(name, version))
                            for name, version in document["extensions"].items()
                            if name not in proxy.hide
                        }
                        payload = json.dumps(document).encode()
                self._answer(response.status, kept, payload)

            def _exchange(
                self, body: bytes | None, headers: dict[str, str]
            ) -> tuple[http.client.HTTPResponse, bytes]:
                """One request upstream. A kept-alive connection the server has closed meanwhile (its idle
                timeout) fails before the request is read; like a gateway, send it again once on a fresh
                connection instead of dropping the client's."""
                reused = self.upstream is not None
                try:
                    return self._send_upstream(body, headers)
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    self._close_upstream()
                    if not reused:
                        raise
                return self._send_upstream(body, headers)

            def _send_upstream(
                self, body: bytes | None, headers: dict[str, str]
            ) -> tuple[http.client.HTTPResponse, bytes]:
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(
                        proxy.target_host, proxy.target_port, timeout=120
                    )
                try:
                    self.upstream.request(self.command, self.path, body=body, headers=headers)
                    response = self.upstream.getresponse()
                    return response, response.read()
                except OSError:
                    self._close_upstream()
                    raise

            def _close_upstream(self) -> None:
                if self.upstream is not None:
                    self.upstream.close()
                    self.upstream = None

            def _answer(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                if self.command != "HEAD" and status not in (204, 304):
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD" and status not in (204, 304):
                    self.wfile.write(payload)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._httpd = BackgroundHTTPServer(self.port, Handler)
        return self

    def filtered(self, header: str) -> str:
        """A ``Durastream-Extensions`` value without the hidden names."""
        assert self.hide is not None
        entries = [entry.strip() for entry in header.split(",")]
        kept = [e for e in entries if e and e.split("=")[0].strip() not in self.hide]
        return ", ".join(self._capped(entry) for entry in kept)

    def _capped(self, entry: str) -> str:
        name, _, version = entry.partition("=")
        name = name.strip()
        if name in self.cap and version.strip().isdigit():
            return f"{name}={min(int(version), self.cap[name])}"
        return entry

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.stop()
            self._httpd = None

    def __enter__(self) -> ExtensionHidingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
