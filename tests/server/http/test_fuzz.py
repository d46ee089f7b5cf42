"""Malformed-input fuzzing: random methods, paths, queries, protocol headers and bodies never get a 5xx, and
the server still answers ``/healthz`` afterwards. Runs against a private server with short live timeouts so
random long-polls and SSE requests end quickly.
"""

from __future__ import annotations

import http.client
import socket

import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.server_process import ServerProcess

TOKEN = "0000000000000000_0000000000000000"
EXISTING = ("fuzz/text", "fuzz/json", "fuzz/bin")
_PRINTABLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)

segments = st.one_of(
    st.sampled_from(
        ["a", "b", ".", "..", "", "%2F", "%2e%2E", "%00", "%zz", "%", "%C3%A9", "__ds", "~x"]
    ),
    st.text(_PRINTABLE.filter(lambda c: c not in "/?#"), min_size=1, max_size=8),
)
paths = st.one_of(
    st.sampled_from(["/healthz", "/", "/v1", "/v1/stream", "/v1/stream/"]),
    st.sampled_from([f"/v1/stream/{p}" for p in EXISTING]),
    st.sampled_from([f"/v1/stream/{p}" for p in EXISTING]),
    st.lists(segments, min_size=1, max_size=4).map(lambda s: "/v1/stream/" + "/".join(s)),
    st.lists(segments, max_size=3).map(lambda s: "/v1/stream/__ds/" + "/".join(s)),
)
offsets = st.one_of(
    st.sampled_from(["-1", "now", TOKEN, "0_5", "", "-2", "9999999999999999_9999999999999999"]),
    st.text(_PRINTABLE, max_size=40),
)
queries = st.lists(
    st.tuples(
        st.sampled_from(["offset", "live", "cursor", "sse_encoding", "x"]),
        st.one_of(offsets, st.sampled_from(["sse", "long-poll", "base64"])),
    ),
    max_size=4,
).map(lambda pairs: "&".join(f"{k}={v.replace('&', '%26').replace('#', '%23')}" for k, v in pairs))
header_values = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "+1",
            "01",
            "1e3",
            "true",
            "TRUE",
            "",
            "text/plain",
            "application/json",
            TOKEN,
        ]
    ),
    st.sampled_from(
        ["/v1/stream/fuzz/text", "/v1/stream/../x", "9007199254740993", "2030-01-01T00:00:00Z"]
    ),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip),
)
header_names = st.sampled_from(
    [
        "Content-Type",
        "Stream-TTL",
        "Stream-Expires-At",
        "Stream-Closed",
        "Stream-Seq",
        "Stream-Forked-From",
        "Stream-Fork-Offset",
        "Stream-Fork-Sub-Offset",
        "Producer-Id",
        "Producer-Epoch",
        "Producer-Seq",
        "If-None-Match",
        "Authorization",
        "Origin",
    ]
)
bodies = st.one_of(
    st.binary(max_size=512),
    st.sampled_from([b"", b"[]", b"{}", b"[1,2]", b'{"a":1}', b"{bad", b"null"]),
)
methods = st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "BREW"])


def _send(
    server: ServerProcess, method: str, target: str, headers: dict[str, str], body: bytes
) -> int:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=15)
    try:
        connection.putrequest(method, target, skip_accept_encoding=True, skip_host=False)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_random_requests_never_get_a_5xx(server_factory) -> None:
    server = server_factory(long_poll_timeout=0.1, extra_args=["--sse-reconnect-seconds", "0.2"])
    for path, content_type, body in zip(
        EXISTING,
        ("text/plain", "application/json", "application/octet-stream"),
        (b"hi", b"[1]", b"\x00"),
        strict=True,
    ):
        assert requests.put(
            server.stream_url(path), data=body, headers={"Content-Type": content_type}
        ).ok

    @settings(
        max_examples=250,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        method=methods,
        path=paths,
        query=queries,
        headers=st.dictionaries(header_names, header_values, max_size=6),
        body=bodies,
    )
    def check(method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> None:
        target = f"{path}?{query}" if query else path
        status = _send(server, method, target, headers, body)
        assert status < 500, (method, target, headers, body, status)

    check()
    assert requests.get(server.base_url + "/healthz").status_code == 200


def test_garbage_on_the_wire_does_not_hurt_the_server(server_factory) -> None:
    server = server_factory()
    garbage = [
        b"\x00\x01\x02\r\n\r\n",
        b"GET /v1/stream/x HTTP/9.9\r\n\r\n",
        b"GET /v1/stream/x HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/stream/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET " + b"/v1/stream/" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        b"PUT /v1/stream/x HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nabc",
    ]
    for payload in garbage:
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            try:
                while sock.recv(65536):
                    pass
            except (ConnectionResetError, TimeoutError):
                pass
    assert requests.get(server.base_url + "/healthz").status_code == 200
    assert (
        requests.head(server.stream_url("x")).status_code == 404
    )  # the truncated PUT created nothing
