"""The durastream sink: each partition writes as an idempotent producer keyed by (query, partition, epoch).

CONTRACT STUB (filled in by the sink issue): ``batch_writer``, ``stream_writer``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType


def batch_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceWriter:
    raise NotImplementedError("the durastream sink is not built yet")


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceStreamWriter:
    raise NotImplementedError("the durastream sink is not built yet")
