"""Subscription endpoints against hostile callers (issue 14, item 3), on real server processes.

- A body is read only after its caller is authenticated: an anonymous callback declaring 60 MiB is
  answered (401, then close) while the client has sent nothing but headers.
- ``__ds`` bodies are capped at 64 KiB: a larger declared body gets 413 naming the limit, unread.
- Deep, malformed or non-UTF-8 JSON gets 400 with a JSON body, never a 500 (``[`` * 60,000 used to
  raise RecursionError), in every body the service parses, and in a webhook receiver's answer.
- Anonymous and unauthorised callers get the same answer whether a subscription id exists or not.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import requests

from durastream_server.subscriptions.signing import WebhookSigner
from durastream_server.subscriptions.urls import WebhookUrlPolicy
from durastream_server.subscriptions.webhook import WebhookSender
from tests.server.subscriptions.receiver import WebhookReceiver
from tests.server.subscriptions.test_end_to_end import (
    JSON,
    Api,
    pull_setup,
    unique,
    wait_until,
    webhook_config,
)
from tests.support.server_process import ServerProcess

SIXTY_MIB = 60 * 1024 * 1024
CONTROL_LIMIT = 64 * 1024
WAKE = {"wake_id": "w_x", "generation": 1}


class RawAnswer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def read_answer(sock: socket.socket) -> RawAnswer:
    """One response from ``sock`` (status, lower-case headers, ``Content-Length`` body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without a complete response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the response body"
        body += chunk
    return RawAnswer(int(status_line.split(" ", 2)[1]), headers, body[:length])


def closed_by_server(sock: socket.socket, deadline_s: float = 5.0) -> bool:
    sock.settimeout(deadline_s)
    try:
        return sock.recv(65536) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def answer_to_headers_only(
    server: ServerProcess, method: str, target: str, headers: dict[str, str]
) -> tuple[RawAnswer, bool]:
    """Send a request's line and headers but none of its body, and wait (10 s at most) for the answer.

    An answer proves the server decided without reading the body. Returns it, and whether the server
    then closed the connection (rather than waiting to drain a body it will not use).
    """
    lines = [f"{method} {target} HTTP/1.1", f"Host: {server.host}:{server.port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        try:
            answer = read_answer(sock)
        except TimeoutError:
            raise AssertionError(
                f"{method} {target}: no answer within 10 s while the body was not sent"
            ) from None
        return answer, closed_by_server(sock)


def control_path(sub_id: str, suffix: str = "") -> str:
    return f"/v1/stream/__ds/subscriptions/{sub_id}{suffix}"


def test_bodies_are_not_read_before_the_caller_is_authenticated(api: Api) -> None:
    server = api.server
    _, existing, _ = pull_setup(api)
    huge = {"Content-Type": "application/json", "Content-Length": str(SIXTY_MIB)}
    for sub_id in (existing, unique("unknown")):
        for action in ("callback", "ack", "release"):
            for auth in ({}, {"Authorization": "Bearer ds1.forged.token"}):
                target = control_path(sub_id, f"/{action}")
                answer, closed = answer_to_headers_only(server, "POST", target, {**huge, **auth})
                assert answer.status == 401, (target, answer.body)
                assert answer.json()["error"]["code"] == "UNAUTHORIZED"
                assert answer.headers["connection"] == "close" and closed, target
    # A chunked body of unknown length: the same.
    chunked = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    answer, closed = answer_to_headers_only(server, "POST", control_path(existing, "/ack"), chunked)
    assert (answer.status, closed) == (401, True)
    assert requests.get(server.base_url + "/healthz").status_code == 200


def test_control_bodies_over_64_kib_get_413_naming_the_limit_unread(api: Api) -> None:
    server = api.server
    _, existing, _ = pull_setup(api)
    declared = {"Content-Type": "application/json", "Content-Length": str(SIXTY_MIB)}
    for method, target in (
        ("PUT", control_path(unique("new"))),
        ("PUT", control_path(existing)),
        ("POST", control_path(existing, "/streams")),
        ("POST", control_path(existing, "/claim")),
    ):
        answer, closed = answer_to_headers_only(server, method, target, declared)
        assert answer.status == 413, (method, target, answer.body)
        error = answer.json()["error"]
        assert error["code"] == "PAYLOAD_TOO_LARGE" and str(CONTROL_LIMIT) in error["message"]
        assert closed
    # Sent in full (not declared: chunked), a body past the limit is refused as it crosses it.
    sent = requests.put(
        server.stream_url(f"__ds/subscriptions/{unique('big')}"),
        data=iter([b"[" * (CONTROL_LIMIT // 2)] * 4),
        headers=JSON,
    )
    assert sent.status_code == 413 and str(CONTROL_LIMIT) in sent.json()["error"]["message"]


def _bomb_bodies() -> list[bytes]:
    return [
        b"[" * 60_000,  # was a 500 (RecursionError)
        b'{"a":' * 12_000,
        b"[" * 33 + b"]" * 33,  # well-formed, one level past the limit
        b'{"streams": ' + b"[" * 40 + b"]" * 40 + b"}",
        b"{bad",
        b"\xff\xfe{}",
        b'{"type": "pull-wake", "streams": ["a\\ud800"], "wake_stream": "w"}',
    ]


def test_deep_or_malformed_json_gets_400_with_a_json_body(
    server_factory, receiver: WebhookReceiver
) -> None:
    server = server_factory()
    api = Api(server)
    prefix, pulled, _ = pull_setup(api, ttl_ms=30_000)
    hooked = unique("hooked")
    assert api.put_sub(hooked, webhook_config(f"{prefix}-h/*", receiver.url)).status_code == 201
    api.create_stream(f"{prefix}-h/s", {"n": 1})
    token = receiver.wait_for(1).body["callback_token"]
    targets = [
        (api.sub(unique("new")), None, "PUT"),
        (api.sub(pulled, "/streams"), None, "POST"),
        (api.sub(pulled, "/claim"), None, "POST"),
        (api.sub(hooked, "/callback"), token, "POST"),
    ]
    for url, bearer, method in targets:
        headers = dict(JSON) if bearer is None else {**JSON, "Authorization": f"Bearer {bearer}"}
        for body in _bomb_bodies():
            answer = requests.request(method, url, data=body, headers=headers)
            assert answer.status_code == 400, (url, body[:40], answer.status_code, answer.text)
            assert answer.json()["error"]["code"] in ("INVALID_JSON", "BAD_REQUEST"), answer.text
    deep = requests.put(api.sub(unique("new")), data=b"[" * 60_000, headers=JSON)
    assert "32 levels" in deep.json()["error"]["message"]
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "RecursionError" not in log


def test_a_webhook_answer_nested_without_bound_counts_as_not_done(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    async def deliver_twice() -> tuple[Any, Any]:
        signer = WebhookSigner.load_or_create(tmp_path)
        sender = WebhookSender(signer, WebhookUrlPolicy(allow_local_dev=True), clock=time.time)
        try:
            receiver.respond(raw=b"[" * 60_000)
            deep = await sender.send(receiver.url, b"{}")
            receiver.respond(raw=b'{"done": true}')
            done = await sender.send(receiver.url, b"{}")
        finally:
            await sender.aclose()
        return deep, done

    deep, done = asyncio.run(deliver_twice())
    assert deep.delivered and not deep.done
    assert done.delivered and done.done


def _answer(response: requests.Response) -> tuple[int, str, str]:
    return response.status_code, response.text, response.headers.get("WWW-Authenticate", "")


def test_unknown_and_unauthorised_ids_answer_alike(api: Api, receiver: WebhookReceiver) -> None:
    prefix, pulled, _ = pull_setup(api, ttl_ms=30_000)
    api.create_stream(f"{prefix}/s", {"n": 1})
    claim_token = wait_until(
        lambda: (
            (r := api.post(pulled, "claim", {"worker": "w"})).status_code == 200
            and r.json()["token"]
        ),
        what="a claim",
    )
    hooked = unique("hooked")
    assert api.put_sub(hooked, webhook_config(f"{prefix}-h/*", receiver.url)).status_code == 201
    api.create_stream(f"{prefix}-h/s", {"n": 1})
    callback_token = receiver.wait_for(1).body["callback_token"]
    owners = {claim_token: pulled, callback_token: hooked}
    credentials: list[str | None] = [
        None,
        "Bearer garbage",
        "Bearer ds1.eyJzdWIiOiJ4In0.AAAA",
        "Basic dXNlcjpwYXNz",
        f"Bearer {claim_token}",
        f"Bearer {callback_token}",
    ]
    ids = [pulled, hooked, unique("unknown")]
    for action in ("callback", "ack", "release"):
        for credential in credentials:
            headers = dict(JSON)
            if credential is not None:
                headers["Authorization"] = credential
            token = credential.removeprefix("Bearer ") if credential else None
            answers = {
                sub_id: _answer(
                    requests.post(api.sub(sub_id, f"/{action}"), json=WAKE, headers=headers)
                )
                for sub_id in ids
                if owners.get(token) != sub_id  # the token's own subscription may answer more
            }
            assert len(set(answers.values())) == 1, (action, credential, answers)
            assert next(iter(answers.values()))[0] == 401


def test_with_server_tokens_anonymous_callers_learn_nothing_about_ids(server_factory) -> None:
    token = "t0k3n-" + "a" * 30
    server = server_factory(extra_args=["--auth-token", token])
    api = Api(server)
    auth = {"Authorization": f"Bearer {token}", **JSON}
    wake = unique("wake")
    assert requests.put(api.stream(wake), headers=auth).status_code == 201
    existing = unique("sub")
    config = {"type": "pull-wake", "pattern": "x/*", "wake_stream": wake}
    assert requests.put(api.sub(existing), json=config, headers=auth).status_code == 201
    for method, suffix in (
        ("GET", ""),
        ("PUT", ""),
        ("DELETE", ""),
        ("POST", "/streams"),
        ("DELETE", "/streams/a%2Fb"),
        ("POST", "/claim"),
        ("POST", "/ack"),
        ("POST", "/callback"),
    ):
        answers = {
            _answer(requests.request(method, api.sub(sub_id, suffix), json=config, headers=JSON))
            for sub_id in (existing, unique("unknown"))
        }
        assert len(answers) == 1 and next(iter(answers))[0] == 401, (method, suffix, answers)
