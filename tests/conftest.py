"""Shared fixtures: real ``durastream-server`` processes (see ``tests/support/server_process.py``).

- ``durastream_server`` (session): one server for the whole run, long-poll timeout 0.5 s. Tests share it,
  so they must use unique stream paths.
- ``server_factory`` (function): starts private servers (e.g. for kill/restart crash tests) with optional
  settings, and stops them when the test ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from tests.support.server_process import ServerProcess


@pytest.fixture(scope="session")
def durastream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("durastream") / "data", long_poll_timeout=0.5)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []
    counter = itertools.count()

    def start(**settings: object) -> ServerProcess:
        root = tmp_path_factory.mktemp(f"durastream-private-{next(counter)}")
        settings.setdefault("long_poll_timeout", 0.5)
        server = ServerProcess(root / "data", **settings)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
