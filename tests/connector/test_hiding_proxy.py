"""The extension-hiding proxy the fallback tests put in front of a server must behave like a gateway when
its kept-alive upstream connection is closed under it (the server's idle timeout, or a restart): send the
request again on a fresh connection, and answer 502 with a JSON body when the server is gone, never drop the
client's connection (a dropped one made the client retry and log a traceback in the latency benchmark)."""

from __future__ import annotations

import requests

from tests.support.hiding_proxy import ExtensionHidingProxy


def test_a_request_after_the_server_restarted_reaches_it_on_a_fresh_upstream_connection(
    server_factory,
) -> None:
    server = server_factory()
    with ExtensionHidingProxy(server.port) as proxy, requests.Session() as session:
        url = f"{proxy.base_url}/v1/stream/proxy/restarted"
        assert session.put(url, headers={"Content-Type": "application/json"}).status_code == 201
        server.restart()  # the proxy's upstream connection is now closed by the old process
        answer = session.head(url)
        assert answer.status_code == 200, answer.headers
        assert "Durastream-Extensions" not in answer.headers


def test_a_server_that_is_gone_gets_a_502_with_a_json_error(server_factory) -> None:
    server = server_factory()
    with ExtensionHidingProxy(server.port) as proxy, requests.Session() as session:
        url = f"{proxy.base_url}/v1/stream/proxy/gone"
        assert session.put(url, headers={"Content-Type": "application/json"}).status_code == 201
        server.kill()
        answer = session.get(url, params={"offset": "-1"})
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "BAD_GATEWAY"
