"""Bearer-token authentication: token parsing (flag and file), the permission rules of ``http/auth.py``
against a real server, and that no token ever shows up in a response, an error message or the server log.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests

from durastream_server.auth import (
    Mode,
    TokenConfigError,
    parse_token_file,
    parse_token_spec,
)
from durastream_server.cli import main
from tests.support.http import exchange, parse_responses
from tests.support.server_process import ServerProcess

RW = "rw-token-0123456789abcdefXYZ"
RO = "ro-token-0123456789abcdefXYZ"
TENANT = "tenant-token-0123456789abcdef"
TENANT_RO = "tenant-ro-token-0123456789ab"
WRONG = "wrong-token-0123456789abcdefX"
ALL_TOKENS = (RW, RO, TENANT, TENANT_RO, WRONG)
TEXT = {"Content-Type": "text/plain"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---- parsing --------------------------------------------------------------------------------------------


def test_token_spec_defaults_to_read_write_everywhere() -> None:
    token = parse_token_spec(RW)
    assert (token.mode, token.prefix, token.writable) == (Mode.READ_WRITE, "", True)
    limited = parse_token_spec(f"{RO}:read-only:/v1/stream/tenant-a/logs/")
    assert (limited.mode, limited.prefix) == (Mode.READ_ONLY, "tenant-a/logs")
    assert limited.covers("tenant-a/logs") and limited.covers("tenant-a/logs/x")
    assert not limited.covers("tenant-a/logs2") and not limited.covers("tenant-a")
    assert RO not in repr(limited) and RW not in repr(token)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("short", "too short"),
        (f"{RW}!", "outside the allowed set"),
        (f"{RW}:write", "unknown mode 'write'"),
        (f"{RW}::tenant", "the mode is empty"),
        (f"{RW}:read-only:", "the prefix is empty"),
        (f"{RW}:read-only:a/../b", "'..'"),
    ],
)
def test_bad_token_specs_say_what_is_wrong_without_echoing_the_token(
    spec: str, expected: str
) -> None:
    with pytest.raises(TokenConfigError) as caught:
        parse_token_spec(spec)
    assert expected in str(caught.value)
    assert RW not in str(caught.value)


def test_token_file_format(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(
        "# durastream tokens\n"
        "\n"
        f"{RW}   read-write\n"
        f"  {RO}\tREAD-ONLY   # trailing comment\n"
        f"{TENANT} read-write tenant-a   # comment after a prefix\n"
    )
    path.chmod(0o600)
    tokens, warnings = parse_token_file(path)
    assert warnings == []
    assert [(t.mode, t.prefix, t.source) for t in tokens] == [
        (Mode.READ_WRITE, "", f"{path}:3"),
        (Mode.READ_ONLY, "", f"{path}:4"),
        (Mode.READ_WRITE, "tenant-a", f"{path}:5"),
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (f"{RW}\n", ":1: expected 'TOKEN MODE [PREFIX]'"),
        (f"# only a comment\n\n{RW} read-write a b\n", ":3: expected 'TOKEN MODE [PREFIX]'"),
        (f"{RW} admin\n", ":1: unknown mode 'admin'"),
        ("tiny read-only\n", ":1: the token is 4 characters long"),
        ("# nothing\n", "no tokens in it"),
        (f"{RW} read-write\n{RW} read-only\n", "the same token is configured twice"),
    ],
)
def test_bad_token_files_name_file_and_line(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(TokenConfigError) as caught:
        tokens, _ = parse_token_file(path)
        from durastream_server.auth import check_unique

        check_unique(tokens)
    assert expected in str(caught.value)
    assert RW not in str(caught.value)


def test_token_file_readable_by_others_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{RW} read-write\n")
    path.chmod(0o644)
    _, warnings = parse_token_file(path)
    assert len(warnings) == 1 and "chmod 600" in warnings[0] and RW not in warnings[0]


def test_cli_rejects_bad_tokens_as_usage_errors_without_echoing_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secretish = "abc!defghijklmnopqrstuvwxyz"
    with pytest.raises(SystemExit) as exit_info:
        main(["--auth-token", secretish])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--auth-token" in err and secretish not in err
    path = tmp_path / "tokens"
    path.write_text(f"{RW} sudo\n")
    assert main(["--auth-token-file", str(path), "--data-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1" in err and "unknown mode" in err and RW not in err
    missing = tmp_path / "missing"
    assert main(["--auth-token-file", str(missing), "--data-dir", str(tmp_path / "d")]) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert main(["--auth-token", RW, "--auth-token", f"{RW}:read-only"]) == 2
    err = capsys.readouterr().err
    assert "configured twice" in err and RW not in err


def _server_output(server: ServerProcess) -> str:
    """What the server process wrote (the harness's own "=== start <command line>" lines excluded)."""
    lines = server.log_path.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if not line.startswith("=== start "))


