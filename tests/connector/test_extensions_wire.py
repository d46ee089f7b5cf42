"""Extension detection and the guards around it, on the wire (scripted local server).

A base-protocol server (the Node reference server) sends no ``Durastream-Extensions`` header and 404s the
discovery URL. It also ignores unknown query parameters, so a bounded read sent to it would come back with
more data than asked for, and a stage would become a visible append: the client must refuse before sending.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durastream_spark.errors import ExtensionNotSupported, MalformedResponse
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol import extensions as ext
from durastream_spark.protocol.client import FRAMES_CONTENT_TYPE, StreamClient
from durastream_spark.protocol.extensions import Extensions
from durastream_spark.protocol.frames import decode_frames, encode_frames
from tests.connector.fault_server import FaultServer, Respond

START = "0000000000000000_0000000000000000"
END = "0000000000000000_0000000000000014"
ALL = (
    "bounded-read=1, message-frames=1, limit-lookup=1, listing=1, staged-append=1, payload-digest=1"
)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer(default=Respond(404)) as running:
        yield running


def client_for(server: FaultServer) -> StreamClient:
    return StreamClient(ConnectionOptions.parse({"url": server.root, "retry.maxAttempts": "1"}))


def test_parse_header() -> None:
    parsed = Extensions.parse(" bounded-read=1,message-frames=2 , listing , bogus=x, =3")
    assert parsed.versions == (("bounded-read", 1), ("listing", 1), ("message-frames", 2))
    assert parsed.bounded_read and parsed.listing and parsed.supports("message-frames", 2)
    assert not parsed.staged_append and not parsed.supports("message-frames", 3)
    assert not Extensions.parse(None) and not Extensions.parse("")


def test_without_extensions_nothing_unbounded_is_sent(server: FaultServer) -> None:
    client = client_for(server)
    with pytest.raises(ExtensionNotSupported, match="bounded-read") as caught:
        client.read("s", START, end=END)
    assert "up to end offset" in str(caught.value)
    with pytest.raises(ExtensionNotSupported, match="message-frames"):
        client.read("s", START, format="frames")
    with pytest.raises(ExtensionNotSupported, match="staged-append"):
        client.stage("s", "h1", b"[1]", "application/json")
    with pytest.raises(ExtensionNotSupported, match="staged-append"):
        client.commit("s", ["h1"], ("p", 0, 0))
    with pytest.raises(ExtensionNotSupported, match="limit-lookup"):
        client.lookup_limit("s", START, max_messages=5)
    with pytest.raises(ExtensionNotSupported, match="listing"):
        list(client.list_streams(prefix="a/"))
    # one discovery request (404: no extensions, cached), and nothing else ever reached the server
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", "/v1/stream" + ext.DISCOVERY_PATH)
    ]


def test_discovery_document_without_header(server: FaultServer) -> None:
    server.script(
        Respond(200, {"Content-Type": "application/json"}, b'{"extensions": {"listing": 1}}')
    )
    assert client_for(server).extensions() == Extensions((("listing", 1),))


def test_any_response_header_updates_the_cache(server: FaultServer) -> None:
    client = client_for(server)
    server.script(Respond(200, {"Stream-Next-Offset": START, ext.HEADER: "bounded-read=1"}))
    client.head("s")
    assert client.extensions().bounded_read
    assert server.requests[-1].method == "HEAD"  # no discovery request was needed


def test_bounded_frames_read_sorts_query_parameters(server: FaultServer) -> None:
    server.extra_headers = {ext.HEADER: ALL}
    body = encode_frames([0, 7], [1, 2], [b'{"a":1}', b'{"b":2}'])
    server.script(
        Respond(200, {"Content-Type": FRAMES_CONTENT_TYPE, "Stream-Next-Offset": END}, body),
        Respond(200, {"Content-Type": FRAMES_CONTENT_TYPE, "Stream-Next-Offset": END}, body),
    )
    client = client_for(server)
    client.extensions()
    chunk = client.read("a b/c", START, end=END, format="frames")
    assert chunk.end_reached and decode_frames(chunk.body).count == 2
    assert server.requests[-1].path == f"/v1/stream/a%20b/c?end={END}&format=frames&offset={START}"
    server.script(
        Respond(
            200,
            {"Content-Type": "application/json"},
            b'{"start": "%s", "end": "%s", "messages": 2, "bytes": 14, "tail": "%s", "closed": false}'
            % (START.encode(), END.encode(), END.encode()),
        )
    )
    found = client.lookup_limit("s", START, max_messages=3, max_bytes=10, end=END)
    assert (found.end, found.messages, found.bytes, found.closed) == (END, 2, 14, False)
    assert server.requests[-1].path == (
        f"/v1/stream/s?end={END}&lookup=limit&max_bytes=10&max_messages=3&offset={START}"
    )


def test_a_read_past_end_is_refused(server: FaultServer) -> None:
    server.extra_headers = {ext.HEADER: ALL}
    client = client_for(server)
    client.extensions()
    beyond = "0000000000000000_0000000000000099"
    server.script(
        Respond(200, {"Content-Type": "application/json", "Stream-Next-Offset": beyond}, b"[1]")
    )
    with pytest.raises(MalformedResponse, match="past the end"):
        client.read("s", START, end=END)


def test_frames_requested_but_not_answered(server: FaultServer) -> None:
    server.extra_headers = {ext.HEADER: ALL}
    client = client_for(server)
    client.extensions()
    server.script(
        Respond(200, {"Content-Type": "application/json", "Stream-Next-Offset": END}, b"[1]")
    )
    with pytest.raises(MalformedResponse, match="format=frames"):
        client.read("s", START, format="frames")


def test_iter_range_refuses_a_server_that_makes_no_progress(server: FaultServer) -> None:
    server.extra_headers = {ext.HEADER: ALL}
    client = client_for(server)
    client.extensions()
    server.default = Respond(
        200, {"Content-Type": "application/json", "Stream-Next-Offset": START}, b"[]"
    )
    with pytest.raises(MalformedResponse, match="no progress"):
        list(client.iter_range("s", START, END))


@pytest.mark.parametrize("bad", ["", "/", "a//b", "a/../b", "./a"])
def test_bad_stream_paths(bad: str) -> None:
    client = StreamClient(ConnectionOptions.parse({"url": "http://127.0.0.1:1/v1/stream"}))
    with pytest.raises(ValueError):
        client.stream_url(bad)


@pytest.mark.parametrize(
    ("version", "form"), [(1, "header"), (2, "body")], ids=["staged-append=1", "staged-append=2"]
)
def test_handle_lists_go_in_the_body_where_the_server_takes_them(
    server: FaultServer, version: int, form: str
) -> None:
    """Issue 15, item 2: a header caps a commit at about 1,000 handles (431 past the server's header
    limit); version 2 of the extension takes the list as the body."""
    client = StreamClient(
        ConnectionOptions.parse({"url": server.root, "retry.maxAttempts": "1"}),
        extensions=Extensions(((ext.STAGED_APPEND, version),)),
    )
    handles = [f"h-{i}" for i in range(3)]
    server.script(Respond(200, {"Stream-Next-Offset": START}), Respond(204))
    client.commit("s", handles, ("p", 4, 0))
    client.abort("s", handles)
    commit, abort = server.requests[-2:]
    if form == "body":
        assert commit.headers["Durastream-Commit"] == abort.headers["Durastream-Abort"] == "@body"
        assert commit.body == abort.body == b"h-0,h-1,h-2"
    else:
        assert (
            commit.headers["Durastream-Commit"]
            == abort.headers["Durastream-Abort"]
            == ("h-0,h-1,h-2")
        )
        assert commit.body == abort.body == b""
    assert commit.headers["Producer-Epoch"] == "4"
    if version == 1:
        with pytest.raises(ExtensionNotSupported, match="at version 2 or later"):
            client.commit("s", handles, ("p", 4, 1), key="k")
        assert len(server.requests) == 2  # refused before sending
