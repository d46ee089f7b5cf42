"""The ``durastream`` data source: the one class Spark sees.

It only dispatches: reads go to ``durastream_spark.source``, writes to ``durastream_spark.sink``. Both
parse their options once into frozen dataclasses there, so a bad option fails at planning time on the
driver with a message naming it, never as a traceback from a task.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from durastream_spark import sink, source
from durastream_spark.boundary import spark_entry_points


@spark_entry_points
class DurableStreamDataSource(DataSource):
    """Spark format ``durastream``: read and write Durable Streams, exactly once.

    Register it with ``spark.dataSource.register(DurableStreamDataSource)``, then use
    ``spark.read/readStream.format("durastream")`` and ``df.write/writeStream.format("durastream")``.
    Options are documented in ``docs/options.md``.
    """

    @classmethod
    def name(cls) -> str:
        return "durastream"

    def schema(self) -> StructType | str:
        return source.default_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return source.batch_reader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return source.stream_reader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return sink.batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return sink.stream_writer(self.options, schema, overwrite)
