"""Malformed-input fuzzing: random methods, paths, queries, protocol headers and bodies never get a 5xx, and
the server still answers ``/healthz`` afterwards. Runs against a private server with short live timeouts so
random long-polls and SSE requests end quickly.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.http import parse_responses, read_until_closed
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
# Expiry times at and past the ends of the datetime range: years 0000..10000 (zero-padded or not),
# out-of-range fields, offsets up to +-24:00 (at the ends, -23:59/+23:59 move the UTC instant into year
# 10000 or 0), fractions of any length, and garbage.
extreme_dates = st.one_of(
    st.builds(
        "{}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}{}{}".format,
        st.one_of(
            st.integers(0, 10000).map("{:04d}".format),
            st.sampled_from(["0001", "9999", "999", "1", "10000", "0000"]),
        ),
        st.integers(0, 13),
        st.integers(0, 32),
        st.integers(0, 24),
        st.integers(0, 60),
        st.integers(0, 61),
        st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=12).map(".{}".format)),
        st.one_of(
            st.sampled_from(["Z", "z", "+23:59", "-23:59", "+00:00", "-00:00", ""]),
            st.builds(
                "{}{:02d}:{:02d}".format,
                st.sampled_from("+-"),
                st.integers(0, 24),
                st.integers(0, 60),
            ),
        ),
    ),
    st.sampled_from(
        [
            "0999-12-31T00:00:00Z",
            "9999-12-31T23:59:59-23:59",
            "0001-01-01T00:00:00+23:59",
            "0001-01-01T00:00:00-23:59",
            "9999-12-31T23:59:59.999999999+23:59",
        ]
    ),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
)
header_values = st.one_of(
    extreme_dates,
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


def fuzz_settings(max_examples: int) -> settings:
    """Deterministic examples and no deadline: every example is a real request to a real server."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


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

    @fuzz_settings(250)
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


def test_extreme_expiry_times_never_get_a_5xx_and_the_server_starts_again(server_factory) -> None:
    """Every Stream-Expires-At is answered 201 or 400 (naming the header), and whatever was stored
    lets the server start again: once, year 999 was written as "999-..." and no start-up could read
    it back."""
    server = server_factory()
    assert requests.put(
        server.stream_url("fuzz/kept"), data=b"x", headers={"Content-Type": "a/b"}
    ).ok
    counter = iter(range(10**6))
    created = 0

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(value=extreme_dates)
    def check(value: str) -> None:
        nonlocal created
        url = server.stream_url(f"fuzz/dates/{next(counter)}")
        response = requests.put(url, headers={"Stream-Expires-At": value})
        assert response.status_code in (201, 400), (value, response.status_code, response.text)
        if response.status_code == 400:
            assert "Stream-Expires-At" in response.json()["error"]["message"], value
        else:
            created += 1

    check()
    assert created > 0
    server.kill()
    server.restart()
    assert server.health()["quarantined"] == []
    assert requests.get(server.stream_url("fuzz/kept"), params={"offset": "-1"}).content == b"x"


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
    for index, payload in enumerate(garbage):
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            received = b""
            try:
                while chunk := sock.recv(65536):
                    received += chunk
            except (ConnectionResetError, TimeoutError):
                pass
        if index < len(garbage) - 1:  # the truncated PUT's client hung up: nobody to answer
            status = parse_responses(received)[0].status
            assert status in (400, 431), (payload[:60], received[:200])
    assert requests.get(server.base_url + "/healthz").status_code == 200
    assert (
        requests.head(server.stream_url("x")).status_code == 404
    )  # the truncated PUT created nothing


# ---- hostile input: huge and slow requests (http/guard.py) ------------------------------------------------

HEADER_LIMIT = 8192
BODY_LIMIT = 256 * 1024
GUARDED_ARGS = [
    "--max-header-bytes",
    str(HEADER_LIMIT),
    "--max-body-bytes",
    str(BODY_LIMIT),
    "--header-timeout-seconds",
    "1",
    "--body-timeout-seconds",
    "1",
    "--sse-reconnect-seconds",
    "0.2",
]


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _status_of(sock: socket.socket, timeout: float = 10.0) -> int | None:
    """The status of the first response on ``sock``, or ``None`` if the server closed without one."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    if not data.startswith(b"HTTP/1."):
        return None
    return int(data.split(b" ", 2)[1])


def _raw(server: ServerProcess, payload: bytes, chunk: int = 1 << 20) -> int | None:
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        try:
            for start in range(0, len(payload), chunk):
                sock.sendall(payload[start : start + chunk])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (and close) before it has read everything
        return _status_of(sock)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Does the server close ``sock`` (after any response it sends) within ``seconds``?"""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


