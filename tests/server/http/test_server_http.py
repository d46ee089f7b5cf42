"""HTTP-layer behaviour against the real server: path mapping, errors, caching, CORS, security headers."""

from __future__ import annotations

import http.client
import json
import uuid
from urllib.parse import urlsplit

import pytest
import requests

from tests.support.server_process import ServerProcess

TEXT = "text/plain"


def unique(name: str) -> str:
    return f"http-layer/{name}-{uuid.uuid4().hex[:10]}"


def raw_request(
    server: ServerProcess,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, dict[str, str], bytes]:
    """A request with the target sent byte-for-byte (requests/urllib would normalise ``..`` and friends)."""
    parts = urlsplit(server.base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.putrequest(method, target, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        if body or method in ("PUT", "POST"):
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_healthz(durastream_server: ServerProcess) -> None:
    response = requests.get(durastream_server.base_url + "/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert isinstance(response.json()["waiters"], int)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/v1/stream/body-limit/any"),
        ("DELETE", "/v1/stream/body-limit/any"),
    ],
)
def test_a_body_declared_over_the_limit_is_refused_on_routes_that_read_none(
    durastream_server: ServerProcess, method: str, path: str
) -> None:
    """Found by the hostile-request fuzz: a GET /healthz declaring a 64 MiB + 1 body was answered 200
    (the body left unread on the connection) where every other route answers 413; later a stream GET
    the same way, whenever the answer went out before the connection's guard saw the body pass the
    limit."""
    connection = http.client.HTTPConnection(
        durastream_server.host, durastream_server.port, timeout=10
    )
    try:
        connection.putrequest(method, path)
        connection.putheader("Content-Length", str((64 << 20) + 1))
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413
        assert json.loads(response.read())["error"]["code"] == "PAYLOAD_TOO_LARGE"
    finally:
        connection.close()
    assert requests.get(durastream_server.base_url + "/healthz").status_code == 200


def test_slash_and_escaped_slash_name_different_streams(durastream_server: ServerProcess) -> None:
    base = unique("sep")
    two_segments = f"/v1/stream/{base}/a/b"
    one_segment = f"/v1/stream/{base}/a%2Fb"
    assert (
        raw_request(durastream_server, "PUT", two_segments, {"Content-Type": TEXT}, b"two")[0]
        == 201
    )
    assert (
        raw_request(durastream_server, "PUT", one_segment, {"Content-Type": TEXT}, b"one")[0] == 201
    )
    assert raw_request(durastream_server, "GET", two_segments)[2] == b"two"
    assert raw_request(durastream_server, "GET", one_segment)[2] == b"one"
    assert raw_request(durastream_server, "GET", f"/v1/stream/{base}/a%2fb")[2] == b"one"


def test_equivalent_percent_encodings_are_one_stream(durastream_server: ServerProcess) -> None:
    base = unique("enc")
    status, headers, _ = raw_request(
        durastream_server, "PUT", f"/v1/stream/{base}/caf%C3%A9%41", {"Content-Type": TEXT}, b"x"
    )
    assert status == 201
    assert headers["location"].endswith(f"/v1/stream/{base}/caf%C3%A9%41")
    assert raw_request(durastream_server, "GET", f"/v1/stream/{base}/caf%c3%a9A")[2] == b"x"


@pytest.mark.parametrize(
    "target",
    [
        "/v1/stream/",
        "/v1/stream/a//b",
        "/v1/stream/a/",
        "/v1/stream/a/../b",
        "/v1/stream/a/./b",
        "/v1/stream/a/%2E%2E/b",
        "/v1/stream/a%00b",
        "/v1/stream/a%zz",
        "/v1/stream/%C3%28",
    ],
)
def test_malformed_stream_paths_are_400(durastream_server: ServerProcess, target: str) -> None:
    for method in ("GET", "PUT", "HEAD"):
        status, headers, body = raw_request(
            durastream_server, method, target, {"Content-Type": TEXT}
        )
        assert status == 400, (method, target)
        if method != "HEAD":
            assert json.loads(body)["error"]["code"] == "BAD_REQUEST"