# ---- a server with tokens -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    root = tmp_path_factory.mktemp("auth")
    token_file = root / "tokens"
    token_file.write_text(
        f"# test tokens\n{RO} read-only\n{TENANT} read-write tenant-a\n{TENANT_RO} read-only tenant-a\n"
    )
    token_file.chmod(0o600)
    server = ServerProcess(
        root / "data",
        extra_args=[
            "--auth-token",
            f"{RW}:read-write",
            "--auth-token-file",
            str(token_file),
            "--log-level",
            "DEBUG",
        ],
    )
    server.start()
    yield server
    server.stop()


def test_requests_without_a_valid_token_get_401_with_a_json_body(secured: ServerProcess) -> None:
    url = secured.stream_url("s401")
    for headers in (
        {},
        bearer(WRONG),
        {"Authorization": f"Basic {RW}"},
        {"Authorization": "Bearer"},
    ):
        response = requests.put(url, headers={**TEXT, **headers})
        assert response.status_code == 401, headers
        assert response.headers["WWW-Authenticate"].startswith('Bearer realm="durastream"')
        assert response.json()["error"]["code"] == "UNAUTHORIZED"
        assert WRONG not in response.text and RW not in response.text
    assert requests.get(url, params={"offset": "-1"}).status_code == 401
    assert requests.head(url).status_code == 401
    # Malformed and unknown paths do not tell an anonymous client more than "401".
    assert requests.get(secured.base_url + "/v1/stream/a//b").status_code == 401
    assert requests.get(secured.base_url + "/elsewhere").status_code == 401
    assert requests.get(secured.base_url + "/elsewhere", headers=bearer(RO)).status_code == 404


def test_an_anonymous_body_is_not_read_and_the_connection_is_closed(
    secured: ServerProcess,
) -> None:
    """An append without a token declares a 1 MiB body and sends only its first bytes: the 401 comes at
    once, says ``Connection: close``, and the server closes rather than wait for (and throw away) the
    rest while the client trickles it."""
    head = (
        f"POST /v1/stream/anonymous HTTP/1.1\r\nHost: {secured.host}:{secured.port}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {1 << 20}\r\n\r\n"
    ).encode()
    (response,) = parse_responses(exchange(secured.host, secured.port, head + b"x" * 100))
    assert response.status == 401 and response.headers["connection"] == "close"
    assert response.error_code() == "UNAUTHORIZED"


