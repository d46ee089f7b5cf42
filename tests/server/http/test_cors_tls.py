"""CORS origins (default loopback only, ``--cors-origin``) and ``--tls-cert``/``--tls-key``."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from durastream_server.cli import main
from durastream_server.http.cors import CorsPolicy, normalize_origin
from tests.support.http import read_until_closed
from tests.support.server_process import free_port

ACAO = "Access-Control-Allow-Origin"


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("https://App.Example", "https://app.example"),
        ("https://app.example:443/", "https://app.example"),
        ("http://localhost:3000", "http://localhost:3000"),
        ("http://[::1]:8080", "http://[::1]:8080"),
        ("*", "*"),
        ("loopback", "loopback"),
    ],
)
def test_origins_are_normalized_as_browsers_send_them(text: str, normal: str) -> None:
    assert normalize_origin(text) == normal


@pytest.mark.parametrize(
    "text", ["app.example", "ftp://x", "https://x/path", "https://u@x", "https://x?q", "null", ""]
)
def test_bad_origins_are_refused(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError):
        normalize_origin(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["--cors-origin", text])
    assert exit_info.value.code == 2 and "--cors-origin" in capsys.readouterr().err


def test_default_policy_allows_loopback_origins_only() -> None:
    policy = CorsPolicy()
    for origin in (
        "http://localhost",
        "http://localhost:3000",
        "https://127.0.0.1:8443",
        "http://127.1.2.3",
        "http://[::1]:5173",
    ):
        assert policy.allows(origin), origin
    for origin in (
        "https://evil.example",
        "http://localhost.evil.example",
        "http://127.0.0.1.evil.example",
        "null",
        "file://",
    ):
        assert not policy.allows(origin), origin
    assert policy.headers_for("https://evil.example") == [(b"vary", b"Origin")]
    assert policy.headers_for(None) == [(b"vary", b"Origin")]


def test_configured_origins_replace_the_default() -> None:
    policy = CorsPolicy(["https://app.example"])
    assert policy.allows("https://app.example") and policy.allows("https://APP.example:443")
    assert not policy.allows("http://localhost:3000")
    both = CorsPolicy(["https://app.example", "loopback"])
    assert both.allows("http://localhost:3000")
    assert CorsPolicy(["*"]).headers_for(None) == [(b"access-control-allow-origin", b"*")]


def test_cors_against_the_server(server_factory) -> None:
    default = server_factory()
    url = default.stream_url("cors")
    local = requests.put(
        url, headers={"Content-Type": "text/plain", "Origin": "http://localhost:3000"}
    )
    assert local.headers[ACAO] == "http://localhost:3000" and "Origin" in local.headers["Vary"]
    foreign = requests.get(url, headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 200 and ACAO not in foreign.headers
    # Exposed headers are listed whatever the origin; the browser shows them only to allowed ones.
    assert "Stream-Next-Offset" in foreign.headers["Access-Control-Expose-Headers"]
    # A preflight from a foreign origin is answered (204), but without an allowed origin the browser
    # refuses the real request.
    preflight = requests.options(
        url,
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 204 and ACAO not in preflight.headers

    anyone = server_factory(extra_args=["--cors-origin", "*"])
    response = requests.get(anyone.base_url + "/healthz", headers={"Origin": "https://x.example"})
    assert response.headers[ACAO] == "*"
    assert requests.get(anyone.base_url + "/healthz").headers[ACAO] == "*"

    listed = server_factory(
        extra_args=["--cors-origin", "https://app.example", "--cors-origin", "https://b.example"]
    )
    health = listed.base_url + "/healthz"
    assert requests.get(health, headers={"Origin": "https://b.example"}).headers[ACAO] == (
        "https://b.example"
    )
    assert ACAO not in requests.get(health, headers={"Origin": "http://localhost:3000"}).headers


@dataclass(frozen=True)
class TlsServer:
    base: str
    port: int
    cert: Path
    log: Path


@contextlib.contextmanager
def tls_server(tmp_path: Path, *extra_args: str) -> Iterator[TlsServer]:
    """A server process with a fresh self-signed certificate for 127.0.0.1, once it answers /healthz."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "durastream_server", "--data-dir", str(tmp_path / "data"),
                "--port", str(port), "--tls-cert", str(cert), "--tls-key", str(key), *extra_args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        base = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                health = requests.get(base + "/healthz", verify=str(cert), timeout=1)
                break
            except requests.exceptions.ConnectionError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        assert health.status_code == 200
        yield TlsServer(base, port, cert, log)
    finally:
        process.terminate()
        process.wait(timeout=30)


needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs openssl to make a certificate"
)


@needs_openssl
def test_tls_serves_https(tmp_path: Path) -> None:
    with tls_server(tmp_path) as server:
        created = requests.put(
            server.base + "/v1/stream/tls", headers={"Content-Type": "text/plain"}, data=b"x",
            verify=str(server.cert),
        )  # fmt: skip
        assert created.status_code == 201
        assert f"serving {server.base}/v1/stream (data dir: " in server.log.read_text()
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{server.port}/healthz", timeout=2)


@needs_openssl
def test_a_tls_handshake_must_finish_within_the_header_timeout(tmp_path: Path) -> None:
    """Without a bound, asyncio holds a connection that never finishes its handshake for 60 s, before
    the server's own header timer starts. Here the handshake gets --header-timeout-seconds (1 s)."""
    with tls_server(tmp_path, "--header-timeout-seconds", "1") as server:
        silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        half = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            half.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, never finished
            for sock in (silent, half):
                assert read_until_closed(sock, 8.0) == b""
            # ... while a client that completes its handshake is served as usual.
            health = requests.get(server.base + "/healthz", verify=str(server.cert), timeout=5)
            assert health.status_code == 200
        finally:
            silent.close()
            half.close()


def test_tls_needs_a_loadable_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    assert main(["--data-dir", str(tmp_path / "d"), "--tls-cert", str(bogus)]) == 2
    assert "--tls-key" in capsys.readouterr().err
    assert (
        main(["--data-dir", str(tmp_path / "d"), "--tls-cert", str(bogus), "--tls-key", str(bogus)])
        == 2
    )
    assert "cannot load" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-header-bytes", "100"], "--max-header-bytes"),
        (["--max-header-bytes", "lots"], "--max-header-bytes"),
        (["--header-timeout-seconds", "0"], "--header-timeout-seconds"),
        (["--body-timeout-seconds", "-1"], "--body-timeout-seconds"),
        (["--webhook-localhost", "sometimes"], "--webhook-localhost"),
        (["--min-body-bytes-per-second", "0"], "--min-body-bytes-per-second"),
    ],
)
def test_bad_limit_flags_are_usage_errors(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_limit_flags_reach_the_config() -> None:
    from durastream_server.cli import build_parser, config_from_args

    config = config_from_args(
        build_parser().parse_args(
            [
                "--max-header-bytes",
                "4096",
                "--header-timeout-seconds",
                "2.5",
                "--body-timeout-seconds",
                "7",
                "--cors-origin",
                "https://App.example",
                "--webhook-localhost",
                "deny",
                "--min-body-bytes-per-second",
                "100",
            ]
        )
    )
    assert config.min_body_bytes_per_second == 100
    assert (config.max_header_bytes, config.header_timeout_seconds) == (4096, 2.5)
    assert (config.body_timeout_seconds, config.webhook_localhost) == (7.0, "deny")
    assert config.cors_origins == ("https://app.example",)
    defaults = config_from_args(build_parser().parse_args([]))
    assert (defaults.max_header_bytes, defaults.header_timeout_seconds) == (32768, 10.0)
    assert (defaults.body_timeout_seconds, defaults.auth_tokens, defaults.cors_origins) == (
        30.0,
        (),
        (),
    )