def test_unknown_routes_and_methods(durastream_server: ServerProcess) -> None:
    status, headers, body = raw_request(durastream_server, "GET", "/nothing-here")
    assert status == 404
    assert json.loads(body)["error"]["code"] == "NOT_FOUND"
    url = durastream_server.stream_url(unique("method"))
    requests.put(url, headers={"Content-Type": TEXT})
    patch = requests.patch(url, data=b"x", headers={"Content-Type": TEXT})
    assert patch.status_code == 405
    assert "PUT" in patch.headers["Allow"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Stream-TTL": "+3600"},
        {"Stream-TTL": "03600"},
        {"Stream-TTL": "3.6e3"},
        {"Stream-TTL": "60", "Stream-Expires-At": "2099-01-01T00:00:00Z"},
        {"Stream-Expires-At": "tomorrow"},
        {"Stream-Fork-Sub-Offset": "0"},
    ],
)
def test_malformed_create_headers_are_400_json(durastream_server: ServerProcess, headers) -> None:
    url = durastream_server.stream_url(unique("bad-put"))
    response = requests.put(url, headers={"Content-Type": TEXT, **headers})
    assert response.status_code == 400
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST" and error["message"]
    assert requests.head(url).status_code == 404  # nothing was created


@pytest.mark.parametrize(
    "headers",
    [
        {"Producer-Id": "p", "Producer-Epoch": "x", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "0"},
        {"Producer-Epoch": "0", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "9007199254740992"},
    ],
)
def test_malformed_producer_headers_are_400(durastream_server: ServerProcess, headers) -> None:
    url = durastream_server.stream_url(unique("bad-post"))
    requests.put(url, headers={"Content-Type": TEXT})
    response = requests.post(url, data=b"x", headers={"Content-Type": TEXT, **headers})
    assert response.status_code == 400
    assert requests.get(url).content == b""


def test_stream_closed_other_values_are_ignored(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("closed-values"))
    requests.put(url, headers={"Content-Type": TEXT, "Stream-Closed": "yes"})
    for value in ("false", "1", "yes"):
        response = requests.post(
            url, data=b"x", headers={"Content-Type": TEXT, "Stream-Closed": value}
        )
        assert response.status_code == 204
        assert "Stream-Closed" not in response.headers
    closing = requests.post(url, headers={"Stream-Closed": "TrUe"})
    assert closing.status_code == 204 and closing.headers["Stream-Closed"] == "true"


def test_security_headers_everywhere(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("security"))
    origin = {"Origin": "http://localhost:3000"}  # loopback origins are allowed by default
    responses = [
        requests.put(url, headers={"Content-Type": TEXT, **origin}, data=b"x"),
        requests.post(url, headers={"Content-Type": TEXT, **origin}, data=b"y"),
        requests.get(url, headers=origin),
        requests.head(url, headers=origin),
        requests.get(url + "-missing", headers=origin),
        requests.options(url, headers=origin),
        requests.get(durastream_server.base_url + "/healthz", headers=origin),
    ]
    for response in responses:
        assert response.headers["X-Content-Type-Options"] == "nosniff", response.request.method
        assert response.headers["Cross-Origin-Resource-Policy"] == "cross-origin"
        assert response.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


def test_cors_exposes_every_protocol_header_and_preflight_allows_every_request_header(
    durastream_server: ServerProcess,
) -> None:
    url = durastream_server.stream_url(unique("cors"))
    for response in (requests.put(url, headers={"Content-Type": TEXT}), requests.get(url + "-404")):
        exposed = {
            h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")
        }
        for header in (
            "stream-next-offset",
            "stream-cursor",
            "stream-up-to-date",
            "stream-closed",
            "stream-sse-data-encoding",
            "stream-ttl",
            "stream-expires-at",
            "producer-epoch",
            "producer-seq",
            "producer-expected-seq",
            "producer-received-seq",
            "etag",
            "location",
        ):
            assert header in exposed, header
    preflight = requests.options(
        url,
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "producer-id,if-none-match",
        },
    )
    assert preflight.status_code == 204
    allowed = {
        h.strip().lower() for h in preflight.headers["Access-Control-Allow-Headers"].split(",")
    }
    for header in (
        "content-type",
        "if-none-match",
        "authorization",
        "stream-seq",
        "stream-ttl",
        "stream-expires-at",
        "stream-closed",
        "stream-forked-from",
        "stream-fork-offset",
        "stream-fork-sub-offset",
        "producer-id",
        "producer-epoch",
        "producer-seq",
    ):
        assert header in allowed, header
    methods = preflight.headers["Access-Control-Allow-Methods"]
    assert all(m in methods for m in ("GET", "HEAD", "PUT", "POST", "DELETE"))


