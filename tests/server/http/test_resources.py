"""Live readers cost coroutines, not threads, and a slow SSE reader cannot make the server buffer a stream."""

from __future__ import annotations

import base64
import socket
import time
from pathlib import Path

import requests

OCTETS = "application/octet-stream"


def _proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _poll(predicate, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_parked_long_polls_do_not_add_threads(server_factory) -> None:
    server = server_factory(long_poll_timeout=20.0)
    url = server.stream_url("many")
    tail = requests.put(url, headers={"Content-Type": "text/plain"}).headers["Stream-Next-Offset"]
    threads_before = _proc_status(server.pid, "Threads")
    request = (
        f"GET /v1/stream/many?offset={tail}&live=long-poll HTTP/1.1\r\n"
        f"Host: {server.host}:{server.port}\r\n\r\n"
    ).encode()
    sockets = []
    try:
        for _ in range(200):
            sock = socket.create_connection((server.host, server.port), timeout=10)
            sock.sendall(request)
            sockets.append(sock)
        _poll(lambda: server.waiters() >= 200, "200 parked long-polls")
        # A bounded worker pool may grow (storage I/O); a thread per waiter would add 200.
        assert _proc_status(server.pid, "Threads") <= threads_before + 32
        requests.post(url, data=b"wake", headers={"Content-Type": "text/plain"})
        for sock in sockets:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        _poll(lambda: server.waiters() == 0, "every long-poll released")
    finally:
        for sock in sockets:
            sock.close()


def test_slow_sse_reader_is_backpressured(server_factory) -> None:
    chunk = 64 * 1024
    server = server_factory(extra_args=["--chunk-bytes", str(chunk)])
    url = server.stream_url("large")
    requests.put(url, headers={"Content-Type": OCTETS})
    payload = bytes(range(256)) * 4096  # 1 MiB
    for _ in range(12):
        assert requests.post(url, data=payload, headers={"Content-Type": OCTETS}).status_code == 204
    rss_before = _proc_status(server.pid, "VmRSS")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect((server.host, server.port))
    sock.settimeout(10)
    with sock:
        sock.sendall(b"GET /v1/stream/large?offset=-1&live=sse HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(
            1.0
        )  # deliberately not reading: the server must stall, not buffer 16 MiB of base64
        rss_stalled = _proc_status(server.pid, "VmRSS")
        received = bytearray()
        while b'"upToDate":true' not in received[-4096:]:
            data = sock.recv(1 << 20)
            assert data, "server closed the SSE connection early"
            received += data
    assert rss_stalled - rss_before < 8 * 1024, (
        rss_before,
        rss_stalled,
    )  # KiB; the stream is 12 MiB
    body = bytes(received).split(b"\r\n\r\n", 1)[1]
    decoded = bytearray()
    for line in body.split(b"\n"):
        # chunked transfer framing lines are hex sizes; SSE data lines are "data:<base64>"
        if line.startswith(b"data:") and not line.startswith(b"data:{"):
            decoded += base64.b64decode(line[5:].strip())
    assert len(decoded) == 12 * len(payload)
    assert bytes(decoded[: len(payload)]) == payload
