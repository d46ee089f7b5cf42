"""``Host`` checks (``http/hosts.py``): a loopback server answers only to loopback names, so a page whose
DNS name was rebound to 127.0.0.1 gets 421; ``--allowed-host`` replaces the default; two ``Host`` headers
get 400 on any server."""

from __future__ import annotations

import uuid

import pytest
import requests

from durastream_server.cli import build_parser, config_from_args, main
from durastream_server.http.hosts import HostPolicy, normalize_allowed_host
from tests.support.http import exchange, parse_responses
from tests.support.server_process import ServerProcess


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("Stream.Example", "stream.example"),
        ("stream.example.", "stream.example"),
        ("stream.example:08443", "stream.example:8443"),
        ("10.0.0.5", "10.0.0.5"),
        ("fd00::1", "[fd00::1]"),
        ("[FD00:0::1]:4437", "[fd00::1]:4437"),
        ("my_service", "my_service"),
        ("loopback", "loopback"),
        ("*", "*"),
    ],
)
def test_allowed_hosts_are_normalized(text: str, normal: str) -> None:
    assert normalize_allowed_host(text) == normal


@pytest.mark.parametrize("text", ["", "a b", "http://x", "x/y", "x:70000", "x:0", "[zz]", "x:y"])
def test_bad_allowed_hosts_are_usage_errors(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--allowed-host", text])
    assert exit_info.value.code == 2
    assert "--allowed-host" in capsys.readouterr().err


def test_the_default_follows_the_listening_address() -> None:
    for listen in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        policy = HostPolicy.for_server((), listen)
        assert policy.loopback and not policy.any, listen
    for listen in ("0.0.0.0", "::", "10.1.2.3"):
        assert HostPolicy.for_server((), listen).any, listen
    configured = HostPolicy.for_server(("stream.example",), "0.0.0.0")
    assert not configured.any and not configured.loopback
    args = build_parser().parse_args(["--allowed-host", "A.example", "--allowed-host", "loopback"])
    assert config_from_args(args).allowed_hosts == ("a.example", "loopback")


def _refusal(policy: HostPolicy, *values: str) -> int | None:
    found = policy.refusal([value.encode("latin-1") for value in values])
    return None if found is None else found[0]


def test_loopback_policy() -> None:
    policy = HostPolicy(["loopback"])
    for host in (
        "localhost",
        "LOCALHOST:4437",
        "localhost.",
        "127.0.0.1",
        "127.1.2.3:80",
        "[::1]:1",
    ):
        assert _refusal(policy, host) is None, host
    assert _refusal(policy) is None  # HTTP/1.0 without Host: no browser sends that
    for host in ("evil.example", "evil.example:4437", "localhost.evil.example", "127.0.0.1.nip.io"):
        assert _refusal(policy, host) == 421, host
    for host in ("", "[::2]", "10.0.0.1"):
        assert _refusal(policy, host) == 421, host
    assert _refusal(policy, "localhost", "localhost") == 400
    assert _refusal(policy, "a b") == 400
    assert _refusal(policy, "localhost, evil.example") == 400


def test_named_policy_with_and_without_ports() -> None:
    policy = HostPolicy(["stream.example", "10.0.0.5:4437", "[fd00::1]"])
    for host in ("stream.example", "Stream.Example:8443", "10.0.0.5:4437", "[fd00::1]:9"):
        assert _refusal(policy, host) is None, host
    for host in ("10.0.0.5", "10.0.0.5:80", "localhost", "other.example", "[fd00::2]"):
        assert _refusal(policy, host) == 421, host
    anything = HostPolicy(["*"])
    assert _refusal(anything, "whatever.example:1") is None and _refusal(anything, "") is None
    assert _refusal(anything, "a", "b") == 400 and _refusal(anything, "a b") == 400


def _request(server: ServerProcess, method: str, path: str, *hosts: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", *[f"Host: {host}" for host in hosts]]
    lines += ["Content-Type: text/plain", "Content-Length: 0", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(server: ServerProcess, method: str, path: str, *hosts: str) -> int:
    (response,) = parse_responses(
        exchange(server.host, server.port, _request(server, method, path, *hosts))
    )
    if response.status in (400, 421):
        assert response.error_code() in ("BAD_REQUEST", "MISDIRECTED_REQUEST")
    return response.status


def test_a_loopback_server_refuses_rebound_names(durastream_server: ServerProcess) -> None:
    server = durastream_server
    path = f"/v1/stream/hosts/{uuid.uuid4().hex}"
    rebound = f"evil.example:{server.port}"
    assert _status(server, "PUT", path, rebound) == 421
    assert requests.head(server.base_url + path).status_code == 404  # nothing was created
    assert _status(server, "GET", "/healthz", rebound) == 421
    (refused,) = parse_responses(
        exchange(server.host, server.port, _request(server, "GET", path, rebound))
    )
    assert "--allowed-host" in refused.error_message() and "evil.example" in refused.error_message()
    assert refused.headers["connection"] == "close"
    for name in ("localhost", "127.0.0.1", f"localhost:{server.port}", "[::1]:1"):
        assert _status(server, "GET", "/healthz", name) == 200, name
    assert _status(server, "PUT", path, "127.0.0.1", "127.0.0.1") == 400  # two Host headers
    assert requests.head(server.base_url + path).status_code == 404
    assert _status(server, "PUT", path, f"127.0.0.1:{server.port}") == 201


def test_allowed_host_replaces_the_default(server_factory) -> None:
    server = server_factory(
        extra_args=["--allowed-host", "stream.example", "--allowed-host", "127.0.0.1"]
    )
    assert _status(server, "GET", "/healthz", "stream.example:8443") == 200
    assert _status(server, "GET", "/healthz", f"127.0.0.1:{server.port}") == 200
    assert _status(server, "GET", "/healthz", "localhost") == 421
    assert _status(server, "GET", "/healthz", "evil.example") == 421


def test_any_host_on_a_non_loopback_address_but_never_two(server_factory) -> None:
    server = server_factory(host="0.0.0.0")
    assert _status(server, "GET", "/healthz", "stream.example") == 200
    assert _status(server, "GET", "/healthz", "a.example", "b.example") == 400
