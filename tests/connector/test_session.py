"""One session per process and server; a forked child builds its own; clients pickle without sessions."""

from __future__ import annotations

import os
import pickle
import uuid

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.session import get_session


def options(root: str, **extra: str) -> ConnectionOptions:
    return ConnectionOptions.parse({"url": root, **extra})


def test_same_session_within_a_process() -> None:
    a = options("http://127.0.0.1:4437/v1/stream")
    assert get_session(a) is get_session(a)
    # headers do not split pools: they are sent per request
    b = options("http://127.0.0.1:4437/v1/stream", **{"header.X-Tenant": "other"})
    assert get_session(b) is get_session(a)
    # another server, or other TLS trust or pool size, gets its own pool
    assert get_session(options("http://127.0.0.1:4438/v1/stream")) is not get_session(a)
    assert get_session(
        options("http://127.0.0.1:4437/v1/stream", maxConnections="2")
    ) is not get_session(a)


def test_pool_size_follows_max_connections() -> None:
    session = get_session(options("http://127.0.0.1:4439/v1/stream", maxConnections="7"))
    adapter = session.get_adapter("http://127.0.0.1:4439/")
    assert adapter._pool_maxsize == 7
    assert adapter.max_retries.total == 0  # retry.py decides what is repeated, never urllib3


def test_forked_child_gets_a_new_working_session(durastream_server) -> None:
    connection = options(durastream_server.base_url + "/v1/stream")
    path = f"session/fork-{uuid.uuid4().hex}"
    client = StreamClient(connection)
    client.create(path, "text/plain")
    parent_session = get_session(connection)

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report, never return into pytest
        status = 1
        try:
            child_session = get_session(connection)
            fresh = child_session is not parent_session and get_session(connection) is child_session
            client.append(path, b"from-child", "text/plain")
            os.write(write_end, b"fresh" if fresh else b"reused")
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == b"fresh"
    assert get_session(connection) is parent_session  # the parent keeps its own
    client.append(path, b"+parent", "text/plain")
    assert client.read(path, "-1").body == b"from-child+parent"


def test_client_pickles_without_a_session() -> None:
    client = StreamClient(
        options("http://127.0.0.1:4437/v1/stream", **{"header.Authorization": "Bearer t"})
    )
    data = pickle.dumps(client)
    assert (
        b"Session" not in data and b"Bearer t" in data
    )  # the header travels (executors need it) ...
    copy = pickle.loads(data)
    assert copy.connection == client.connection
    assert "Bearer t" not in repr(copy)  # ... but is never displayed
