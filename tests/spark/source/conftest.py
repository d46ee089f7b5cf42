"""Fixtures shared by the source tests."""

from __future__ import annotations

import pytest

from tests.spark.source.support import Streams


@pytest.fixture
def streams(durastream_server) -> Streams:
    """Streams on the suite's durastream-server (the rakaia and reference-server tests define their own)."""
    return Streams(durastream_server)