_TOKEN_CHARS = st.characters(
    codec="ascii", categories=("L", "N"), include_characters="!#$%&'*+-.^_`|~"
)
raw_methods = st.one_of(methods, st.text(_TOKEN_CHARS, min_size=1, max_size=12))
raw_header_names = st.one_of(header_names, st.text(_TOKEN_CHARS, min_size=1, max_size=40))
raw_header_values = st.one_of(
    header_values,
    st.binary(max_size=64).map(
        lambda b: b.replace(b"\r", b"").replace(b"\n", b"").decode("latin-1")
    ),
    st.integers(min_value=1, max_value=3 * HEADER_LIMIT).map(lambda n: "v" * n),
)
body_sizes = st.one_of(
    st.integers(min_value=0, max_value=2048), st.sampled_from([BODY_LIMIT, BODY_LIMIT + 1, 3 << 20])
)


def test_hostile_requests_never_get_a_5xx_and_memory_stays_bounded(server_factory) -> None:
    server = server_factory(long_poll_timeout=0.1, extra_args=GUARDED_ARGS)
    assert requests.put(
        server.stream_url("fuzz/text"), data=b"hi", headers={"Content-Type": "text/plain"}
    ).ok
    baseline = _rss_bytes(server.pid)
    statuses: set[int | None] = set()

    @fuzz_settings(150)
    @given(
        method=raw_methods,
        path=paths,
        headers=st.lists(st.tuples(raw_header_names, raw_header_values), max_size=8),
        body_size=body_sizes,
        declare_length=st.booleans(),
    )
    # The limits are always exercised, whatever the strategies draw: headers too large, body too large.
    @example("GET", "/v1/stream/fuzz/text", [("X-Big", "v" * (3 * HEADER_LIMIT))], 0, False)
    @example("POST", "/v1/stream/fuzz/text", [("Content-Type", "text/plain")], 3 << 20, True)
    def check(
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body_size: int,
        declare_length: bool,
    ) -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {server.host}"]
        lines += [f"{name}: {value}" for name, value in headers if name.lower() != "content-length"]
        if declare_length:
            lines.append(f"Content-Length: {body_size}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        body = b"x" * body_size if declare_length else b""
        status = _raw(server, head + body)
        statuses.add(status)
        assert status is None or status < 500, (method, path, status)
        oversized = len(head) - 4 > HEADER_LIMIT + 64
        if oversized:
            assert status in (400, 431, None), status  # 400: a bad request line fails first
        elif declare_length and body_size > BODY_LIMIT and status is not None:
            assert status in (400, 404, 405, 413, 431), status

    check()
    assert 431 in statuses
    # Headers arrive whole or byte-chunked: either way the server stops at the limit.
    huge = b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * (10 * HEADER_LIMIT) + b"\r\n\r\n"
    assert _raw(server, huge) == 431
    assert _raw(server, huge, chunk=1024) == 431
    long_url = b"GET /v1/stream/" + b"u" * (4 * HEADER_LIMIT) + b" HTTP/1.1\r\n\r\n"
    assert _raw(server, long_url, chunk=512) == 431
    # A flood of oversized headers in parallel (32 x 8 MiB) leaves memory where it was: each connection
    # is cut off after HEADER_LIMIT bytes. (Without the limit, 32 x 4 MiB grew the server by 73 MiB.)
    flood = b"GET /healthz HTTP/1.1\r\nX-Big: " + b"f" * (8 << 20)
    threads = [threading.Thread(target=_raw, args=(server, flood, 4096)) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    grown = _rss_bytes(server.pid) - baseline
    assert grown < 64 * 1024 * 1024, f"RSS grew by {grown} bytes"
    # ... and the server still serves, with no internal error logged.
    assert requests.get(server.stream_url("fuzz/text"), params={"offset": "-1"}).content == b"hi"
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log


transfer_codings = st.lists(
    st.sampled_from(
        ["chunked", "CHUNKED", "gzip", "deflate", "br", "identity", "xchunked", "chunked;q=1", ""]
    ),
    min_size=1,
    max_size=3,
).map(", ".join)
host_names = st.sampled_from(
    ["127.0.0.1", "localhost:1", "[::1]", "evil.example", "127.0.0.1.evil.example", "a b", ""]
)
chunked_bodies = st.one_of(
    st.sampled_from(
        [
            b"3\r\nabc\r\n0\r\n\r\n",
            b"0\r\n\r\n",
            b"zz\r\n",
            b"-1\r\n",
            b"ffffffffffffffffffff\r\n",
            b"3\r\nabcXX\r\n0\r\n\r\n",
            b'3;x="y"\r\nabc\r\n0\r\nTrailer: 1\r\n\r\n',
            b"3\r\nab",  # incomplete: the body timeout answers
        ]
    ),
    st.binary(max_size=48),
)


def test_stacked_codings_and_duplicate_hosts_always_get_a_status_line(server_factory) -> None:
    """Framing and Host shapes (``http/guard.py``, ``http/hosts.py``): whatever is sent, the answer has
    a status line and is never a 5xx; two Host headers get 400, a Transfer-Encoding other than one
    ``chunked`` 400 (or 421, when the Host is checked first), a name that is not a loopback name 421."""
    server = server_factory(
        extra_args=["--body-timeout-seconds", "0.3", "--header-timeout-seconds", "2"]
    )
    path = "/v1/stream/fuzz/framing"
    assert requests.put(server.base_url + path, headers={"Content-Type": "text/plain"}).ok

    @fuzz_settings(120)
    @given(
        hosts=st.lists(host_names, min_size=0, max_size=3),
        codings=st.lists(transfer_codings, max_size=2),
        length=st.one_of(st.none(), st.sampled_from(["3", "0", "-1", "3, 3", "x"])),
        body=chunked_bodies,
        version=st.sampled_from(["1.1", "1.1", "1.0"]),
    )
    def check(
        hosts: list[str], codings: list[str], length: str | None, body: bytes, version: str
    ) -> None:
        lines = [f"POST {path} HTTP/{version}", "Content-Type: text/plain"]
        lines += [f"Host: {host}" for host in hosts]
        lines += [f"Transfer-Encoding: {coding}" for coding in codings]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        status = _raw(server, ("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        assert status is not None and status < 500, (lines, body, status)
        if len(hosts) > 1:
            assert status == 400, (lines, status)
        plain_chunked = len(codings) == 1 and codings[0].strip().lower() == "chunked"
        if codings and not (plain_chunked and version == "1.1"):
            assert status in (400, 421), (lines, status)

    check()
    assert requests.get(server.base_url + "/healthz").status_code == 200
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log


def test_slowloris_connections_are_dropped_and_do_not_starve_others(server_factory) -> None:
    server = server_factory(extra_args=GUARDED_ARGS)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 200 + b"\r\n\r\n"
    slow = [socket.create_connection((server.host, server.port), timeout=5) for _ in range(64)]
    idle = [socket.create_connection((server.host, server.port), timeout=5) for _ in range(16)]
    started = time.monotonic()
    closed_at: dict[int, float] = {}
    try:
        position = 0
        while len(closed_at) < len(slow) and time.monotonic() - started < 6:
            for index, sock in enumerate(slow):
                if index in closed_at:
                    continue
                try:
                    sock.sendall(request[position : position + 1])  # one byte per 50 ms per socket
                except (BrokenPipeError, ConnectionResetError):
                    closed_at[index] = time.monotonic() - started
            position += 1
            # Meanwhile ordinary requests are served at once.
            began = time.monotonic()
            assert requests.get(server.base_url + "/healthz", timeout=2).status_code == 200
            assert time.monotonic() - began < 0.5
            time.sleep(0.05)
        assert position < len(request)  # none of them ever finished its headers
        # The server answered 408 and closed; a client that keeps writing sees the closed socket.
        for index, sock in enumerate(slow):
            if index not in closed_at:
                assert _closed_within(sock, 1.0), index
        assert len(closed_at) + sum(1 for i in range(len(slow)) if i not in closed_at) == len(slow)
        assert time.monotonic() - started < 8
        # Connections that never send a byte are closed too, without a response.
        for sock in idle:
            assert _closed_within(sock, 2.0)
    finally:
        for sock in slow + idle:
            sock.close()
    first = _status_of_fresh_slow_request(server)
    assert first == 408


def _status_of_fresh_slow_request(server: ServerProcess) -> int | None:
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes the headers
        return _status_of(sock, timeout=5)


def test_stalled_request_bodies_are_cut_off_and_commit_nothing(server_factory) -> None:
    # A minimum rate of 1 byte/s: here only silence is at stake.
    server = server_factory(extra_args=[*GUARDED_ARGS, "--min-body-bytes-per-second", "1"])
    url = server.stream_url("fuzz/stall")
    assert requests.put(url, headers={"Content-Type": "text/plain"}).status_code == 201
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/stream/fuzz/stall HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 100\r\n\r\n0123456789"
        )
        began = time.monotonic()
        (response,) = parse_responses(read_until_closed(sock, 5.0))
        assert time.monotonic() - began < 3.0
    # The client is told why (408, naming the flag), then the connection is closed.
    assert response.status == 408 and "--body-timeout-seconds" in response.error_message()
    assert requests.get(url, params={"offset": "-1"}).content == b""
    # A slow but steady body (a chunk every 0.3 s, below the 1 s silence limit) is fine.
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/stream/fuzz/stall HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 10\r\n\r\n"
        )
        for byte in b"abcdefghij":
            time.sleep(0.3)
            sock.sendall(bytes([byte]))
        assert _status_of(sock) == 204
    assert requests.get(url, params={"offset": "-1"}).content == b"abcdefghij"


def test_a_trickled_body_is_cut_off_at_the_minimum_rate(server_factory) -> None:
    """A byte every 0.2 s is never silent for the 1 s body timeout, but it is far below a minimum rate of
    1000 bytes/s: after 1 s plus what the bytes sent earned, the server answers 408 and closes."""
    server = server_factory(extra_args=[*GUARDED_ARGS, "--min-body-bytes-per-second", "1000"])
    url = server.stream_url("fuzz/trickle")
    assert requests.put(url, headers={"Content-Type": "text/plain"}).status_code == 201
    answer = b""
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/stream/fuzz/trickle HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
        )
        sock.settimeout(0.2)  # the pace of the trickle: one byte per wait for an answer
        for _ in range(50):  # 10 s at most
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                sock.sendall(b"x")
        answer += read_until_closed(sock, 5.0)
    (response,) = parse_responses(answer)
    assert response.status == 408
    assert "--min-body-bytes-per-second" in response.error_message()
    assert requests.get(url, params={"offset": "-1"}).content == b""
    assert requests.get(server.base_url + "/healthz").status_code == 200


def test_keep_alive_connection_can_send_a_second_request_later(server_factory) -> None:
    """The header timer starts with a request's first byte, not when the previous response ended."""
    server = server_factory(extra_args=GUARDED_ARGS)
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        for _ in range(2):
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            time.sleep(1.5)  # past the 1 s header timeout, under uvicorn's 5 s keep-alive
    finally:
        connection.close()


# ---- hostile input: subscription control requests (subscriptions/, http/subscriptions.py) ---------------

CONTROL_LIMIT = 64 * 1024
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children)
    ),
    max_leaves=16,
)
_field_values = st.one_of(
    _json_values,
    st.sampled_from(
        ["pull-wake", "webhook", "fz/*", "**", "w_x", "http://127.0.0.1:9/h", "\ud800"]
    ),
)
_control_documents = st.dictionaries(
    st.sampled_from(
        ["type", "pattern", "streams", "webhook", "wake_stream", "lease_ttl_ms", "description"]
        + ["wake_id", "generation", "acks", "done", "worker", "x"]
    ),
    _field_values,
    max_size=6,
).map(lambda doc: json.dumps(doc).encode())
_nesting_bombs = st.tuples(
    st.sampled_from([b"[", b'{"a":', b'{"streams":[', b'{"acks":[{"stream":']),
    st.integers(min_value=1, max_value=100_000),
).map(lambda shape: shape[0] * shape[1])
control_bodies = st.one_of(
    _nesting_bombs,
    _control_documents,
    _json_values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=256),
    st.sampled_from([b"", b"{}", b"{bad", b"\xff\xfe", b'{"streams":["\\ud800"]}', b"[" * 33]),
)


