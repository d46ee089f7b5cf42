"""A server with a small chunk size, so chunking and the "at least one message" rule are exercised
with small streams (the shared ``durastream_server`` uses the 1 MiB default)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.server_process import ServerProcess

SMALL_CHUNK = 256


def chunk_server(tmp_path_factory: pytest.TempPathFactory, chunk: int) -> Iterator[ServerProcess]:
    """A server of its own whose catch-up and frames responses hold at most ``chunk`` bytes."""
    server = ServerProcess(
        tmp_path_factory.mktemp("durastream-ext") / "data",
        long_poll_timeout=0.5,
        extra_args=("--chunk-bytes", str(chunk)),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def small_chunk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from chunk_server(tmp_path_factory, SMALL_CHUNK)
