"""A ``url`` that is not a stream root (``http://host:4437`` without ``/v1/stream``) gets its fix on a 404,
and a server certificate the connector does not trust gets the TLS options named.

Against the real server: the 404 says which option to change and to what; a right root with a missing
stream keeps the plain "does not exist" message.
"""

from __future__ import annotations

import pytest

from durastream_spark.errors import StreamNotFound, TransportError, stream_root_hint
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from tests.server.http.test_cors_tls import needs_openssl, tls_server


def head_error(url: str, path: str) -> StreamNotFound:
    client = StreamClient(ConnectionOptions.parse({"url": url}))
    with pytest.raises(StreamNotFound) as caught:
        client.head(path)
    return caught.value


@pytest.mark.parametrize("suffix", ["", "/", "/v1"])
def test_a_url_without_the_stream_root_suggests_it(durastream_server, suffix: str) -> None:
    base = durastream_server.base_url
    durastream_server_client = StreamClient(ConnectionOptions.parse({"url": base + "/v1/stream"}))
    durastream_server_client.create("hint/events")
    error = head_error(base + suffix, "hint/events")
    first_line = str(error).splitlines()[0]
    assert first_line.startswith(
        f"HEAD stream 'hint/events': not found (404): option 'url' ({base}{suffix.rstrip('/')}) "
        "does not look like a stream root; durastream-server serves streams under /v1/stream, so "
        f'use .option("url", "{base}/v1/stream")'
    )


def test_a_stream_root_keeps_the_plain_message(durastream_server) -> None:
    error = head_error(durastream_server.base_url + "/v1/stream", "hint/never-created")
    assert "does not exist under" in str(error)
    assert "stream root" not in str(error)


def test_what_looks_like_a_stream_root() -> None:
    assert stream_root_hint("http://h:4437/v1/stream") is None
    assert stream_root_hint("https://h/proxy/v1/stream") is None
    assert '"http://h:4437/v1/stream"' in (stream_root_hint("http://h:4437") or "")
    assert '"https://h/ds/v1/stream"' in (stream_root_hint("https://h/ds") or "")


@needs_openssl
def test_an_untrusted_certificate_names_tls_and_the_options(tmp_path) -> None:
    with tls_server(tmp_path) as server:
        client = StreamClient(ConnectionOptions.parse({"url": server.base + "/v1/stream"}))
        with pytest.raises(TransportError) as caught:
            client.head("anything")
        trusted = StreamClient(
            ConnectionOptions.parse(
                {"url": server.base + "/v1/stream", "tls.caBundle": str(server.cert)}
            )
        )
        with pytest.raises(StreamNotFound):
            trusted.head("anything")  # the fix the message names works
    text = str(caught.value)
    assert text.startswith(
        f"TLS with the server at {server.base} failed (self-signed certificate): "
    )
    assert "set option 'tls.caBundle' to the CA that signed it" in text