def test_subscription_requests_never_get_a_5xx_and_big_bodies_are_not_read(server_factory) -> None:
    server = server_factory()
    json_type = {"Content-Type": "application/json"}
    assert requests.put(server.stream_url("fz/wake"), headers=json_type).ok
    pull = {"type": "pull-wake", "pattern": "fz/*", "wake_stream": "fz/wake"}
    assert requests.put(server.stream_url("__ds/subscriptions/fz-pull"), json=pull).ok
    assert requests.put(server.stream_url("fz/data"), data=b"[1]", headers=json_type).ok
    claim = requests.post(
        server.stream_url("__ds/subscriptions/fz-pull/claim"), json={"worker": "fuzz"}
    )
    claim_token = claim.json()["token"]

    @settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD"]),
        sub_id=st.sampled_from(["fz-pull", "fz-unknown", "%2e%2e", "a%00b", "x" * 300]),
        action=st.sampled_from(["", "/streams", "/streams/fz%2Fx", "/claim", "/ack", "/release"]),
        auth=st.sampled_from([None, "Bearer garbage", f"Bearer {claim_token}", "Basic eDp5"]),
        body=control_bodies,
        declared_only=st.sampled_from([None, CONTROL_LIMIT + 1, 60 << 20]),
    )
    def check(
        method: str,
        sub_id: str,
        action: str,
        auth: str | None,
        body: bytes,
        declared_only: int | None,
    ) -> None:
        target = f"/v1/stream/__ds/subscriptions/{sub_id}{action}"
        lines = [
            f"{method} {target} HTTP/1.1",
            f"Host: {server.host}",
            "Content-Type: application/json",
        ]
        if auth is not None:
            lines.append(f"Authorization: {auth}")
        length = declared_only if declared_only is not None else len(body)
        lines.append(f"Content-Length: {length}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        # declared_only: headers announce a big body that is never sent; the server must answer anyway.
        status = _raw(server, head if declared_only is not None else head + body)
        assert status is not None and status < 500, (method, target, auth, body[:40], status)
        if declared_only is not None and method in ("PUT", "POST"):
            assert status in (400, 401, 404, 405, 409, 413), (method, target, status)

    check()
    assert requests.get(server.base_url + "/healthz").status_code == 200
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log


# ---- message-count bombs (issue 14): the cap counts top-level elements, whatever the body looks like ----

BOMB_CAP = 40
_bomb_leaves = st.sampled_from(
    [
        b"0",
        b"1",
        b'""',
        b'","',
        b'"]"',
        b'"\\",["',
        b"[]",
        b"{}",
        b"[0,0]",
        b'{"a":[0,{}]}',
        b"null",
    ]
)
_bomb_elements = st.recursive(
    _bomb_leaves,
    lambda inner: st.lists(inner, max_size=5).map(lambda xs: b"[" + b",".join(xs) + b"]"),
    max_leaves=30,
)


@st.composite
def _bomb_bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A JSON array around the cap (many tiny elements, or few with many nested commas), sometimes
    damaged; returns the body and its top-level element count (None when not valid JSON)."""
    count = draw(
        st.one_of(st.integers(0, 3), st.integers(BOMB_CAP - 2, BOMB_CAP + 2), st.integers(0, 400))
    )
    element = draw(_bomb_elements)
    mixed = draw(st.lists(_bomb_elements, max_size=3))
    elements = [element] * count + mixed
    separator = draw(st.sampled_from([b",", b", ", b" ,\n"]))
    body = b"[" + separator.join(elements) + b"]"
    if draw(st.integers(0, 4)) == 0:  # damaged: a cut, or a stray byte
        at = draw(st.integers(0, len(body)))
        body = (
            body[:at] + draw(st.sampled_from([b"", b",", b"]", b"[", b'"', b"\\"])) + body[at + 1 :]
        )
    try:
        parsed = json.loads(body)
    except ValueError:
        return body, None
    return body, len(parsed) if isinstance(parsed, list) else 1


def test_message_count_bombs_are_refused_by_count_and_never_get_a_5xx(server_factory) -> None:
    server = server_factory(extra_args=["--max-messages-per-request", str(BOMB_CAP)])
    url = server.stream_url("fuzz/bombs")
    assert requests.put(url, headers={"Content-Type": "application/json"}).status_code == 201
    session = requests.Session()

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=_bomb_bodies(), staged=st.booleans())
    def check(case: tuple[bytes, int | None], staged: bool) -> None:
        body, count = case
        headers = {"Content-Type": "application/json"}
        if staged:
            headers["Durastream-Txn"] = "bomb"
        response = session.post(url, data=body, headers=headers)
        status = response.status_code
        assert status < 500, (body[:200], status)
        if count is None:
            assert status in (400, 413), (body[:200], status)
        elif count > BOMB_CAP:
            assert status == 413 and response.json()["error"]["code"] == "TOO_MANY_MESSAGES", status
        elif count == 0:
            assert status == 400  # [] appends nothing
        else:
            assert status in (200, 204), (body[:200], status, response.text[:200])

    check()
    assert requests.get(server.base_url + "/healthz").status_code == 200
