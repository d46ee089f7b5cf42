"""What each server offers the connector, asserted on the real servers (no Spark): durastream-server, the
Node reference server (npm) and rakaia (PyPI). docs/compatibility.md is the table these tests back; the
Spark-level outcome on each server (exactly once, loud failure or refusal) is in the Spark tests named
there.

| property                          | durastream-server      | Node reference      | rakaia                |
| --------------------------------- | ---------------------- | ------------------- | --------------------- |
| durastream extensions             | all (incl. time-lookup)| none                | none                  |
| forks (replayable reads via pins) | yes                    | yes                 | no: PUT ignores them  |
| reused producer tuple, new bytes  | 409 (loud)             | 204 (silent)        | 204 (silent)          |
| §6 subscriptions (pattern)        | yes (lists instead)    | yes                 | no (``__ds`` is a     |
|                                   |                        |                     | plain stream path)    |
"""

from __future__ import annotations

import uuid

import pytest

from durastream_spark.errors import DuplicatePayloadMismatch, StreamNotFound
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.source.discovery import StreamCatalog, whole_segment_glob
from durastream_spark.source.fallback import ReplayNotGuaranteed, ensure_pin, pin_path

SERVERS = ("durastream_server", "reference_server", "rakaia_server")


@pytest.fixture(params=SERVERS)
def server(request):
    return request.param, request.getfixturevalue(request.param)


def client_for(server) -> StreamClient:
    root = getattr(server, "stream_root", None) or server.base_url + "/v1/stream"
    return StreamClient(ConnectionOptions.parse({"url": root}))


def unique(name: str) -> str:
    return f"compat/{name}-{uuid.uuid4().hex[:10]}"


def test_extensions_are_advertised_only_by_durastream_server(server) -> None:
    name, process = server
    extensions = client_for(process).extensions()
    if name == "durastream_server":
        assert extensions.time_lookup and extensions.bounded_read and extensions.limit_lookup
    else:
        assert not extensions  # the connector falls back to the base protocol, or refuses


def test_forks_pin_a_range_except_on_rakaia_where_reads_are_refused(server) -> None:
    name, process = server
    client = client_for(process)
    path = unique("fork")
    client.create(path, "application/json")
    end = client.append(path, b'[{"n":1},{"n":2}]', "application/json").next_offset
    client.append(path, b'[{"n":3}]', "application/json")
    if name == "rakaia_server":
        # The PUT succeeds but ignores Stream-Forked-From: the source refuses rather than read past E.
        with pytest.raises(ReplayNotGuaranteed, match="re-read identically"):
            ensure_pin(client, "__pins", path, end, "application/json", 600)
        with pytest.raises(StreamNotFound):  # the stream its PUT created instead is removed again
            client.head(pin_path("__pins", path, end))
        return
    pin = ensure_pin(client, "__pins", path, end, "application/json", 600)
    assert client.head(pin).next_offset == end


def test_a_reused_producer_tuple_with_other_bytes_is_loud_only_with_payload_digests(server) -> None:
    """The sink's ordered mode relies on replays sending the same bytes under the same tuple; without
    the server's payload digests a replay that differs is accepted as a duplicate, silently."""
    name, process = server
    client = client_for(process)
    path = unique("digest")
    client.create(path, "application/json")
    client.append(path, b'[{"n":1}]', "application/json", producer=("p", 0, 0))
    if name == "durastream_server":
        with pytest.raises(DuplicatePayloadMismatch):
            client.append(path, b'[{"n":2}]', "application/json", producer=("p", 0, 0))
    else:
        result = client.append(path, b'[{"n":2}]', "application/json", producer=("p", 0, 0))
        assert result.duplicate  # 204: the second payload is dropped without an error
    chunk = client.read(path, "-1")
    assert chunk.body == b'[{"n":1}]'


def test_patterns_list_through_subscriptions_only_where_the_server_has_them(server) -> None:
    """Section 6 subscriptions as a listing: probed without side effects, then one short-lived
    subscription per snapshot; a glob with ``*`` inside a segment is widened for the server and
    filtered by the connector."""
    name, process = server
    client = client_for(process)
    if name == "rakaia_server":
        assert not client.subscriptions_supported()
        return
    assert client.subscriptions_supported()
    if name == "durastream_server":
        return  # it lists through its listing extension instead
    base = unique("glob")
    for path in (f"{base}/a", f"{base}/b1", f"{base}/b2/deeper", f"{base}-x/b3"):
        client.create(path, "application/json")
    catalog = StreamCatalog(client, pattern=f"{base}/b*", exclude_prefix="__pins")
    assert list(catalog.snapshot()) == [f"{base}/b1"]
    assert whole_segment_glob("ev/b*/**/x*y") == "ev/*/**/*"
