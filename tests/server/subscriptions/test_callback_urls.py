"""Subscription callback and JWKS URLs come from ``--public-url`` (or the listening address), never from
a request's ``Host`` (issue 14, item 8): a re-confirming PUT with ``Host: attacker.example`` used to point
every later callback, and its token, at attacker.example.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
from pathlib import Path

import pytest
import requests

from durastream_server.cli import main
from durastream_server.config import ServerConfig
from durastream_server.server import with_public_url
from durastream_server.subscriptions.service import SubscriptionService
from tests.server.subscriptions.receiver import WebhookReceiver
from tests.server.subscriptions.test_end_to_end import JSON, Api, unique, webhook_config
from tests.server.subscriptions.test_service import ROOT, FakeEngine, Hook, call, eventually

PUBLIC = "https://streams.example.test/base"


def _hostile_hosts(api: Api) -> list[str]:
    # A name the server has nothing to do with, and a loopback spelling other than the bound address
    # (which a Host allow-list on a loopback server accepts, so the URL rule is exercised either way).
    return ["attacker.example", f"localhost:{api.server.port}"]


def _create_and_reconfirm_with(api: Api, sub_id: str, config: dict, host: str) -> list[dict]:
    """PUT (create or re-confirm) and GET with a hostile Host; the descriptions that were served."""
    served = []
    headers = {**JSON, "Host": host}
    for response in (
        requests.put(api.sub(sub_id), data=json.dumps(config), headers=headers),
        requests.put(api.sub(sub_id), data=json.dumps(config), headers=headers),
        requests.get(api.sub(sub_id), headers={"Host": host}),
    ):
        if host == "attacker.example" and response.status_code in (400, 421):
            continue  # refused by a Host allow-list first: just as safe
        assert response.status_code in (200, 201), (host, response.status_code, response.text)
        served.append(response.json())
    return served


def _check_urls(api: Api, receiver: WebhookReceiver, root: str) -> None:
    prefix, sub_id = unique("cburl"), unique("sub")
    config = webhook_config(f"{prefix}/*", receiver.url, lease_ttl_ms=30_000)
    assert requests.put(api.sub(sub_id), data=json.dumps(config), headers=JSON).status_code == 201
    served = []
    for host in _hostile_hosts(api):
        served += _create_and_reconfirm_with(api, sub_id, config, host)
    assert served  # the loopback spelling is always accepted
    for description in served:
        assert description["webhook"]["signing"]["jwks_url"] == f"{root}/__ds/jwks.json"
    api.create_stream(f"{prefix}/s", {"n": 1})
    note = receiver.wait_for(1).body
    assert note["callback_url"] == f"{root}/__ds/subscriptions/{sub_id}/callback"


def test_callback_urls_come_from_public_url_whatever_the_host_header(
    server_factory, receiver: WebhookReceiver
) -> None:
    server = server_factory(extra_args=["--public-url", PUBLIC + "/"])
    _check_urls(Api(server), receiver, f"{PUBLIC}/v1/stream")


def test_without_public_url_callback_urls_name_the_listening_address(
    api: Api, receiver: WebhookReceiver
) -> None:
    _check_urls(api, receiver, f"{api.server.base_url}/v1/stream")


def test_state_written_with_a_host_derived_url_does_not_carry_it_forward(tmp_path: Path) -> None:
    """Subscriptions persisted by earlier versions hold the Host-derived root: it is ignored."""

    async def scenario() -> None:
        engine = FakeEngine()
        hook = Hook()
        service = SubscriptionService(
            engine, tmp_path, stream_root_url=ROOT, http_client=hook.client(), rng=random.Random(1)
        )
        await service.start()
        config = {"type": "webhook", "pattern": "ev/*", "webhook": {"url": "http://127.0.0.1:9/h"}}
        assert (await call(service, "PUT", "subscriptions/s1", config)).status == 201
        await service.close()
        (state_file,) = (tmp_path / "subscriptions").glob("*.json")
        state = json.loads(state_file.read_text())
        assert "stream_root_url" not in state
        state["stream_root_url"] = "http://attacker.example/v1/stream"  # as older versions wrote it
        state_file.write_text(json.dumps(state))

        restarted = SubscriptionService(
            engine, tmp_path, stream_root_url=ROOT, http_client=hook.client(), rng=random.Random(1)
        )
        await restarted.start()
        engine.create("ev/a", b"[1]")
        await eventually(lambda: hook.calls)
        assert hook.calls[0][1]["callback_url"] == f"{ROOT}/__ds/subscriptions/s1/callback"
        await restarted.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "value",
    [
        "ftp://streams.example.com",
        "streams.example.com",
        "https://streams.example.com/?tenant=a",
        "https://streams.example.com/#top",
        "https://user:secret@streams.example.com",
        "https:///path-only",
        "https://streams.example.com:99999",
        "https://streams example.com",
    ],
)
def test_a_bad_public_url_is_a_usage_error_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--public-url", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--public-url" in err
    assert "secret" not in err  # credentials are never echoed
    with pytest.raises(ValueError, match="public URL"):
        ServerConfig(public_url=value)


def test_the_default_public_url_is_the_bound_address(caplog: pytest.LogCaptureFixture) -> None:
    given = ServerConfig(public_url="HTTPS://Streams.example.com/base/")
    assert given.public_base_url == "https://Streams.example.com/base"
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
        assert with_public_url(given, sock) is given
        resolved = with_public_url(ServerConfig(port=0), sock)
        assert resolved.public_base_url == f"http://127.0.0.1:{port}"  # the real port, not 0
    assert not caplog.records
    with socket.create_server(("0.0.0.0", 0)) as sock, caplog.at_level(logging.WARNING):
        resolved = with_public_url(ServerConfig(host="0.0.0.0", port=0), sock)
        port = sock.getsockname()[1]
    assert resolved.public_url == f"http://0.0.0.0:{port}"
    assert "--public-url" in caplog.text
