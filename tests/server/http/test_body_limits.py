"""Request bodies over ``--max-body-bytes`` get 413 without the server reading (or buffering) the rest.

Raw sockets, because an HTTP client library would insist on sending the whole body before reading.
"""

from __future__ import annotations

import http.client
import socket

import requests

from tests.support.http import read_until_closed
from tests.support.server_process import ServerProcess

LIMIT = 1024
OCTETS = "application/octet-stream"


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.settimeout(10)
    return sock


def _request_head(server: ServerProcess, path: str, extra: str) -> bytes:
    return (
        f"POST /v1/stream/{path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n"
        f"Content-Type: {OCTETS}\r\n{extra}\r\n"
    ).encode()


def test_declared_oversize_body_is_refused_before_it_is_sent(server_factory) -> None:
    server = server_factory(max_body_bytes=LIMIT)
    requests.put(server.stream_url("big"), headers={"Content-Type": OCTETS})
    with _connect(server) as sock:
        # Expect: 100-continue: a server that wanted the body would say "100 Continue" first.
        sock.sendall(
            _request_head(
                server, "big", f"Content-Length: {50 * 1024 * 1024}\r\nExpect: 100-continue\r\n"
            )
        )
        response = read_until_closed(sock)
    assert response.startswith(b"HTTP/1.1 413 "), response[:100]
    assert b"100 Continue" not in response
    assert b"PAYLOAD_TOO_LARGE" in response
    assert requests.get(server.stream_url("big")).content == b""


def test_chunked_body_is_cut_off_at_the_limit(server_factory) -> None:
    server = server_factory(max_body_bytes=LIMIT)
    requests.put(server.stream_url("chunked"), headers={"Content-Type": OCTETS})
    with _connect(server) as sock:
        sock.sendall(_request_head(server, "chunked", "Transfer-Encoding: chunked\r\n"))
        # Cross the limit, then stop sending (no terminating chunk): the answer must come anyway.
        for _ in range(3):
            sock.sendall(b"200\r\n" + b"x" * 512 + b"\r\n")
        response = read_until_closed(sock)
    assert response.startswith(b"HTTP/1.1 413 "), response[:100]
    assert requests.get(server.stream_url("chunked")).content == b""
    # The server is fine afterwards, and a body at the limit is accepted.
    ok = requests.post(
        server.stream_url("chunked"), data=b"y" * LIMIT, headers={"Content-Type": OCTETS}
    )
    assert ok.status_code == 204
    assert requests.get(server.stream_url("chunked")).content == b"y" * LIMIT


def test_oversize_create_body_is_refused_too(server_factory) -> None:
    server = server_factory(max_body_bytes=LIMIT)
    response = requests.put(
        server.stream_url("big-create"), data=b"z" * (LIMIT + 1), headers={"Content-Type": OCTETS}
    )
    assert response.status_code == 413
    assert requests.head(server.stream_url("big-create")).status_code == 404


def test_bodies_larger_than_the_receive_buffer_arrive_whole(server_factory) -> None:
    """The server gathers a body before waking its handler (guard.py), up to a buffer of 4 MiB; larger
    bodies, declared or chunked and sent in small pieces, must still arrive byte for byte."""
    server = server_factory()
    requests.put(server.stream_url("large"), headers={"Content-Type": OCTETS})
    declared = bytes(range(256)) * (9 * 4096)  # 9 MiB
    chunked = bytes(reversed(range(256))) * (5 * 4096)  # 5 MiB

    def pieces():
        for start in range(0, len(chunked), 100_000):
            yield chunked[start : start + 100_000]

    first = requests.post(
        server.stream_url("large"), data=declared, headers={"Content-Type": OCTETS}
    )
    second = requests.post(
        server.stream_url("large"), data=pieces(), headers={"Content-Type": OCTETS}
    )
    assert (first.status_code, second.status_code) == (204, 204)
    body = b""
    offset = "-1"
    while True:  # catch-up reads come in chunks: follow Stream-Next-Offset
        response = requests.get(server.stream_url("large"), params={"offset": offset})
        body += response.content
        offset = response.headers["Stream-Next-Offset"]
        if response.headers.get("Stream-Up-To-Date") == "true":
            break
    assert body == declared + chunked


def test_a_body_answered_without_being_read_does_not_leak_into_the_next_request(
    server_factory,
) -> None:
    """The guard gathers body pieces before handing them over; an answer that comes before the body is
    read (here a 405: health checks take no POST, and the handler never reads the body) must not leave
    them for the next request on the connection."""
    server = server_factory()
    requests.put(server.stream_url("kept"), headers={"Content-Type": OCTETS})
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        refused_body = b"r" * (3 * 1024 * 1024)
        connection.request("POST", "/healthz", body=refused_body, headers={"Content-Type": OCTETS})
        refused = connection.getresponse()
        refused.read()
        kept_open = connection.sock  # http.client drops it if the server closes the connection
        connection.request(
            "POST", "/v1/stream/kept", body=b"accepted", headers={"Content-Type": OCTETS}
        )
        accepted = connection.getresponse()
        accepted.read()
        reused = kept_open is not None and connection.sock is kept_open
    finally:
        connection.close()
    assert (refused.status, accepted.status) == (405, 204)
    assert reused, "the second request must travel on the same connection"
    assert requests.get(server.stream_url("kept"), params={"offset": "-1"}).content == b"accepted"
