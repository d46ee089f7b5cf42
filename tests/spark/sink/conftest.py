"""Fixtures of the sink tests (the Spark session and servers come from tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.spark.sink.probe import ProbeDataSource


@pytest.fixture(scope="session")
def sink_spark(spark):
    """The shared session, with the probing variant of the sink registered too."""
    spark.dataSource.register(ProbeDataSource)
    return spark
