"""Small helpers shared by tests that talk to a real server over HTTP."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass


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


# ---- raw sockets: what a server writes, byte for byte ----------------------------------------------------


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def error_code(self) -> str:
        return json.loads(self.body)["error"]["code"]

    def error_message(self) -> str:
        return json.loads(self.body)["error"]["message"]


def read_until_closed(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends on ``sock`` until it closes the connection; fails if it is still open
    after ``timeout`` seconds."""
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
    raise AssertionError(f"server kept the connection open after: {b''.join(chunks)[:300]!r}")


def exchange(host: str, port: int, *payloads: bytes, timeout: float = 10.0) -> bytes:
    """Send ``payloads`` on a new connection and return what the server sent until it closed it. The
    write side stays open (a half-close would tell the server the request is over)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            for payload in payloads:
                sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before it has read everything
        return read_until_closed(sock, timeout)


def parse_responses(data: bytes) -> list[RawResponse]:
    """The HTTP/1.1 responses in ``data``, in order (bodies by Content-Length, chunked, or until the end)."""
    responses = []
    while data:
        head, separator, rest = data.partition(b"\r\n\r\n")
        if not separator:
            raise AssertionError(f"incomplete response head: {data[:300]!r}")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        assert status_line.startswith("HTTP/1."), f"not a status line: {status_line!r}"
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line.split(" ", 2)[1])
        if "content-length" in headers:
            size = int(headers["content-length"])
            body, data = rest[:size], rest[size:]
        elif headers.get("transfer-encoding") == "chunked":
            body, data = _dechunk(rest)
        elif status in (204, 304):
            body, data = b"", rest
        else:
            body, data = rest, b""
        responses.append(RawResponse(status, headers, body))
    return responses


def _dechunk(data: bytes) -> tuple[bytes, bytes]:
    """A chunked body (as much of it as ``data`` holds) and what follows it."""
    pieces = []
    while data:
        size_line, separator, data = data.partition(b"\r\n")
        if not separator:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return b"".join(pieces), data.partition(b"\r\n")[2]
        pieces.append(data[:size])
        data = data[size + 2 :]
    return b"".join(pieces), b""
