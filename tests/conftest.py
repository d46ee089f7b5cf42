"""Shared fixtures: real ``durastream-server`` processes (see ``tests/support/server_process.py``).

- ``durastream_server`` (session): one server for the whole run, long-poll timeout 0.5 s. Tests share it,
  so they must use unique stream paths.
- ``server_factory`` (function): starts private servers (e.g. for kill/restart crash tests) with optional
  settings, and stops them when the test ends.
- ``reference_server`` (session): the Node reference server from npm, for compatibility tests.
- ``rakaia_server`` (session): rakaia (``rakaia-streams`` from PyPI) on its file store, a third server
  implementation, for compatibility tests (docs/compatibility.md).
- ``spark`` (session): one local SparkSession with the ``durastream`` source registered; Spark is slow to
  start, so every Spark test shares it.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support.rakaia_server import RakaiaServer
from tests.support.reference_server import ReferenceServer
from tests.support.server_process import ServerProcess

# Property tests check properties, not speed: on a loaded 2-core machine input generation can pass
# Hypothesis's 1 s/200 ms health checks and per-example deadline without anything being wrong.
settings.register_profile("durastream", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("durastream")


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


@pytest.fixture(scope="session")
def reference_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    server = ReferenceServer(tmp_path_factory.mktemp("reference") / "data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def rakaia_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RakaiaServer]:
    server = RakaiaServer(tmp_path_factory.mktemp("rakaia") / "data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark():  # -> pyspark.sql.SparkSession (imported lazily: server-only runs never start a JVM)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    session = (
        # local[N, F]: F attempts per task. Plain local[N] never retries a failed task, and the sink's
        # exactly-once tests need Spark's own task retries.
        SparkSession.builder.master("local[2,4]")
        .appName("durastream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        # A Python worker's connect-back to the JVM times out after 15 s by default, which a loaded
        # 2-core machine exceeds at times; the query then fails with "Python worker failed to connect
        # back" although nothing is wrong.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(DurableStreamDataSource)
    try:
        yield session
    finally:
        session.stop()