def test_open_endpoints_need_no_token(secured: ServerProcess) -> None:
    assert requests.get(secured.base_url + "/healthz").status_code == 200
    preflight = requests.options(
        secured.stream_url("anything"),
        headers={
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert preflight.status_code == 204
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    jwks = requests.get(secured.stream_url("__ds/jwks.json"))
    assert jwks.status_code == 200 and jwks.json()["keys"]


def test_read_only_tokens_read_but_do_not_write(secured: ServerProcess) -> None:
    url = secured.stream_url("modes")
    assert requests.put(url, headers={**TEXT, **bearer(RW)}, data=b"a").status_code == 201
    assert requests.get(url, params={"offset": "-1"}, headers=bearer(RO)).content == b"a"
    assert requests.head(url, headers=bearer(RO)).status_code == 200
    for method in ("PUT", "POST", "DELETE"):
        response = requests.request(method, url, headers={**TEXT, **bearer(RO)}, data=b"b")
        assert response.status_code == 403, method
        error = response.json()["error"]
        assert error["code"] == "FORBIDDEN" and "read-only" in error["message"]
        assert "insufficient_scope" in response.headers["WWW-Authenticate"]
        assert "Producer-Epoch" not in response.headers  # not to be mistaken for a fenced producer
    assert requests.post(url, headers={**TEXT, **bearer(RW)}, data=b"b").status_code == 204
    assert requests.get(url, params={"offset": "-1"}, headers=bearer(RO)).content == b"ab"


def test_prefixed_tokens_stay_inside_their_prefix(secured: ServerProcess) -> None:
    inside = secured.stream_url("tenant-a/events")
    assert requests.put(inside, headers={**TEXT, **bearer(TENANT)}, data=b"x").status_code == 201
    assert requests.post(inside, headers={**TEXT, **bearer(TENANT)}, data=b"y").status_code == 204
    assert requests.get(inside, params={"offset": "-1"}, headers=bearer(TENANT_RO)).ok
    assert (
        requests.post(inside, headers={**TEXT, **bearer(TENANT_RO)}, data=b"z").status_code == 403
    )
    # The prefix is the stream "tenant-a" itself and everything under "tenant-a/".
    assert requests.put(secured.stream_url("tenant-a"), headers={**TEXT, **bearer(TENANT)}).ok
    for outside in ("tenant-b/events", "tenant-ab", "tenant-a%2Fx", "modes"):
        response = requests.put(secured.stream_url(outside), headers={**TEXT, **bearer(TENANT)})
        assert response.status_code == 403, outside
        assert "outside it" in response.json()["error"]["message"]
    # A fork reads its source: a tenant cannot copy another tenant's stream into its own prefix.
    secret = secured.stream_url("tenant-b/secret")
    assert requests.put(secret, headers={**TEXT, **bearer(RW)}, data=b"s").status_code == 201
    fork = requests.put(
        secured.stream_url("tenant-a/stolen"),
        headers={**TEXT, **bearer(TENANT), "Stream-Forked-From": "/v1/stream/tenant-b/secret"},
    )
    assert fork.status_code == 403 and "tenant-b/secret" in fork.json()["error"]["message"]
    own_fork = requests.put(
        secured.stream_url("tenant-a/copy"),
        headers={**TEXT, **bearer(TENANT), "Stream-Forked-From": "/v1/stream/tenant-a/events"},
    )
    assert own_fork.status_code == 201


def test_listing_and_discovery(secured: ServerProcess) -> None:
    listing = secured.stream_url("__ds/x-durastream/streams")
    requests.put(secured.stream_url("tenant-a/l1"), headers={**TEXT, **bearer(RW)})
    requests.put(secured.stream_url("other/l2"), headers={**TEXT, **bearer(RW)})
    everything = requests.get(listing, headers=bearer(RO))
    assert everything.status_code == 200
    assert requests.get(listing, headers=bearer(TENANT)).status_code == 403
    assert (
        requests.get(listing, params={"prefix": "tenant-"}, headers=bearer(TENANT)).status_code
        == 403
    )
    for params in ({"prefix": "tenant-a/"}, {"pattern": "tenant-a/*"}, {"pattern": "tenant-a/**"}):
        response = requests.get(listing, params=params, headers=bearer(TENANT_RO))
        assert response.status_code == 200, params
        paths = [s["path"] for s in response.json()["streams"]]
        assert "tenant-a/l1" in paths
        assert all(p == "tenant-a" or p.startswith("tenant-a/") for p in paths), paths
    assert (
        requests.get(listing, params={"pattern": "*/l1"}, headers=bearer(TENANT)).status_code == 403
    )
    extensions = secured.stream_url("__ds/x-durastream/extensions")
    assert requests.get(extensions, headers=bearer(TENANT_RO)).status_code == 200
    assert requests.get(extensions).status_code == 401


def test_change_feed_is_scoped_like_the_listing(secured: ServerProcess) -> None:
    feed = secured.stream_url("__ds/x-durastream/changes")
    requests.put(secured.stream_url("tenant-a/c1"), headers={**TEXT, **bearer(RW)})
    requests.put(secured.stream_url("other/c2"), headers={**TEXT, **bearer(RW)})
    assert requests.get(feed).status_code == 401
    assert requests.get(feed, headers=bearer(TENANT_RO)).status_code == 403
    everything = requests.get(feed, headers=bearer(RO)).json()["changes"]
    assert {"tenant-a/c1", "other/c2"} <= {entry["path"] for entry in everything}
    scoped = requests.get(feed, params={"pattern": "tenant-a/*"}, headers=bearer(TENANT_RO))
    assert scoped.status_code == 200
    paths = {entry["path"] for entry in scoped.json()["changes"]}
    assert "tenant-a/c1" in paths and all(p.startswith("tenant-a/") for p in paths), paths
    # A selection adds to the prefix; it does not replace it for a prefixed token.
    selections = secured.stream_url("__ds/x-durastream/selections")
    registered = requests.post(
        selections, json={"streams": ["other/c2", "tenant-a/c1"]}, headers=bearer(TENANT_RO)
    )
    assert registered.status_code == 200
    selection = registered.json()["selection"]
    alone = requests.get(feed, params={"selection": selection}, headers=bearer(TENANT_RO))
    assert alone.status_code == 403
    narrowed = requests.get(
        feed, params={"selection": selection, "prefix": "tenant-a/"}, headers=bearer(TENANT_RO)
    )
    assert [entry["path"] for entry in narrowed.json()["changes"]] == ["tenant-a/c1"]


def test_multi_range_requests_answer_streams_outside_the_prefix_with_403(
    secured: ServerProcess,
) -> None:
    for path in ("tenant-a/m1", "other/m2"):
        requests.put(secured.stream_url(path), data=b"hi", headers={**TEXT, **bearer(RW)})
    ranges = [
        {"path": path, "offset": "-1", "end": "0000000000000000_0000000000000002"}
        for path in ("tenant-a/m1", "other/m2")
    ]
    lookups = requests.post(
        secured.stream_url("__ds/x-durastream/lookups"),
        json={"lookups": ranges},
        headers=bearer(TENANT_RO),
    )
    inside, outside = lookups.json()["results"]
    assert inside["messages"] == 1 and outside["error"]["status"] == 403
    reads = requests.post(
        secured.stream_url("__ds/x-durastream/reads"), json={"ranges": ranges}, headers=bearer(RO)
    )
    assert reads.status_code == 200 and b"FORBIDDEN" not in reads.content
    scoped = requests.post(
        secured.stream_url("__ds/x-durastream/reads"),
        json={"ranges": ranges},
        headers=bearer(TENANT_RO),
    )
    assert b'"code":"FORBIDDEN"' in scoped.content and b"hi" in scoped.content
    assert (
        requests.post(
            secured.stream_url("__ds/x-durastream/reads"), json={"ranges": ranges}
        ).status_code
        == 401
    )


def test_subscription_control_needs_an_unrestricted_token(secured: ServerProcess) -> None:
    wake = secured.stream_url("wake/pool")
    assert requests.put(wake, headers={"Content-Type": "application/json", **bearer(RW)}).ok
    sub_url = secured.stream_url("__ds/subscriptions/auth-sub")
    body = json.dumps({"type": "pull-wake", "pattern": "tenant-a/*", "wake_stream": "wake/pool"})
    json_type = {"Content-Type": "application/json"}
    assert requests.put(sub_url, data=body, headers=json_type).status_code == 401
    prefixed = requests.put(sub_url, data=body, headers={**json_type, **bearer(TENANT)})
    assert prefixed.status_code == 403 and "without a prefix" in prefixed.json()["error"]["message"]
    assert requests.put(sub_url, data=body, headers={**json_type, **bearer(RO)}).status_code == 403
    assert requests.put(sub_url, data=body, headers={**json_type, **bearer(RW)}).status_code == 201
    assert requests.get(sub_url, headers=bearer(RO)).status_code == 200
    assert requests.get(sub_url, headers=bearer(TENANT_RO)).status_code == 403
    claim = requests.post(
        sub_url + "/claim", data=json.dumps({"worker": "w"}), headers={**json_type, **bearer(RO)}
    )
    assert claim.status_code == 403
    # callback / ack / release carry the subscription's own claim token, not a server token: the
    # server's token check stays out of their way and the subscription service judges them.
    ack = requests.post(
        sub_url + "/ack",
        data=json.dumps({"wake_id": "w_x", "generation": 1, "acks": []}),
        headers={**json_type, "Authorization": "Bearer not-a-server-token"},
    )
    assert ack.json()["error"]["message"] != "the bearer token is not valid"
    assert 'realm="durastream"' not in ack.headers.get("WWW-Authenticate", "")
    assert requests.delete(sub_url, headers=bearer(RW)).status_code == 204


def test_no_token_reaches_the_server_log(secured: ServerProcess) -> None:
    # Everything above ran against this server at DEBUG level (one line per request). The token given
    # with --auth-token is in the harness's copy of the command line, not in anything the server wrote.
    url = secured.stream_url("tenant-a/log")
    requests.get(url, headers=bearer(WRONG))
    requests.get(url, headers=bearer(TENANT))
    log = _server_output(secured)
    assert "-> 401" in log and "-> 403" in log  # the log did record the requests
    for token in ALL_TOKENS:
        assert token not in log


# ---- exposure warning -----------------------------------------------------------------------------------


def _first_log_lines(server: ServerProcess) -> str:
    return _server_output(server)


def test_non_loopback_without_auth_warns_loudly(server_factory) -> None:
    exposed = server_factory(host="0.0.0.0")
    log = _first_log_lines(exposed)
    assert "WARNING" in log and "WITHOUT authentication" in log
    assert "durastream-server: WARNING:" in log  # the stderr banner, besides the log record
    secured = server_factory(host="0.0.0.0", extra_args=["--auth-token", RW])
    log = _first_log_lines(secured)
    assert "WITHOUT authentication" not in log and "clear text" in log
    assert RW not in log
    local = server_factory()
    assert "WARNING" not in _first_log_lines(local)


def test_exposure_warnings_by_address() -> None:
    from durastream_server.config import ServerConfig
    from durastream_server.server import exposure_warnings

    open_config = ServerConfig()
    for host in ("127.0.0.1", "127.0.0.5", "::1", "localhost"):
        assert exposure_warnings(open_config, host) == [], host
    for host in ("0.0.0.0", "::", "10.1.2.3", "192.168.0.10"):
        (warning,) = exposure_warnings(open_config, host)
        assert "WITHOUT authentication" in warning
    with_tokens = ServerConfig(auth_tokens=(parse_token_spec(RW),))
    assert "clear text" in exposure_warnings(with_tokens, "0.0.0.0")[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_token_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{RW} read-write\n")
    path.chmod(0)
    assert main(["--auth-token-file", str(path)]) == 2


# ---- webhooks to localhost (section 12.8's development exception) ---------------------------------------


def test_localhost_webhooks_only_while_listening_on_loopback(server_factory) -> None:
    from durastream_server.config import ServerConfig
    from durastream_server.server import local_webhooks_allowed

    assert local_webhooks_allowed(ServerConfig(host="127.0.0.1"))
    assert not local_webhooks_allowed(ServerConfig(host="0.0.0.0"))
    assert local_webhooks_allowed(ServerConfig(host="0.0.0.0", webhook_localhost="allow"))
    assert not local_webhooks_allowed(ServerConfig(host="127.0.0.1", webhook_localhost="deny"))

    body = json.dumps(
        {"type": "webhook", "pattern": "x/*", "webhook": {"url": "http://localhost:9/hook"}}
    )
    json_type = {"Content-Type": "application/json", **bearer(RW)}
    local = server_factory()
    created = requests.put(local.stream_url("__ds/subscriptions/dev"), data=body, headers=json_type)
    assert created.status_code == 201
    exposed = server_factory(host="0.0.0.0", extra_args=["--auth-token", RW])
    refused = requests.put(
        exposed.stream_url("__ds/subscriptions/dev"), data=body, headers=json_type
    )
    assert refused.status_code == 400 and "localhost" in refused.text
    for url in ("http://169.254.169.254/latest", "https://10.0.0.1/x", "http://example.com/x"):
        hook = json.dumps({"type": "webhook", "pattern": "x/*", "webhook": {"url": url}})
        answer = requests.put(
            local.stream_url("__ds/subscriptions/ssrf"), data=hook, headers=json_type
        )
        assert answer.status_code == 400, url
