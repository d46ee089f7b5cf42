"""Requests whose framing the server will not trust get a status line: 400 with a JSON body naming what was
wrong, then the connection is closed (``http/guard.py``). Nothing of such a request is stored, earlier
requests on the connection are still answered, and the server keeps serving everyone else.

Raw sockets: an HTTP client library would not send these.
"""

from __future__ import annotations

import socket
import uuid

import pytest
import requests

from tests.support.http import exchange, parse_responses, read_until_closed
from tests.support.server_process import ServerProcess

TEXT = {"Content-Type": "text/plain"}


def _stream(server: ServerProcess) -> str:
    path = f"framing/{uuid.uuid4().hex}"
    assert requests.put(server.stream_url(path), headers=TEXT).status_code == 201
    return path


def _head(server: ServerProcess, path: str, *headers: str, method: str = "POST") -> bytes:
    lines = [
        f"{method} /v1/stream/{path} HTTP/1.1",
        f"Host: {server.host}:{server.port}",
        "Content-Type: text/plain",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _stored(server: ServerProcess, path: str) -> bytes:
    return requests.get(server.stream_url(path), params={"offset": "-1"}).content


CHUNKED = "Transfer-Encoding: chunked"

BAD_FRAMING = {
    # Rejected by the parser once the handler has started (it is waiting for the body).
    "bad chunk size": ([CHUNKED], b"zz\r\n", "chunk size"),
    "chunk size overflow": ([CHUNKED], b"ffffffffffffffffffff\r\nabc", "overflow"),
    "no CRLF after chunk data": ([CHUNKED], b"3\r\nabcXX\r\n0\r\n\r\n", "invalid HTTP request"),
    # Unknown codings, and codings stacked on chunked: the body could not be interpreted.
    "gzip": (["Transfer-Encoding: gzip"], b"abc", "'gzip'"),
    "xchunked": (["Transfer-Encoding: xchunked"], b"abc", "'xchunked'"),
    "identity": (["Transfer-Encoding: identity"], b"abc", "'identity'"),
    "gzip, chunked": (["Transfer-Encoding: gzip, chunked"], b"3\r\nabc\r\n0\r\n\r\n", "gzip"),
    "chunked, chunked": (
        ["Transfer-Encoding: chunked, chunked"],
        b"3\r\nabc\r\n0\r\n\r\n",
        "Transfer-Encoding",
    ),
    "two chunked headers": ([CHUNKED, CHUNKED], b"3\r\nabc\r\n0\r\n\r\n", "Transfer-Encoding"),
    "chunked, gzip": (["Transfer-Encoding: chunked, gzip"], b"abc", "Transfer-Encoding"),
    "empty coding": (["Transfer-Encoding: "], b"abc", "Transfer-Encoding"),
    # Ambiguous lengths (request smuggling shapes).
    "chunked and length": (
        [CHUNKED, "Content-Length: 3"],
        b"3\r\nabc\r\n0\r\n\r\n",
        "Content-Length",
    ),
    "two lengths": (["Content-Length: 3", "Content-Length: 4"], b"abcd", "Content-Length"),
}


@pytest.mark.parametrize("shape", BAD_FRAMING, ids=list(BAD_FRAMING))
def test_bad_framing_gets_400_with_a_json_body_then_close(
    durastream_server: ServerProcess, shape: str
) -> None:
    headers, body, named = BAD_FRAMING[shape]
    server = durastream_server
    path = _stream(server)
    (response,) = parse_responses(
        exchange(server.host, server.port, _head(server, path, *headers) + body)
    )
    assert response.status == 400, response
    assert response.headers["connection"] == "close"
    assert response.error_code() == "BAD_REQUEST"
    assert named in response.error_message()
    assert _stored(server, path) == b""
    assert requests.get(server.base_url + "/healthz").status_code == 200


def test_chunked_over_http_1_0_is_refused(durastream_server: ServerProcess) -> None:
    server = durastream_server
    path = _stream(server)
    head = _head(server, path, CHUNKED).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    (response,) = parse_responses(
        exchange(server.host, server.port, head + b"3\r\nabc\r\n0\r\n\r\n")
    )
    assert response.status == 400 and "HTTP/1.0" in response.error_message()
    assert _stored(server, path) == b""


def test_a_plain_chunked_body_is_still_accepted(durastream_server: ServerProcess) -> None:
    server = durastream_server
    path = _stream(server)
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        head = _head(server, path, "Transfer-Encoding: Chunked", "Connection: close")
        sock.sendall(head + b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        (response,) = parse_responses(read_until_closed(sock))
    assert response.status == 204
    assert _stored(server, path) == b"abcde"


def test_an_error_in_a_body_the_handler_is_reading_still_gets_400(
    durastream_server: ServerProcess,
) -> None:
    """More than the server's 4 MiB receive buffer arrives first, so the handler is woken and waits for
    the rest; then the framing breaks. The handler must give up (nothing stored) and the client must
    still get its 400."""
    server = durastream_server
    path = _stream(server)
    first = b"x" * (5 * 1024 * 1024)
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(_head(server, path, CHUNKED) + b"%x\r\n" % len(first) + first + b"\r\n")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # no answer while the body is incomplete
        sock.sendall(b"zz\r\n")
        (response,) = parse_responses(read_until_closed(sock))
    assert response.status == 400 and "chunk size" in response.error_message()
    assert _stored(server, path) == b""


def test_earlier_pipelined_requests_are_answered_before_the_400(
    durastream_server: ServerProcess,
) -> None:
    server = durastream_server
    path = _stream(server)
    good = _head(server, path, "Content-Length: 5") + b"first"
    bad = _head(server, path, CHUNKED) + b"zz\r\n"
    responses = parse_responses(exchange(server.host, server.port, good + good + bad))
    assert [r.status for r in responses] == [204, 204, 400]
    assert _stored(server, path) == b"firstfirst"


def test_garbage_after_a_parked_long_poll_waits_for_its_answer(
    durastream_server: ServerProcess,
) -> None:
    """A long-poll is in flight (it answers 204 after the server's 0.5 s timeout) when a malformed next
    request arrives: the long-poll still gets its answer, then the 400."""
    server = durastream_server
    path = _stream(server)
    tail = requests.head(server.stream_url(path)).headers["Stream-Next-Offset"]
    poll = (
        f"GET /v1/stream/{path}?offset={tail}&live=long-poll HTTP/1.1\r\n"
        f"Host: {server.host}:{server.port}\r\n\r\n"
    ).encode()
    responses = parse_responses(
        exchange(server.host, server.port, poll, b"BREW \x00 HTTP/1.1\r\n\r\n")
    )
    assert [r.status for r in responses] == [204, 400]
    assert responses[1].error_code() == "BAD_REQUEST"


def test_a_request_answered_before_its_body_gets_no_second_status_line(
    durastream_server: ServerProcess,
) -> None:
    """``POST /healthz`` is answered 405 without reading the body. When that body's framing then breaks,
    the 405 was the answer: the connection closes without a 400 the client would take for the answer to
    a next request."""
    server = durastream_server
    head = _head(server, "x", CHUNKED).replace(b"/v1/stream/x", b"/healthz", 1)
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head + b"3\r\nabc\r\n")
        sock.settimeout(10)
        assert sock.recv(12) == b"HTTP/1.1 405"
        sock.sendall(b"zz\r\n")
        rest = read_until_closed(sock)
    assert b"HTTP/1.1 " not in rest


def test_a_response_under_way_is_cut_off_by_a_framing_error(
    durastream_server: ServerProcess,
) -> None:
    """An SSE response has started (status line sent) when the request's own body turns out malformed:
    closing is all that is left, and the stream is unharmed."""
    server = durastream_server
    path = _stream(server)
    head = _head(server, f"{path}?offset=-1&live=sse", CHUNKED, method="GET")
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head + b"3\r\nabc\r\n")
        sock.settimeout(10)
        assert sock.recv(12) == b"HTTP/1.1 200"
        sock.sendall(b"zz\r\n")
        assert b"HTTP/1.1 " not in read_until_closed(sock)
    assert requests.post(server.stream_url(path), data=b"ok", headers=TEXT).status_code == 204
