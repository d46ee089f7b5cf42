"""Advertisement: the ``Durastream-Extensions`` header on every kind of response, the CORS expose list,
and the discovery endpoint."""

from __future__ import annotations

import http.client

import pytest
import requests

from durastream_server import extensions
from tests.server.extensions.support import JSON, TEXT, TIMEOUT, append, create, unique
from tests.support.server_process import ServerProcess

EXPECTED = {
    "bounded-read": 1,
    "message-frames": 1,
    "limit-lookup": 1,
    "listing": 1,
    "staged-append": 2,
    "payload-digest": 2,
    "forgotten-producers": 1,
    "time-lookup": 1,
    "changes": 1,
    "multi-range": 1,
    "bulk-write": 2,
    "byte-positions": 1,
}


def parse_header(value: str) -> dict[str, int]:
    pairs = [item.strip().split("=") for item in value.split(",")]
    return {name: int(version) for name, version in pairs}


def assert_advertised(response: requests.Response) -> None:
    value = response.headers.get("Durastream-Extensions")
    assert value is not None, (response.status_code, dict(response.headers))
    assert parse_header(value) == EXPECTED
    exposed = [h.strip() for h in response.headers["Access-Control-Expose-Headers"].split(",")]
    assert "Durastream-Extensions" in exposed and "Durastream-End-Reached" in exposed


def test_the_list_is_defined_once_and_matches_the_document() -> None:
    assert dict(extensions.EXTENSIONS) == EXPECTED
    assert parse_header(extensions.HEADER_VALUE) == EXPECTED


def test_header_on_every_kind_of_response(durastream_server: ServerProcess) -> None:
    path = unique("adv")
    url = durastream_server.stream_url(path)
    seen = []

    def check(response: requests.Response) -> None:
        assert_advertised(response)
        seen.append(response.status_code)

    check(requests.put(url, data=b"[1]", headers={"Content-Type": JSON}, timeout=TIMEOUT))  # 201
    check(requests.get(url, timeout=TIMEOUT))  # 200 catch-up
    check(requests.head(url, timeout=TIMEOUT))  # HEAD
    check(
        requests.post(url, data=b"[2]", headers={"Content-Type": JSON}, timeout=TIMEOUT)
    )  # 204 append
    check(requests.get(url, params={"offset": "bogus"}, timeout=TIMEOUT))  # 400
    check(requests.get(durastream_server.stream_url(unique("missing")), timeout=TIMEOUT))  # 404
    check(requests.patch(url, timeout=TIMEOUT))  # 405
    check(requests.options(url, timeout=TIMEOUT))  # preflight 204
    check(requests.get(durastream_server.base_url + "/healthz", timeout=TIMEOUT))
    tail = requests.head(url, timeout=TIMEOUT).headers["Stream-Next-Offset"]
    check(
        requests.get(url, params={"offset": tail, "live": "long-poll"}, timeout=TIMEOUT)
    )  # 204 timeout
    etag = requests.get(url, params={"offset": "-1"}, timeout=TIMEOUT).headers["ETag"]
    check(
        requests.get(url, params={"offset": "-1"}, headers={"If-None-Match": etag}, timeout=TIMEOUT)
    )  # 304
    assert sorted(set(seen)) == [200, 201, 204, 304, 400, 404, 405]


def test_header_on_sse(durastream_server: ServerProcess) -> None:
    path = unique("adv-sse")
    create(durastream_server, path, b"hello", content_type=TEXT)
    append(durastream_server, path, b"", content_type=TEXT, close=True)
    with requests.get(
        durastream_server.stream_url(path),
        params={"offset": "-1", "live": "sse"},
        stream=True,
        timeout=TIMEOUT,
    ) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert_advertised(response)
        assert b"hello" in response.raw.read()  # closed stream: the server ends the response


def test_discovery_endpoint(durastream_server: ServerProcess) -> None:
    url = durastream_server.base_url + "/v1/stream/__ds/x-durastream/extensions"
    response = requests.get(url, timeout=TIMEOUT)
    assert response.status_code == 200
    assert_advertised(response)
    assert response.headers["Content-Type"] == "application/json"
    document = response.json()
    assert document["extensions"] == EXPECTED
    assert document["server"].startswith("durastream-server/")
    head = requests.head(url, timeout=TIMEOUT)
    assert head.status_code == 200 and head.content == b""
    refused = requests.post(url, data=b"{}", timeout=TIMEOUT)
    assert refused.status_code == 405 and refused.headers["Allow"] == "GET, HEAD"
    unknown = requests.get(url.replace("extensions", "nope"), timeout=TIMEOUT)
    assert unknown.status_code == 404
    assert_advertised(unknown)


@pytest.mark.parametrize("method", ["GET", "OPTIONS"])
def test_discovery_is_not_a_stream_or_a_subscription(
    durastream_server: ServerProcess, method: str
) -> None:
    """The x-durastream namespace sits under the reserved __ds segment: never a stream path, and it
    answers even though the subscription service owns the rest of __ds."""
    host = durastream_server.base_url.split("//")[1]
    name, port = host.split(":")
    connection = http.client.HTTPConnection(name, int(port), timeout=TIMEOUT)
    try:
        connection.request(method, "/v1/stream/__ds/x-durastream/extensions")
        response = connection.getresponse()
        response.read()
        assert response.status == (200 if method == "GET" else 204)
        assert response.getheader("Durastream-Extensions") == extensions.HEADER_VALUE
    finally:
        connection.close()
