"""``RequestBody``: a body in pieces is the bytes of its pieces, whatever the client does with it."""

from __future__ import annotations

import pickle

import requests

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.body import RequestBody, wire_body
from durastream_spark.protocol.client import StreamClient


def test_a_body_is_the_concatenation_of_its_pieces() -> None:
    data = memoryview(b'{"a":1},{"b":2},')
    body = RequestBody([b"[", data[:8], b"", data[8:-1], bytearray(b"]")])
    assert len(body) == len(b'[{"a":1},{"b":2}]')
    assert bytes(body) == b'[{"a":1},{"b":2}]'
    assert body == b'[{"a":1},{"b":2}]' and body != b"[]"
    assert b"".join(bytes(piece) for piece in body) == bytes(body)
    assert b"".join(bytes(piece) for piece in body) == bytes(body)  # iterable again (a retry)
    assert all(
        len(piece) for piece in body
    )  # empty pieces are dropped (an empty send is pointless)
    assert not RequestBody([]) and not RequestBody([b""])


def test_pickled_it_is_plain_bytes() -> None:
    """The ordered mode's last request travels to the driver in a commit message."""
    body = RequestBody([b"[", memoryview(b"1,2,")[:-1], b"]"])
    restored = pickle.loads(pickle.dumps(body))
    assert type(restored) is bytes and restored == b"[1,2]"


def test_wire_body_keeps_pieces_and_copies_other_buffers() -> None:
    body = RequestBody([b"x"])
    assert wire_body(body) is body
    assert wire_body(memoryview(b"ab")) == b"ab" and type(wire_body(bytearray(b"ab"))) is bytes


def test_the_server_receives_every_piece_in_order(durastream_server) -> None:
    """Sent by the real client to the real server: Content-Length from len(), no chunked encoding."""
    server = durastream_server
    client = StreamClient(ConnectionOptions(url=f"{server.base_url}/v1/stream"))
    client.create("pieces", content_type="application/json")
    rows = memoryview(b"".join(b'{"n":%d},' % n for n in range(5000)))
    middle = len(rows) // 3
    body = RequestBody([b"[", rows[:middle], rows[middle:-1], b"]"])
    client.append("pieces", body, "application/json", producer=("p", 0, 0))
    response = requests.get(server.stream_url("pieces"), params={"offset": "-1"}, timeout=10)
    assert response.json() == [{"n": n} for n in range(5000)]
