"""The durastream source: stream offsets mapped to replay-deterministic micro-batch offsets.

CONTRACT STUB (filled in by the source issue): ``default_schema``, ``batch_reader``, ``stream_reader``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

DEFAULT_SCHEMA = "stream STRING, offset STRING, value BINARY, timestamp TIMESTAMP"


def default_schema(options: Mapping[str, str]) -> str:
    """The schema of a read without a user schema."""
    return DEFAULT_SCHEMA


def batch_reader(options: Mapping[str, str], schema: StructType) -> DataSourceReader:
    raise NotImplementedError("the durastream source is not built yet")


def stream_reader(options: Mapping[str, str], schema: StructType) -> DataSourceStreamReader:
    raise NotImplementedError("the durastream source is not built yet")