def test_head_is_metadata_only_and_uncached(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("head"))
    requests.put(url, headers={"Content-Type": TEXT, "Stream-TTL": "3600"}, data=b"abc")
    head = requests.head(url)
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["Cache-Control"] == "no-store"
    assert head.headers["Stream-TTL"] == "3600"
    assert head.headers["Content-Type"] == TEXT
    assert "Stream-Closed" not in head.headers
    requests.post(url, headers={"Stream-Closed": "true"})
    assert requests.head(url).headers["Stream-Closed"] == "true"


def test_read_caching_and_etags(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("etag"))
    requests.put(url, headers={"Content-Type": TEXT}, data=b"data")
    first = requests.get(url, params={"offset": "-1"})
    etag = first.headers["ETag"]
    assert first.headers["Cache-Control"] == "public, max-age=60, stale-while-revalidate=300"
    assert etag.startswith('"') and etag.endswith('"')
    for header in (etag, f'W/"other", {etag}', f"W/{etag}", "*"):
        conditional = requests.get(url, params={"offset": "-1"}, headers={"If-None-Match": header})
        assert conditional.status_code == 304, header
        assert conditional.content == b""
    now = requests.get(url, params={"offset": "now"})
    assert now.status_code == 200 and now.content == b""
    assert now.headers["Cache-Control"] == "no-store"
    assert "ETag" not in now.headers
    # Closing without new data changes the tag, so a cached 304 cannot hide EOF.
    requests.post(url, headers={"Stream-Closed": "true"})
    closed = requests.get(url, params={"offset": "-1"}, headers={"If-None-Match": etag})
    assert closed.status_code == 200
    assert closed.headers["Stream-Closed"] == "true"
    assert closed.headers["ETag"] != etag


def test_put_and_post_response_headers(durastream_server: ServerProcess) -> None:
    url = durastream_server.stream_url(unique("writes"))
    created = requests.put(url, headers={"Content-Type": TEXT})
    assert created.status_code == 201
    assert created.headers["Location"] == url
    assert created.headers["Cache-Control"] == "no-store"
    again = requests.put(url, headers={"Content-Type": TEXT})
    assert again.status_code == 200 and "Location" not in again.headers
    producer = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    first = requests.post(url, data=b"a", headers={"Content-Type": TEXT, **producer})
    assert first.status_code == 200
    assert (first.headers["Producer-Epoch"], first.headers["Producer-Seq"]) == ("0", "0")
    duplicate = requests.post(url, data=b"a", headers={"Content-Type": TEXT, **producer})
    assert duplicate.status_code == 204
    assert duplicate.headers["Producer-Seq"] == "0"
    assert requests.get(url).content == b"a"


def test_a_put_with_a_malformed_content_type_is_refused_and_creates_nothing(
    durastream_server: ServerProcess,
) -> None:
    """A malformed Content-Type on a create is a 400 naming it, not a silent octet-stream stream; a
    missing or blank one still gets the protocol's default, and a valid one with parameters is kept."""
    url = durastream_server.stream_url(unique("ctype"))
    for raw in ("json", "application/json/x", "text /plain"):
        response = requests.put(url, headers={"Content-Type": raw})
        assert response.status_code == 400, (raw, response.status_code, response.text)
        error = response.json()["error"]
        assert error["code"] == "BAD_REQUEST"
        assert repr(raw) in error["message"] and "type/subtype" in error["message"]
        assert requests.head(url).status_code == 404
    source = durastream_server.stream_url(unique("ctype-src"))
    assert requests.put(source, headers={"Content-Type": "text/plain"}).status_code == 201
    fork = requests.put(
        url,
        headers={"Content-Type": "plain", "Stream-Forked-From": urlsplit(source).path},
    )
    assert fork.status_code == 400 and "'plain'" in fork.json()["error"]["message"]
    assert requests.put(url, headers={"Content-Type": ""}).status_code == 201
    assert requests.head(url).headers["Content-Type"] == "application/octet-stream"
    kept = durastream_server.stream_url(unique("ctype-kept"))
    assert (
        requests.put(kept, headers={"Content-Type": "Text/Plain; charset=utf-8"}).status_code == 201
    )
    assert requests.head(kept).headers["Content-Type"] == "text/plain; charset=utf-8"
