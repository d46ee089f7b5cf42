"""The forward of ``--workers 2`` (``shards/router.py``): every framing of a request and of an answer
survives the relay. Each test learns which worker accepted its connection (``/healthz`` names the shard)
and then uses only a stream of the *other* shard, so every request below is forwarded: the server runs
with ``--no-connection-handoff`` (else the connection would move to the owner, ``shards/handoff.py``,
whose tests are ``test_handoff.py``). Over TLS connections never move."""

from __future__ import annotations

import http.client
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from durastream_server import extensions
from durastream_server.shards.layout import shard_of
from tests.server.http.test_cors_tls import needs_openssl, tls_server
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT workers")

BIG = 300 * 1024  # more than the relay's 64 KiB reads, so the answer streams in pieces


@pytest.fixture
def connection(server_factory) -> Iterator[http.client.HTTPConnection]:  # type: ignore[no-untyped-def]
    """One keep-alive connection to a ``--workers 2`` server that forwards (never hands over)."""
    server: ServerProcess = server_factory(extra_args=("--workers", "2", "--no-connection-handoff"))
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    yield connection
    connection.close()


def _exchange(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, response.headers, response.read()


def _forwarded_stream(connection: http.client.HTTPConnection) -> str:
    """A fresh stream path of the shard that did NOT accept ``connection``."""
    status, _, body = _exchange(connection, "GET", "/healthz")
    assert status == 200
    here = json.loads(body)["shard"]["index"]
    while True:
        path = f"fwd-{uuid.uuid4().hex[:10]}"
        if shard_of(path, 2) != here:
            return path


def _forwarded_count(connection: http.client.HTTPConnection) -> int:
    return json.loads(_exchange(connection, "GET", "/healthz")[2])["shard"]["forwarded"]


def test_large_bodies_chunked_requests_and_head_are_relayed(
    connection: http.client.HTTPConnection,
) -> None:
    path = _forwarded_stream(connection)
    url = f"/v1/stream/{path}"
    before = _forwarded_count(connection)
    assert _exchange(connection, "PUT", url, headers={"Content-Type": "text/plain"})[0] == 201
    big = bytes(range(256)) * (BIG // 256)
    assert _exchange(connection, "POST", url, big, {"Content-Type": "text/plain"})[0] == 204
    connection.putrequest("POST", url)
    connection.putheader("Content-Type", "text/plain")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    connection.send(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    response = connection.getresponse()
    response.read()
    assert response.status == 204
    status, headers, body = _exchange(connection, "GET", f"{url}?offset=-1")
    assert status == 200
    assert body == big + b"abcde"
    status, head_headers, head_body = _exchange(connection, "HEAD", url)
    assert (status, head_body) == (200, b"")
    assert head_headers["Stream-Next-Offset"] == headers["Stream-Next-Offset"]
    # PUT, two POSTs, GET, HEAD went to the other worker (the /healthz requests are answered here)
    assert _forwarded_count(connection) - before == 5


def test_an_owners_error_answer_is_relayed_as_it_was(
    connection: http.client.HTTPConnection,
) -> None:
    path = _forwarded_stream(connection)
    status, headers, body = _exchange(
        connection, "POST", f"/v1/stream/{path}", b"x", {"Content-Type": "text/plain"}
    )
    assert status == 404
    assert headers["Content-Type"] == "application/json"
    assert "error" in json.loads(body)
    # The connection is still usable after a relayed error.
    assert _exchange(connection, "GET", "/healthz")[0] == 200


def test_extensions_spanning_streams_are_not_advertised(
    connection: http.client.HTTPConnection,
) -> None:
    path = _forwarded_stream(connection)
    for method, url in (("GET", "/healthz"), ("HEAD", f"/v1/stream/{path}")):
        _, headers, _ = _exchange(connection, method, url)
        advertised = {item.split("=")[0].strip() for item in headers[extensions.HEADER].split(",")}
        assert advertised, url
        assert not advertised & extensions.NOT_WITH_WORKERS, (url, advertised)
        assert "bounded-read" in advertised


@needs_openssl
def test_a_forwarded_create_over_tls_names_an_https_location(tmp_path: Path) -> None:
    """The forward reaches the owner over plain HTTP on its Unix socket; the owner must still answer
    with the scheme the client used (a create's Location)."""
    with tls_server(tmp_path, "--workers", "2") as server, requests.Session() as session:
        verify = str(
            server.cert
        )  # per request: requests prefers REQUESTS_CA_BUNDLE to session.verify
        here = session.get(server.base + "/healthz", verify=verify, timeout=10).json()["shard"][
            "index"
        ]
        candidates = (f"tls-{uuid.uuid4().hex[:10]}" for _ in range(200))
        paths = [p for p in candidates if shard_of(p, 2) != here][:2]
        # a small declared body: the direct path (http/fastpath.py); a chunked one: the ordinary path
        for path, data in zip(paths, (b"x" * 10, iter([b"x"])), strict=True):
            created = session.put(
                f"{server.base}/v1/stream/{path}",
                headers={"Content-Type": "text/plain"},
                data=data,
                verify=verify,
                timeout=10,
            )
            assert created.status_code == 201, created.text
            assert created.headers["Location"] == f"{server.base}/v1/stream/{path}"
        forwarded = session.get(server.base + "/healthz", verify=verify, timeout=10).json()[
            "shard"
        ]["forwarded"]
        assert forwarded >= 2
